package regions

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/triage-queue/triage/cmd/triage/natsserver/natstest"
	"github.com/triage-queue/triage/deploy/mariadb"
	"github.com/triage-queue/triage/deploy/mariadb/mariadbtest"
	"github.com/triage-queue/triage/regions/replication"
	"github.com/triage-queue/triage/schema"
	"github.com/triage-queue/triage/schema/metrics"
	"github.com/triage-queue/triage/shardmap"
	"github.com/triage-queue/triage/shardmap/shardmaptest"
)

func TestMain(m *testing.M) { os.Exit(mariadbtest.MainCheckingLeaks(m)) }

var (
	repl = replication.Credentials{User: "repl", Password: "repl-secret"}
	app  = replication.Credentials{User: "triage", Password: "triage-secret"}
)

// cluster is one shard (primary in region a, replicas in regions b and c,
// as in the three-region bed), an embedded NATS server, observers in
// regions a, b and c, and a controller.
type cluster struct {
	t        *testing.T
	primary  *mariadb.Server
	replica  *mariadb.Server // in region b, the preferred one
	replica2 *mariadb.Server // in region c
	maps     *shardmap.Holder
	ctl      *Controller
	ctlNC    *nats.Conn              // ctl's own connection, so a test can cut it off
	ctlKV    *shardmaptest.LaggingKV // ctl's view of the map bucket, so a test can make it lag
	natsURL  string
}

func start(t *testing.T, id int) *mariadb.Server {
	s, err := mariadb.Start(t.Context(), mariadb.Config{Dir: t.TempDir(), ServerID: id})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Stop() })
	return s
}

func setup(t *testing.T, opts ...func(*Config)) *cluster {
	t.Helper()
	return setupShards(t, 1, opts...)
}

// setupShards is setup with n shards, IDs 1 to n, as databases
// (shardDB) on the same three servers: one primary server, two replica
// servers.
func setupShards(t *testing.T, n int, opts ...func(*Config)) *cluster {
	t.Helper()
	ctx := t.Context()
	var p, r, r2 *mariadb.Server
	var wg sync.WaitGroup
	wg.Go(func() { p = start(t, 1) })
	wg.Go(func() { r = start(t, 2) })
	wg.Go(func() { r2 = start(t, 3) })
	wg.Wait()
	require.NotNil(t, p)
	require.NotNil(t, r)
	require.NotNil(t, r2)
	pa, err := replication.Open(p.DSN(""))
	require.NoError(t, err)
	defer pa.Close()
	require.NoError(t, pa.EnsureUsers(ctx, repl, app))
	require.NoError(t, pa.EnableSemiSync(ctx, true))
	for _, s := range []*mariadb.Server{r, r2} {
		ra, err := replication.Open(s.DSN(""))
		require.NoError(t, err)
		require.NoError(t, ra.EnsureUsers(ctx, repl, app))
		require.NoError(t, ra.ReplicateFrom(ctx, p.Addr(), repl))
		ra.Close()
	}
	if !assert.Eventually(t, func() bool {
		ss, err := pa.SemiSyncStatus(ctx)
		return err == nil && ss.Clients == 2
	}, 20*time.Second, 20*time.Millisecond, "both replicas acknowledge") {
		// Say why: a CI run once failed here with no more to go on.
		ss, err := pa.SemiSyncStatus(ctx)
		t.Logf("primary %s semi-sync: %+v (err %v)", p.Addr(), ss, err)
		for _, s := range []*mariadb.Server{r, r2} {
			if ra, err := replication.Open(s.DSN("")); err == nil {
				st, err := ra.Status(ctx)
				t.Logf("replica %s: %+v (err %v)", s.Addr(), st, err)
				ra.Close()
			}
		}
		t.FailNow()
	}
	root := sqlOpen(t, p.DSN(""))
	var shards []shardmap.Shard
	for id := range uint32(n) {
		db := shardDB(id + 1)
		_, err = root.Exec("CREATE DATABASE IF NOT EXISTS " + db)
		require.NoError(t, err)
		_, err = root.Exec("CREATE TABLE " + db + ".t (id INT PRIMARY KEY)")
		require.NoError(t, err)
		_, err = schema.Migrate(ctx, sqlOpen(t, p.DSN(db)+"&multiStatements=true"))
		require.NoError(t, err)
		// The application account is granted "triage" alone (EnsureUsers'
		// default); the grants of the others replicate. Not "triage" again:
		// a GRANT is no transaction, and one in the binary log beyond the
		// position a killed primary truncates to when it restarts with
		// RejoinArgs fails its crash recovery ("unsafe statement is found
		// ... beyond the truncation position").
		if db != "triage" {
			_, err = root.Exec("GRANT SELECT, INSERT, UPDATE, DELETE ON `" + db + "`.* TO '" + app.User + "'@'%'")
			require.NoError(t, err)
		}
		shards = append(shards, shardmap.Shard{ID: id + 1, HomeRegion: "a", Primary: p.Addr(), Database: db,
			Replicas: []string{r.Addr(), r2.Addr()}, ReplicaRegions: []string{"b", "c"}, Epoch: 1})
	}

	nc, js := natstest.JetStream(t)
	m, err := shardmap.New(shardmap.Map{Version: 1, Regions: []string{"a", "b", "c"}, Shards: shards})
	require.NoError(t, err)
	kv, err := shardmap.OpenBucket(ctx, js, 1)
	require.NoError(t, err)
	_, err = shardmap.Bootstrap(ctx, kv, m)
	require.NoError(t, err)
	maps := shardmap.NewHolder(m)
	runCtx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go shardmap.Watch(runCtx, js, kv, maps, discard())
	hkv, err := OpenHealth(ctx, js, 1)
	require.NoError(t, err)
	for _, region := range []string{"a", "b", "c"} {
		o := &Observer{Region: region, Maps: maps, Dial: func(a string) string { return a }, KV: hkv, Logger: discard()}
		go o.Run(runCtx)
	}
	c := &cluster{t: t, primary: p, replica: r, replica2: r2, maps: maps, natsURL: nc.ConnectedUrl()}
	c.ctl, c.ctlNC, c.ctlKV = c.newController("ctl-1", opts...)
	require.Eventually(t, c.ctl.isLeader, 10*time.Second, 20*time.Millisecond)
	return c
}

