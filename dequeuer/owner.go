package dequeuer

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/triage-queue/triage/proto/triage/peer"
	"github.com/triage-queue/triage/schema"
	"github.com/triage-queue/triage/shardmap"
)

// DefaultOwnerTTL is the ownership TTL when none is configured.
const DefaultOwnerTTL = 10 * time.Second

// OpenOwners creates or opens the ownership bucket, with keys expiring
// after ttl (DefaultOwnerTTL when ttl is 0). Every process of a deployment
// opens it and the last one sets its TTL, so they must agree; a TTL of 0
// would make the bucket keep keys forever, and a killed dequeuer's claims
// would then never expire. replicas copies survive the loss of a region in
// a cluster.
func OpenOwners(ctx context.Context, js jetstream.JetStream, ttl time.Duration, replicas int) (jetstream.KeyValue, error) {
	if ttl <= 0 {
		ttl = DefaultOwnerTTL
	}
	kv, err := peer.EnsureKeyValue(ctx, js, jetstream.KeyValueConfig{
		Bucket:   peer.OwnersBucket,
		TTL:      ttl,
		Storage:  jetstream.MemoryStorage,
		Replicas: max(replicas, 1),
	})
	if err != nil {
		return nil, fmt.Errorf("open kv bucket %s: %w", peer.OwnersBucket, err)
	}
	return kv, nil
}

// Present reports whether region has live processes of role.
func Present(ctx context.Context, kv jetstream.KeyValue, role, region string) bool {
	_, err := kv.Get(ctx, peer.PresenceKey(role, region))
	return err == nil
}

// ownership claims and keeps this dequeuer's shards: those whose primary
// runs in its region (Map.ServedIn), and, when a region has no dequeuer left
// (region down), that region's shards after they stayed unowned for a TTL,
// handed back when the region's dequeuers return.
//
// A shard is served from its primary's region, not its home region: every
// prefetch, serve and refresh is a round trip to the primary plus a
// semi-sync acknowledgement, so after a failover moved the primary, a
// home-region owner would work it across the WAN for as long as it stayed
// there, every dequeue call paying WAN round trips. The old owner hands the shard over when it sees the map
// (claim runs on every map change), the new one claims it at once. One owner per shard
// keeps dequeuers from fighting over the same rows (correctness does not
// depend on it: every serve is a compare-and-set), so its reads need no
// row locks.
type ownership struct {
	s  *Service
	kv jetstream.KeyValue
	// view is the watched ownership bucket (nil: none, every claim asks
	// the bucket).
	view *Owners

	mu     sync.Mutex
	revs   map[uint32]uint64    // owned shard -> KV revision of our claim
	sureAt map[uint32]time.Time // last successful claim or refresh
	// heldAway: shards whose primary runs in this region but whose claim
	// a dequeuer of another region still holds, since when (see takeOver).
	heldAway map[uint32]time.Time
	// current: shards of other regions whose schema was found current
	// (see migrated); a schema never goes back.
	current  map[uint32]bool
	checking map[uint32]bool
}

func newOwnership(s *Service, kv jetstream.KeyValue) *ownership {
	return &ownership{s: s, kv: kv, revs: map[uint32]uint64{}, sureAt: map[uint32]time.Time{}, heldAway: map[uint32]time.Time{},
		current: map[uint32]bool{}, checking: map[uint32]bool{}}
}

