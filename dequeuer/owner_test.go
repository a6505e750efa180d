package dequeuer

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/triage-queue/triage/cmd/triage/natsserver/natstest"
	"github.com/triage-queue/triage/proto/triage/peer"
	"github.com/triage-queue/triage/shardmap"
	"github.com/triage-queue/triage/shardmap/shardmaptest"
)

// TestOpenOwnersNeverDropsTheTTL: a process that opens the ownership
// bucket without an owner TTL (an enqueuer or router with owner_ttl unset)
// used to set the bucket's TTL to 0, so the claims of a dequeuer killed
// afterwards never expired and no other dequeuer took its shards (seen as
// a flaky e2e kill test).
func TestOpenOwnersNeverDropsTheTTL(t *testing.T) {
	_, js := natstest.JetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	_, err := OpenOwners(ctx, js, 2*time.Second, 1)
	require.NoError(t, err)
	kv, err := OpenOwners(ctx, js, 0, 1)
	require.NoError(t, err)
	st, err := kv.Status(ctx)
	require.NoError(t, err)
	require.Equal(t, DefaultOwnerTTL, st.TTL(), "an unset TTL means the default, never no expiry")
}

// ownerBuckets starts a JetStream server and opens on it the ownership
// bucket (TTL ttl) and the claims bucket. ctx ends with the test, before
// its cleanups: claim loops a cleanup waits for stop first.
func ownerBuckets(t *testing.T, ttl time.Duration) (ctx context.Context, js jetstream.JetStream, kv, claims jetstream.KeyValue) {
	t.Helper()
	_, js = natstest.JetStream(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	t.Cleanup(cancel)
	kv, err := OpenOwners(ctx, js, ttl, 1)
	require.NoError(t, err)
	claims, err = OpenClaims(ctx, js, 1)
	require.NoError(t, err)
	return ctx, js, kv, claims
}

// holderOf returns the dequeuer claiming shard, or "".
func holderOf(ctx context.Context, claims jetstream.KeyValue, shard uint32) string {
	e, err := claims.Get(ctx, peer.OwnerKey(shard))
	if err != nil {
		return ""
	}
	return string(e.Value())
}

// TestOwnershipFollowsThePrimary: a shard is owned by a dequeuer of the
// region its primary runs in. After a failover moves the primary from
// region a to region b, a's dequeuer hands the shard over and b's takes it
// as soon as they see the new map, not an ownership TTL later. Before, the
// home region kept the shard and served it across the WAN.
func TestOwnershipFollowsThePrimary(t *testing.T) {
	// A TTL far longer than the test: a handover that waited for the old
	// claim to expire would fail it.
	const ttl = time.Minute
	ctx, _, kv, claims := ownerBuckets(t, ttl)

	at := func(version uint64, primaryRegion string) *shardmap.Map {
		return twoRegionMap(t, version, primaryRegion)
	}
	maps := shardmap.NewHolder(at(1, "a"))
	dequeuer := func(region string) *Service {
		s := &Service{cfg: Config{Region: region, ID: "deq-" + region, Maps: maps, OwnerTTL: ttl},
			log: slog.New(slog.NewTextHandler(os.Stderr, nil)).With("dequeuer", region), topics: map[bufKey]*topicBuf{}}
		s.owner = newOwnership(s, kv, claims)
		s.owner.claim(ctx)
		s.claimLoop(ctx)
		t.Cleanup(s.wg.Wait)
		return s
	}
	a, b := dequeuer("a"), dequeuer("b")
	owner := func() string { return holderOf(ctx, claims, 1) }
	require.Equal(t, "deq-a", owner())
	require.True(t, a.owner.owns(1))

	require.True(t, maps.Offer(at(2, "b")))
	require.Eventually(t, func() bool { return owner() == "deq-b" && b.owner.owns(1) }, 5*time.Second, 20*time.Millisecond,
		"b's dequeuer owns the shard whose primary moved to b (owner now %q)", owner())
	require.False(t, a.owner.owns(1))
}

// TestHandOverSeesAMapThatLandsDuringAClaim: a map that arrives while a
// claim round runs (after the round read the map) wakes the next round at
// once. The claim loop used to ask for the change channel after each
// round, so such a change went unseen until the next tick, OwnerTTL/4
// later: in a primary-kill drill the old owner handed its shard over 1.35 s
// after the new primary was published (the new region's dequeuer took it
// over first), and dequeues through the other regions' routers waited.
func TestHandOverSeesAMapThatLandsDuringAClaim(t *testing.T) {
	const ttl = time.Minute // ticks every 15 s: far longer than the test
	ctx, _, kv, claims := ownerBuckets(t, ttl)
	holder := shardmap.NewHolder(twoRegionMap(t, 1, "a"))
	maps := &shardmaptest.LandsDuringRead{Holder: holder}
	// b's dequeuer is present (so a hands over to it) and claims on its
	// own map, which already names b.
	b := &Service{cfg: Config{Region: "b", ID: "b-1", Maps: shardmap.NewHolder(twoRegionMap(t, 2, "b")), OwnerTTL: ttl},
		log: slog.New(slog.DiscardHandler), topics: map[bufKey]*topicBuf{}}
	b.owner = newOwnership(b, kv, claims)
	_, err := kv.Put(ctx, peer.PresenceKey("dequeuers", "b"), []byte("b-1"))
	require.NoError(t, err)

	a := &Service{cfg: Config{Region: "a", ID: "a-1", Maps: maps, OwnerTTL: ttl},
		log: slog.New(slog.DiscardHandler), topics: map[bufKey]*topicBuf{}}
	a.owner = newOwnership(a, kv, claims)
	a.owner.claim(ctx)
	require.True(t, a.owner.owns(1))
	// The loop's first round reads map 1; map 2, which moves the primary
	// to b, lands right after that read.
	maps.Arm(twoRegionMap(t, 2, "b"))
	a.claimLoop(ctx)
	t.Cleanup(a.wg.Wait)
	require.Eventually(t, func() bool { return !a.owner.owns(1) }, 5*time.Second, 20*time.Millisecond,
		"a hands the shard over in the round the change woke, not a tick later")
	b.owner.claim(ctx)
	require.True(t, b.owner.owns(1))
}

// TestOwnersView: the view names each shard's claim holder, live while the
// holder's session was refreshed within the TTL: a session that expires by
// the bucket's TTL is announced to no watcher, and the claim itself stays.
// Watch events never go back to an older revision.
func TestOwnersView(t *testing.T) {
	const ttl = time.Second
	ctx, _, kv, claims := ownerBuckets(t, ttl)
	_, err := kv.Put(ctx, peer.SessionKey("dead"), []byte("a"))
	require.NoError(t, err)
	_, err = claims.Put(ctx, peer.OwnerKey(1), []byte("dead"))
	require.NoError(t, err)
	owners, err := WatchOwners(ctx, kv, claims)
	require.NoError(t, err)
	owner, live := owners.Live(1, ttl)
	require.True(t, live)
	require.Equal(t, "dead", owner)

	require.Eventually(t, func() bool { _, live := owners.Live(1, ttl); return !live }, 10*time.Second, 50*time.Millisecond,
		"the session expires, unannounced")
	owner, ok := owners.Owner(1)
	require.True(t, ok)
	require.Equal(t, "dead", owner, "the claim stands until someone takes it")

	_, err = kv.Put(ctx, peer.SessionKey("alive"), []byte("a"))
	require.NoError(t, err)
	_, err = claims.Put(ctx, peer.OwnerKey(1), []byte("alive"))
	require.NoError(t, err)
	require.Eventually(t, func() bool { o, live := owners.Live(1, ttl); return o == "alive" && live }, 5*time.Second, 20*time.Millisecond)
	owners.set(1, 1, "dead", true) // a replayed older event
	owner, _ = owners.Owner(1)
	require.Equal(t, "alive", owner, "an older revision never overwrites a newer one")
}

// TestCutOffOwnerIsTakenOver: after a failover moves a shard's primary to
// region b, an owner in region a that never hands the shard over (cut off
// from NATS in a partition: it neither sees the new map nor can refresh
// its claim) loses it to b's dequeuer after handOverGrace, not after its
// claim's TTL. Partition drills waited out the TTL: dequeues of the shard
// resumed 5 s after its new primary was published. A claim of a dequeuer
// of b's own region is never taken.
func TestCutOffOwnerIsTakenOver(t *testing.T) {
	const ttl = time.Minute // far longer than the test
	ctx, _, kv, claims := ownerBuckets(t, ttl)
	at := func(version uint64, primaryRegion string) *shardmap.Map {
		return twoRegionMap(t, version, primaryRegion)
	}
	owner := func() string { return holderOf(ctx, claims, 1) }
	service := func(region, id string, maps shardmap.Source) *Service {
		return ownerService(region, id, maps, ttl, kv, claims)
	}
	// a's dequeuer claims the shard once and is then cut off: it runs no
	// claim loop and keeps seeing the old map.
	a := service("a", "a-1", shardmap.NewHolder(at(1, "a")))
	a.owner.claim(ctx)
	require.Equal(t, "a-1", owner())

	// b's first dequeuer would own the shard but starts late; a second
	// dequeuer of b holding the claim is left alone.
	maps := shardmap.NewHolder(at(2, "b"))
	b := service("b", "b-1", maps)
	b.claimLoop(ctx)
	t.Cleanup(b.wg.Wait)
	moved := time.Now()
	require.Eventually(t, func() bool { return owner() == "b-1" && b.owner.owns(1) }, 10*time.Second, 20*time.Millisecond,
		"b's dequeuer takes the shard over from the cut-off owner (owner now %q)", owner())
	require.GreaterOrEqual(t, time.Since(moved), handOverGrace, "a live owner gets handOverGrace to hand over")

	// a reaches NATS again, still on the old map: its session never
	// expired, but its view shows b's claim, so a drops the shard.
	view, err := WatchOwners(ctx, kv, claims)
	require.NoError(t, err)
	a.owner.view = view
	require.True(t, a.owner.owns(1), "a has not looked yet")
	a.owner.claim(ctx)
	require.False(t, a.owner.owns(1), "a sees b's claim at its next round")
	require.Equal(t, "b-1", owner())

	peer2 := service("b", "b-2", maps)
	peer2.claimLoop(ctx)
	t.Cleanup(peer2.wg.Wait)
	time.Sleep(2 * handOverGrace)
	require.Equal(t, "b-1", owner(), "a dequeuer never takes a shard from one of its own region")
}

// TestOwnersReloadIsPaced: routers reload the owner of a shard on every
// request that finds no answering owner (and, since a region-down drill
// left one router's view empty for 6 s, on every request that finds none
// at all); the bucket is read at most once per reloadEvery per shard.
func TestOwnersReloadIsPaced(t *testing.T) {
	ctx, _, _, kv := ownerBuckets(t, time.Minute)
	// No watch: only Reload fills the view.
	owners := newOwners(kv)
	owner := func() string { o, _ := owners.Owner(1); return o }

	_, err := kv.Put(ctx, peer.OwnerKey(1), []byte("first"))
	require.NoError(t, err)
	changed := owners.Changed()
	owners.Reload(ctx, []uint32{1})
	require.Equal(t, "first", owner())
	select {
	case <-changed:
	default:
		t.Fatal("a reload that changed the view did not close Changed")
	}

	_, err = kv.Put(ctx, peer.OwnerKey(1), []byte("second"))
	require.NoError(t, err)
	owners.Reload(ctx, []uint32{1})
	require.Equal(t, "first", owner(), "a reload within reloadEvery of the last reads nothing")
	time.Sleep(reloadEvery)
	owners.Reload(ctx, []uint32{1})
	require.Equal(t, "second", owner())

	require.NoError(t, kv.Delete(ctx, peer.OwnerKey(1)))
	time.Sleep(reloadEvery)
	owners.Reload(ctx, []uint32{1})
	_, ok := owners.Owner(1)
	require.False(t, ok, "a released claim is gone from the view")
}

// TestOwnersReloadNeverHidesANewerClaim: a Reload that read "no claim"
// just before a dequeuer claimed the shard, and whose answer lands after
// the watch delivered that claim, left the view with no owner; claims are
// not rewritten while their holder lives, so no later event restored it,
// and the same revision read again was refused as not newer (a
// region-down drill's bed: eu-west's router answered "no dequeuer owns
// the shards yet" for a minute).
func TestOwnersReloadNeverHidesANewerClaim(t *testing.T) {
	owners := newOwners(nil)
	before := owners.changes[1]   // a Reload starts
	owners.set(1, 7, "a-1", true) // the watch delivers the claim
	owners.unset(1, before)       // the Reload's "not found" lands
	owner, ok := owners.Owner(1)
	require.True(t, ok, "a missing claim read before the watch's event clears nothing")
	require.Equal(t, "a-1", owner)

	owners.unset(1, owners.changes[1]) // nothing came in meanwhile: cleared
	_, ok = owners.Owner(1)
	require.False(t, ok)
	owners.set(1, 7, "a-1", true) // a Reload reads the same revision again
	owner, _ = owners.Owner(1)
	require.Equal(t, "a-1", owner, "the same revision restores the claim")
}

// twoRegionMap is a map of regions a and b with one shard, homed in a, whose
// primary runs in primaryRegion at epoch version.
func twoRegionMap(t *testing.T, version uint64, primaryRegion string) *shardmap.Map {
	t.Helper()
	m, err := shardmap.New(shardmap.Map{Version: version, Regions: []string{"a", "b"}, Shards: []shardmap.Shard{{
		ID: 1, HomeRegion: "a", PrimaryRegion: primaryRegion, Primary: "127.0.0.1:1", Database: "d",
		Replicas: []string{"127.0.0.1:2"}, ReplicaRegions: []string{"b"}, Epoch: version}}})
	require.NoError(t, err)
	return m
}

// oneRegionMap is a map of region a with shards 1 to n.
func oneRegionMap(t *testing.T, n int) *shardmap.Map {
	t.Helper()
	m := shardmap.Map{Version: 1, Regions: []string{"a"}}
	for i := 1; i <= n; i++ {
		m.Shards = append(m.Shards, shardmap.Shard{ID: uint32(i), HomeRegion: "a", Primary: "127.0.0.1:1", Database: fmt.Sprintf("d%d", i)})
	}
	sm, err := shardmap.New(m)
	require.NoError(t, err)
	return sm
}

// ownerService is a Service of region with ownership over kv and claims
// and no claim loop running.
func ownerService(region, id string, maps shardmap.Source, ttl time.Duration, kv, claims jetstream.KeyValue) *Service {
	s := &Service{cfg: Config{Region: region, ID: id, Maps: maps, OwnerTTL: ttl},
		log: slog.New(slog.DiscardHandler), topics: map[bufKey]*topicBuf{}}
	s.owner = newOwnership(s, kv, claims)
	return s
}

// TestClaimRoundWritesOnlyTheSession: a round of a dequeuer that owns its
// shards writes its session and presence, not a key per shard: at 1,000
// shards a claim refreshed per shard every OwnerTTL/4 was 800 KV writes a
// second, and under load a round outlasted the TTL.
func TestClaimRoundWritesOnlyTheSession(t *testing.T) {
	ctx, js, kv, claims := ownerBuckets(t, time.Minute)
	a := ownerService("a", "a-1", shardmap.NewHolder(oneRegionMap(t, 100)), time.Minute, kv, claims)
	a.owner.claim(ctx)
	require.Len(t, a.owner.owned(), 100)
	lastSeq := func(bucket string) uint64 {
		s, err := js.Stream(ctx, "KV_"+bucket)
		require.NoError(t, err)
		info, err := s.Info(ctx)
		require.NoError(t, err)
		return info.State.LastSeq
	}
	claimsAt, ownersAt := lastSeq(peer.ClaimsBucket), lastSeq(peer.OwnersBucket)
	for range 3 {
		a.owner.claim(ctx)
	}
	for id := uint32(1); id <= 100; id++ {
		require.True(t, a.owner.owns(id))
	}
	require.Equal(t, claimsAt, lastSeq(peer.ClaimsBucket), "no claim written again")
	require.Equal(t, ownersAt+6, lastSeq(peer.OwnersBucket), "a session and a presence write a round")
}

// TestDeadDequeuersShardsAreTakenOver: the claims of a dequeuer that died
// stand until its session expires, then another dequeuer of the region
// takes every one of them with a compare-and-set.
func TestDeadDequeuersShardsAreTakenOver(t *testing.T) {
	const ttl = 2 * time.Second
	ctx, _, kv, claims := ownerBuckets(t, ttl)
	maps := shardmap.NewHolder(oneRegionMap(t, 20))
	a := ownerService("a", "a-1", maps, ttl, kv, claims)
	a.owner.claim(ctx)
	require.Len(t, a.owner.owned(), 20)
	a.owner.forget() // a crash: no claim loop runs, the session is not refreshed again
	died := time.Now()

	b := ownerService("a", "a-2", maps, ttl, kv, claims)
	b.claimLoop(ctx)
	t.Cleanup(b.wg.Wait)
	time.Sleep(ttl / 2)
	require.Empty(t, b.owner.owned(), "a's claims stand while its session may be live")
	require.Eventually(t, func() bool {
		for id := uint32(1); id <= 20; id++ {
			if holderOf(ctx, claims, id) != "a-2" || !b.owner.owns(id) {
				return false
			}
		}
		return true
	}, 10*time.Second, 20*time.Millisecond, "b takes every shard of the dead a")
	t.Logf("taken over %s after a died (TTL %s)", time.Since(died).Round(time.Millisecond), ttl)
	_, err := kv.Get(ctx, peer.SessionKey("a-1"))
	require.ErrorIs(t, err, jetstream.ErrKeyNotFound, "only after a's session expired")
}

// TestExpiredSessionConfirmsClaims: a dequeuer whose session expired (a
// pause longer than the TTL) serves none of its shards until it has
// confirmed each claim in a new session; one another dequeuer took
// meanwhile is dropped.
func TestExpiredSessionConfirmsClaims(t *testing.T) {
	const ttl = time.Minute
	ctx, _, kv, claims := ownerBuckets(t, ttl)
	a := ownerService("a", "a-1", shardmap.NewHolder(oneRegionMap(t, 2)), ttl, kv, claims)
	a.owner.claim(ctx)
	require.True(t, a.owner.owns(1))
	require.True(t, a.owner.owns(2))

	// The session expires (as the TTL would), and a-2 takes shard 2.
	require.NoError(t, kv.Delete(ctx, peer.SessionKey("a-1")))
	_, err := kv.Put(ctx, peer.SessionKey("a-2"), []byte("a"))
	require.NoError(t, err)
	e, err := claims.Get(ctx, peer.OwnerKey(2))
	require.NoError(t, err)
	_, err = claims.Update(ctx, peer.OwnerKey(2), []byte("a-2"), e.Revision())
	require.NoError(t, err)

	a.owner.keepSession(ctx)
	require.False(t, a.owner.owns(1), "a new session: no claim counts before it is confirmed")
	require.False(t, a.owner.owns(2))
	a.owner.claim(ctx)
	require.True(t, a.owner.owns(1), "confirmed")
	require.False(t, a.owner.owns(2), "taken meanwhile")
	require.Equal(t, []uint32{1}, a.owner.owned())
	require.Equal(t, "a-2", holderOf(ctx, claims, 2))
}

// TestClaimsBalanceAcrossTheRegionsDequeuers: the shards of a region are
// split evenly among its live dequeuers, in contiguous blocks: one that
// starts takes what the others release, one that resigns or dies leaves
// its shards to the rest. No shard is ever owned (owns) by two dequeuers
// at once, and every shard is owned again within a second of a start or
// a resignation.
func TestClaimsBalanceAcrossTheRegionsDequeuers(t *testing.T) {
	const ttl, shards = 2 * time.Second, 12
	ctx, _, kv, claims := ownerBuckets(t, ttl)
	maps := shardmap.NewHolder(oneRegionMap(t, shards))
	type member struct {
		s    *Service
		stop context.CancelFunc
	}
	var mu sync.Mutex
	live := map[string]member{}
	start := func(id string) {
		s := ownerService("a", id, maps, ttl, kv, claims)
		sctx, stop := context.WithCancel(ctx)
		view, err := WatchOwners(sctx, kv, claims)
		require.NoError(t, err)
		s.owner.view = view
		s.owner.claim(sctx)
		s.claimLoop(sctx)
		mu.Lock()
		live[id] = member{s, stop}
		mu.Unlock()
		t.Cleanup(func() { stop(); s.wg.Wait() })
	}
	leave := func(id string, resign bool) {
		mu.Lock()
		m := live[id]
		delete(live, id)
		mu.Unlock()
		m.stop()
		m.s.wg.Wait()
		if resign {
			m.s.owner.resign(ctx)
		}
	}
	// owned maps each live dequeuer to the shards it owns, sorted; twice
	// reports a shard two of them own at once.
	owned := func() (by map[string][]uint32, twice []uint32) {
		mu.Lock()
		defer mu.Unlock()
		by = map[string][]uint32{}
		for id := uint32(1); id <= shards; id++ {
			n := 0
			for name, m := range live {
				if m.s.owner.owns(id) {
					by[name] = append(by[name], id)
					n++
				}
			}
			if n > 1 {
				twice = append(twice, id)
			}
		}
		return by, twice
	}
	// Sampled throughout: no shard owned twice.
	var doubled []uint32
	sampled := make(chan struct{})
	sctx, stopSampling := context.WithCancel(ctx)
	go func() {
		defer close(sampled)
		for sctx.Err() == nil {
			if _, twice := owned(); len(twice) > 0 {
				mu.Lock()
				doubled = append(doubled, twice...)
				mu.Unlock()
			}
			time.Sleep(time.Millisecond)
		}
	}()
	span := func(from, to uint32) []uint32 {
		var out []uint32
		for id := from; id <= to; id++ {
			out = append(out, id)
		}
		return out
	}
	expect := func(within time.Duration, what string, want map[string][]uint32) {
		t.Helper()
		began := time.Now()
		var by map[string][]uint32
		assert := func() bool { by, _ = owned(); return reflect.DeepEqual(by, want) }
		if !assert() {
			require.Eventually(t, assert, within, 5*time.Millisecond, "%s: owned %v", what, by)
		}
		t.Logf("%s: %v after %s", what, by, time.Since(began).Round(time.Millisecond))
	}

	start("a-1")
	expect(time.Second, "alone", map[string][]uint32{"a-1": span(1, 12)})
	start("a-2")
	expect(time.Second, "a-2 starts", map[string][]uint32{"a-1": span(1, 6), "a-2": span(7, 12)})
	start("a-3")
	// a-1 and a-2 each release the last two of their shards; a-3 takes
	// them: no more moves than the quotas ask.
	expect(time.Second, "a-3 starts", map[string][]uint32{"a-1": span(1, 4), "a-2": span(7, 10), "a-3": {5, 6, 11, 12}})
	leave("a-3", true)
	expect(time.Second, "a-3 resigns", map[string][]uint32{"a-1": span(1, 6), "a-2": span(7, 12)})
	// A claim in a-1's name that a-1 does not hold (a release whose delete
	// failed): a-2 finds its claim of shard 7 lost, a-1 deletes the stray
	// one, a-2 claims the shard again.
	e, err := claims.Get(ctx, peer.OwnerKey(7))
	require.NoError(t, err)
	stray, err := claims.Update(ctx, peer.OwnerKey(7), []byte("a-1"), e.Revision())
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		e, err := claims.Get(ctx, peer.OwnerKey(7))
		return err == nil && e.Revision() > stray && string(e.Value()) == "a-2"
	}, 3*time.Second, 5*time.Millisecond, "a-2 claims shard 7 again")
	expect(time.Second, "a stray claim", map[string][]uint32{"a-1": span(1, 6), "a-2": span(7, 12)})
	leave("a-2", false)
	expect(ttl+2*time.Second, "a-2 dies", map[string][]uint32{"a-1": span(1, 12)})

	stopSampling()
	<-sampled
	require.Empty(t, doubled, "shards two dequeuers owned at once")
}