// newController starts a controller as a separate node would run it: its
// own NATS connection, shard-map holder and watch.
func (c *cluster) newController(id string, opts ...func(*Config)) (*Controller, *nats.Conn, *shardmaptest.LaggingKV) {
	t := c.t
	nc, err := nats.Connect(c.natsURL, nats.MaxReconnects(0))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	bucket, err := shardmap.OpenBucket(t.Context(), js, 1)
	require.NoError(t, err)
	kv := &shardmaptest.LaggingKV{KeyValue: bucket}
	m, err := shardmap.Load(t.Context(), kv)
	require.NoError(t, err)
	maps := shardmap.NewHolder(m)
	runCtx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go shardmap.Watch(runCtx, js, kv, maps, discard())
	cfg := Config{ID: id, Region: "c", Maps: maps, MapKV: kv, NC: nc, JS: js, Repl: repl,
		Metrics: metrics.New(prometheus.NewRegistry(), metrics.Options{}),
		Detect:  time.Second, Cooldown: time.Minute, Logger: slog.New(slog.NewTextHandler(os.Stderr, nil)).With("ctl", id)}
	for _, o := range opts {
		o(&cfg)
	}
	ctl, err := New(cfg)
	require.NoError(t, err)
	require.NoError(t, ctl.Run(runCtx))
	return ctl, nc, kv
}

func discard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func sqlOpen(t *testing.T, dsn string) *sql.DB {
	db, err := sql.Open("mysql", dsn)
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	return db
}

// shardDB is the database of shard id in the clusters setupShards makes:
// the first shard's is "triage", as a lone shard's is.
func shardDB(id uint32) string {
	if id == 1 {
		return "triage"
	}
	return fmt.Sprintf("triage%d", id)
}

func appDB(t *testing.T, addr string) *sql.DB { return appDBOf(t, addr, "triage") }

