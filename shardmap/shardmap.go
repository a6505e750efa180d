package shardmap

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"slices"
	"sort"
	"time"
)

// Defaults of a namespace's limits when its config leaves them out.
const (
	DefaultMaxPayloadBytes = 256 << 10
	// MaxPayloadCeiling bounds any namespace's max_payload_bytes: one item
	// must fit one INSERT packet beside a group of others.
	MaxPayloadCeiling    = 8 << 20
	DefaultLeaseDuration = 30 * time.Second
	DefaultMaxAttempts   = 10
	// MaxLeaseDuration bounds any lease, so a crashed consumer's items come
	// back within a day at worst.
	MaxLeaseDuration = 12 * time.Hour
	// MinLeaseDuration is the shortest lease a client may ask for.
	MinLeaseDuration = 100 * time.Millisecond
)

// ErrUnknownNamespace is returned for a namespace the map does not have.
var ErrUnknownNamespace = errors.New("unknown namespace")

// ErrNoShards is returned when a namespace has no shards in a region.
var ErrNoShards = errors.New("no shards")

// Duration is a time.Duration that reads and writes JSON as "30s".
type Duration time.Duration

// MarshalJSON writes the duration as a Go duration string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// UnmarshalJSON reads a Go duration string such as "1m30s".
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("duration must be a string such as \"30s\": %w", err)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}

// Shard is one MySQL database: a primary and its replicas.
type Shard struct {
	// ID is the shard number that item IDs carry.
	ID uint32 `json:"id"`
	// HomeRegion is where the shard's items logically live.
	HomeRegion string `json:"home_region"`
	// Primary is the host:port of the current primary.
	Primary string `json:"primary"`
	// Database is the schema name on the primary. Default "triage".
	Database string `json:"database,omitempty"`
	// Replicas are host:port of replicas, in promotion preference order.
	Replicas []string `json:"replicas,omitempty"`
	// ReplicaRegions[i] is the region Replicas[i] runs in.
	ReplicaRegions []string `json:"replica_regions,omitempty"`
	// Epoch rises with every failover; writers check it to fence a deposed
	// primary.
	Epoch uint64 `json:"epoch"`
	// PrimaryRegion is where Primary runs. Empty: HomeRegion.
	PrimaryRegion string `json:"primary_region,omitempty"`
	// Fenced is set while a failover is under way: no process writes to
	// the shard until a map with a new primary is published.
	Fenced bool `json:"fenced,omitempty"`
	// Weight is the shard's share of new enqueues without a dedup key
	// among its namespace's shards in a region, 1 to MaxWeight. 0 reads
	// as 1. A new shard can take a larger share until it is balanced.
	Weight uint32 `json:"weight,omitempty"`
	// Draining shards take no new enqueues; dequeues and item calls go
	// on until they are empty and Retire removes them (see change.go).
	Draining bool `json:"draining,omitempty"`
	// DrainedAtMs is when Drain was published (unix ms, the admin
	// router's clock): a drained shard's buffer is known closed to new
	// publishes DrainSettle after it.
	DrainedAtMs int64 `json:"drained_at_ms,omitempty"`
}

