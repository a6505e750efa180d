package regions

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/triage-queue/triage/shardmap"
)

// groupShards is how many shards the group tests put on one primary
// server.
const groupShards = 5

// writeEveryShard inserts rows 1 to n into every shard's table t on the
// primary server.
func writeEveryShard(t *testing.T, c *cluster, n int) {
	t.Helper()
	for _, s := range c.maps.Current().Shards {
		db := appDBOf(t, s.Primary, s.Database)
		for i := 1; i <= n; i++ {
			_, err := db.Exec("INSERT INTO t VALUES (?)", i)
			require.NoError(t, err, "shard %d", s.ID)
		}
	}
}

// requireMovedTogether checks that every shard of m left old for one new
// primary, unfenced, at epoch 2 (one failover each), and that the new
// primary holds the rows acknowledged on the old one and takes writes.
func requireMovedTogether(t *testing.T, m *shardmap.Map, old string, rows int) {
	t.Helper()
	require.Len(t, m.Shards, groupShards)
	primary := m.Shards[0].Primary
	require.NotEqual(t, old, primary)
	for _, s := range m.Shards {
		require.Equal(t, primary, s.Primary, "shard %d: every shard of the dead server has the same new primary", s.ID)
		require.False(t, s.Fenced, "shard %d", s.ID)
		require.Equal(t, uint64(2), s.Epoch, "shard %d: one failover moves its epoch by one", s.ID)
		require.Contains(t, s.Replicas, old, "shard %d: the old primary is listed to rejoin", s.ID)
		db := appDBOf(t, primary, s.Database)
		var n int
		require.NoError(t, db.QueryRow("SELECT COUNT(*) FROM t").Scan(&n))
		require.Equal(t, rows, n, "shard %d: every acknowledged row is on the new primary", s.ID)
		_, err := db.Exec("INSERT INTO t VALUES (?)", rows+1)
		require.NoError(t, err, "shard %d: the new primary takes application writes", s.ID)
	}
}

// countSteps counts the events of ctl by step.
func countSteps(ctl *Controller) map[string]int {
	n := map[string]int{}
	for _, e := range ctl.Events() {
		n[e.Step]++
	}
	return n
}

// TestServerFailoverMovesEveryShard: five shards are databases on one
// primary server, with the same two replica servers. Killing the primary
// fails them over together: one detection, one fence publish, one
// promotion, one publish of the new map; every shard gets the same new
// primary, its epoch moves by one, and no acknowledged row is missing.
func TestServerFailoverMovesEveryShard(t *testing.T) {
	t.Parallel()
	c := setupShards(t, groupShards)
	old := c.primary.Addr()
	writeEveryShard(t, c, 20)
	before, err := shardmap.Load(t.Context(), c.ctlKV.KeyValue)
	require.NoError(t, err)
	killed := time.Now()
	require.NoError(t, c.primary.Kill())
	require.Eventually(t, func() bool {
		for _, s := range c.maps.Current().Shards {
			if s.Primary == old || s.Fenced {
				return false
			}
		}
		return true
	}, 30*time.Second, 50*time.Millisecond, "events: %+v", c.ctl.Events())
	t.Logf("%d shards published on their new primary %s after the kill; events: %+v",
		groupShards, time.Since(killed).Round(time.Millisecond), c.ctl.Events())
	requireMovedTogether(t, c.maps.Current(), old, 20)
	after, err := shardmap.Load(t.Context(), c.ctlKV.KeyValue)
	require.NoError(t, err)
	// A failover of one shard publishes twice (fenced, then moved); one
	// per shard would have published 2 × groupShards maps.
	published := after.Version - before.Version
	t.Logf("map versions published for the group: %d", published)
	require.Equal(t, uint64(2), published, "one fence publish and one publish of the new primary for the whole group")
	steps := countSteps(c.ctl)
	require.Equal(t, 1, steps["detected"], "%+v", steps)
	require.Equal(t, 1, steps["fenced"], "%+v", steps)
	require.Equal(t, 1, steps["promoted"], "%+v", steps)
	require.Equal(t, 1, steps["published"], "%+v", steps)
}

// TestServerFailoverResumedByAnotherController: the leader is cut off
// from NATS right after the group's fence publish (every shard fenced at
// epoch 2, nothing promoted). The next leader resumes the group and
// finishes every shard: one promotion in all, each shard at epoch 2 (b
// resumed the fenced group rather than fencing it again), nothing
// acknowledged lost.
func TestServerFailoverResumedByAnotherController(t *testing.T) {
	t.Parallel()
	c := setupShards(t, groupShards)
	a := c.ctl
	b, _, _ := c.newController("ctl-2")
	c.cutOffAt(a, b, "read-only")
	old := c.primary.Addr()
	writeEveryShard(t, c, 20)
	require.NoError(t, c.primary.Kill())
	bmaps := b.cfg.Maps
	require.Eventually(t, func() bool {
		for _, s := range bmaps.Current().Shards {
			if s.Primary == old || s.Fenced {
				return false
			}
		}
		return true
	}, 60*time.Second, 50*time.Millisecond, "b: %+v", b.Events())
	t.Logf("a: %+v", a.Events())
	t.Logf("b: %+v", b.Events())
	sa, sb := countSteps(a), countSteps(b)
	require.Equal(t, 1, sa["fenced"], "a fenced the group: %+v", sa)
	require.Zero(t, sa["promoted"], "the cut-off controller promoted after losing its lease")
	require.Equal(t, 1, sb["promoted"], "one promotion for the group: %+v", sb)
	requireMovedTogether(t, bmaps.Current(), old, 20)
}

// TestGroups: shards fail over together when their primary server and
// replicas are the same; a shard of the same server whose replicas are
// listed otherwise is a group of its own.
func TestGroups(t *testing.T) {
	shard := func(id uint32, primary string, replicas ...string) shardmap.Shard {
		return shardmap.Shard{ID: id, Primary: primary, Replicas: replicas}
	}
	got := groups([]shardmap.Shard{shard(4, "p:1", "r:1", "r:2"), shard(1, "p:1", "r:1", "r:2"), shard(2, "p:1", "r:1"),
		shard(3, "q:1", "r:1", "r:2"), shard(5, "p:1", "r:1", "r:2")})
	var idsOf [][]uint32
	for _, g := range got {
		idsOf = append(idsOf, ids(g))
	}
	require.Equal(t, [][]uint32{{1, 4, 5}, {2}, {3}}, idsOf)
}
