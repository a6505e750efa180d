package regions

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/triage-queue/triage/regions/replication"
	"github.com/triage-queue/triage/shardmap"
)

// The rejoin loop acts on servers, not shards. A replica's status, its
// read_only and what it replicates from are the server's, whatever
// databases it holds, so a server listed as a replica of many shards is
// read once a pass and rejoined once, for all of them: a target is the
// shards that list one server as a replica of one primary. Per shard, a
// deposed server that had held 26 shards' primaries was read 26 times a
// second and, once back, given 26 RejoinAsReplica at once: 23 failed
// within 18 ms (error 1198, a running replica), and the others repointed
// the server one after another.

// A rejoinTarget is what one server listed as a replica should do:
// replicate from primary, reached at want, for shards (in ID order).
type rejoinTarget struct {
	server  string
	primary string
	want    string // primary as the server reaches it (ReplicationVia), as its first shard lists it
	shards  []shardmap.Shard
}

// A rejoinServer is one server the rejoin loop looks at: its targets
// (one, unless the map lists it as a replica of several primaries) and
// the shards the map names it the primary of (none, unless the map lists
// it as both).
type rejoinServer struct {
	addr      string
	targets   []*rejoinTarget
	primaryOf []shardmap.Shard
}

// rejoinPlan returns the servers m lists as replicas, each with its
// targets, in the order of the first shard (by ID) listing them. It leaves
// out the shards of a busy primary (one of its shards is fenced or in a
// failover): the map is about to name another.
func (c *Controller) rejoinPlan(m *shardmap.Map) []*rejoinServer {
	shards := m.Shards // in ID order
	busy := map[string]bool{}
	primaryOf := map[string][]shardmap.Shard{}
	c.mu.Lock()
	for _, s := range shards {
		busy[s.Primary] = busy[s.Primary] || s.Fenced || c.inflight[s.ID]
		primaryOf[s.Primary] = append(primaryOf[s.Primary], s)
	}
	c.mu.Unlock()
	by := map[string]*rejoinServer{}
	var out []*rejoinServer
	for _, s := range shards {
		if busy[s.Primary] {
			continue
		}
		for j, r := range s.Replicas {
			srv := by[r]
			if srv == nil {
				srv = &rejoinServer{addr: r, primaryOf: primaryOf[r]}
				by[r] = srv
				out = append(out, srv)
			}
			i := slices.IndexFunc(srv.targets, func(t *rejoinTarget) bool { return t.primary == s.Primary })
			if i < 0 {
				region := ""
				if j < len(s.ReplicaRegions) {
					region = s.ReplicaRegions[j]
				}
				i = len(srv.targets)
				srv.targets = append(srv.targets, &rejoinTarget{server: r, primary: s.Primary, want: c.via(region, s.Primary)})
			}
			t := srv.targets[i]
			if n := len(t.shards); n == 0 || t.shards[n-1].ID != s.ID {
				t.shards = append(t.shards, s)
			}
		}
	}
	return out
}

// rejoin repoints listed replicas that answer but do not replicate from
// their shards' current primary: a deposed primary coming back. Servers
// are looked at in parallel (one cut off costs its connect timeout, not
// everyone's), each once.
func (c *Controller) rejoin(ctx context.Context, m *shardmap.Map) {
	// One proof that the stored map is current serves the whole pass:
	// LoadCurrent rewrites the map at the revision it read, so targets
	// proving it each for themselves, in parallel, conflict with one
	// another and all but one skip their rejoin, pass after pass, while
	// the primary waits for a replica to acknowledge its commits.
	current := sync.OnceValues(func() (*shardmap.Map, error) { return shardmap.LoadCurrent(ctx, c.cfg.MapKV, m) })
	plan := c.rejoinPlan(m)
	reads := make([]int, len(plan))
	var wg sync.WaitGroup
	for i, srv := range plan {
		wg.Go(func() { reads[i] = c.rejoinServer(ctx, srv, current) })
	}
	wg.Wait()
	c.mu.Lock()
	hook := c.rejoinReads
	c.mu.Unlock()
	if hook != nil {
		by := map[string]int{}
		for i, srv := range plan {
			if reads[i] > 0 {
				by[srv.addr] += reads[i]
			}
		}
		hook(by)
	}
}