// Namespace is a tenant: its shards and its limits.
type Namespace struct {
	Name string `json:"name"`
	// Shards lists shard IDs per region. A region left out uses every shard
	// whose home is that region.
	Shards map[string][]uint32 `json:"shards,omitempty"`
	// MaxPayloadBytes bounds one item's payload. Default 256 KiB.
	MaxPayloadBytes int `json:"max_payload_bytes,omitempty"`
	// DefaultLeaseDuration applies when neither item nor dequeue says.
	// Default 30s.
	DefaultLeaseDuration Duration `json:"default_lease_duration,omitempty"`
	// MaxAttempts is the deliveries before an item is dead-lettered.
	// Default 10.
	MaxAttempts int `json:"max_attempts,omitempty"`
	// DefaultTTL deletes items this long after enqueue. Default none.
	DefaultTTL Duration `json:"default_ttl,omitempty"`
	// EnqueueRateLimit is items/s each router accepts. 0: no limit.
	EnqueueRateLimit float64 `json:"enqueue_rate_limit,omitempty"`
	// EnqueueBurst is the token bucket's size. Default: one second of the
	// rate (at least 1).
	EnqueueBurst int `json:"enqueue_burst,omitempty"`
	// MaxDepth bounds the items a region's shards hold. 0: no limit.
	MaxDepth int64 `json:"max_depth,omitempty"`
	// DedupWindow keeps a dedup key taken this long after its item is gone.
	DedupWindow Duration `json:"dedup_window,omitempty"`
	// DedupRetryWindow keeps a dedup key taken this long after its item's
	// enqueue, whatever became of the item: see RetryWindow. Nil: the
	// default, DefaultDedupRetryWindow; 0 turns it off.
	DedupRetryWindow *Duration `json:"dedup_retry_window,omitempty"`
	// Topics holds per-topic overrides.
	Topics map[string]TopicConfig `json:"topics,omitempty"`
	// Slots holds the dedup slot tables, one per region: a dedup key
	// hashes to one of DedupSlots slots, and Slots[region][slot] is the
	// shard of that region that holds every copy of the key enqueued with
	// that region. A request's region picks where its items are stored and
	// a dequeue reads only its region's shards, so dedup is exact per
	// (namespace, topic, region): the same key enqueued with two regions
	// is two items. Deduplicating across regions would need a cross-region
	// lookup on every enqueue, and the item must live where the producer
	// chose. A slot's shard must stay fixed while the key's item or
	// tombstone may live there, or the shard's unique index would not see
	// a later copy; so a region's table is filled once, when the namespace
	// first has shards there (from that region's shards, sorted), and kept
	// when its shard lists change. A shard a region's slots name cannot
	// leave the namespace's shards in that region; draining the shard
	// moves its slots (WithDrain, with SlotsFrom).
	Slots DedupSlotTables `json:"dedup_slots,omitempty"`
	// SlotsFrom records, per region and slot, the shard a slot moved
	// away from when that shard was drained (0: not moved). That shard
	// may still hold a live item or tombstone of the slot's keys, so a
	// router looks a key up there before it enqueues the key on the
	// slot's new shard (see "# Changing shards" in doc.go). Entries are
	// cleared when the old shard is retired, which requires it empty.
	SlotsFrom DedupSlotTables `json:"dedup_slots_from,omitempty"`
}

// DedupSlotTables maps a region to its DedupSlots shard IDs.
//
// In JSON a table that repeats a cycle of shard IDs, as every table New
// fills does until a slot moves, is written as {"cycle": [IDs]}: the map
// holds one table per region for every namespace, and written out in
// full they made up nearly all of it (about 2.7 KB a namespace against
// 60 bytes), which bounded a map, one KV value, to a few thousand
// namespaces and made every process parse megabytes on each change.
type DedupSlotTables map[string][]uint32

// slotCycle is a table written as the cycle it repeats.
type slotCycle struct {
	Cycle []uint32 `json:"cycle"`
}

// MarshalJSON writes each table as its cycle when it repeats one at
// least twice, in full otherwise.
func (t DedupSlotTables) MarshalJSON() ([]byte, error) {
	out := make(map[string]slotTable, len(t))
	for region, table := range t {
		out[region] = table
	}
	return json.Marshal(out)
}

// slotTable is one slot table in JSON: {"cycle": [IDs]} when it repeats
// a cycle at least twice, an array of its IDs otherwise.
type slotTable []uint32

func (t slotTable) MarshalJSON() ([]byte, error) {
	if p := period(t); p <= len(t)/2 {
		return json.Marshal(slotCycle{Cycle: t[:p]})
	}
	return json.Marshal([]uint32(t))
}

func (t *slotTable) UnmarshalJSON(b []byte) error {
	if trimmed := bytes.TrimSpace(b); len(trimmed) == 0 || trimmed[0] != '{' {
		return json.Unmarshal(b, (*[]uint32)(t))
	}
	var c slotCycle
	if err := json.Unmarshal(b, &c); err != nil || len(c.Cycle) == 0 || len(c.Cycle) > DedupSlots {
		return fmt.Errorf("a cycle must list 1 to %d shard IDs", DedupSlots)
	}
	*t = make(slotTable, DedupSlots)
	for i := range *t {
		(*t)[i] = c.Cycle[i%len(c.Cycle)]
	}
	return nil
}