// migrated reports whether an unowned shard of another region has every
// migration this binary knows, so that adopting it is of use. A region's
// node migrates its own shards as it starts; when regions start together,
// a dequeuer that adopted another region's shard before that would sweep
// and read tables that do not exist yet, and its dequeues there would
// fail.
//
// The check runs in the background (one at a time per shard) and this
// reports what it last found, so a claim never waits on it: a shard is
// adopted only when its home region has no dequeuer left, typically a
// region that is down, whose primary may not answer for seconds, while
// the same claim refreshes this dequeuer's own shards. A shard is adopted
// at the claim after the check found it current. A Service without a
// Pool (ownership tests) has no schema to check.
func (o *ownership) migrated(ctx context.Context, shard uint32) bool {
	if o.s.cfg.Pool == nil {
		return true
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.current[shard] || o.checking[shard] {
		return o.current[shard]
	}
	o.checking[shard] = true
	o.s.wg.Go(func() {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		n, err := o.pending(ctx, shard)
		o.mu.Lock()
		defer o.mu.Unlock()
		delete(o.checking, shard)
		if err == nil && n == 0 {
			o.current[shard] = true
			return
		}
		o.s.log.Debug("not adopting a shard whose schema is not current yet", "shard", shard, "pending", n, "err", err)
	})
	return false
}

// pending is schema.Pending on shard's primary.
func (o *ownership) pending(ctx context.Context, shard uint32) (int, error) {
	db, _, err := o.s.cfg.Pool.Primary(o.s.cfg.Maps.Current(), shard)
	if err != nil {
		return 0, err
	}
	return schema.Pending(ctx, db.DB)
}

// handOverGrace is how long a dequeuer of another region may keep the
// claim of a shard whose primary now runs in this region before this
// region's dequeuer takes it over. A live owner that sees the new map
// hands over within a few hundred milliseconds; one that does not is cut
// off from the control plane (a partition), and waiting for its claim to
// expire (OwnerTTL after its last refresh) would keep the shard's
// dequeues down for seconds after its new primary was published. Taking it over is safe
// because correctness never rests on ownership (see the package doc): a
// cut-off owner's writes go to the old primary, which can complete no
// commit, and its claim refresh fails once it can reach NATS again.
const handOverGrace = time.Second

// takeOver takes the claim of shard from a dequeuer of another region that
// has held it for handOverGrace since this one first found it there. It
// reads the claim and replaces it with a compare-and-set on that revision,
// so a hand-over or another taker in between wins instead. It reports
// whether a dequeuer of another region still holds the shard, to be tried
// again soon; a holder of this region is where the shard belongs.
func (o *ownership) takeOver(ctx context.Context, shard uint32) (heldAway bool) {
	e, err := o.kv.Get(ctx, peer.OwnerKey(shard))
	if err != nil {
		return true // gone meanwhile: the next claim creates it
	}
	holder := string(e.Value())
	now := time.Now()
	o.mu.Lock()
	since, seen := o.heldAway[shard]
	if !seen {
		o.heldAway[shard] = now
	}
	o.mu.Unlock()
	if strings.HasPrefix(holder, o.s.cfg.Region+"-") {
		// A dequeuer of this region (IDs start with the region, see
		// Config.ID) serves it: that is where the shard belongs.
		o.mu.Lock()
		delete(o.heldAway, shard)
		o.mu.Unlock()
		return false
	}
	if !seen || now.Sub(since) < handOverGrace {
		return true
	}
	rev, err := o.kv.Update(ctx, peer.OwnerKey(shard), []byte(o.s.cfg.ID), e.Revision())
	if err != nil {
		return true
	}
	o.s.log.Warn("took over a shard whose primary runs here from a dequeuer of another region that did not hand it over (cut off?)",
		"shard", shard, "from", holder, "held_for", now.Sub(since).Round(time.Millisecond))
	o.mu.Lock()
	o.revs[shard], o.sureAt[shard] = rev, time.Now()
	delete(o.heldAway, shard)
	o.mu.Unlock()
	return false
}

// owns reports whether this dequeuer holds shard and has refreshed the
// claim recently enough that no other owner can have taken it.
func (o *ownership) owns(shard uint32) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	_, ok := o.revs[shard]
	return ok && time.Since(o.sureAt[shard]) < o.s.cfg.OwnerTTL*3/4
}

func (o *ownership) owned() []uint32 {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := make([]uint32, 0, len(o.revs))
	for id := range o.revs {
		out = append(out, id)
	}
	return out
}