// appDBOf opens database db on addr as the application.
func appDBOf(t *testing.T, addr, db string) *sql.DB {
	c := mysql.NewConfig()
	c.User, c.Passwd, c.Net, c.Addr, c.DBName = app.User, app.Password, "tcp", addr, db
	c.Timeout = 2 * time.Second
	return sqlOpen(t, c.FormatDSN())
}

// TestFailoverOnPrimaryKill: kill -9 the primary; observers in several
// regions report it down; the controller fences, waits out stale writers,
// promotes the replica and publishes it, with every committed row there.
func TestFailoverOnPrimaryKill(t *testing.T) {
	t.Parallel()
	c := setup(t)
	pdb := appDB(t, c.primary.Addr())
	for i := 1; i <= 50; i++ {
		_, err := pdb.Exec("INSERT INTO t VALUES (?)", i)
		require.NoError(t, err)
	}
	// Both replicas hold every row before the kill: semi-sync needs one
	// acknowledgement, and a replica a row behind would rightly not be
	// promoted (a run under -race promoted the other one, in region c).
	for _, r := range []*mariadb.Server{c.replica, c.replica2} {
		rdb := appDB(t, r.Addr())
		require.Eventually(t, func() bool {
			var n int
			return rdb.QueryRow("SELECT COUNT(*) FROM t").Scan(&n) == nil && n == 50
		}, 10*time.Second, 20*time.Millisecond)
	}
	killed := time.Now()
	require.NoError(t, c.primary.Kill())
	require.Eventually(t, func() bool {
		s, _ := c.maps.Current().Shard(1)
		return s.Primary == c.replica.Addr() && !s.Fenced
	}, 30*time.Second, 50*time.Millisecond)
	rto := time.Since(killed)
	t.Logf("failover published %s after the kill; events: %+v", rto.Round(time.Millisecond), c.ctl.Events())
	s, _ := c.maps.Current().Shard(1)
	require.Equal(t, uint64(2), s.Epoch)
	require.Equal(t, "b", s.PrimaryRegion)
	require.Equal(t, []string{c.replica2.Addr(), c.primary.Addr()}, s.Replicas, "the old primary is listed to rejoin")
	require.NoError(t, c.maps.Writable(1))
	rdb := appDB(t, c.replica.Addr())
	var n int
	require.NoError(t, rdb.QueryRow("SELECT COUNT(*) FROM t").Scan(&n))
	require.Equal(t, 50, n, "every acknowledged row is on the new primary")
	_, err := rdb.Exec("INSERT INTO t VALUES (51)")
	require.NoError(t, err, "the promoted replica takes application writes")
	require.Less(t, rto, 15*time.Second)
}