// period returns the least p with table[i] == table[i%p] for every i
// (len(table) when there is none shorter).
func period(table []uint32) int {
	for p := 1; p < len(table); p++ {
		if table[p] != table[0] {
			continue
		}
		i := p
		for i < len(table) && table[i] == table[i%p] {
			i++
		}
		if i == len(table) {
			return p
		}
	}
	return len(table)
}

// UnmarshalJSON reads the per-region tables, each an array or a cycle. A
// single table (a JSON array: the namespace-wide table of an earlier
// version, which could name shards of any region) is dropped, so New
// fills a table per region from that region's shards.
func (t *DedupSlotTables) UnmarshalJSON(b []byte) error {
	if trimmed := bytes.TrimSpace(b); len(trimmed) > 0 && trimmed[0] == '[' {
		*t = nil
		return nil
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		return fmt.Errorf("dedup_slots must map a region to %d shard IDs: %w", DedupSlots, err)
	}
	*t = make(DedupSlotTables, len(m))
	for region, raw := range m {
		var table slotTable
		if err := json.Unmarshal(raw, &table); err != nil {
			if bytes.HasPrefix(bytes.TrimSpace(raw), []byte("{")) {
				return fmt.Errorf("dedup_slots of region %q: %w", region, err)
			}
			return fmt.Errorf("dedup_slots must map a region to %d shard IDs: %w", DedupSlots, err)
		}
		(*t)[region] = table
	}
	return nil
}

// DedupSlots is the size of a region's dedup slot table: enough that
// slots spread evenly over any practical number of shards.
const DedupSlots = 256

// DedupSlot returns the slot of topic's dedup key. The topic is part of
// the hash because a key is unique within its topic.
func DedupSlot(topic, key string) int {
	h := fnv.New32a()
	h.Write([]byte(topic))
	h.Write([]byte{0})
	h.Write([]byte(key))
	return int(h.Sum32() % DedupSlots)
}

// DedupShard returns the shard of region that holds every item of topic
// with the dedup key enqueued with that region, and false when the
// namespace has no slot table there (it has no shards in the region).
func (ns *Namespace) DedupShard(region, topic, key string) (uint32, bool) {
	table := ns.Slots[region]
	if len(table) != DedupSlots {
		return 0, false
	}
	return table[DedupSlot(topic, key)], true
}

// Dequeue policies.
const (
	PolicyStrict   = "strict"
	PolicyWeighted = "weighted"
)

// DefaultBandWeights are the WEIGHTED policy's shares of bands 0, 1, 2, 3
// and 4+ (seed 000).
var DefaultBandWeights = []float64{8, 4, 2, 1, 0.5}

// TopicConfig overrides namespace defaults for one topic.
type TopicConfig struct {
	// Policy is "strict" (default) or "weighted".
	Policy string `json:"policy,omitempty"`
	// BandWeights: band i is priority i, the last band every priority from
	// its index up. Default DefaultBandWeights.
	BandWeights []float64 `json:"band_weights,omitempty"`
	// AtMostOnce deletes an item whose lease expires.
	AtMostOnce bool `json:"at_most_once,omitempty"`
	// AgingThreshold moves items ready longer than this up one level.
	AgingThreshold Duration `json:"aging_threshold,omitempty"`
	// Paused holds the topic's deliveries (PauseTopic): dequeuers serve
	// none of it until ResumeTopic clears it. It lives here so that every
	// dequeuer of every region sees it and it outlives restarts and
	// failovers.
	Paused bool `json:"paused,omitempty"`
	// MaxAttempts overrides the namespace's for the topic (0: the
	// namespace's); Backoff is the topic's nack delay (nil:
	// DefaultBackoff). See Namespace.Retry.
	MaxAttempts int      `json:"max_attempts,omitempty"`
	Backoff     *Backoff `json:"backoff,omitempty"`
}