// rejoinServer looks at srv once (one replica status read, however many
// shards list it) and rejoins it for its target when it answers and does
// not replicate from the target's primary. A server the map also names a
// primary, or lists as a replica of two primaries, is left alone (alarm):
// it cannot follow both, and rejoining it would demote a primary or move
// it back and forth. It returns how many times it read the server's
// replica status.
func (c *Controller) rejoinServer(ctx context.Context, srv *rejoinServer, current func() (*shardmap.Map, error)) (reads int) {
	t := srv.targets[0]
	if len(srv.primaryOf) > 0 {
		c.alarmOnce("primary-and-replica "+srv.addr, "ALARM: a server listed as a replica is the primary of other shards; it is not rejoined: list a server's shards with the same replicas",
			"server", srv.addr, "primary_of", shardIDs(srv.primaryOf), "replica_of", shardIDs(t.shards), "replica_of_primary", t.primary)
		return 0
	}
	if len(srv.targets) > 1 {
		var primaries []string
		for _, o := range srv.targets {
			primaries = append(primaries, o.primary+" (shards "+shardIDs(o.shards)+")")
		}
		c.alarmOnce("two-primaries "+srv.addr, "ALARM: a server is listed as a replica of more than one primary; it is not rejoined",
			"server", srv.addr, "primaries", strings.Join(primaries, ", "))
		return 0
	}
	a, err := c.admin(srv.addr)
	if err != nil {
		return 0
	}
	defer a.Close()
	sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	st, err := a.Status(sctx)
	cancel()
	if err != nil || (st.PrimaryAddr == t.want && st.IOThreadRunning()) {
		return 1
	}
	if st.PrimaryAddr == t.want && diverged(st) {
		c.alarmOnce(t.server, "ALARM: replica stopped on an error against the current primary; it must be rebuilt from a copy of the primary",
			"shards", len(t.shards), "shard_ids", shardIDs(t.shards), "server", t.server, "primary", t.primary,
			"io_errno", st.LastIOErrno, "io_error", st.LastIOError, "sql_errno", st.LastSQLErrno, "sql_error", st.LastSQLError)
		return 1
	}
	c.rejoinTarget(ctx, t, a, current)
	return 1
}

// errBinlogUnreadable is MariaDB's ER_MASTER_FATAL_ERROR_READING_BINLOG:
// the primary's binary log cannot serve the replica's position, because
// the replica holds transactions the primary never had.
const errBinlogUnreadable = 1236

// diverged reports a replica that stopped because its history and its
// primary's differ (IO error 1236, or the SQL thread failing to apply):
// it must be rebuilt. Any other stopped state, such as an IO thread a
// failover stopped after it had lost its connection (errors 2003, 2013),
// is restarted by rejoining.
func diverged(st replication.Status) bool {
	return st.LastSQLErrno != 0 || (st.LastIOErrno == errBinlogUnreadable && !st.IOThreadRunning())
}

// rejoinTimeout bounds how long rejoinTarget waits for a rejoined
// replica's threads to run.
const rejoinTimeout = 10 * time.Second

// rejoinTarget rejoins t's server, open as a, to t's primary, once for all
// of t's shards, when mayRejoin allows it. It reports "rejoined" only once
// both replication threads run.
func (c *Controller) rejoinTarget(ctx context.Context, t *rejoinTarget, a *replication.Admin, current func() (*shardmap.Map, error)) {
	if !c.mayRejoin(ctx, t, current) {
		return
	}
	rctx, cancel := context.WithTimeout(ctx, rejoinTimeout)
	defer cancel()
	c.rejoinAttempts.Add(1)
	if err := a.RejoinAsReplica(rctx, t.want, c.cfg.Repl); err != nil {
		c.rejoinFailures.Add(1)
		if errors.Is(err, replication.ErrCommitsWaiting) {
			// A deposed primary woken after its failover: it cannot commit
			// (no replica receives from it), but only a restart with
			// RejoinArgs lets it rejoin.
			c.alarmOnce(t.server, "ALARM: deposed primary holds commits waiting for an acknowledgement and cannot be fenced; restart it with the rejoin arguments",
				"shards", len(t.shards), "shard_ids", shardIDs(t.shards), "server", t.server, "primary", t.primary, "err", err)
			return
		}
		c.log.Warn("rejoin failed", "shards", len(t.shards), "shard_ids", shardIDs(t.shards), "server", t.server, "primary", t.primary, "err", err)
		return
	}
	c.waitReplicating(rctx, t, a)
}