// TestPlannedSwitchoverAndRejoin: a planned switchover makes the old
// primary read-only first and loses nothing; the old primary then rejoins
// as a replica of the new one and refuses application writes.
func TestPlannedSwitchoverAndRejoin(t *testing.T) {
	t.Parallel()
	c := setup(t)
	pdb := appDB(t, c.primary.Addr())
	for i := 1; i <= 20; i++ {
		_, err := pdb.Exec("INSERT INTO t VALUES (?)", i)
		require.NoError(t, err)
	}
	before := c.ctl.cfg.Maps.Current()
	stored, err := c.ctlKV.KeyValue.Get(t.Context(), shardmap.Key)
	require.NoError(t, err)
	res, err := c.ctl.Failover(t.Context(), FailoverRequest{Shard: 1, ToRegion: "b", Planned: true})
	require.NoError(t, err)
	require.Equal(t, c.replica.Addr(), res.NewPrimary)
	steps := map[string]bool{}
	for _, e := range res.Events {
		steps[e.Step] = true
	}
	require.True(t, steps["old-primary-read-only"] && steps["promoted"] && steps["published"], "%+v", res.Events)
	reg := c.ctl.cfg.Metrics.Registry
	require.Equal(t, 1.0, gathered(t, reg, "triage_failovers_total", "kind", "planned", "result", "done"))
	require.Equal(t, 1.0, gathered(t, reg, "triage_failover_phase_duration_seconds", "step", "published"))
	rdb := appDB(t, c.replica.Addr())
	var n int
	require.NoError(t, rdb.QueryRow("SELECT COUNT(*) FROM t").Scan(&n))
	require.Equal(t, 20, n)
	_, err = rdb.Exec("INSERT INTO t VALUES (21)")
	require.NoError(t, err)
	// The old primary rejoins as a replica: it gets row 21 and stays
	// read-only for the application.
	require.Eventually(t, func() bool {
		var got int
		return pdb.QueryRow("SELECT COUNT(*) FROM t").Scan(&got) == nil && got == 21
	}, 20*time.Second, 100*time.Millisecond)
	_, err = pdb.Exec("INSERT INTO t VALUES (22)")
	require.Error(t, err)
	require.Contains(t, err.Error(), "read-only")
	// A rejoin pass run with the map from before the switchover (a
	// controller back from a partition leads with the map it had) sees the
	// new primary as a replica that replicates from the wrong server. It
	// must not demote it: the stored map names it primary at epoch 2.
	c.ctl.rejoin(t.Context(), before)
	_, err = rdb.Exec("INSERT INTO t VALUES (23)")
	require.NoError(t, err, "a rejoin from a stale map demoted the new primary")
	// Nor when the bucket's copy it reads lags too (its NATS server is back
	// from the same partition and has not caught up): it agrees with the
	// stale map, and only a read the bucket's leader commits tells.
	c.ctlKV.Lag.Store(stored.Revision())
	c.ctl.rejoin(t.Context(), before)
	c.ctlKV.Lag.Store(0)
	_, err = rdb.Exec("INSERT INTO t VALUES (24)")
	require.NoError(t, err, "a rejoin from a stale map, confirmed by a lagging read, demoted the new primary")
	// A planned switchover of a shard whose primary is down is refused.
	require.NoError(t, c.replica.Kill())
	_, err = c.ctl.Failover(t.Context(), FailoverRequest{Shard: 1, Planned: true})
	require.Error(t, err)
	require.Eventually(t, func() bool {
		s, _ := c.maps.Current().Shard(1)
		return !s.Fenced
	}, 10*time.Second, 20*time.Millisecond, "a refused planned switchover unfences")
	require.Equal(t, 1.0, gathered(t, reg, "triage_failovers_total", "kind", "planned", "result", "failed"))
}