// Topic returns topic's config with defaults filled.
func (ns *Namespace) Topic(topic string) TopicConfig {
	tc := ns.Topics[topic]
	if tc.Policy == "" {
		tc.Policy = PolicyStrict
	}
	if tc.Policy == PolicyWeighted && len(tc.BandWeights) == 0 {
		tc.BandWeights = DefaultBandWeights
	}
	return tc
}

// DefaultDedupRetryWindow is a namespace's DedupRetryWindow unless it
// sets one: as long as SQS FIFO queues keep a deduplication ID.
const DefaultDedupRetryWindow = 5 * time.Minute

// MaxDedupRetryWindow bounds DedupRetryWindow: a shard keeps the
// tombstones that carry it for a day (store.KeyMemory).
const MaxDedupRetryWindow = 24 * time.Hour

// RetryWindow is how long after an item's enqueue its dedup key stays
// taken from other enqueues, whatever the dedup window: an enqueue
// answered anything but ok may have been inserted all the same, and its
// item delivered and acked before the producer's retry arrives, which the
// dedup window alone (counted from the item's removal, 0 by default)
// would take for a new item.
func (ns *Namespace) RetryWindow() time.Duration {
	if ns.DedupRetryWindow == nil {
		return DefaultDedupRetryWindow
	}
	return time.Duration(*ns.DedupRetryWindow)
}

func (ns *Namespace) validate() error {
	if ns.MaxPayloadBytes < 0 || ns.MaxAttempts < 0 || ns.DefaultTTL < 0 || ns.EnqueueRateLimit < 0 ||
		ns.EnqueueBurst < 0 || ns.MaxDepth < 0 || ns.DedupWindow < 0 {
		return fmt.Errorf("namespace %q: limits must not be negative", ns.Name)
	}
	if w := ns.RetryWindow(); w < 0 || w > MaxDedupRetryWindow {
		return fmt.Errorf("namespace %q: dedup_retry_window must be within 0s..%s", ns.Name, MaxDedupRetryWindow)
	}
	if ns.MaxPayloadBytes > MaxPayloadCeiling {
		return fmt.Errorf("namespace %q: max_payload_bytes %d is over the %d (8 MiB) ceiling", ns.Name, ns.MaxPayloadBytes, MaxPayloadCeiling)
	}
	if d := time.Duration(ns.DefaultLeaseDuration); d < MinLeaseDuration || d > MaxLeaseDuration {
		return fmt.Errorf("namespace %q: default_lease_duration must be within %s..%s", ns.Name, MinLeaseDuration, MaxLeaseDuration)
	}
	for name, tc := range ns.Topics {
		if !ValidName(name) {
			return fmt.Errorf("namespace %q: topic %q: names are 1-128 letters, digits, '_', '.', '-'", ns.Name, name)
		}
		if tc.Policy != "" && tc.Policy != PolicyStrict && tc.Policy != PolicyWeighted {
			return fmt.Errorf("namespace %q: topic %q: policy %q: allowed strict or weighted", ns.Name, name, tc.Policy)
		}
		if len(tc.BandWeights) > 32 {
			return fmt.Errorf("namespace %q: topic %q: at most 32 band weights", ns.Name, name)
		}
		for _, w := range tc.BandWeights {
			if !(w > 0) || w > 1e6 {
				return fmt.Errorf("namespace %q: topic %q: band weights must be positive numbers", ns.Name, name)
			}
		}
		if tc.AgingThreshold < 0 || (tc.AgingThreshold > 0 && time.Duration(tc.AgingThreshold) < 100*time.Millisecond) {
			return fmt.Errorf("namespace %q: topic %q: aging_threshold must be 0 (off) or at least 100ms", ns.Name, name)
		}
		if tc.MaxAttempts < 0 {
			return fmt.Errorf("namespace %q: topic %q: max_attempts must not be negative", ns.Name, name)
		}
		if tc.Backoff != nil {
			if err := tc.Backoff.validate(); err != nil {
				return fmt.Errorf("namespace %q: topic %q: backoff: %w", ns.Name, name, err)
			}
		}
	}
	return nil
}

