package regions

import (
	"context"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/triage-queue/triage/deploy/mariadb"
	"github.com/triage-queue/triage/regions/replication"
	"github.com/triage-queue/triage/shardmap"
)

// countingHandler passes records on to Handler and counts those whose
// message is msg.
type countingHandler struct {
	slog.Handler
	msg string
	n   *atomic.Int64
}

func (h countingHandler) Handle(ctx context.Context, r slog.Record) error {
	if r.Message == h.msg {
		h.n.Add(1)
	}
	return h.Handler.Handle(ctx, r)
}

func (h countingHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return countingHandler{Handler: h.Handler.WithAttrs(as), msg: h.msg, n: h.n}
}

func (h countingHandler) WithGroup(name string) slog.Handler {
	return countingHandler{Handler: h.Handler.WithGroup(name), msg: h.msg, n: h.n}
}

// TestServerRejoinsOnce: five shards are databases on one primary server
// with two replica servers. Killed, the server's group fails over; back
// with RejoinArgs, the old primary rejoins as a read-only replica of the
// new primary, for every shard's database, through one RejoinAsReplica
// for all five shards: one attempt, none failed, no "rejoin failed" log,
// one "rejoined" event naming the five shards. Run per shard, five
// attempts raced on the one server: some failed (error 1198, a running
// replica), and the others repointed it again, one after another.
// And every rejoin pass reads each listed replica server's status once,
// however many shards list it (per shard: five times).
func TestServerRejoinsOnce(t *testing.T) {
	t.Parallel()
	var failedLogs atomic.Int64
	c := setupShards(t, groupShards, func(cfg *Config) {
		cfg.Logger = slog.New(countingHandler{Handler: cfg.Logger.Handler(), msg: "rejoin failed", n: &failedLogs})
	})
	var pmu sync.Mutex
	var passes []map[string]int
	c.ctl.mu.Lock()
	c.ctl.rejoinReads = func(reads map[string]int) {
		pmu.Lock()
		passes = append(passes, reads)
		pmu.Unlock()
	}
	c.ctl.mu.Unlock()

	old := c.primary.Addr()
	writeEveryShard(t, c, 20)
	require.NoError(t, c.primary.Kill())
	<-c.primary.Wait()
	require.Eventually(t, func() bool {
		for _, s := range c.maps.Current().Shards {
			if s.Primary == old || s.Fenced {
				return false
			}
		}
		return true
	}, 30*time.Second, 50*time.Millisecond, "events: %+v", c.ctl.Events())
	requireMovedTogether(t, c.maps.Current(), old, 20)
	primary := c.maps.Current().Shards[0].Primary
	other := c.replica.Addr()
	if other == primary {
		other = c.replica2.Addr()
	}

	cfg := c.primary.Config()
	cfg.ExtraArgs = append(cfg.ExtraArgs, replication.RejoinArgs()...)
	back, err := mariadb.Start(t.Context(), cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = back.Stop() })
	require.Eventually(t, func() bool { return countSteps(c.ctl)["rejoined"] > 0 },
		30*time.Second, 50*time.Millisecond, "events: %+v", c.ctl.Events())
	requireReplicaOf(t, back, primary)
	require.True(t, waitBothAcknowledge(t, primary), "both replicas acknowledge %s; events: %+v", primary, c.ctl.Events())

	requireEveryShardReplicates(t, c.maps.Current(), old)

	// Two passes more, so that a late attempt would show.
	pmu.Lock()
	seen := len(passes)
	pmu.Unlock()
	require.Eventually(t, func() bool {
		pmu.Lock()
		defer pmu.Unlock()
		return len(passes) >= seen+2
	}, 10*time.Second, 50*time.Millisecond)
	var rejoined []Event
	for _, e := range c.ctl.Events() {
		if e.Step == "rejoined" {
			rejoined = append(rejoined, e)
		}
	}
	t.Logf("rejoined: %+v", rejoined)
	require.Len(t, rejoined, 1, "one rejoin for the server's five shards")
	require.Contains(t, rejoined[0].Details, "shards 1 2 3 4 5 (5,")
	require.Contains(t, rejoined[0].Details, old+" replicates from "+primary)
	require.Equal(t, int64(1), c.ctl.rejoinAttempts.Load(), "RejoinAsReplica calls")
	require.Zero(t, c.ctl.rejoinFailures.Load(), "failed RejoinAsReplica calls")
	require.Zero(t, failedLogs.Load(), `"rejoin failed" logged`)

	pmu.Lock()
	defer pmu.Unlock()
	requireReadOnce(t, passes, old, other)
}

