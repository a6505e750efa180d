package shardmap

import (
	"database/sql"
	"os"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"

	"github.com/triage-queue/triage/deploy/mariadb/mariadbtest"
	"github.com/triage-queue/triage/schema"
)

func TestMain(m *testing.M) { os.Exit(mariadbtest.Main(m)) }

// TestWriterChecksTheEpoch: a writer whose map is older than the epoch the
// failover controller stored on the primary has missed a failover: it gets
// ErrNotWritable, even though its map names that server (a primary again,
// e.g. after a failback). A map at that epoch or later writes.
func TestWriterChecksTheEpoch(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	dsn := mariadbtest.Database(t)
	cfg, err := mysql.ParseDSN(dsn)
	require.NoError(t, err)
	cfg.MultiStatements = true
	root, err := sql.Open("mysql", cfg.FormatDSN())
	require.NoError(t, err)
	t.Cleanup(func() { root.Close() })
	_, err = schema.Migrate(ctx, root)
	require.NoError(t, err)

	mapAt := func(epoch uint64) *Holder {
		m, err := New(Map{Version: epoch, Regions: []string{"a", "b"}, Shards: []Shard{{ID: 1, HomeRegion: "a",
			Primary: cfg.Addr, Database: cfg.DBName, Replicas: []string{"127.0.0.1:1"}, ReplicaRegions: []string{"b"}, Epoch: epoch}}})
		require.NoError(t, err)
		return NewHolder(m)
	}
	pool := NewPool(Credentials{User: cfg.User, Password: cfg.Passwd})
	t.Cleanup(func() { pool.Close() })
	old := mapAt(3)
	_, err = pool.Writer(old, 1)
	require.NoError(t, err, "no epoch stored: the shard never failed over")

	// The controller promotes this server at epoch 5.
	_, err = root.ExecContext(ctx, "INSERT INTO shard_meta (id, epoch) VALUES (1, 5)")
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		old.Touch() // the map is confirmed; only the epoch can stop it
		_, err := pool.Writer(old, 1)
		return err != nil
	}, 5*time.Second, 20*time.Millisecond, "a map at epoch 3 must not write to a primary at epoch 5")
	_, err = pool.Writer(old, 1)
	require.ErrorIs(t, err, ErrNotWritable)
	require.ErrorContains(t, err, "epoch 5")
	for _, e := range []uint64{5, 6} {
		db, err := pool.Writer(mapAt(e), 1)
		require.NoError(t, err, "map at epoch %d", e)
		require.NoError(t, db.PingContext(ctx))
	}
}

// TestClosedPoolOpensNothing: a call that comes after Close (a loop still
// winding down when its node stopped) gets ErrPoolClosed and opens no
// pool that nobody would close.
func TestClosedPoolOpensNothing(t *testing.T) {
	t.Parallel()
	m, err := New(Map{Version: 1, Regions: []string{"a"}, Shards: []Shard{{ID: 1, HomeRegion: "a",
		Primary: "127.0.0.1:1", Database: "triage"}}})
	require.NoError(t, err)
	pool := NewPool(Credentials{})
	_, _, err = pool.Primary(m, 1)
	require.NoError(t, err, "opening a pool dials nothing yet")
	require.NoError(t, pool.Close())
	_, _, err = pool.Primary(m, 1)
	require.ErrorIs(t, err, ErrPoolClosed)
	_, err = pool.Writer(NewHolder(m), 1)
	require.ErrorIs(t, err, ErrPoolClosed)
	pool.mu.Lock()
	defer pool.mu.Unlock()
	require.Empty(t, pool.dbs, "a closed pool holds no connection pool")
}

// TestPoolDSNFollowsTheShard: DSN is cached, so the cache must be keyed by
// everything a shard's DSN depends on: a shard moved to another primary or
// database gets a pool of its own, never the old one's.
func TestPoolDSNFollowsTheShard(t *testing.T) {
	pool := NewPool(Credentials{User: "app", DialVia: map[string]string{"10.0.0.2:3306": "127.0.0.1:4000"}})
	t.Cleanup(func() { pool.Close() })
	a := Shard{ID: 1, Primary: "10.0.0.1:3306", Database: "triage_1"}
	moved := a
	moved.Primary = "10.0.0.2:3306"
	renamed := a
	renamed.Database = "triage_9"
	dsns := map[string]bool{}
	for _, s := range []Shard{a, moved, renamed, a, moved} {
		dsn := pool.DSN(s)
		require.Equal(t, pool.formatDSN(s), dsn)
		cfg, err := mysql.ParseDSN(dsn)
		require.NoError(t, err)
		require.Equal(t, pool.Addr(s.Primary), cfg.Addr)
		require.Equal(t, s.Database, cfg.DBName)
		dsns[dsn] = true
	}
	require.Len(t, dsns, 3)
}

// TestPruneClosesTheFormerPrimarysPool: once the map moves a shard, the
// pool to its former primary is closed by the second Prune that finds it
// not handed out since the one before (the grace for work in flight),
// while the current primary's pool is never closed, and a call for the
// former primary afterwards gets a new, working pool.
func TestPruneClosesTheFormerPrimarysPool(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	a, err := mysql.ParseDSN(mariadbtest.Database(t))
	require.NoError(t, err)
	b, err := mysql.ParseDSN(mariadbtest.Database(t))
	require.NoError(t, err)
	mapOn := func(version uint64, c *mysql.Config) *Map {
		m, err := New(Map{Version: version, Regions: []string{"a"}, Shards: []Shard{{ID: 1, HomeRegion: "a", Primary: c.Addr, Database: c.DBName}}})
		require.NoError(t, err)
		return m
	}
	before, after := mapOn(1, a), mapOn(2, b) // a failover moved shard 1
	pool := NewPool(Credentials{User: a.User, Password: a.Passwd})
	t.Cleanup(func() { pool.Close() })
	former, err := pool.Writer(NewHolder(before), 1) // checks and keeps the epoch
	require.NoError(t, err)
	require.NoError(t, former.PingContext(ctx))
	current, _, err := pool.Primary(after, 1)
	require.NoError(t, err)

	require.Zero(t, pool.Prune(after), "handed out since the last prune: kept for work in flight")
	require.NoError(t, former.PingContext(ctx))
	require.Equal(t, 1, pool.Prune(after))
	require.ErrorContains(t, former.PingContext(ctx), "database is closed")
	for range 3 {
		require.Zero(t, pool.Prune(after), "the current primary's pool stays")
		require.NoError(t, current.PingContext(ctx))
	}

	again, _, err := pool.Primary(before, 1) // failed back
	require.NoError(t, err)
	require.NotSame(t, former, again)
	require.NoError(t, again.PingContext(ctx))
	require.Zero(t, pool.Prune(after))
	_, _, err = pool.Primary(before, 1) // still in use
	require.NoError(t, err)
	require.Zero(t, pool.Prune(after))
	require.Equal(t, 1, pool.Prune(after))
	want := pool.DSN(after.Shards[0])
	pool.mu.Lock()
	defer pool.mu.Unlock()
	require.Len(t, pool.dbs, 1)
	require.Contains(t, pool.dbs, want)
	require.Empty(t, pool.epochs, "the former primary's epoch check is forgotten")
	require.Equal(t, map[dsnKey]string{{primary: b.Addr, database: b.DBName}: want}, pool.dsns)
}