// Map is an immutable shard-map snapshot. Build it with Parse or New.
type Map struct {
	Version    uint64      `json:"version"`
	Regions    []string    `json:"regions"`
	Shards     []Shard     `json:"shards"`
	Namespaces []Namespace `json:"namespaces"`
	// Retired lists the IDs of retired shards. They are never reused:
	// an item ID names its shard, so a stale ID of a retired shard must
	// not find another shard's rows.
	Retired []uint32 `json:"retired,omitempty"`

	shards     map[uint32]*Shard
	namespaces map[string]*Namespace
	byRegion   map[string][]uint32
	// rev is the KV revision of the head the map was read at or written
	// as (0: neither), so Publish can compare-and-set on it without
	// reading the stored map again; stamps says the same of each
	// namespace (see store.go), so Publish writes only changed ones and
	// a watch parses only those.
	rev    uint64
	stamps map[string]stamp
}

// ValidName reports whether s is a valid namespace, topic or region name:
// 1-128 of letters, digits, '_', '.', '-', starting with a letter or digit.
// Every request checks its namespace and topics, so this is a loop over
// bytes rather than a regular expression.
func ValidName(s string) bool {
	if len(s) == 0 || len(s) > 128 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case i > 0 && (c == '_' || c == '.' || c == '-'):
		default:
			return false
		}
	}
	return true
}

// Parse reads a JSON map and validates it.
func Parse(data []byte) (*Map, error) {
	var w storedMap
	if err := json.Unmarshal(data, &w); err != nil {
		return nil, fmt.Errorf("shard map: %w", err)
	}
	m, err := w.restore()
	if err != nil {
		return nil, fmt.Errorf("shard map: %w", err)
	}
	return New(m)
}

// storedMap is a Map as Marshal writes it. Every namespace has a slot
// table per region, and most namespaces' tables are the same few (every
// namespace on all of a region's shards has the same one), so the
// distinct tables are listed once, in SlotTables, and a namespace names
// its tables by index (dedup_slot_refs). Written out per namespace they
// made up nearly all of the map: with 1,000 shards and 10,000 namespaces
// 34.6 MB, where one NATS message, the KV value that holds the map,
// carries 8 MiB. A namespace's dedup_slots, the form of earlier maps and
// of a hand-written bootstrap map, is still read.
type storedMap struct {
	mapFields
	SlotTables []slotTable       `json:"slot_tables,omitempty"`
	Namespaces []storedNamespace `json:"namespaces"`
}

// mapFields and namespaceFields are Map and Namespace without their
// methods, so the stored forms embed their fields and encoding/json
// writes them as the plain types would; the stored forms' own fields
// of the same JSON name take their place.
type (
	mapFields       Map
	namespaceFields Namespace
)

type storedNamespace struct {
	namespaceFields
	Slots    DedupSlotTables `json:"dedup_slots,omitempty"`
	SlotRefs map[string]int  `json:"dedup_slot_refs,omitempty"`
}

// stored returns m's stored form.
func (m *Map) stored() *storedMap {
	w := &storedMap{mapFields: mapFields{Version: m.Version, Regions: m.Regions, Shards: m.Shards, Retired: m.Retired},
		Namespaces: make([]storedNamespace, len(m.Namespaces))}
	index := map[string]int{}
	var buf []byte
	for i, ns := range m.Namespaces {
		sn := storedNamespace{namespaceFields: namespaceFields(ns)}
		sn.namespaceFields.Slots = nil
		// Regions in order: the same map marshals to the same bytes.
		for _, region := range slices.Sorted(maps.Keys(ns.Slots)) {
			table := ns.Slots[region]
			buf = buf[:0]
			for _, id := range table {
				buf = binary.LittleEndian.AppendUint32(buf, id)
			}
			key := string(buf)
			k, ok := index[key]
			if !ok {
				k = len(w.SlotTables)
				index[key] = k
				w.SlotTables = append(w.SlotTables, table)
			}
			if sn.SlotRefs == nil {
				sn.SlotRefs = map[string]int{}
			}
			sn.SlotRefs[region] = k
		}
		w.Namespaces[i] = sn
	}
	return w
}

