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

	"github.com/triage-queue/triage/deploy/natsserver/natstest"
	"github.com/triage-queue/triage/shardmap"
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
	a := startOwnership(t, ctx, kv, maps, "a", ttl, true)
	b := startOwnership(t, ctx, kv, maps, "b", ttl, true)
	t.Cleanup(cancel)
	owner := func() string { return ownerOf(ctx, kv, 1) }
	require.Equal(t, "deq-a", owner())
	require.True(t, a.owner.owns(1))

	require.True(t, maps.Offer(at(2, "b")))
	require.Eventually(t, func() bool { return owner() == "deq-b" && b.owner.owns(1) }, 5*time.Second, 20*time.Millisecond,
		"b's dequeuer owns the shard whose primary moved to b (owner now %q)", owner())
	require.False(t, a.owner.owns(1))
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
	_, err = kv.Put(ctx, ownerKey(1), []byte("dead"))
	require.NoError(t, err)
	owners, err := WatchOwners(ctx, kv)
	require.NoError(t, err)
	owner, ok := owners.Owner(1)
	require.True(t, ok)
	require.Equal(t, "dead", owner)

	require.Eventually(t, func() bool {
		_, err := kv.Get(ctx, ownerKey(1))
		return errors.Is(err, jetstream.ErrKeyNotFound)
	}, 10*time.Second, 50*time.Millisecond, "the claim expires")
	owners.Reload(ctx, []uint32{1})
	_, ok = owners.Owner(1)
	require.False(t, ok, "the expired claim is gone from the view")

	_, err = kv.Put(ctx, ownerKey(1), []byte("alive"))
	require.NoError(t, err)
	require.Eventually(t, func() bool { o, _ := owners.Owner(1); return o == "alive" }, 5*time.Second, 20*time.Millisecond)
	owners.set(1, 1, "dead", true) // a replayed older event
	owner, _ = owners.Owner(1)
	require.Equal(t, "alive", owner, "an older revision never overwrites a newer one")
}

// twoRegionMap is a map of regions a and b with shard 1 homed in a and
// its primary in primaryRegion.
func twoRegionMap(t *testing.T, version uint64, primaryRegion string) *shardmap.Map {
	m, err := shardmap.New(shardmap.Map{Version: version, Regions: []string{"a", "b"}, Shards: []shardmap.Shard{{
		ID: 1, HomeRegion: "a", PrimaryRegion: primaryRegion, Primary: "127.0.0.1:1", Database: "d",
		Replicas: []string{"127.0.0.1:2"}, ReplicaRegions: []string{"b"}, Epoch: version}}})
	require.NoError(t, err)
	return m
}

// startOwnership runs the ownership of a dequeuer "deq-<region>" (no
// serving): one claim, then, if loop, its claim loop.
func startOwnership(t *testing.T, ctx context.Context, kv jetstream.KeyValue, maps *shardmap.Holder, region string, ttl time.Duration, loop bool) *Service {
	s := &Service{cfg: Config{Region: region, ID: "deq-" + region, Maps: maps, OwnerTTL: ttl},
		log: slog.New(slog.NewTextHandler(os.Stderr, nil)).With("dequeuer", region), topics: map[bufKey]*topicBuf{}}
	s.owner = newOwnership(s, kv)
	changed := s.mapChanged()
	s.owner.claim(ctx)
	if loop {
		s.claimLoop(ctx, changed)
		t.Cleanup(s.wg.Wait)
	}
	return s
}

// ownerOf returns the dequeuer the bucket names for shard, "" for none.
func ownerOf(ctx context.Context, kv jetstream.KeyValue, shard uint32) string {
	e, err := kv.Get(ctx, ownerKey(shard))
	if err != nil {
		return ""
	}
	return parseClaim(e.Value()).ID
}

// TestCutOffOwnerIsTakenOver: the owner in the old primary's region is
// cut off by a partition and never hands the shard over; its claim would
// hold for the TTL (5 s on the bed, after the NATS election: a partition
// drill's dequeues resumed 5 s after the new primary was published). The
// dequeuer of the new primary's region takes the claim over on seeing
// the map; one of the same region never takes it from another.
func TestCutOffOwnerIsTakenOver(t *testing.T) {
	_, js := natstest.JetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const ttl = time.Minute
	kv, err := OpenOwners(ctx, js, ttl, 1)
	require.NoError(t, err)
	maps := shardmap.NewHolder(twoRegionMap(t, 1, "a"))
	startOwnership(t, ctx, kv, maps, "a", ttl, false) // claims once, then is cut off
	require.Equal(t, "deq-a", ownerOf(ctx, kv, 1))
	b := startOwnership(t, ctx, kv, maps, "b", ttl, true)
	t.Cleanup(cancel)

	require.True(t, maps.Offer(twoRegionMap(t, 2, "b")))
	require.Eventually(t, func() bool { return ownerOf(ctx, kv, 1) == "deq-b" && b.owner.owns(1) }, 5*time.Second, 20*time.Millisecond,
		"the new primary's region takes the shard over (owner now %q)", ownerOf(ctx, kv, 1))

	// A second dequeuer of region b leaves it to the first.
	b2 := &Service{cfg: Config{Region: "b", ID: "deq-b2", Maps: maps, OwnerTTL: ttl},
		log: slog.New(slog.NewTextHandler(os.Stderr, nil)).With("dequeuer", "b2"), topics: map[bufKey]*topicBuf{}}
	b2.owner = newOwnership(b2, kv)
	require.True(t, b2.owner.claim(ctx), "the shard is wanted and held by its region's other dequeuer")
	require.Equal(t, "deq-b", ownerOf(ctx, kv, 1))
	require.False(t, b2.owner.owns(1))
}
