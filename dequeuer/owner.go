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
// a cluster. The bucket is in memory, and its writes make it again after a
// restart of NATS lost it (peer.KeepKeyValue).
func OpenOwners(ctx context.Context, js jetstream.JetStream, ttl time.Duration, replicas int) (jetstream.KeyValue, error) {
	if ttl <= 0 {
		ttl = DefaultOwnerTTL
	}
	kv, err := peer.KeepKeyValue(ctx, js, jetstream.KeyValueConfig{
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

// OpenClaims creates or opens the claims bucket (peer.ClaimsBucket). Its
// keys do not expire: a claim stands while its holder's session does
// (ownership.keepSession), so a dequeuer writes one key per refresh, not
// one per shard it owns. Like the ownership bucket, it is in memory and
// made again by its writes.
func OpenClaims(ctx context.Context, js jetstream.JetStream, replicas int) (jetstream.KeyValue, error) {
	kv, err := peer.KeepKeyValue(ctx, js, jetstream.KeyValueConfig{
		Bucket:   peer.ClaimsBucket,
		Storage:  jetstream.MemoryStorage,
		Replicas: max(replicas, 1),
	})
	if err != nil {
		return nil, fmt.Errorf("open kv bucket %s: %w", peer.ClaimsBucket, err)
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
// A claim is a key per shard in the claims bucket that never expires; it
// stands while its holder's session, one key per dequeuer in the TTL'd
// ownership bucket, is refreshed. A refresh is one write however many
// shards the dequeuer owns: a key per shard refreshed every OwnerTTL/4 was
// 800 writes a second at 1,000 shards, and under load a round of them
// outlasted the TTL and claims expired. A claim whose holder's session
// has expired is taken by a compare-and-set on its revision.
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
	kv jetstream.KeyValue // sessions and presence (peer.OwnersBucket)
	// claims is the claims bucket (peer.ClaimsBucket).
	claims jetstream.KeyValue
	// view is the watched claims and sessions (nil: none, every claim asks
	// the buckets).
	view *Owners

	mu sync.Mutex
	// sessionRev is the revision of this dequeuer's session key (0: none
	// yet) and sessionSure when the refresh that stored it was sent; gen
	// counts the sessions made: a session that expired is made anew, and
	// a claim counts only once confirmed in the current one (see owns).
	sessionRev  uint64
	sessionSure time.Time
	gen         uint64
	revs        map[uint32]uint64 // owned shard -> claims revision
	confirmed   map[uint32]uint64 // owned shard -> gen its claim was last confirmed in
	// heldAway: shards whose primary runs in this region but whose claim
	// a dequeuer of another region still holds, since when (see takeOver).
	heldAway map[uint32]time.Time
	// current: shards of other regions whose schema was found current
	// (see migrated); a schema never goes back.
	current  map[uint32]bool
	checking map[uint32]bool
	// hungrySince is when this dequeuer found itself under its quota
	// while a peer was over its own (see balance); zero otherwise.
	hungrySince time.Time
}

func newOwnership(s *Service, kv, claims jetstream.KeyValue) *ownership {
	return &ownership{s: s, kv: kv, claims: claims, revs: map[uint32]uint64{}, confirmed: map[uint32]uint64{},
		heldAway: map[uint32]time.Time{}, current: map[uint32]bool{}, checking: map[uint32]bool{}}
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
	e, err := o.claims.Get(ctx, peer.OwnerKey(shard))
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
	gen := o.gen
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
	rev, err := o.claims.Update(ctx, peer.OwnerKey(shard), []byte(o.s.cfg.ID), e.Revision())
	if err != nil {
		return true
	}
	o.s.log.Warn("took over a shard whose primary runs here from a dequeuer of another region that did not hand it over (cut off?)",
		"shard", shard, "from", holder, "held_for", now.Sub(since).Round(time.Millisecond))
	o.mu.Lock()
	o.revs[shard], o.confirmed[shard] = rev, gen
	delete(o.heldAway, shard)
	o.mu.Unlock()
	return false
}

// owns reports whether this dequeuer holds shard, confirmed in its current
// session, and has refreshed the session recently enough that it cannot
// have expired: only then can no other dequeuer have taken the claim.
func (o *ownership) owns(shard uint32) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	_, ok := o.revs[shard]
	return ok && o.confirmed[shard] == o.gen && o.sessionSureLocked()
}

// sessionSureLocked reports whether a refresh sent within 3/4 of the TTL
// stored the session: the bucket keeps it a TTL from when it stored it,
// so it cannot have expired, and no other dequeuer can have taken a claim
// from it. Callers hold o.mu.
func (o *ownership) sessionSureLocked() bool {
	return o.gen > 0 && time.Since(o.sessionSure) < o.s.cfg.OwnerTTL*3/4
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

// keepSession refreshes this dequeuer's session with a compare-and-set on
// its revision. One that fails as lost expired (or a refresh whose answer
// was lost stored it): the session is made again under a new generation,
// and every claim is confirmed again before it counts (claimOne), since a
// dequeuer that found the session expired may have taken it. A refresh
// that fails otherwise (NATS unreachable) changes nothing: the session
// stops being sure after 3/4 of the TTL and owns with it.
func (o *ownership) keepSession(ctx context.Context) {
	o.mu.Lock()
	rev, owned := o.sessionRev, len(o.revs)
	o.mu.Unlock()
	key, value := peer.SessionKey(o.s.cfg.ID), []byte(o.s.cfg.Region)
	sent := time.Now()
	var err error
	fresh := rev == 0
	if !fresh {
		if rev, err = o.kv.Update(ctx, key, value, rev); err != nil && isLost(err) {
			fresh = true
		}
	}
	if fresh {
		rev, err = o.kv.Put(ctx, key, value)
	}
	if err != nil {
		o.s.log.Warn("dequeuer session not refreshed; its shards are not served once it is 3/4 of the owner TTL old", "err", err)
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.sessionRev, o.sessionSure = rev, sent
	if fresh {
		o.gen++
		if owned > 0 {
			o.s.log.Warn("dequeuer session had expired; confirming its claims before serving", "shards", owned)
		}
	}
}

// claim refreshes the session, confirms claims that need it, and tries to
// take unowned shards of the region. It runs every OwnerTTL/4 and on every
// map change. It reports whether a shard it wants is still held by a
// dequeuer of another region (one handing it over), so that the caller
// tries again soon.
//
// A shard this dequeuer holds, confirmed in its session, costs no KV
// request unless the view shows another claim of it; nor does one whose
// claim a live dequeuer of this region holds, as the view says
// (Owners.Live). The claims run claimParallel at a time, so a round's
// length does not grow with the shards one KV round trip each.
func (o *ownership) claim(ctx context.Context) (pending bool) {
	o.keepSession(ctx)
	o.mu.Lock()
	sure := o.sessionSureLocked()
	o.mu.Unlock()
	if !sure {
		return false // a claim needs a live session to stand on
	}
	m := o.s.cfg.Maps.Current()
	sessions := &sessionCache{kv: o.kv, alive: map[string]bool{}}
	presentIn := o.announce(ctx, m)
	o.dropRetired(ctx, m)
	home, hungry := o.balance(ctx, m.ServedIn(o.s.cfg.Region))
	isHome := make(map[uint32]bool, len(home))
	for _, id := range home {
		isHome[id] = true
	}
	want := append(home, o.othersWanted(ctx, m, presentIn, sessions)...)
	var mu sync.Mutex
	var away []uint32
	var wg sync.WaitGroup
	sem := make(chan struct{}, claimParallel)
	for _, id := range want {
		if o.settled(id) || o.heldHere(id) {
			continue
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if o.claimOne(ctx, id, isHome[id], sessions) {
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
	return pending || hungry
}

// balance splits the shards served in this region (home) among the
// region's live dequeuers, as the view shows them: each holds at most its
// quota, ceil(len(home)/dequeuers). A dequeuer over its quota releases the
// excess; one under it claims unowned shards, the block of home its rank
// among the dequeuers names first, so dequeuers that start together end
// with contiguous blocks (a namespace's shards on one dequeuer, its
// dequeues asking one owner), and one that joins takes what the others
// release, no more shards moving than the new quotas ask. It returns the
// home shards to claim or confirm this round, and hungry when this
// dequeuer is under its quota while a peer is over it: the peer releases
// at its next round, and the caller's next round comes soon (claimRetry)
// to take what it released, for at most an owner TTL.
//
// Without a view (ownership tests) a dequeuer claims every home shard.
func (o *ownership) balance(ctx context.Context, home []uint32) (want []uint32, hungry bool) {
	if o.view == nil {
		return home, false
	}
	home = slices.Sorted(slices.Values(home))
	ttl := o.s.cfg.OwnerTTL
	peers := o.view.LiveIn(o.s.cfg.Region, ttl)
	rank, found := slices.BinarySearch(peers, o.s.cfg.ID)
	if !found {
		peers = slices.Insert(peers, rank, o.s.cfg.ID)
	}
	n, k := len(home), len(peers)
	quota := (n + k - 1) / k
	lo, hi := rank*n/k, (rank+1)*n/k
	preferred := func(i int) bool { return i >= lo && i < hi }

	var mine []int // indexes into home
	others := map[string]int{}
	o.mu.Lock()
	for i, id := range home {
		if _, ok := o.revs[id]; ok {
			mine = append(mine, i)
		}
	}
	o.mu.Unlock()
	for _, id := range home {
		if holder, live := o.view.Live(id, ttl); live && holder != o.s.cfg.ID && strings.HasPrefix(holder, o.s.cfg.Region+"-") {
			others[holder]++
		}
	}
	if excess := len(mine) - quota; excess > 0 {
		// Shards out of this dequeuer's block go first, the last first.
		slices.SortFunc(mine, func(a, b int) int {
			if pa, pb := preferred(a), preferred(b); pa != pb {
				if pa {
					return 1
				}
				return -1
			}
			return b - a
		})
		o.shed(ctx, home, mine[:excess])
		o.s.log.Info("released shards to balance the region's dequeuers", "released", excess, "kept", quota, "dequeuers", k)
		mine = mine[excess:]
	}
	chosen := make(map[int]bool, len(mine))
	for _, i := range mine {
		want = append(want, home[i])
		chosen[i] = true
	}
	budget := quota - len(mine)
	for _, block := range []bool{true, false} {
		for i, id := range home {
			if budget > 0 && preferred(i) == block && !chosen[i] && !o.heldHere(id) {
				want = append(want, id)
				chosen[i] = true
				budget--
			}
		}
	}
	for i, id := range home {
		if holder, ok := o.view.Owner(id); ok && holder == o.s.cfg.ID && !chosen[i] {
			o.releaseStray(ctx, id)
		}
	}
	over := false
	for _, c := range others {
		over = over || c > quota
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	switch {
	case budget <= 0 || !over:
		o.hungrySince = time.Time{}
	case o.hungrySince.IsZero():
		o.hungrySince = time.Now()
	}
	return want, !o.hungrySince.IsZero() && time.Since(o.hungrySince) < ttl
}

// claimParallel is how many claims of one round are in flight at once.
const claimParallel = 64

// settled reports whether shard is this dequeuer's, confirmed in the
// current session, and the view shows no other dequeuer's claim of it (a
// dequeuer of another region took it over, see takeOver) nor a deletion
// after it: nothing to write. A view that lags behind this dequeuer's own
// claim costs a confirmation, never a shard.
func (o *ownership) settled(shard uint32) bool {
	o.mu.Lock()
	rev, mine := o.revs[shard]
	ok := mine && o.confirmed[shard] == o.gen
	o.mu.Unlock()
	if !ok || o.view == nil {
		return ok
	}
	holder, at, claimed := o.view.claim(shard)
	if !claimed {
		// Not yet seen (the view lags behind this claim), or deleted
		// after it.
		return at <= rev
	}
	return holder == o.s.cfg.ID
}

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

// dropRetired gives up owned shards the map no longer has.
func (o *ownership) dropRetired(ctx context.Context, m *shardmap.Map) {
	for _, id := range o.owned() {
		if _, ok := m.Shard(id); !ok {
			o.release(ctx, id)
			o.s.dropShard(ctx, id)
		}
	}
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
func (o *ownership) othersWanted(ctx context.Context, m *shardmap.Map, presentIn map[string]bool, sessions *sessionCache) []uint32 {
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
				o.s.log.Info("handing shard over to the region of its primary", "shard", id, "region", region)
				o.release(ctx, id)
				o.s.dropShard(ctx, id)
			case mine:
				want = append(want, id)
			case !present:
				// Adopt a shard whose home region has no dequeuer left
				// (its presence key expired: none refreshed it for a
				// TTL) once its owner's session expired too.
				if o.claimable(ctx, id, sessions) && o.migrated(ctx, id) {
					want = append(want, id)
				}
			}
		}
	}
	return want
}

// claimable reports whether shard's claim is missing, this dequeuer's, or
// held by a dequeuer whose session has expired.
func (o *ownership) claimable(ctx context.Context, shard uint32, sessions *sessionCache) bool {
	e, err := o.claims.Get(ctx, peer.OwnerKey(shard))
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return true
	case err != nil:
		return false
	}
	holder := string(e.Value())
	return holder == o.s.cfg.ID || !sessions.live(ctx, holder)
}

// release gives up an owned shard: its claim goes first, so the next
// owner can claim at once; dropping the buffered rows (the caller's)
// writes nothing (they were never hidden), and any copy this owner still
// serves fails the serve's compare-and-set once the new owner served the
// row.
func (o *ownership) release(ctx context.Context, id uint32) {
	o.mu.Lock()
	rev := o.revs[id]
	delete(o.revs, id)
	delete(o.confirmed, id)
	o.mu.Unlock()
	_ = o.claims.Delete(ctx, peer.OwnerKey(id), jetstream.LastRevision(rev))
}

// shed releases the shards home[i] for each i of which, claimParallel at
// a time: a dequeuer that gives half of a thousand shards to one that
// joined would otherwise wait 500 KV round trips, across the WAN when
// the bucket's leader is in another region.
func (o *ownership) shed(ctx context.Context, home []uint32, which []int) {
	var wg sync.WaitGroup
	sem := make(chan struct{}, claimParallel)
	for _, i := range which {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			o.release(ctx, home[i])
		})
	}
	wg.Wait()
	for _, i := range which {
		o.s.dropShard(ctx, home[i])
	}
}

// releaseStray deletes a claim in this dequeuer's name that it does not
// hold: a release whose delete failed (NATS unreachable), or a claim of an
// earlier process with its ID. Left standing, it would keep the shard
// from every other dequeuer of the region while nobody served it.
func (o *ownership) releaseStray(ctx context.Context, id uint32) {
	e, err := o.claims.Get(ctx, peer.OwnerKey(id))
	if err != nil || string(e.Value()) != o.s.cfg.ID {
		return
	}
	o.mu.Lock()
	_, mine := o.revs[id]
	o.mu.Unlock()
	if !mine {
		_ = o.claims.Delete(ctx, peer.OwnerKey(id), jetstream.LastRevision(e.Revision()))
	}
}

// claimOne confirms the claim of a shard this dequeuer owns, or claims one
// it does not: a missing claim is created, one whose holder's session
// expired is taken by a compare-and-set. It reports whether the shard is
// home (its primary runs in this region) and held by a live dequeuer of
// another region, to be taken over (takeOver). A confirmation that finds
// the claim held by another dequeuer drops the shard.
func (o *ownership) claimOne(ctx context.Context, id uint32, home bool, sessions *sessionCache) (heldAway bool) {
	o.mu.Lock()
	rev, mine := o.revs[id]
	gen := o.gen
	o.mu.Unlock()
	var err error
	if mine {
		rev, err = o.claims.Update(ctx, peer.OwnerKey(id), []byte(o.s.cfg.ID), rev)
		if err != nil && isLost(err) {
			rev, err = o.reclaim(ctx, id, err)
		}
	} else {
		rev, err = o.claims.Create(ctx, peer.OwnerKey(id), []byte(o.s.cfg.ID))
		if errors.Is(err, jetstream.ErrKeyExists) {
			rev, err = o.takeFromExpired(ctx, id, sessions, err)
		}
	}
	o.mu.Lock()
	switch {
	case err == nil:
		if !mine {
			o.s.log.Info("took shard ownership", "shard", id, "adopted", !home)
		}
		o.revs[id], o.confirmed[id] = rev, gen
		delete(o.heldAway, id)
	case !mine && errors.Is(err, jetstream.ErrKeyExists) && home:
		heldAway = true
	case mine && !errors.Is(err, context.Canceled) && isLost(err):
		o.s.log.Warn("lost shard ownership", "shard", id, "err", err)
		delete(o.revs, id)
		delete(o.confirmed, id)
		o.mu.Unlock()
		o.s.dropShard(ctx, id)
		return false
	}
	o.mu.Unlock()
	return heldAway
}

// takeFromExpired takes shard's claim, which Create found (exists), when
// its holder's session has expired, or when the holder is this dequeuer
// (a Create whose answer was lost, or a process restarted with the same
// ID), by a compare-and-set on the revision it read: of two takers, one
// wins. A claim of a live holder gives back exists.
func (o *ownership) takeFromExpired(ctx context.Context, shard uint32, sessions *sessionCache, exists error) (uint64, error) {
	e, err := o.claims.Get(ctx, peer.OwnerKey(shard))
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return o.claims.Create(ctx, peer.OwnerKey(shard), []byte(o.s.cfg.ID)) // released meanwhile
	case err != nil:
		return 0, err
	}
	holder := string(e.Value())
	if holder != o.s.cfg.ID && sessions.live(ctx, holder) {
		return 0, exists
	}
	rev, err := o.claims.Update(ctx, peer.OwnerKey(shard), []byte(o.s.cfg.ID), e.Revision())
	if err == nil && holder != o.s.cfg.ID {
		o.s.log.Info("took over the shard of a dequeuer whose session expired", "shard", shard, "from", holder)
	}
	return rev, err
}

// reclaim looks again at a claim whose confirmation failed as lost (err).
// The claim may still be this dequeuer's: a confirmation that timed out
// after the bucket stored it leaves the next one a revision behind. Or it
// was deleted (a hand-over this dequeuer made, then took back) and nobody
// claimed it since. Only a claim another dequeuer holds is lost.
func (o *ownership) reclaim(ctx context.Context, id uint32, err error) (uint64, error) {
	e, gerr := o.claims.Get(ctx, peer.OwnerKey(id))
	switch {
	case gerr == nil && string(e.Value()) == o.s.cfg.ID:
		return e.Revision(), nil
	case errors.Is(gerr, jetstream.ErrKeyNotFound):
		if rev, cerr := o.claims.Create(ctx, peer.OwnerKey(id), []byte(o.s.cfg.ID)); cerr == nil {
			return rev, nil
		}
	}
	return 0, err
}

// isLost tells a key another process wrote, or one that expired, from a
// NATS outage, during which we keep the claims until the session is too
// old to trust (see owns).
func isLost(err error) bool {
	return errors.Is(err, jetstream.ErrKeyExists) || strings.Contains(err.Error(), "wrong last sequence") ||
		errors.Is(err, jetstream.ErrKeyNotFound)
}

// forget drops our claims without touching the buckets (a crash): the
// session expires a TTL after its last refresh, and with it the claims.
func (o *ownership) forget() {
	o.mu.Lock()
	defer o.mu.Unlock()
	clear(o.revs)
	clear(o.confirmed)
	o.sessionRev, o.gen = 0, o.gen+1
}

// resign deletes our claims and session so the next owner need not wait
// for the TTL.
func (o *ownership) resign(ctx context.Context) {
	for _, id := range o.owned() {
		o.release(ctx, id)
	}
	o.mu.Lock()
	rev := o.sessionRev
	o.sessionRev = 0
	o.mu.Unlock()
	if rev != 0 {
		_ = o.kv.Delete(ctx, peer.SessionKey(o.s.cfg.ID), jetstream.LastRevision(rev))
	}
}

// sessionCache answers, for one claim round, whether dequeuers' sessions
// are live, asking the bucket once per dequeuer: a dead dequeuer's
// thousand claims cost one read of its session.
type sessionCache struct {
	kv    jetstream.KeyValue
	mu    sync.Mutex
	alive map[string]bool
}

// live reports whether dequeuer id's session key exists. A read that
// fails otherwise counts as live: a claim is taken only from a session
// known to be gone.
func (c *sessionCache) live(ctx context.Context, id string) bool {
	c.mu.Lock()
	alive, ok := c.alive[id]
	c.mu.Unlock()
	if ok {
		return alive
	}
	_, err := c.kv.Get(ctx, peer.SessionKey(id))
	alive = !errors.Is(err, jetstream.ErrKeyNotFound)
	c.mu.Lock()
	c.alive[id] = alive
	c.mu.Unlock()
	return alive
}

// Owners is a router's view of shard ownership: which dequeuer claims
// which shard (the claims bucket), and when each dequeuer's session was
// last refreshed (the ownership bucket).
type Owners struct {
	claims jetstream.KeyValue
	mu     sync.RWMutex
	by     map[uint32]string
	rev    map[uint32]uint64 // KV revision of what by says, so nothing older overwrites it
	// changes counts what the view applied per shard: a Reload that finds
	// no claim clears the view's only if nothing came in meanwhile, since
	// an answer without a claim has no revision to order it by.
	changes map[uint32]uint64
	// refreshed is when the view last heard a put of each dequeuer's
	// session. A session that expires by the bucket's TTL is announced to
	// no watcher, so a live session is one refreshed within the TTL (see
	// Live).
	refreshed map[string]time.Time
	// reloaded paces Reload per shard (reloadEvery): routers call it on
	// every request that finds no answering owner, hundreds a second
	// during an outage.
	reloaded map[uint32]time.Time
	// changed fires whenever a claim changes (see Changed), joined when a
	// session appears or is deleted (see Joined).
	changed, joined signal
}

// signal is a channel closed at the next fire, made on first use; its
// owner's lock guards it.
type signal struct{ ch chan struct{} }

// wait returns the channel the next fire closes.
func (s *signal) wait() <-chan struct{} {
	if s.ch == nil {
		s.ch = make(chan struct{})
	}
	return s.ch
}

// fire wakes every waiter.
func (s *signal) fire() {
	if s.ch != nil {
		close(s.ch)
		s.ch = nil
	}
}

// reloadEvery is the least time between two bucket reads of one shard's
// owner by Reload.
const reloadEvery = 100 * time.Millisecond

// WatchOwners follows the ownership bucket's sessions and the claims
// bucket until ctx ends. Both buckets are in memory: a restart of NATS
// loses them, and the dequeuers' writes make them again (OpenOwners). A
// watch of a lost stream either ends or, when the stream is back first,
// waits at a sequence the new stream reaches only after as many writes,
// seeing nothing; so the view watches again when a watch ends or a
// bucket's stream is not the one it watched (its creation time), every
// rewatchEvery.
func WatchOwners(ctx context.Context, owners, claims jetstream.KeyValue) (*Owners, error) {
	o := newOwners(claims)
	w, err := o.watch(ctx, owners, claims)
	if err != nil {
		return nil, err
	}
	go o.keepWatching(ctx, owners, claims, w)
	return o, nil
}

// rewatchEvery is how often the view checks that it watches the buckets'
// current streams.
const rewatchEvery = 2 * time.Second

// ownersWatch is one watch of both buckets.
type ownersWatch struct {
	stop context.CancelFunc
	// ended is closed when either watch ends (nil: never, for a watch
	// that could not start).
	ended   chan struct{}
	created [2]time.Time // of the claims and the ownership bucket's streams
}

// keepWatching watches the buckets again whenever w ends or watches a
// stream that is gone, until ctx ends.
func (o *Owners) keepWatching(ctx context.Context, owners, claims jetstream.KeyValue, w *ownersWatch) {
	t := time.NewTicker(rewatchEvery)
	defer t.Stop()
	ended := false
	for {
		select {
		case <-ctx.Done():
			w.stop()
			return
		case <-w.ended:
			ended, w.ended = true, nil // watched again at the tick, so a watch that keeps ending is paced
			continue
		case <-t.C:
			if !ended && bucketsCreated(ctx, claims, owners) == w.created {
				continue
			}
		}
		ended = false
		w.stop()
		nw, err := o.watch(ctx, owners, claims)
		if err != nil {
			nw = &ownersWatch{stop: func() {}} // tried again at the next tick
		}
		w = nw
	}
}

// bucketsCreated returns the creation times of the buckets' streams, zero
// for one that cannot be read.
func bucketsCreated(ctx context.Context, claims, owners jetstream.KeyValue) (out [2]time.Time) {
	ctx, cancel := context.WithTimeout(ctx, rewatchEvery)
	defer cancel()
	for i, kv := range []jetstream.KeyValue{claims, owners} {
		if st, err := kv.Status(ctx); err == nil {
			if b, ok := st.(*jetstream.KeyValueBucketStatus); ok {
				out[i] = b.StreamInfo().Created
			}
		}
	}
	return out
}

// watch starts a watch of both buckets and returns once each has
// replayed what its bucket holds; the view then holds exactly the claims
// replayed, whatever it held before (a stream made anew numbers its
// revisions from 1 again).
func (o *Owners) watch(ctx context.Context, owners, claims jetstream.KeyValue) (*ownersWatch, error) {
	created := bucketsCreated(ctx, claims, owners)
	wctx, cancel := context.WithCancel(ctx)
	cw, err := claims.WatchAll(wctx)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("watch %s: %w", peer.ClaimsBucket, err)
	}
	sw, err := owners.Watch(wctx, peer.SessionKey(">"))
	if err != nil {
		cancel()
		_ = cw.Stop()
		return nil, fmt.Errorf("watch %s: %w", peer.OwnersBucket, err)
	}
	w := &ownersWatch{stop: cancel, ended: make(chan struct{}), created: created}
	end := sync.OnceFunc(func() { close(w.ended) })
	ready := make(chan struct{}, 2)
	go func() {
		defer end()
		defer cw.Stop()
		replay := map[uint32]claimEntry{}
		replaying := true
		for e := range cw.Updates() {
			switch {
			case e == nil:
				if replaying {
					o.reset(replay)
					replaying = false
					ready <- struct{}{}
				}
			case replaying:
				if id, ok := peer.OwnerShard(e.Key()); ok {
					replay[id] = claimEntry{rev: e.Revision(), owner: string(e.Value()), put: e.Operation() == jetstream.KeyValuePut}
				}
			default:
				if id, ok := peer.OwnerShard(e.Key()); ok {
					o.set(id, e.Revision(), string(e.Value()), e.Operation() == jetstream.KeyValuePut)
				}
			}
		}
		if replaying {
			ready <- struct{}{}
		}
	}()
	go func() {
		defer end()
		defer sw.Stop()
		once := sync.OnceFunc(func() { ready <- struct{}{} })
		defer once()
		for e := range sw.Updates() {
			if e == nil {
				once()
				continue
			}
			if id, ok := peer.SessionID(e.Key()); ok {
				o.session(id, e.Operation() == jetstream.KeyValuePut)
			}
		}
	}()
	for range 2 {
		select {
		case <-ready:
		case <-ctx.Done():
			cancel()
			return nil, ctx.Err()
		}
	}
	return w, nil
}

// claimEntry is a claim as a watch replayed it.
type claimEntry struct {
	rev   uint64
	owner string
	put   bool
}

// reset makes the view hold exactly replay's claims.
func (o *Owners) reset(replay map[uint32]claimEntry) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for id := range o.by {
		if _, ok := replay[id]; !ok {
			o.rev[id] = 0
			o.apply(id, "", false)
		}
	}
	for id, e := range replay {
		o.rev[id] = e.rev
		o.apply(id, e.owner, e.put)
	}
}

// newOwners returns an empty view that Reload reads claims into.
func newOwners(claims jetstream.KeyValue) *Owners {
	return &Owners{claims: claims, by: map[uint32]string{}, rev: map[uint32]uint64{}, changes: map[uint32]uint64{},
		refreshed: map[string]time.Time{}, reloaded: map[uint32]time.Time{}}
}

// set records shard's owner (none when !put) as of revision rev, unless
// the view already holds a later revision. The same revision is applied
// again: a Reload that read it restores what a cleared view lost.
func (o *Owners) set(shard uint32, rev uint64, owner string, put bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if rev < o.rev[shard] {
		return
	}
	o.rev[shard] = rev
	o.apply(shard, owner, put)
}

// unset clears shard's owner, found missing by a read that began when the
// view had applied before changes of it, unless another came in since.
func (o *Owners) unset(shard uint32, before uint64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.changes[shard] == before {
		o.apply(shard, "", false)
	}
}

// apply records shard's owner and tells the waiters of a change. Callers
// hold o.mu.
func (o *Owners) apply(shard uint32, owner string, put bool) {
	o.changes[shard]++
	was, had := o.by[shard]
	if put {
		o.by[shard] = owner
	} else {
		delete(o.by, shard)
	}
	if had != put || was != owner {
		o.changed.fire()
	}
}

// session records a put (refresh) or delete (resign) of dequeuer id's
// session.
func (o *Owners) session(id string, put bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	_, known := o.refreshed[id]
	if put {
		o.refreshed[id] = time.Now()
	} else {
		delete(o.refreshed, id)
	}
	if known != put {
		o.joined.fire()
	}
}

// Joined returns a channel closed when a dequeuer's session appears or is
// deleted (one starts, or one resigns): the region's dequeuers balance
// their shards at once (see balance) rather than at their next round. A
// session that expires is announced to no watcher; the rounds see it.
func (o *Owners) Joined() <-chan struct{} {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.joined.wait()
}

// Changed returns a channel closed at the view's next change: a router
// waiting for a shard's new owner (a hand-over) wakes on it.
func (o *Owners) Changed() <-chan struct{} {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.changed.wait()
}

// Reload reads the owners of shards from the claims bucket itself. A
// router calls it when the owner its view names does not answer (no
// responders): a watch whose stream lost its leader with a region sees
// nothing until the stream elects another and the watch recovers,
// seconds after the new owner claimed.
func (o *Owners) Reload(ctx context.Context, shards []uint32) {
	for _, id := range shards {
		o.mu.Lock()
		if time.Since(o.reloaded[id]) < reloadEvery {
			o.mu.Unlock()
			continue
		}
		o.reloaded[id] = time.Now()
		before := o.changes[id]
		o.mu.Unlock()
		e, err := o.claims.Get(ctx, peer.OwnerKey(id))
		switch {
		case err == nil:
			o.set(id, e.Revision(), string(e.Value()), true)
		case errors.Is(err, jetstream.ErrKeyNotFound):
			o.unset(id, before)
		}
	}
}

// Live returns shard's owner when the view heard the owner's session
// refreshed within ttl, the ownership bucket's TTL: a session older than
// that has expired, announced or not, and its claims with it.
func (o *Owners) Live(shard uint32, ttl time.Duration) (string, bool) {
	o.mu.RLock()
	defer o.mu.RUnlock()
	id, ok := o.by[shard]
	at, seen := o.refreshed[id]
	return id, ok && seen && time.Since(at) < ttl
}

// LiveIn returns the dequeuers of region (IDs start with the region, see
// Config.ID) whose sessions the view heard refreshed within ttl, sorted.
func (o *Owners) LiveIn(region string, ttl time.Duration) []string {
	o.mu.RLock()
	defer o.mu.RUnlock()
	var out []string
	for id, at := range o.refreshed {
		if strings.HasPrefix(id, region+"-") && time.Since(at) < ttl {
			out = append(out, id)
		}
	}
	slices.Sort(out)
	return out
}

// claim returns shard's claim as the view last saw it, and the revision
// it saw it at (also that of a deletion).
func (o *Owners) claim(shard uint32) (holder string, rev uint64, claimed bool) {
	o.mu.RLock()
	defer o.mu.RUnlock()
	holder, claimed = o.by[shard]
	return holder, o.rev[shard], claimed
}

// Owner returns the dequeuer that claims shard.
func (o *Owners) Owner(shard uint32) (string, bool) {
	o.mu.RLock()
	defer o.mu.RUnlock()
	id, ok := o.by[shard]
	return id, ok
}