// restore returns the Map w holds, its namespaces' slot tables in place.
func (w *storedMap) restore() (Map, error) {
	m := Map(w.mapFields)
	m.Namespaces = make([]Namespace, len(w.Namespaces))
	for i, sn := range w.Namespaces {
		ns := Namespace(sn.namespaceFields)
		ns.Slots = sn.Slots
		for region, k := range sn.SlotRefs {
			if k < 0 || k >= len(w.SlotTables) {
				return Map{}, fmt.Errorf("namespace %q: dedup_slot_refs of region %q names table %d of %d", ns.Name, region, k, len(w.SlotTables))
			}
			if ns.Slots == nil {
				ns.Slots = DedupSlotTables{}
			}
			ns.Slots[region] = slices.Clone(w.SlotTables[k])
		}
		m.Namespaces[i] = ns
	}
	return m, nil
}

// New validates m, fills defaults and builds its indexes. m is copied.
func New(m Map) (*Map, error) {
	out := &Map{
		Version:    m.Version,
		Regions:    slices.Clone(m.Regions),
		Retired:    slices.Sorted(slices.Values(m.Retired)),
		shards:     map[uint32]*Shard{},
		namespaces: map[string]*Namespace{},
		byRegion:   map[string][]uint32{},
	}
	if len(out.Regions) == 0 {
		return nil, errors.New("shard map: at least one region is required")
	}
	for _, r := range out.Regions {
		if !ValidName(r) {
			return nil, fmt.Errorf("shard map: region %q: names are 1-128 letters, digits, '_', '.', '-'", r)
		}
	}
	if err := out.addShards(m.Shards); err != nil {
		return nil, err
	}
	named := map[string]bool{}
	for _, ns := range m.Namespaces {
		if named[ns.Name] {
			return nil, fmt.Errorf("shard map: namespace %q listed twice", ns.Name)
		}
		named[ns.Name] = true
		if err := out.addNamespace(ns); err != nil {
			return nil, err
		}
	}
	sort.Slice(out.Namespaces, func(i, j int) bool { return out.Namespaces[i].Name < out.Namespaces[j].Name })
	for i := range out.Namespaces {
		out.namespaces[out.Namespaces[i].Name] = &out.Namespaces[i]
	}
	return out, nil
}

// addShards checks shards against the map's regions and retired IDs and
// adds them, copied, with their defaults, in ID order.
func (out *Map) addShards(shards []Shard) error {
	seen := map[uint32]bool{}
	for _, s := range shards {
		s.Replicas = slices.Clone(s.Replicas)
		s.ReplicaRegions = slices.Clone(s.ReplicaRegions)
		if len(s.ReplicaRegions) != 0 && len(s.ReplicaRegions) != len(s.Replicas) {
			return fmt.Errorf("shard map: shard %d: replica_regions must name one region per replica", s.ID)
		}
		if s.Database == "" {
			s.Database = "triage"
		}
		if seen[s.ID] {
			return fmt.Errorf("shard map: shard %d listed twice", s.ID)
		}
		seen[s.ID] = true
		if !slices.Contains(out.Regions, s.HomeRegion) {
			return fmt.Errorf("shard map: shard %d: home region %q is not in regions %v", s.ID, s.HomeRegion, out.Regions)
		}
		if s.Primary == "" {
			return fmt.Errorf("shard map: shard %d has no primary", s.ID)
		}
		if s.Weight > MaxWeight {
			return fmt.Errorf("shard map: shard %d: weight %d: allowed 1 to %d (0 reads as 1)", s.ID, s.Weight, MaxWeight)
		}
		if slices.Contains(out.Retired, s.ID) {
			return fmt.Errorf("shard map: shard %d is retired: shard IDs are never reused (item IDs name their shard); pick another ID", s.ID)
		}
		out.Shards = append(out.Shards, s)
	}
	sort.Slice(out.Shards, func(i, j int) bool { return out.Shards[i].ID < out.Shards[j].ID })
	for i := range out.Shards {
		s := &out.Shards[i]
		out.shards[s.ID] = s
		out.byRegion[s.HomeRegion] = append(out.byRegion[s.HomeRegion], s.ID)
	}
	return nil
}

