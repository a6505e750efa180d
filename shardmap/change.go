package shardmap

import (
	"errors"
	"fmt"
	"slices"
	"time"
)

// MaxWeight bounds a shard's Weight.
const MaxWeight = 1000

// DrainSettle is how long after a shard's drain was published no process
// can still publish to its enqueue buffer: a router refuses enqueues once
// its map is unconfirmed for MaxStaleness (so within MaxStaleness it has
// the drain or has stopped), plus a publish in flight and clock skew
// between hosts. Routers look up moved dedup keys on the drained shard
// only after it, and Retire waits for it.
const DrainSettle = 2*MaxStaleness + time.Second

var (
	// ErrUnknownShard is returned for a shard the map does not have.
	ErrUnknownShard = errors.New("unknown shard")
	// ErrShardState means a change does not fit the shard's state now
	// (draining, not draining, not empty yet); the message says what to
	// do first. Nothing was changed.
	ErrShardState = errors.New("shard state does not allow this change")
)

// EnqueueShards returns the shards of namespace in region that take new
// enqueues (not draining), with their weights, in ID order.
func (m *Map) EnqueueShards(namespace, region string) (ids []uint32, weights []uint32, err error) {
	all, err := m.ShardsFor(namespace, region)
	if err != nil {
		return nil, nil, err
	}
	for _, id := range all {
		s := m.shards[id]
		if s.Draining {
			continue
		}
		ids = append(ids, id)
		weights = append(weights, max(1, s.Weight))
	}
	if len(ids) == 0 {
		return nil, nil, fmt.Errorf("%w taking enqueues for namespace %q in region %q: all of %v are draining", ErrNoShards, namespace, region, all)
	}
	return ids, weights, nil
}

// PickWeighted returns the shard that the n-th pick over ids with weights
// gets: each shard takes picks in proportion to its weight, interleaved.
func PickWeighted(ids, weights []uint32, n uint64) uint32 {
	var total uint64
	for _, w := range weights {
		total += uint64(w)
	}
	r := n % total
	// Interleave: with weights 3:1 the picks go a, b, a, a rather than
	// a, a, a, b. Stride through the ring by a step coprime with total.
	step := uint64(1)
	for s := total/2 + 1; s < total; s++ {
		if gcd(s, total) == 1 {
			step = s
			break
		}
	}
	r = (r * step) % total
	for i, w := range weights {
		if r < uint64(w) {
			return ids[i]
		}
		r -= uint64(w)
	}
	return ids[len(ids)-1]
}

func gcd(a, b uint64) uint64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// DedupRoute returns the shard of region that takes topic's dedup key,
// and the shard the key's slot moved from when that one was drained and
// is not retired yet (0 otherwise): that shard may still hold the key's
// item or tombstone, so the caller must look there first.
func (ns *Namespace) DedupRoute(region, topic, key string) (shard, from uint32, ok bool) {
	table := ns.Slots[region]
	if len(table) != DedupSlots {
		return 0, 0, false
	}
	slot := DedupSlot(topic, key)
	if f := ns.SlotsFrom[region]; len(f) == DedupSlots {
		from = f[slot]
	}
	return table[slot], from, true
}

func (m *Map) next() Map {
	next := Map{Version: m.Version + 1, Regions: m.Regions, Retired: slices.Clone(m.Retired)}
	for _, s := range m.Shards {
		s.Replicas = slices.Clone(s.Replicas)
		s.ReplicaRegions = slices.Clone(s.ReplicaRegions)
		next.Shards = append(next.Shards, s)
	}
	for _, ns := range m.Namespaces {
		next.Namespaces = append(next.Namespaces, ns.clone())
	}
	return next
}

func (ns Namespace) clone() Namespace {
	out := ns
	out.Shards = map[string][]uint32{}
	for r, ids := range ns.Shards {
		out.Shards[r] = slices.Clone(ids)
	}
	cl := func(t DedupSlotTables) DedupSlotTables {
		if t == nil {
			return nil
		}
		o := DedupSlotTables{}
		for r, ids := range t {
			o[r] = slices.Clone(ids)
		}
		return o
	}
	out.Slots, out.SlotsFrom = cl(ns.Slots), cl(ns.SlotsFrom)
	return out
}

// WithNewShard returns the next version of m with shard s added. Its ID
// must be new (never used, also not by a retired shard). Namespaces that
// list no shards for s's home region take it at once, with its weight;
// the others take it with WithNamespaceShard. It takes no dedup slots:
// slots move only off a drained shard (WithDrain).
func (m *Map) WithNewShard(s Shard) (*Map, error) {
	if _, ok := m.shards[s.ID]; ok {
		return nil, fmt.Errorf("shard %d already exists: pick an unused ID", s.ID)
	}
	if s.Draining || s.Fenced || s.DrainedAtMs != 0 {
		return nil, errors.New("a new shard cannot start fenced or draining")
	}
	next := m.next()
	next.Shards = append(next.Shards, s)
	return New(next)
}

