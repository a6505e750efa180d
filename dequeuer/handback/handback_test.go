package handback

import (
	"database/sql"
	"errors"
	"log/slog"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/triage-queue/triage/deploy/mariadb/mariadbtest"
	peerv1 "github.com/triage-queue/triage/proto/triage/peer/v1"
	"github.com/triage-queue/triage/schema"
	"github.com/triage-queue/triage/schema/store"
	"github.com/triage-queue/triage/shardmap"
)

func TestMain(m *testing.M) { os.Exit(mariadbtest.MainCheckingLeaks(m)) }

// fenced is a shard map source whose one shard can be made unwritable,
// as during a failover.
type fenced struct {
	m      *shardmap.Map
	fenced atomic.Bool
}

func (f *fenced) Current() *shardmap.Map { return f.m }

func (f *fenced) Writable(uint32) error {
	if f.fenced.Load() {
		return errors.New("injected: shard 1 is fenced")
	}
	return nil
}

// fixture is one migrated shard with a served item, key 5, leased under
// token 42 with its attempt counted, as a dequeuer leaves it.
type fixture struct {
	src  *fenced
	pool *shardmap.Pool
	db   *sqlx.DB
	us   []store.Undelivered
}

func newFixture(t *testing.T) *fixture {
	ctx := t.Context()
	dsn, err := mysql.ParseDSN(mariadbtest.Database(t))
	require.NoError(t, err)
	root := *dsn
	root.MultiStatements = true
	rdb, err := sql.Open("mysql", root.FormatDSN())
	require.NoError(t, err)
	defer rdb.Close()
	_, err = schema.Migrate(ctx, rdb)
	require.NoError(t, err)
	m, err := shardmap.New(shardmap.Map{Version: 1, Regions: []string{"a"}, Namespaces: []shardmap.Namespace{{Name: "default"}},
		Shards: []shardmap.Shard{{ID: 1, HomeRegion: "a", PrimaryRegion: "a", Primary: dsn.Addr, Database: dsn.DBName}}})
	require.NoError(t, err)
	f := &fixture{src: &fenced{m: m}, pool: shardmap.NewPool(shardmap.Credentials{User: dsn.User, Password: dsn.Passwd})}
	t.Cleanup(func() { f.pool.Close() })
	f.db, err = f.pool.Writer(f.src, 1)
	require.NoError(t, err)
	now := time.Now()
	_, err = store.New(f.db).ItemInsertBatch(ctx, store.ItemInsertBatchParams{NowUS: now.UnixMicro(),
		Batches: []*peerv1.EnqueueBatch{{Namespace: "default", Topic: "t", Shard: 1, BatchId: 1, EnqueuedAtUs: now.UnixMicro(),
			Items: []*peerv1.BufferedItem{{Key: 5, Payload: []byte("x"), LeaseMs: 60_000}}}}})
	require.NoError(t, err)
	var was int64
	require.NoError(t, f.db.GetContext(ctx, &was, "SELECT deliver_after FROM items WHERE id = 5"))
	until := now.Add(time.Minute).UnixMicro()
	_, err = f.db.ExecContext(ctx, "UPDATE items SET lease_token = 42, leased_until = ?, deliver_after = ?, attempts = 1 WHERE id = 5", until, until)
	require.NoError(t, err)
	f.us = []store.Undelivered{{LeaseRef: store.LeaseRef{Key: 5, Token: 42}, DeliverAfterUS: was}}
	return f
}

func (f *fixture) row(t *testing.T) store.Item {
	var it store.Item
	require.NoError(t, f.db.GetContext(t.Context(), &it, "SELECT id, attempts, lease_token, leased_until FROM items WHERE id = 5"))
	return it
}

// TestReturnRetriesThroughAFence: a hand-back whose first try meets a
// fenced shard (a failover in flight) is not dropped: it is retried in
// the background and lands once the shard is writable, taking the
// attempt back, long before the item's lease would lapse.
func TestReturnRetriesThroughAFence(t *testing.T) {
	f := newFixture(t)
	r := New(Config{Maps: f.src, Pool: f.pool, Log: slog.New(slog.DiscardHandler)})
	defer r.Stop()

	f.src.fenced.Store(true)
	var ready atomic.Int32
	ok := r.Return("default", 1, f.us, time.Now().Add(time.Minute), func() { ready.Add(1) })
	require.False(t, ok, "the first try met the fence")
	time.Sleep(300 * time.Millisecond)
	require.Equal(t, uint64(42), f.row(t).LeaseToken, "nothing changes while fenced")
	require.Zero(t, ready.Load())

	f.src.fenced.Store(false)
	require.Eventually(t, func() bool {
		it := f.row(t)
		return it.LeaseToken == 0 && !it.LeasedUntil.Valid && it.Attempts == 0
	}, 10*time.Second, 20*time.Millisecond, "handed back once the fence lifts: %+v", f.row(t))
	require.Eventually(t, func() bool { return ready.Load() == 1 }, time.Second, 10*time.Millisecond)
}

// TestReturnLeavesAReservedItemAlone: a retried hand-back that lands after
// the item was served again (another token) changes nothing: the new
// consumer's lease and attempt stand.
func TestReturnLeavesAReservedItemAlone(t *testing.T) {
	f := newFixture(t)
	r := New(Config{Maps: f.src, Pool: f.pool, Log: slog.New(slog.DiscardHandler)})
	defer r.Stop()

	f.src.fenced.Store(true)
	var ready atomic.Int32
	require.False(t, r.Return("default", 1, f.us, time.Now().Add(time.Minute), func() { ready.Add(1) }))
	_, err := f.db.ExecContext(t.Context(), "UPDATE items SET lease_token = 43, attempts = 2 WHERE id = 5")
	require.NoError(t, err)
	f.src.fenced.Store(false)
	require.Eventually(t, func() bool { return ready.Load() == 1 }, 10*time.Second, 10*time.Millisecond)
	it := f.row(t)
	require.Equal(t, uint64(43), it.LeaseToken)
	require.Equal(t, 2, int(it.Attempts))
}

// TestStopEndsRetries: Stop ends a hand-back that cannot land, at once;
// the item is left to its lease.
func TestStopEndsRetries(t *testing.T) {
	f := newFixture(t)
	r := New(Config{Maps: f.src, Pool: f.pool, Log: slog.New(slog.DiscardHandler)})
	f.src.fenced.Store(true)
	require.False(t, r.Return("default", 1, f.us, time.Now().Add(time.Minute), func() { t.Error("ready after Stop") }))
	r.Go("default", 1, f.us, time.Now().Add(time.Minute), func() { t.Error("ready after Stop") })
	stopped := make(chan struct{})
	go func() { r.Stop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(5 * time.Second):
		t.Fatal("Stop waited for a hand-back that cannot land")
	}
	require.False(t, r.Return("default", 1, f.us, time.Now().Add(time.Minute), func() { t.Error("ready after Stop") }))
	f.src.fenced.Store(false)
	require.Equal(t, uint64(42), f.row(t).LeaseToken)
}