// claim refreshes owned shards and tries to take unowned shards of the
// region. It runs every OwnerTTL/4 and on every map change. It reports
// whether a shard it wants is still held by a dequeuer of another region
// (one handing it over), so that the caller tries again soon.
//
// A shard whose claim a live dequeuer of this region holds, as the watched
// view says (Owners.Live), costs no KV request: at a thousand shards, a
// Create and a Get per shard and round from every dequeuer that owns none
// were most of an idle region's JetStream traffic. The claims run
// claimParallel at a time, so a round's length does not grow with the
// shards one KV round trip each.
func (o *ownership) claim(ctx context.Context) (pending bool) {
	m := o.s.cfg.Maps.Current()
	presentIn := o.announce(ctx, m)
	home := m.ServedIn(o.s.cfg.Region)
	isHome := make(map[uint32]bool, len(home))
	for _, id := range home {
		isHome[id] = true
	}
	want := append(slices.Clone(home), o.othersWanted(ctx, m, presentIn)...)
	var mu sync.Mutex
	var away []uint32
	var wg sync.WaitGroup
	sem := make(chan struct{}, claimParallel)
	for _, id := range want {
		if o.heldHere(id) {
			continue
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if o.claimOne(ctx, id, isHome[id]) {
				mu.Lock()
				away = append(away, id)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	for _, id := range away {
		if o.takeOver(ctx, id) {
			pending = true
		}
	}
	return pending
}

// claimParallel is how many claims of one round are in flight at once.
const claimParallel = 64

// heldHere reports whether shard is not this dequeuer's and the view has a
// live claim of it by another dequeuer of this region: the shard is where
// it belongs, and a Create would only fail.
func (o *ownership) heldHere(shard uint32) bool {
	if o.view == nil {
		return false
	}
	o.mu.Lock()
	_, mine := o.revs[shard]
	o.mu.Unlock()
	holder, live := o.view.Live(shard, o.s.cfg.OwnerTTL)
	return !mine && live && holder != o.s.cfg.ID && strings.HasPrefix(holder, o.s.cfg.Region+"-")
}

// announce announces this region's dequeuers, so adopters of its shards
// hand them back, and reads which other regions have dequeuers, all at
// once: one after the other they would be four KV round trips (across the
// WAN) before a shard whose primary moved away is handed over, on the
// failover's critical path for dequeues.
func (o *ownership) announce(ctx context.Context, m *shardmap.Map) map[string]bool {
	presentIn := map[string]bool{}
	var wg sync.WaitGroup
	var mu sync.Mutex
	wg.Go(func() { _, _ = o.kv.Put(ctx, peer.PresenceKey("dequeuers", o.s.cfg.Region), []byte(o.s.cfg.ID)) })
	for _, region := range m.Regions {
		if region != o.s.cfg.Region {
			wg.Go(func() {
				p := Present(ctx, o.kv, "dequeuers", region)
				mu.Lock()
				presentIn[region] = p
				mu.Unlock()
			})
		}
	}
	wg.Wait()
	return presentIn
}

// othersWanted goes through the shards served in other regions: it hands
// over those it owns whose region has dequeuers (presentIn), and returns
// those it keeps or adopts.
func (o *ownership) othersWanted(ctx context.Context, m *shardmap.Map, presentIn map[string]bool) []uint32 {
	var want []uint32
	for _, region := range m.Regions {
		if region == o.s.cfg.Region {
			continue
		}
		present := presentIn[region]
		for _, id := range m.ServedIn(region) {
			o.mu.Lock()
			_, mine := o.revs[id]
			o.mu.Unlock()
			switch {
			case mine && present:
				// The region of its primary has dequeuers (again, or the
				// primary moved there): hand the shard over.
				o.handOver(ctx, id, region)
			case mine:
				want = append(want, id)
			case !present:
				// Adopt a shard whose home region has no dequeuer left
				// (its presence key expired: none refreshed it for a
				// TTL) once its owner's claim expired too.
				if _, err := o.kv.Get(ctx, peer.OwnerKey(id)); errors.Is(err, jetstream.ErrKeyNotFound) && o.migrated(ctx, id) {
					want = append(want, id)
				}
			}
		}
	}
	return want
}

// handOver gives up an owned shard to the dequeuers of region.
func (o *ownership) handOver(ctx context.Context, id uint32, region string) {
	o.s.log.Info("handing shard over to the region of its primary", "shard", id, "region", region)
	o.mu.Lock()
	rev := o.revs[id]
	delete(o.revs, id)
	o.mu.Unlock()
	// The claim goes first, so the new owner can claim at once;
	// dropping the buffered rows writes nothing (they were never
	// hidden), and any copy this owner still serves fails the serve's
	// compare-and-set once the new owner served the row.
	_ = o.kv.Delete(ctx, peer.OwnerKey(id), jetstream.LastRevision(rev))
	o.s.dropShard(ctx, id)
}

// claimOne refreshes the claim of a shard this dequeuer owns, or claims
// one it does not. It reports whether the shard is home (its primary runs
// in this region) and still held by a dequeuer of another region, to be
// taken over (takeOver). A refresh that finds the claim held by another
// dequeuer drops the shard.
func (o *ownership) claimOne(ctx context.Context, id uint32, home bool) (heldAway bool) {
	o.mu.Lock()
	rev, mine := o.revs[id]
	o.mu.Unlock()
	var err error
	if mine {
		rev, err = o.kv.Update(ctx, peer.OwnerKey(id), []byte(o.s.cfg.ID), rev)
		if err != nil && isLost(err) {
			rev, err = o.reclaim(ctx, id, err)
		}
	} else {
		rev, err = o.kv.Create(ctx, peer.OwnerKey(id), []byte(o.s.cfg.ID))
	}
	o.mu.Lock()
	switch {
	case err == nil:
		if !mine {
			o.s.log.Info("took shard ownership", "shard", id, "adopted", !home)
		}
		o.revs[id] = rev
		o.sureAt[id] = time.Now()
		delete(o.heldAway, id)
	case !mine && errors.Is(err, jetstream.ErrKeyExists) && home:
		heldAway = true
	case mine && !errors.Is(err, context.Canceled) && isLost(err):
		o.s.log.Warn("lost shard ownership", "shard", id, "err", err)
		delete(o.revs, id)
		o.mu.Unlock()
		o.s.dropShard(ctx, id)
		return false
	}
	o.mu.Unlock()
	return heldAway
}

// reclaim looks again at a claim whose refresh failed as lost (err). The
// claim may still be this dequeuer's: a refresh that timed out after the
// bucket stored it leaves the next one a revision behind. Or it expired
// (a round late under load) and nobody claimed it since: claiming it
// again keeps the shard where it was instead of moving it, and its
// buffer, for nothing. Only a claim another dequeuer holds is lost.
func (o *ownership) reclaim(ctx context.Context, id uint32, err error) (uint64, error) {
	e, gerr := o.kv.Get(ctx, peer.OwnerKey(id))
	switch {
	case gerr == nil && string(e.Value()) == o.s.cfg.ID:
		return e.Revision(), nil
	case errors.Is(gerr, jetstream.ErrKeyNotFound):
		rev, cerr := o.kv.Create(ctx, peer.OwnerKey(id), []byte(o.s.cfg.ID))
		if cerr == nil {
			o.s.log.Warn("shard claim had expired before its refresh; claimed again", "shard", id)
			return rev, nil
		}
	}
	return 0, err
}

// isLost tells a claim another owner holds from a NATS outage, during which
// we keep the claim until it is too old to trust (see owns).
func isLost(err error) bool {
	return errors.Is(err, jetstream.ErrKeyExists) || strings.Contains(err.Error(), "wrong last sequence") ||
		errors.Is(err, jetstream.ErrKeyNotFound)
}

// forget drops our claims without touching the bucket (a crash).
func (o *ownership) forget() {
	o.mu.Lock()
	defer o.mu.Unlock()
	clear(o.revs)
}

// resign deletes our claims so the next owner need not wait for the TTL.
func (o *ownership) resign(ctx context.Context) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for id, rev := range o.revs {
		_ = o.kv.Delete(ctx, peer.OwnerKey(id), jetstream.LastRevision(rev))
		delete(o.revs, id)
	}
}

// Owners is a router's view of the ownership bucket: which dequeuer serves
// which shard.
type Owners struct {
	kv  jetstream.KeyValue
	mu  sync.RWMutex
	by  map[uint32]string
	rev map[uint32]uint64 // KV revision of what by says, so nothing older overwrites it
	// seen is when the view last heard a put of each shard's claim. A
	// claim that expires by the bucket's TTL is announced to no watcher,
	// so a live claim is one refreshed within the TTL (see Live).
	seen map[uint32]time.Time
	// reloaded paces Reload per shard (reloadEvery): routers call it on
	// every request that finds no answering owner, hundreds a second
	// during an outage.
	reloaded map[uint32]time.Time
	// changed is closed, and replaced, whenever the view changes; made
	// on first use.
	changed chan struct{}
}

// reloadEvery is the least time between two bucket reads of one shard's
// owner by Reload.
const reloadEvery = 100 * time.Millisecond

// WatchOwners follows the ownership bucket until ctx ends.
func WatchOwners(ctx context.Context, kv jetstream.KeyValue) (*Owners, error) {
	o := &Owners{kv: kv, by: map[uint32]string{}, rev: map[uint32]uint64{}, seen: map[uint32]time.Time{}, reloaded: map[uint32]time.Time{}}
	w, err := kv.WatchAll(ctx)
	if err != nil {
		return nil, fmt.Errorf("watch %s: %w", peer.OwnersBucket, err)
	}
	ready := make(chan struct{})
	go func() {
		defer w.Stop()
		once := sync.OnceFunc(func() { close(ready) })
		for e := range w.Updates() {
			if e == nil {
				once()
				continue
			}
			id, ok := peer.OwnerShard(e.Key())
			if !ok {
				continue
			}
			o.set(id, e.Revision(), string(e.Value()), e.Operation() == jetstream.KeyValuePut)
		}
		once()
	}()
	select {
	case <-ready:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return o, nil
}

// set records shard's owner (none when !put) as of revision rev, unless
// the view already holds a later revision.
func (o *Owners) set(shard uint32, rev uint64, owner string, put bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if rev != 0 && rev <= o.rev[shard] {
		return
	}
	if rev != 0 {
		o.rev[shard] = rev
	}
	was, had := o.by[shard]
	if put {
		o.by[shard] = owner
		o.seen[shard] = time.Now()
	} else {
		delete(o.by, shard)
		delete(o.seen, shard)
	}
	if had != put || was != owner {
		if o.changed != nil {
			close(o.changed)
		}
		o.changed = make(chan struct{})
	}
}

// Changed returns a channel closed at the view's next change: a router
// waiting for a shard's new owner (a hand-over) wakes on it.
func (o *Owners) Changed() <-chan struct{} {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.changed == nil {
		o.changed = make(chan struct{})
	}
	return o.changed
}

// Reload reads the owners of shards from the bucket itself. A router calls
// it when the owner its view names does not answer (no responders): the
// claim of a dequeuer that died expires by the bucket's TTL, which no
// watcher is told of, and a watch whose stream lost its leader with a
// region sees nothing until the stream elects another and the watch
// recovers, seconds after the new owner claimed.
func (o *Owners) Reload(ctx context.Context, shards []uint32) {
	for _, id := range shards {
		o.mu.Lock()
		if time.Since(o.reloaded[id]) < reloadEvery {
			o.mu.Unlock()
			continue
		}
		o.reloaded[id] = time.Now()
		o.mu.Unlock()
		e, err := o.kv.Get(ctx, peer.OwnerKey(id))
		switch {
		case err == nil:
			o.set(id, e.Revision(), string(e.Value()), true)
		case errors.Is(err, jetstream.ErrKeyNotFound):
			o.set(id, 0, "", false)
		}
	}
}

// Live returns shard's owner when the view heard its claim put within
// ttl, the bucket's TTL: a claim older than that has expired, announced
// or not.
func (o *Owners) Live(shard uint32, ttl time.Duration) (string, bool) {
	o.mu.RLock()
	defer o.mu.RUnlock()
	id, ok := o.by[shard]
	return id, ok && time.Since(o.seen[shard]) < ttl
}

// Owner returns the dequeuer that owns shard.
func (o *Owners) Owner(shard uint32) (string, bool) {
	o.mu.RLock()
	defer o.mu.RUnlock()
	id, ok := o.by[shard]
	return id, ok
}