// WithNamespaceShard returns the next version of m with shard id added to
// namespace's shards in region. A namespace that lists no shards for the
// region (and so takes every shard homed there) gets an explicit list of
// those plus id: nothing it had is dropped.
func (m *Map) WithNamespaceShard(namespace, region string, id uint32) (*Map, error) {
	s, ok := m.shards[id]
	if !ok {
		return nil, fmt.Errorf("%w %d: add it to the map first (AddShard)", ErrUnknownShard, id)
	}
	if _, err := m.Namespace(namespace); err != nil {
		return nil, err
	}
	if s.HomeRegion != region {
		return nil, fmt.Errorf("shard %d is homed in %q, not %q: a region lists only shards homed there", id, s.HomeRegion, region)
	}
	if s.Draining {
		return nil, fmt.Errorf("%w: shard %d is draining: it takes no namespace", ErrShardState, id)
	}
	next := m.next()
	for i := range next.Namespaces {
		ns := &next.Namespaces[i]
		if ns.Name != namespace {
			continue
		}
		ids, explicit := ns.Shards[region]
		if !explicit {
			ids = slices.Clone(m.byRegion[region])
			ids = slices.DeleteFunc(ids, func(x uint32) bool { return x == id })
		}
		if slices.Contains(ids, id) {
			return nil, fmt.Errorf("%w: namespace %q already has shard %d in region %q", ErrShardState, namespace, id, region)
		}
		ns.Shards[region] = append(ids, id)
	}
	return New(next)
}

// WithWeight returns the next version of m with shard id's weight set.
func (m *Map) WithWeight(id uint32, weight uint32) (*Map, error) {
	if _, ok := m.shards[id]; !ok {
		return nil, fmt.Errorf("%w %d", ErrUnknownShard, id)
	}
	if weight < 1 || weight > MaxWeight {
		return nil, fmt.Errorf("weight %d: allowed 1 to %d", weight, MaxWeight)
	}
	next := m.next()
	for i := range next.Shards {
		if next.Shards[i].ID == id {
			next.Shards[i].Weight = weight
		}
	}
	return New(next)
}

// WithDrain returns the next version of m with shard id draining as of
// now: routers send it no new enqueues. Every dedup slot that names it
// moves to the namespace's other shards in that region that take
// enqueues, spread by weight, and remembers id in SlotsFrom, so a key
// whose item or tombstone is still on id is found there (the router's
// lookup) and the key's copies never live on two shards. Refused
// (ErrShardState) when a namespace would have no shard taking enqueues
// in the region, or when id holds slots moved from a shard not retired
// yet: a slot remembers one old shard, so that one must be retired first.
func (m *Map) WithDrain(id uint32, now time.Time) (*Map, error) {
	s, ok := m.shards[id]
	if !ok {
		return nil, fmt.Errorf("%w %d", ErrUnknownShard, id)
	}
	if s.Draining {
		return nil, fmt.Errorf("%w: shard %d has been draining since %s", ErrShardState, id, time.UnixMilli(s.DrainedAtMs).UTC().Format(time.RFC3339))
	}
	next := m.next()
	for i := range next.Shards {
		if next.Shards[i].ID == id {
			next.Shards[i].Draining = true
			next.Shards[i].DrainedAtMs = now.UnixMilli()
		}
	}
	region := s.HomeRegion
	for i := range next.Namespaces {
		ns := &next.Namespaces[i]
		all, err := m.ShardsFor(ns.Name, region)
		if err != nil || !slices.Contains(all, id) {
			continue
		}
		var ids, weights []uint32
		for _, x := range all {
			if t := m.shards[x]; x != id && !t.Draining {
				ids = append(ids, x)
				weights = append(weights, max(1, t.Weight))
			}
		}
		if len(ids) == 0 {
			return nil, fmt.Errorf("%w: shard %d is the last shard of namespace %q in region %q that takes enqueues: add another shard there first (AddShard, AddNamespaceShard)",
				ErrShardState, id, ns.Name, region)
		}
		table := ns.Slots[region]
		if len(table) != DedupSlots {
			continue
		}
		from := ns.SlotsFrom[region]
		for slot, owner := range from {
			if owner != 0 && table[slot] == id {
				return nil, fmt.Errorf("%w: shard %d holds dedup slots of namespace %q that moved from shard %d, which is not retired yet: retire shard %d first",
					ErrShardState, id, ns.Name, owner, owner)
			}
		}
		if len(from) != DedupSlots {
			from = make([]uint32, DedupSlots)
		}
		n := uint64(0)
		for slot, owner := range table {
			if owner != id {
				continue
			}
			table[slot] = PickWeighted(ids, weights, n)
			from[slot] = id
			n++
		}
		if n > 0 {
			if ns.SlotsFrom == nil {
				ns.SlotsFrom = DedupSlotTables{}
			}
			ns.SlotsFrom[region] = from
		}
	}
	return New(next)
}

// WithoutShard returns the next version of m without shard id, which must
// be draining; the caller checks that it is empty and its buffer drained
// (the map cannot know). Its ID is kept in Retired, and dedup slots that
// moved from it forget it.
func (m *Map) WithoutShard(id uint32) (*Map, error) {
	s, ok := m.shards[id]
	if !ok {
		return nil, fmt.Errorf("%w %d", ErrUnknownShard, id)
	}
	if !s.Draining {
		return nil, fmt.Errorf("%w: shard %d is not draining: drain it first, then retire it once it is empty", ErrShardState, id)
	}
	next := m.next()
	next.Shards = slices.DeleteFunc(next.Shards, func(x Shard) bool { return x.ID == id })
	next.Retired = append(next.Retired, id)
	for i := range next.Namespaces {
		ns := &next.Namespaces[i]
		for r, ids := range ns.Shards {
			ns.Shards[r] = slices.DeleteFunc(ids, func(x uint32) bool { return x == id })
		}
		for r, table := range ns.Slots {
			if slices.Contains(table, id) {
				return nil, fmt.Errorf("%w: namespace %q: dedup slots of region %q still name shard %d", ErrShardState, ns.Name, r, id)
			}
		}
		for _, from := range ns.SlotsFrom {
			for slot, x := range from {
				if x == id {
					from[slot] = 0
				}
			}
		}
	}
	return New(next)
}