// addNamespace checks a namespace against the map's regions and shards
// (added first) and adds it, with its slots and defaults.
func (out *Map) addNamespace(ns Namespace) error {
	if !ValidName(ns.Name) {
		return fmt.Errorf("shard map: namespace %q: names are 1-128 letters, digits, '_', '.', '-'", ns.Name)
	}
	shards := map[string][]uint32{}
	for region, ids := range ns.Shards {
		if !slices.Contains(out.Regions, region) {
			return fmt.Errorf("shard map: namespace %q: region %q is not in regions", ns.Name, region)
		}
		for _, id := range ids {
			s := out.shards[id]
			if s == nil {
				return fmt.Errorf("shard map: namespace %q: shard %d does not exist", ns.Name, id)
			}
			// A region's enqueue stream is drained only into the shards
			// homed there: a foreign shard here would take BUFFERED items
			// that no enqueuer ever inserts.
			if s.HomeRegion != region {
				return fmt.Errorf("shard map: namespace %q: region %q lists shard %d, whose home region is %q: list only shards homed in that region", ns.Name, region, id, s.HomeRegion)
			}
		}
		shards[region] = slices.Sorted(slices.Values(ids))
	}
	ns.Shards = shards
	if err := out.fillSlots(&ns); err != nil {
		return fmt.Errorf("shard map: %w", err)
	}
	ns.MaxPayloadBytes = cmpOr(ns.MaxPayloadBytes, DefaultMaxPayloadBytes)
	ns.DefaultLeaseDuration = cmpOr(ns.DefaultLeaseDuration, Duration(DefaultLeaseDuration))
	ns.MaxAttempts = cmpOr(ns.MaxAttempts, DefaultMaxAttempts)
	if ns.EnqueueRateLimit > 0 && ns.EnqueueBurst == 0 {
		ns.EnqueueBurst = max(1, int(ns.EnqueueRateLimit))
	}
	if err := ns.validate(); err != nil {
		return fmt.Errorf("shard map: %w", err)
	}
	out.Namespaces = append(out.Namespaces, ns)
	return nil
}

// fillSlots gives ns a dedup slot table in every region where it has
// shards and none yet, and checks that every table names only shards the
// namespace has in that region. Slot i takes the (i mod n)th of the
// region's n shards in ID order, so a new table spreads keys evenly.
func (m *Map) fillSlots(ns *Namespace) error {
	for _, region := range slices.Sorted(maps.Keys(ns.Slots)) {
		if !slices.Contains(m.Regions, region) {
			return fmt.Errorf("namespace %q: dedup_slots has a table for region %q, which is not in regions %v", ns.Name, region, m.Regions)
		}
	}
	tables := DedupSlotTables{}
	for _, region := range m.Regions {
		ids, ok := ns.Shards[region]
		if !ok {
			ids = m.byRegion[region]
		}
		table := ns.Slots[region]
		if len(table) == 0 {
			// A draining shard takes no new keys.
			ids := slices.DeleteFunc(slices.Clone(ids), func(id uint32) bool { return m.shards[id].Draining })
			if len(ids) == 0 {
				continue // no shards here yet: filled once it has some
			}
			table = make([]uint32, DedupSlots)
			for i := range table {
				table[i] = ids[i%len(ids)]
			}
			tables[region] = table
			continue
		}
		if len(table) != DedupSlots {
			return fmt.Errorf("namespace %q: dedup_slots of region %q has %d entries: it must have exactly %d, or be left out to be filled",
				ns.Name, region, len(table), DedupSlots)
		}
		for i, id := range table {
			if !slices.Contains(ids, id) {
				return fmt.Errorf("namespace %q: region %q: dedup slot %d names shard %d, which is not among the namespace's shards %v in that region: "+
					"that shard may still hold live items and dedup tombstones of the slot's keys, so it cannot leave the namespace's shards in region %q "+
					"(moving dedup slots is not supported yet); keep shard %d in region %q", ns.Name, region, i, id, ids, region, id, region)
			}
		}
		tables[region] = slices.Clone(table)
	}
	ns.Slots = nil
	if len(tables) > 0 {
		ns.Slots = tables
	}
	// A moved slot's old shard that is gone (retired) holds nothing more.
	from := DedupSlotTables{}
	for region, table := range ns.SlotsFrom {
		if _, ok := ns.Slots[region]; !ok || len(table) != DedupSlots {
			return fmt.Errorf("namespace %q: dedup_slots_from of region %q must have %d entries beside a dedup_slots table", ns.Name, region, DedupSlots)
		}
		out := make([]uint32, DedupSlots)
		moved := false
		for i, id := range table {
			if _, ok := m.shards[id]; ok && id != ns.Slots[region][i] {
				out[i], moved = id, true
			}
		}
		if moved {
			from[region] = out
		}
	}
	ns.SlotsFrom = nil
	if len(from) > 0 {
		ns.SlotsFrom = from
	}
	return nil
}