// alarmOnce logs an ALARM under key (a server, or a kind of alarm and a
// server) the first time only: the rejoin loop meets the same state every
// second.
func (c *Controller) alarmOnce(key, msg string, args ...any) {
	c.mu.Lock()
	seen := c.alarmed[key]
	c.alarmed[key] = true
	c.mu.Unlock()
	if !seen {
		c.log.Error(msg, args...)
	}
}

// mayRejoin: rejoining makes t's server read-only and a replica of
// t.primary: irreversible, and a demotion of the real primary if the map
// t comes from is stale (a controller that just came back from a
// partition leads with the map it had, and its own NATS server's copy of
// the bucket may be stale too). So act only as the leader now, and only
// if the bucket still names t.primary, unfenced, for every shard of t at
// its epoch, and names the server the primary of no shard, read so that a
// lagging replica cannot answer (current: LoadCurrent, once per pass).
func (c *Controller) mayRejoin(ctx context.Context, t *rejoinTarget, current func() (*shardmap.Map, error)) bool {
	if err := c.checkLeader(ctx, t.shards[0].ID, "rejoin"); err != nil {
		return false
	}
	m, err := current()
	if err != nil {
		c.log.Warn("rejoin skipped: the stored shard map could not be proven current",
			"shards", len(t.shards), "shard_ids", shardIDs(t.shards), "server", t.server, "err", err)
		return false
	}
	for _, s := range t.shards {
		if cur, ok := m.Shard(s.ID); !ok || cur.Epoch != s.Epoch || cur.Primary != s.Primary || cur.Fenced {
			c.log.Warn("rejoin skipped: the stored shard map moved on", "shard", s.ID,
				"shards", len(t.shards), "shard_ids", shardIDs(t.shards), "server", t.server, "primary_in_memory", s.Primary)
			return false
		}
	}
	if i := slices.IndexFunc(m.Shards, func(s shardmap.Shard) bool { return s.Primary == t.server }); i >= 0 {
		c.log.Warn("rejoin skipped: the stored shard map names the server a primary", "shard", m.Shards[i].ID,
			"shards", len(t.shards), "shard_ids", shardIDs(t.shards), "server", t.server)
		return false
	}
	return true
}

// waitReplicating reports t's server "rejoined", once for t's shards,
// when both replication threads run (IO "Yes", connected; SQL "Yes"), or
// raises the alarm if it stops on a divergence, until ctx ends.
func (c *Controller) waitReplicating(ctx context.Context, t *rejoinTarget, a *replication.Admin) {
	var st replication.Status
	var err error
	for {
		st, err = a.Status(ctx)
		if err == nil && st.IORunning == "Yes" && st.SQLRunning {
			c.event(t.shards[0].ID, "rejoined", fmt.Sprintf("%s%s replicates from %s (IO and SQL threads running, at %s)",
				groupPrefix(t.shards), t.server, t.primary, st.SlavePos))
			return
		}
		if err == nil && diverged(st) {
			c.log.Error("ALARM: rejoined replica stopped replicating; it must be rebuilt from a copy of the primary",
				"shards", len(t.shards), "shard_ids", shardIDs(t.shards), "server", t.server, "primary", t.primary,
				"io_errno", st.LastIOErrno, "io_error", st.LastIOError, "sql_errno", st.LastSQLErrno, "sql_error", st.LastSQLError)
			return
		}
		select {
		case <-ctx.Done():
			c.log.Warn("rejoin: replication not running yet", "shards", len(t.shards), "shard_ids", shardIDs(t.shards),
				"server", t.server, "io", st.IORunning, "sql", st.SQLRunning, "io_error", st.LastIOError, "sql_error", st.LastSQLError)
			return
		case <-time.After(200 * time.Millisecond):
		}
	}
}
