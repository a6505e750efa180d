package dequeuer

import (
	"context"
	"errors"
	"log/slog"
	"os"
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

// TestOwnershipFollowsThePrimary: a shard is owned by a dequeuer of the
// region its primary runs in. After a failover moves the primary from
// region a to region b, a's dequeuer hands the shard over and b's takes it
// as soon as they see the new map, not an ownership TTL later. Before, the
// home region kept the shard and served it across the WAN.
func TestOwnershipFollowsThePrimary(t *testing.T) {
	_, js := natstest.JetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// A TTL far longer than the test: a handover that waited for the old
	// claim to expire would fail it.
	const ttl = time.Minute
	kv, err := OpenOwners(ctx, js, ttl, 1)
	require.NoError(t, err)

	at := func(version uint64, primaryRegion string) *shardmap.Map {
		return twoRegionMap(t, version, primaryRegion)
	}
	maps := shardmap.NewHolder(at(1, "a"))
	dequeuer := func(region string) *Service {
		s := &Service{cfg: Config{Region: region, ID: "deq-" + region, Maps: maps, OwnerTTL: ttl},
			log: slog.New(slog.NewTextHandler(os.Stderr, nil)).With("dequeuer", region), topics: map[bufKey]*topicBuf{}}
		s.owner = newOwnership(s, kv)
		s.owner.claim(ctx)
		s.claimLoop(ctx)
		t.Cleanup(s.wg.Wait)
		return s
	}
	a, b := dequeuer("a"), dequeuer("b")
	t.Cleanup(cancel)
	owner := func() string {
		e, err := kv.Get(ctx, peer.OwnerKey(1))
		if err != nil {
			return ""
		}
		return string(e.Value())
	}
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
	_, js := natstest.JetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const ttl = time.Minute // ticks every 15 s: far longer than the test
	kv, err := OpenOwners(ctx, js, ttl, 1)
	require.NoError(t, err)
	holder := shardmap.NewHolder(twoRegionMap(t, 1, "a"))
	maps := &shardmaptest.LandsDuringRead{Holder: holder}
	// b's dequeuer is present (so a hands over to it) and claims on its
	// own map, which already names b.
	b := &Service{cfg: Config{Region: "b", ID: "b-1", Maps: shardmap.NewHolder(twoRegionMap(t, 2, "b")), OwnerTTL: ttl},
		log: slog.New(slog.DiscardHandler), topics: map[bufKey]*topicBuf{}}
	b.owner = newOwnership(b, kv)
	_, err = kv.Put(ctx, peer.PresenceKey("dequeuers", "b"), []byte("b-1"))
	require.NoError(t, err)

	a := &Service{cfg: Config{Region: "a", ID: "a-1", Maps: maps, OwnerTTL: ttl},
		log: slog.New(slog.DiscardHandler), topics: map[bufKey]*topicBuf{}}
	a.owner = newOwnership(a, kv)
	a.owner.claim(ctx)
	require.True(t, a.owner.owns(1))
	// The loop's first round reads map 1; map 2, which moves the primary
	// to b, lands right after that read.
	maps.Arm(twoRegionMap(t, 2, "b"))
	a.claimLoop(ctx)
	t.Cleanup(a.wg.Wait)
	t.Cleanup(cancel)
	require.Eventually(t, func() bool { return !a.owner.owns(1) }, 5*time.Second, 20*time.Millisecond,
		"a hands the shard over in the round the change woke, not a tick later")
	b.owner.claim(ctx)
	require.True(t, b.owner.owns(1))
}

// TestOwnersReload: the claim of a dequeuer that died expires by the
// bucket's TTL, which watchers are not told of, so a router's view kept
// naming the dead owner (region-down drills: dequeues through one router
// failed for 6 s after another dequeuer had taken the shard). Reload reads
// the bucket itself; later watch events still win by revision.
func TestOwnersReload(t *testing.T) {
	_, js := natstest.JetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	kv, err := OpenOwners(ctx, js, time.Second, 1)
	require.NoError(t, err)
	_, err = kv.Put(ctx, peer.OwnerKey(1), []byte("dead"))
	require.NoError(t, err)
	owners, err := WatchOwners(ctx, kv)
	require.NoError(t, err)
	owner, ok := owners.Owner(1)
	require.True(t, ok)
	require.Equal(t, "dead", owner)

	require.Eventually(t, func() bool {
		_, err := kv.Get(ctx, peer.OwnerKey(1))
		return errors.Is(err, jetstream.ErrKeyNotFound)
	}, 10*time.Second, 50*time.Millisecond, "the claim expires")
	owners.Reload(ctx, []uint32{1})
	_, ok = owners.Owner(1)
	require.False(t, ok, "the expired claim is gone from the view")

	_, err = kv.Put(ctx, peer.OwnerKey(1), []byte("alive"))
	require.NoError(t, err)
	require.Eventually(t, func() bool { o, _ := owners.Owner(1); return o == "alive" }, 5*time.Second, 20*time.Millisecond)
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
	_, js := natstest.JetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const ttl = time.Minute // far longer than the test
	kv, err := OpenOwners(ctx, js, ttl, 1)
	require.NoError(t, err)
	at := func(version uint64, primaryRegion string) *shardmap.Map {
		return twoRegionMap(t, version, primaryRegion)
	}
	owner := func() string {
		e, err := kv.Get(ctx, peer.OwnerKey(1))
		if err != nil {
			return ""
		}
		return string(e.Value())
	}
	service := func(region, id string, maps shardmap.Source) *Service {
		s := &Service{cfg: Config{Region: region, ID: id, Maps: maps, OwnerTTL: ttl},
			log: slog.New(slog.DiscardHandler), topics: map[bufKey]*topicBuf{}}
		s.owner = newOwnership(s, kv)
		return s
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
	t.Cleanup(cancel)
	moved := time.Now()
	require.Eventually(t, func() bool { return owner() == "b-1" && b.owner.owns(1) }, 10*time.Second, 20*time.Millisecond,
		"b's dequeuer takes the shard over from the cut-off owner (owner now %q)", owner())
	require.GreaterOrEqual(t, time.Since(moved), handOverGrace, "a live owner gets handOverGrace to hand over")

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
	_, js := natstest.JetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	kv, err := OpenOwners(ctx, js, time.Minute, 1)
	require.NoError(t, err)
	// No watch: only Reload fills the view.
	owners := &Owners{kv: kv, by: map[uint32]string{}, rev: map[uint32]uint64{}, seen: map[uint32]time.Time{}, reloaded: map[uint32]time.Time{}}
	owner := func() string { o, _ := owners.Owner(1); return o }

	_, err = kv.Put(ctx, peer.OwnerKey(1), []byte("first"))
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