// TestOwnersViewFollowsBucketsMadeAgain: after the buckets' streams are
// lost (memory buckets across a NATS restart) and made again by a write,
// the view watches the new streams and holds what they hold, though their
// revisions start from 1 again, below what the view last saw.
func TestOwnersViewFollowsBucketsMadeAgain(t *testing.T) {
	const ttl = time.Minute
	ctx, js, kv, claims := ownerBuckets(t, ttl)
	for range 20 {
		_, err := claims.Put(ctx, peer.OwnerKey(1), []byte("a-1"))
		require.NoError(t, err)
	}
	_, err := claims.Put(ctx, peer.OwnerKey(2), []byte("a-1"))
	require.NoError(t, err)
	_, err = kv.Put(ctx, peer.SessionKey("a-1"), []byte("a"))
	require.NoError(t, err)
	owners, err := WatchOwners(ctx, kv, claims)
	require.NoError(t, err)
	owner, _ := owners.Owner(1)
	require.Equal(t, "a-1", owner)

	require.NoError(t, js.DeleteKeyValue(ctx, peer.ClaimsBucket))
	require.NoError(t, js.DeleteKeyValue(ctx, peer.OwnersBucket))
	_, err = claims.Put(ctx, peer.OwnerKey(1), []byte("a-2")) // makes the bucket again: revision 1
	require.NoError(t, err)
	_, err = kv.Put(ctx, peer.SessionKey("a-2"), []byte("a"))
	require.NoError(t, err)
	began := time.Now()
	require.Eventually(t, func() bool {
		o1, ok1 := owners.Owner(1)
		_, ok2 := owners.Owner(2)
		_, live := owners.Live(1, ttl)
		return ok1 && o1 == "a-2" && !ok2 && live
	}, 3*rewatchEvery, 20*time.Millisecond, "the view holds the new buckets' claims: shard 1 a-2's, shard 2 nobody's")
	t.Logf("the view followed the new buckets %s after they were made", time.Since(began).Round(time.Millisecond))
}