// requireEveryShardReplicates checks that rows written on m's primary
// reach every shard's database on replica, which refuses the
// application's writes.
func requireEveryShardReplicates(t *testing.T, m *shardmap.Map, replica string) {
	t.Helper()
	for _, s := range m.Shards {
		_, err := appDBOf(t, s.Primary, s.Database).Exec("INSERT INTO t VALUES (100)")
		require.NoError(t, err, "shard %d", s.ID)
		db := appDBOf(t, replica, s.Database)
		require.Eventually(t, func() bool {
			var n int
			return db.QueryRow("SELECT COUNT(*) FROM t WHERE id = 100").Scan(&n) == nil && n == 1
		}, 10*time.Second, 50*time.Millisecond, "shard %d replicates to %s", s.ID, replica)
		_, err = db.Exec("INSERT INTO t VALUES (101)")
		require.ErrorContains(t, err, "read-only", "shard %d", s.ID)
	}
}

// requireReadOnce checks that every rejoin pass read each server's status
// once at most, and that the last one read exactly servers.
func requireReadOnce(t *testing.T, passes []map[string]int, servers ...string) {
	t.Helper()
	t.Logf("%d rejoin passes; the last read %v", len(passes), passes[len(passes)-1])
	for i, reads := range passes {
		for server, n := range reads {
			require.Equal(t, 1, n, "pass %d read the status of %s %d times: %v", i, server, n, reads)
		}
	}
	slices.Sort(servers)
	require.Equal(t, servers, slices.Sorted(maps.Keys(passes[len(passes)-1])), "the last pass reads every listed replica server")
}

// requireReplicaOf checks that srv is read-only and replicates from
// primary, both threads running.
func requireReplicaOf(t *testing.T, srv *mariadb.Server, primary string) {
	t.Helper()
	a, err := replication.Open(srv.DSN("") + "&timeout=2s")
	require.NoError(t, err)
	defer a.Close()
	st, err := a.Status(t.Context())
	require.NoError(t, err)
	require.True(t, st.ReadOnly, "%s is read-only", srv.Addr())
	require.Equal(t, replication.RoleReplica, st.Role)
	require.Equal(t, primary, st.PrimaryAddr)
	require.True(t, st.IORunning == "Yes" && st.SQLRunning, "IO %s, SQL %t: %s %s", st.IORunning, st.SQLRunning,
		st.LastIOError, st.LastSQLError)
}

// TestRejoinPlan: the rejoin loop acts on each server listed as a replica
// once, for every shard listing it with the same primary; it leaves out
// the shards of a primary in a failover (fenced or in flight), and marks a server listed as a
// replica of two primaries, or as a replica and a primary.
func TestRejoinPlan(t *testing.T) {
	shard := func(id uint32, primary string, fenced bool, replicas ...string) shardmap.Shard {
		return shardmap.Shard{ID: id, HomeRegion: "a", Primary: primary, Replicas: replicas, Epoch: 1, Fenced: fenced}
	}
	m, err := shardmap.New(shardmap.Map{Version: 1, Regions: []string{"a"}, Shards: []shardmap.Shard{
		shard(3, "p:1", false, "r:1", "r:2"), shard(1, "p:1", false, "r:1", "r:2"), shard(2, "p:1", false, "r:1"),
		shard(4, "q:1", false, "r:2", "s:1"), // r:2 follows p:1 and q:1
		shard(5, "s:1", false, "t:1"),        // s:1 is a replica of q:1 and a primary
		shard(6, "u:1", true, "v:1"),         // u:1 is being failed over: fenced,
		shard(7, "w:1", false, "v:2"),        // and w:1 too: in flight
	}})
	require.NoError(t, err)
	c := &Controller{inflight: map[uint32]bool{7: true}}
	var got []string
	for _, srv := range c.rejoinPlan(m) {
		var ts []string
		for _, tg := range srv.targets {
			ts = append(ts, tg.primary+"["+shardIDs(tg.shards)+"]")
		}
		got = append(got, srv.addr+" <- "+strings.Join(ts, " ")+" primary of ["+shardIDs(srv.primaryOf)+"]")
	}
	require.Equal(t, []string{
		"r:1 <- p:1[1 2 3] primary of []",
		"r:2 <- p:1[1 3] q:1[4] primary of []",
		"s:1 <- q:1[4] primary of [5]",
		"t:1 <- s:1[5] primary of []",
	}, got)
}