// gathered returns the value (a histogram's count) of the sample of name
// in reg whose labels include the pairs kv; 0 if none.
func gathered(t *testing.T, reg *prometheus.Registry, name string, kv ...string) float64 {
	t.Helper()
	fams, err := reg.Gather()
	require.NoError(t, err)
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
	next:
		for _, m := range f.Metric {
			have := map[string]string{}
			for _, l := range m.Label {
				have[l.GetName()] = l.GetValue()
			}
			for i := 0; i+1 < len(kv); i += 2 {
				if have[kv[i]] != kv[i+1] {
					continue next
				}
			}
			if h := m.GetHistogram(); h != nil {
				return float64(h.GetSampleCount())
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}

// TestEmergencyFailoverWaitsForTheCandidate: with the old primary
// reachable, a failover to a replica that has not applied acknowledged
// commits must not promote it: the controller makes the old primary
// read-only, waits for the candidate to apply the old primary's binlog
// position, and, when it cannot, refuses and gives the shard back to the
// old primary.
//
// The candidate is held behind by a global read lock on it, which blocks
// its applier (the IO thread still receives). Stopping its IO thread
// raced the leader's rejoin loop, which restarts a stopped IO thread
// within a second by design: once, under load, the candidate caught up
// before the failover ran.
func TestEmergencyFailoverWaitsForTheCandidate(t *testing.T) {
	t.Parallel()
	c := setup(t)
	pdb := appDB(t, c.primary.Addr())
	for i := 1; i <= 10; i++ {
		_, err := pdb.Exec("INSERT INTO t VALUES (?)", i)
		require.NoError(t, err)
	}
	rdb := appDB(t, c.replica.Addr())
	require.Eventually(t, func() bool {
		var n int
		return rdb.QueryRow("SELECT COUNT(*) FROM t").Scan(&n) == nil && n == 10
	}, 10*time.Second, 20*time.Millisecond)
	lock, err := sqlOpen(t, c.replica.DSN("")).Conn(t.Context())
	require.NoError(t, err)
	defer lock.Close() // ends the session, and its lock, even if the test fails
	_, err = lock.ExecContext(t.Context(), "FLUSH TABLES WITH READ LOCK")
	require.NoError(t, err)
	for i := 11; i <= 20; i++ {
		_, err := pdb.Exec("INSERT INTO t VALUES (?)", i)
		require.NoError(t, err)
	}
	_, err = c.ctl.Failover(t.Context(), FailoverRequest{Shard: 1, ToRegion: "b"})
	require.Error(t, err, "the candidate lacks acknowledged rows 11-20")
	t.Logf("refused: %v", err)
	require.Eventually(t, func() bool {
		s, _ := c.maps.Current().Shard(1)
		return s.Primary == c.primary.Addr() && !s.Fenced
	}, 10*time.Second, 20*time.Millisecond, "the refused failover unfenced the shard, old primary kept")
	var n int
	require.NoError(t, rdb.QueryRow("SELECT COUNT(*) FROM t").Scan(&n))
	require.Equal(t, 10, n)
	_, err = pdb.Exec("INSERT INTO t VALUES (21)")
	require.NoError(t, err, "the old primary serves again")
	_, err = lock.ExecContext(t.Context(), "UNLOCK TABLES")
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		return rdb.QueryRow("SELECT COUNT(*) FROM t").Scan(&n) == nil && n == 21
	}, 10*time.Second, 20*time.Millisecond, "the candidate, released, replicates from the old primary again")
}

// cutOffAt cuts controller a off from NATS (not from MySQL) when it
// reaches step the first time, and holds it there until b leads.
func (c *cluster) cutOffAt(a, b *Controller, step string) {
	var cut atomic.Bool
	a.stepHook = func(_ uint32, s string) {
		if s != step || !cut.CompareAndSwap(false, true) {
			return
		}
		c.ctlNC.Close()
		deadline := time.Now().Add(20 * time.Second)
		for !b.isLeader() && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// TestTwoControllersOnePromotion: the leader is cut off from NATS (not from
// MySQL) in the middle of a failover, after fencing and before promoting.
// It must notice it lost the lease and stop; the new leader finishes the
// failover. Exactly one replica is promoted, once.
func TestTwoControllersOnePromotion(t *testing.T) {
	t.Parallel()
	c := setup(t)
	a := c.ctl
	b, _, _ := c.newController("ctl-2")
	c.cutOffAt(a, b, "promote")
	pdb := appDB(t, c.primary.Addr())
	for i := 1; i <= 20; i++ {
		_, err := pdb.Exec("INSERT INTO t VALUES (?)", i)
		require.NoError(t, err)
	}
	require.NoError(t, c.primary.Kill())
	bmaps := b.cfg.Maps
	require.Eventually(t, func() bool {
		s, _ := bmaps.Current().Shard(1)
		return s.Primary != c.primary.Addr() && !s.Fenced
	}, 60*time.Second, 50*time.Millisecond)
	promotions := 0
	for _, ctl := range []*Controller{a, b} {
		for _, e := range ctl.Events() {
			if e.Step == "promoted" {
				promotions++
			}
		}
	}
	t.Logf("a: %+v", a.Events())
	t.Logf("b: %+v", b.Events())
	require.Equal(t, 1, promotions, "one promotion for the shard and epoch")
	for _, e := range a.Events() {
		require.NotEqual(t, "promoted", e.Step, "the cut-off controller promoted after losing its lease")
	}
	s, _ := bmaps.Current().Shard(1)
	require.Equal(t, uint64(2), s.Epoch)
	var n int
	require.NoError(t, appDB(t, s.Primary).QueryRow("SELECT COUNT(*) FROM t").Scan(&n))
	require.Equal(t, 20, n)
}
