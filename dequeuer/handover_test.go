package dequeuer

import (
	"context"
	"database/sql"
	"log/slog"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/triage-queue/triage/cmd/triage/natsserver/natstest"
	"github.com/triage-queue/triage/deploy/mariadb/mariadbtest"
	"github.com/triage-queue/triage/proto/triage/peer"
	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
	"github.com/triage-queue/triage/schema"
	"github.com/triage-queue/triage/shardmap"
)

// TestHandOverEndsLongPollsAtTheOldOwner: when a failover moves a shard's
// primary to another region, the old owner hands the shard over, and a
// long poll parked at it must end at once with ErrNotOwner (the router
// then asks the new owner). Before, ownership was checked once per request:
// the old owner's long polls went on fetching the shard until their wait
// ran out, leasing rows across the WAN into a buffer it no longer served
// from (a primary-kill drill: dequeues through two routers answered 1.3 s
// after the new owner had claimed the shard).
func TestHandOverEndsLongPollsAtTheOldOwner(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	nc, js := natstest.JetStream(t)
	dsn, err := mysql.ParseDSN(mariadbtest.Database(t))
	require.NoError(t, err)
	migrateDB(t, dsn)

	at := func(version uint64, primaryRegion string) *shardmap.Map {
		return dbShardMap(t, version, primaryRegion, dsn)
	}
	maps := shardmap.NewHolder(at(1, "a"))
	touched := confirmMaps(ctx, maps)
	defer func() { cancel(); <-touched }()
	pool := shardmap.NewPool(shardmap.Credentials{User: dsn.User, Password: dsn.Passwd})
	defer pool.Close()
	start := func(region string) *Service {
		s, err := New(Config{Region: region, ID: "deq-" + region, Maps: maps, Pool: pool, NC: nc, JS: js,
			OwnerTTL: time.Minute, Logger: slog.New(slog.DiscardHandler)})
		require.NoError(t, err)
		require.NoError(t, s.Start(ctx))
		t.Cleanup(s.Stop)
		return s
	}
	a, b := start("a"), start("b")
	require.True(t, a.owner.owns(1))

	type answer struct {
		items []*triagev1.LeasedItem
		err   error
		took  time.Duration
	}
	done := make(chan answer, 1)
	go func() {
		t0 := time.Now()
		items, err := a.Dequeue(ctx, &triagev1.DequeueRequest{Namespace: "default",
			Topics: []*triagev1.TopicCount{{Topic: "t", Count: 10}}, Wait: durationpb.New(20 * time.Second)}, []uint32{1})
		done <- answer{items, err, time.Since(t0)}
	}()
	time.Sleep(300 * time.Millisecond) // parked: the topic is empty

	moved := time.Now()
	require.True(t, maps.Offer(at(2, "b")))
	require.Eventually(t, func() bool { return b.owner.owns(1) }, 5*time.Second, 10*time.Millisecond)
	select {
	case got := <-done:
		require.ErrorIs(t, got.err, peer.ErrNotOwner, "the old owner's long poll ends with not-owner, so the router asks the new one")
		require.Empty(t, got.items)
		require.Less(t, time.Since(moved), 3*time.Second, "ended soon after the hand-over (took %s in all)", got.took)
	case <-time.After(5 * time.Second):
		t.Fatal("the old owner's long poll still runs 5 s after it handed the shard over")
	}
}

// confirmMaps confirms maps every 100 ms until ctx ends, as a node's KV
// watch does (a map unconfirmed for shardmap.MaxStaleness refuses
// writes); the channel closes when it has stopped.
func confirmMaps(ctx context.Context, maps *shardmap.Holder) <-chan struct{} {
	touched := make(chan struct{})
	go func() {
		defer close(touched)
		for ctx.Err() == nil {
			maps.Touch()
			time.Sleep(100 * time.Millisecond)
		}
	}()
	return touched
}

// dbShardMap is a map of regions a and b whose shard 1 is dsn's database,
// its primary in primaryRegion.
func dbShardMap(t *testing.T, version uint64, primaryRegion string, dsn *mysql.Config) *shardmap.Map {
	t.Helper()
	m, err := shardmap.New(shardmap.Map{Version: version, Regions: []string{"a", "b"},
		Namespaces: []shardmap.Namespace{{Name: "default"}},
		Shards: []shardmap.Shard{{ID: 1, HomeRegion: "a", PrimaryRegion: primaryRegion, Primary: dsn.Addr,
			Database: dsn.DBName, Replicas: []string{"127.0.0.1:1"}, ReplicaRegions: []string{"b"}}}})
	require.NoError(t, err)
	return m
}

// migrateDB applies the schema to dsn's database.
func migrateDB(t *testing.T, dsn *mysql.Config) {
	t.Helper()
	root := *dsn
	root.MultiStatements = true
	db, err := sql.Open("mysql", root.FormatDSN())
	require.NoError(t, err)
	defer db.Close()
	_, err = schema.Migrate(t.Context(), db)
	require.NoError(t, err)
}