func cmpOr[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

// Marshal writes the map as JSON.
func (m *Map) Marshal() ([]byte, error) { return json.Marshal(m.stored()) }

// Shard returns the shard with id.
func (m *Map) Shard(id uint32) (Shard, bool) {
	s, ok := m.shards[id]
	if !ok {
		return Shard{}, false
	}
	return *s, true
}

// HasRegion reports whether region is one of the map's regions.
func (m *Map) HasRegion(region string) bool { return slices.Contains(m.Regions, region) }

// Namespace returns a namespace's config.
func (m *Map) Namespace(name string) (*Namespace, error) {
	ns, ok := m.namespaces[name]
	if !ok {
		return nil, fmt.Errorf("%w %q: create it in the shard map first", ErrUnknownNamespace, name)
	}
	return ns, nil
}

// ShardsFor returns the shards that serve namespace in region, in ID order.
func (m *Map) ShardsFor(namespace, region string) ([]uint32, error) {
	ns, err := m.Namespace(namespace)
	if err != nil {
		return nil, err
	}
	ids, ok := ns.Shards[region]
	if !ok {
		ids = m.byRegion[region]
	}
	if len(ids) == 0 {
		return nil, fmt.Errorf("%w for namespace %q in region %q", ErrNoShards, namespace, region)
	}
	return ids, nil
}

// WithShard returns the next version of m with shard s replaced.
func (m *Map) WithShard(s Shard) (*Map, error) {
	next := Map{Version: m.Version + 1, Regions: m.Regions, Namespaces: m.Namespaces, Retired: m.Retired}
	for _, old := range m.Shards {
		if old.ID == s.ID {
			old = s
		}
		next.Shards = append(next.Shards, old)
	}
	return New(next)
}

// ReplicaRegion returns the region of a shard's replica at addr, or "".
func (s Shard) ReplicaRegion(addr string) string {
	for i, r := range s.Replicas {
		if r == addr && i < len(s.ReplicaRegions) {
			return s.ReplicaRegions[i]
		}
	}
	return ""
}

// WithNamespace returns the next version of m with ns added or replaced.
func (m *Map) WithNamespace(ns Namespace) (*Map, error) {
	next := Map{Version: m.Version + 1, Regions: m.Regions, Shards: m.Shards, Retired: m.Retired}
	for _, old := range m.Namespaces {
		if old.Name != ns.Name {
			next.Namespaces = append(next.Namespaces, old)
		}
	}
	next.Namespaces = append(next.Namespaces, ns)
	return New(next)
}

// RegionShards returns the shards whose home is region.
func (m *Map) RegionShards(region string) []uint32 { return m.byRegion[region] }

// ServedIn returns the shards whose primary runs in region
// (Shard.PrimaryRegion, or the home region when unset). Dequeuers own, and
// enqueuers drain the buffers of, the shards served in their region: every
// statement they run is then a round trip within it, not across the WAN.
func (m *Map) ServedIn(region string) []uint32 {
	var out []uint32
	for _, s := range m.Shards {
		if cmp.Or(s.PrimaryRegion, s.HomeRegion) == region {
			out = append(out, s.ID)
		}
	}
	return out
}
