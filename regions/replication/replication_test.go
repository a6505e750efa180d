package replication_test

import (
	"context"
	"database/sql"
	"errors"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/triage-queue/triage/deploy/mariadb"
	"github.com/triage-queue/triage/deploy/mariadb/mariadbtest"
	"github.com/triage-queue/triage/regions/replication"
)

func TestMain(m *testing.M) { os.Exit(mariadbtest.Main(m)) }

var (
	repl = replication.Credentials{User: "repl", Password: "repl-secret"}
	// The quote in the password exercises quoting.
	app = replication.Credentials{User: "triage_app", Password: "app'secret"}
)

const (
	waitFor = 20 * time.Second
	tick    = 20 * time.Millisecond
	// errReadOnly is ER_OPTION_PREVENTS_STATEMENT: "running with the
	// --read-only option".
	errReadOnly = 1290
)

// node is one shard server as the controller sees it: the process, its
// Admin and a root connection for the test's own checks.
type node struct {
	srv   *mariadb.Server
	admin *replication.Admin
	root  *sql.DB
}

// startNodes starts n servers at once, with server ids 1..n. They come from
// mariadb.Start rather than mariadbtest.NewServer because replicating
// servers need distinct server ids (an IO thread refuses a primary with its
// own id) and NewServer starts every server with id 1.
func startNodes(t *testing.T, n int) []*node {
	t.Helper()
	dirs := make([]string, n)
	for i := range dirs {
		dirs[i] = t.TempDir()
	}
	srvs := make([]*mariadb.Server, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { srvs[i], errs[i] = mariadb.Start(t.Context(), mariadb.Config{Dir: dirs[i], ServerID: i + 1}) })
	}
	wg.Wait()
	for _, s := range srvs {
		if s != nil {
			stopAtCleanup(t, s)
		}
	}
	require.NoError(t, errors.Join(errs...))
	nodes := make([]*node, n)
	for i, s := range srvs {
		nodes[i] = attach(t, s)
	}
	return nodes
}

func stopAtCleanup(t *testing.T, s *mariadb.Server) {
	t.Cleanup(func() {
		if err := s.Stop(); err != nil {
			t.Errorf("stop mariadbd: %v", err)
		}
	})
}

func attach(t *testing.T, s *mariadb.Server) *node {
	t.Helper()
	a, err := replication.Open(s.DSN(""))
	require.NoError(t, err)
	t.Cleanup(func() { _ = a.Close() })
	root, err := sql.Open("mysql", s.DSN(""))
	require.NoError(t, err)
	t.Cleanup(func() { _ = root.Close() })
	return &node{srv: s, admin: a, root: root}
}

// appDB connects as the application account, as a Triage process would.
func (n *node) appDB(t *testing.T) *sql.DB {
	t.Helper()
	cfg := mysql.NewConfig()
	cfg.User, cfg.Passwd, cfg.Net, cfg.Addr, cfg.DBName = app.User, app.Password, "tcp", n.srv.Addr(), "triage"
	db, err := sql.Open("mysql", cfg.FormatDSN())
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	return db
}

type bundle struct {
	primary  *node
	replicas []*node
}

// setup starts a primary and n-1 replicas the way the controller bootstraps
// a shard: accounts on every server, semi-sync without async fallback,
// replicas pointed at the primary, and a triage.items table created on the
// primary and replicated.
func setup(t *testing.T, n int) bundle {
	t.Helper()
	ctx := t.Context()
	nodes := startNodes(t, n)
	b := bundle{primary: nodes[0], replicas: nodes[1:]}
	for _, nd := range nodes {
		require.NoError(t, nd.admin.EnsureUsers(ctx, repl, app))
	}
	require.NoError(t, b.primary.admin.EnableSemiSync(ctx, true))
	for _, r := range b.replicas {
		require.NoError(t, r.admin.EnableSemiSync(ctx, false))
		require.NoError(t, r.admin.ReplicateFrom(ctx, b.primary.srv.Addr(), repl))
	}
	waitSemiSyncClients(t, b.primary, n-1)
	exec(t, b.primary.root, "CREATE DATABASE triage")
	exec(t, b.primary.root, "CREATE TABLE triage.items (id BIGINT PRIMARY KEY, note VARCHAR(64) NOT NULL DEFAULT '')")
	for _, r := range b.replicas {
		waitCaughtUp(t, r, b.primary)
	}
	return b
}

func exec(t *testing.T, db *sql.DB, query string, args ...any) {
	t.Helper()
	_, err := db.ExecContext(t.Context(), query, args...)
	require.NoError(t, err, query)
}

// insert writes rows from..to as the application, one autocommit
// transaction each: every returned Exec is an acknowledged write.
func insert(t *testing.T, db *sql.DB, from, to int) {
	t.Helper()
	for id := from; id <= to; id++ {
		_, err := db.ExecContext(t.Context(), "INSERT INTO items (id) VALUES (?)", id)
		require.NoError(t, err, "insert %d", id)
	}
}

func span(from, to int) []int64 {
	var s []int64
	for id := from; id <= to; id++ {
		s = append(s, int64(id))
	}
	return s
}

func ids(t *testing.T, n *node) []int64 {
	t.Helper()
	got, err := queryIDs(t.Context(), n)
	require.NoError(t, err)
	return got
}

func queryIDs(ctx context.Context, n *node) ([]int64, error) {
	rows, err := n.root.QueryContext(ctx, "SELECT id FROM triage.items ORDER BY id")
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []int64
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		out = append(out, id)
	}
	return out, rows.Err()
}

// The conditions polled below run on another goroutine, where require must
// not be used: they report through the collector instead.

func waitIDs(t *testing.T, n *node, want []int64) {
	t.Helper()
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		got, err := queryIDs(t.Context(), n)
		assert.NoError(c, err)
		assert.Equal(c, want, got, "rows on %s", n.srv.Addr())
	}, waitFor, tick)
}

func status(t *testing.T, n *node) replication.Status {
	t.Helper()
	st, err := n.admin.Status(t.Context())
	require.NoError(t, err)
	return st
}

func semiSync(t *testing.T, n *node) replication.SemiSync {
	t.Helper()
	ss, err := n.admin.SemiSyncStatus(t.Context())
	require.NoError(t, err)
	return ss
}

// waitCaughtUp waits until replica r has applied everything in primary's
// binary log, with both threads running and no errors.
func waitCaughtUp(t *testing.T, r, primary *node) {
	t.Helper()
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		p, err := primary.admin.Status(t.Context())
		if !assert.NoError(c, err) {
			return
		}
		st, err := r.admin.Status(t.Context())
		if !assert.NoError(c, err) {
			return
		}
		assert.Equal(c, "Yes", st.IORunning)
		assert.True(c, st.SQLRunning)
		assert.Zero(c, st.LastIOErrno, st.LastIOError)
		assert.Zero(c, st.LastSQLErrno, st.LastSQLError)
		assert.Equal(c, p.BinlogPos, st.CurrentPos, "%s caught up with %s", r.srv.Addr(), primary.srv.Addr())
	}, waitFor, tick)
}

func waitSemiSyncClients(t *testing.T, primary *node, n int) {
	t.Helper()
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		ss, err := primary.admin.SemiSyncStatus(t.Context())
		assert.NoError(c, err)
		assert.Equal(c, n, ss.Clients, "semi-sync replicas connected to %s", primary.srv.Addr())
	}, waitFor, tick)
}

func requireReadOnlyError(t *testing.T, err error) {
	t.Helper()
	var me *mysql.MySQLError
	require.ErrorAs(t, err, &me)
	require.EqualValues(t, errReadOnly, me.Number, "%v", err)
}

// rootNoBinlog runs statements as root on one connection with binary
// logging off, as an operator's local fix would.
func rootNoBinlog(t *testing.T, n *node, stmts ...string) {
	t.Helper()
	c, err := n.root.Conn(t.Context())
	require.NoError(t, err)
	defer c.Close()
	_, err = c.ExecContext(t.Context(), "SET SESSION sql_log_bin = 0")
	require.NoError(t, err)
	for _, s := range stmts {
		_, err = c.ExecContext(t.Context(), s)
		require.NoError(t, err, s)
	}
	_, err = c.ExecContext(t.Context(), "SET SESSION sql_log_bin = 1")
	require.NoError(t, err)
}

// Test 1: a primary and a semi-sync replica. Rows written on the primary
// reach the replica; the primary waits for the replica's acknowledgement;
// the replica is fenced for the application but not for root; and none of
// the admin statements put a GTID of the replica's own in its binary log.
func TestSemiSyncReplicaFollowsAndIsFenced(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setup(t, 2)
	p, r := b.primary, b.replicas[0]

	// Someone once gave the application account privileges that bypass
	// read_only; EnsureUsers, run again, takes them away.
	rootNoBinlog(t, r, "GRANT SUPER, READ ONLY ADMIN ON *.* TO 'triage_app'@'%'")
	require.NoError(t, r.admin.EnsureUsers(ctx, repl, app))

	exec(t, p.root, "CREATE TABLE triage.probe (id INT PRIMARY KEY)")
	insert(t, p.appDB(t), 1, 10)
	waitIDs(t, r, span(1, 10))

	ss := semiSync(t, p)
	require.True(t, ss.PrimaryEnabled)
	require.True(t, ss.Active, "every commit waited for the replica")
	require.False(t, ss.FellBack())
	require.Equal(t, 1, ss.Clients)
	require.Equal(t, "AFTER_SYNC", ss.WaitPoint)
	require.Equal(t, replication.NoFallback, ss.Timeout, "no fallback to async")
	require.True(t, ss.WaitNoReplica, "commits wait even with no replica connected")
	require.GreaterOrEqual(t, ss.YesTx, uint64(13), "2 DDL + 1 DDL + 10 rows acknowledged")
	require.Zero(t, ss.NoTx, "no commit went unacknowledged")
	rs := semiSync(t, r)
	require.True(t, rs.ReplicaEnabled)
	require.True(t, rs.ReplicaActive)
	require.False(t, rs.PrimaryEnabled)

	// The fence: the application cannot write on the replica...
	_, err := r.appDB(t).ExecContext(ctx, "INSERT INTO items (id) VALUES (100)")
	requireReadOnlyError(t, err)
	// ...but root can (MariaDB has no super_read_only), which is why the
	// application must never run as root. Unlogged, so it creates no GTID.
	rootNoBinlog(t, r, "INSERT INTO triage.probe VALUES (1)")

	st := status(t, r)
	require.Equal(t, replication.RoleReplica, st.Role)
	require.True(t, st.ReadOnly)
	require.Equal(t, uint32(2), st.ServerID)
	require.Equal(t, p.srv.Addr(), st.PrimaryAddr)
	require.Equal(t, "Yes", st.IORunning)
	require.True(t, st.SQLRunning)
	require.True(t, st.LagKnown)
	require.Zero(t, st.LastIOErrno)
	require.Zero(t, st.LastSQLErrno)
	ps := status(t, p)
	require.Equal(t, replication.RolePrimary, ps.Role)
	require.False(t, ps.ReadOnly)
	require.Empty(t, ps.IORunning)

	// GTID strict mode stays happy: the replica's binary log holds exactly
	// the primary's transactions, all from server 1, after EnsureUsers
	// (twice), EnableSemiSync, ReplicateFrom and root's unlogged insert.
	require.Equal(t, ps.BinlogPos, st.BinlogPos)
	require.Equal(t, ps.BinlogPos, st.IOPos)
	for _, g := range st.BinlogPos {
		require.Equal(t, uint32(1), g.ServerID, "GTID %s", g)
	}
	insert(t, p.appDB(t), 11, 11)
	waitIDs(t, r, span(1, 11))
	waitCaughtUp(t, r, p)
}

// The reason for sql_log_bin=0: the same CREATE USER, binary-logged on a
// replica, gets a GTID with the replica's server id, and the primary's next
// transaction, with the same sequence number, stops the replica's SQL
// thread in GTID strict mode. Promote then refuses that replica.
func TestBinloggedAdminStatementBreaksReplica(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setup(t, 2)
	p, r := b.primary, b.replicas[0]

	exec(t, r.root, "CREATE USER 'oops'@'%' IDENTIFIED BY 'x'") // root passes read_only
	insert(t, p.appDB(t), 1, 1)
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		st, err := r.admin.Status(ctx)
		assert.NoError(c, err)
		assert.False(c, st.SQLRunning)
		assert.EqualValues(c, 1950, st.LastSQLErrno, "ER_GTID_STRICT_OUT_OF_ORDER: %s", st.LastSQLError)
	}, waitFor, tick)

	_, err := r.admin.Promote(ctx, time.Second, nil)
	require.ErrorIs(t, err, replication.ErrRelayLogNotApplied)
	require.ErrorContains(t, err, "1950")
}

// Test 3: failover and rejoin. Primary p with replicas r1 and r2 under
// semi-sync. r1 receives everything but its applier is stalled; r2 applies
// everything it receives but stops receiving early; a last write is in
// p's binary log, unacknowledged, when p is killed. MostAdvanced must pick
// r1 by what it received, Promote must apply r1's relay log before taking
// writes, r2 must follow r1, and p must come back as a read-only replica of
// r1 without the unacknowledged write.
func TestFailoverPromotesMostAdvancedAndRejoinsOldPrimary(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setup(t, 3)
	p, r1, r2 := b.primary, b.replicas[0], b.replicas[1]
	appP := p.appDB(t)

	insert(t, appP, 1, 20)
	waitIDs(t, r1, span(1, 20))
	waitIDs(t, r2, span(1, 20))

	// r1's SQL thread blocks on a table lock; its IO thread keeps
	// receiving (and acknowledging) into the relay log.
	lock, err := r1.root.Conn(ctx)
	require.NoError(t, err)
	defer lock.Close()
	_, err = lock.ExecContext(ctx, "LOCK TABLES triage.items READ")
	require.NoError(t, err)
	insert(t, appP, 21, 40)
	waitIDs(t, r2, span(1, 40))
	// r2 stops receiving; rows 41-60 are acknowledged by r1 alone.
	exec(t, r2.root, "STOP SLAVE IO_THREAD")
	insert(t, appP, 41, 60)
	pst := status(t, p)
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		st, err := r1.admin.Status(ctx)
		assert.NoError(c, err)
		assert.Equal(c, pst.BinlogPos, st.IOPos, "r1 received everything")
	}, waitFor, tick)
	ss := semiSync(t, p)
	require.True(t, ss.Active)
	require.Zero(t, ss.NoTx, "each of rows 1-60 was in a replica's relay log before its commit returned")

	// Last write: r1 stops receiving too, so the commit sits in p's binary
	// log waiting for an acknowledgement that cannot come when p dies.
	exec(t, r1.root, "STOP SLAVE IO_THREAD")
	inDoubt := make(chan error, 1)
	go func() {
		_, err := appP.ExecContext(context.WithoutCancel(ctx), "INSERT INTO items (id, note) VALUES (1000, 'never acknowledged')")
		inDoubt <- err
	}()
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		var n int
		err := p.root.QueryRowContext(ctx, "SELECT COUNT(*) FROM information_schema.processlist WHERE user = ? AND state LIKE '%semi-sync%'", app.User).Scan(&n)
		assert.NoError(c, err)
		assert.Equal(c, 1, n, "insert 1000 waits for a semi-sync ACK")
	}, waitFor, tick)
	require.NoError(t, p.srv.Kill())
	require.Error(t, <-inDoubt, "the client never got an acknowledgement for row 1000")

	// r1 received more (60 rows) but applied less (20) than r2 (40 and 40).
	s1, s2 := status(t, r1), status(t, r2)
	c, ok := s1.SlavePos.Compare(s2.SlavePos)
	require.True(t, ok)
	require.Equal(t, -1, c, "r1 applied less")
	c, ok = s1.Received().Compare(s2.Received())
	require.True(t, ok)
	require.Equal(t, 1, c, "r1 received more")
	best, err := replication.MostAdvanced(ctx, []*replication.Admin{r2.admin, r1.admin})
	require.NoError(t, err)
	require.Equal(t, 1, best, "r1, although r2 comes first in preference order")

	// Promote r1. It must wait in MASTER_GTID_WAIT until the relay log is
	// applied, which happens only once the test releases the table lock.
	type result struct {
		gtid string
		err  error
	}
	promoted := make(chan result, 1)
	go func() {
		gtid, err := r1.admin.Promote(ctx, 30*time.Second, nil)
		promoted <- result{gtid, err}
	}()
	var early *result
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		select {
		case res := <-promoted:
			early = &res
			return
		default:
		}
		var n int
		err := r1.root.QueryRowContext(ctx, "SELECT COUNT(*) FROM information_schema.processlist WHERE info LIKE '%MASTER_GTID_WAIT%' AND id <> CONNECTION_ID()").Scan(&n)
		assert.NoError(c, err)
		assert.Equal(c, 1, n, "Promote waits for the relay log")
	}, waitFor, tick)
	require.Nil(t, early, "Promote returned before the relay log was applied")
	_, err = lock.ExecContext(ctx, "UNLOCK TABLES")
	require.NoError(t, err)
	res := <-promoted
	require.NoError(t, res.err)
	promotedAt, err := replication.ParseGTIDList(res.gtid)
	require.NoError(t, err)
	require.True(t, promotedAt.Covers(s1.Received()), "promoted at %s, received %s", promotedAt, s1.Received())

	// No acknowledged row is missing, and the unacknowledged one is absent.
	require.Equal(t, span(1, 60), ids(t, r1))
	st := status(t, r1)
	require.Equal(t, replication.RolePrimary, st.Role)
	require.False(t, st.ReadOnly)
	require.Equal(t, res.gtid, st.CurrentPos.String())
	_, err = r1.admin.Promote(ctx, time.Second, nil)
	require.ErrorIs(t, err, replication.ErrNotReplica, "promoting twice is refused, not unfencing")

	// The new primary takes application writes; r2 follows it and catches up.
	require.NoError(t, r1.admin.EnableSemiSync(ctx, true))
	require.NoError(t, r2.admin.ReplicateFrom(ctx, r1.srv.Addr(), repl))
	waitSemiSyncClients(t, r1, 1)
	insert(t, r1.appDB(t), 61, 70)
	require.False(t, semiSync(t, r1).FellBack())
	waitIDs(t, r2, span(1, 70))
	waitCaughtUp(t, r2, r1)

	// The old primary comes back on its data with RejoinArgs: read-only
	// from the start, and recovery has cut the unacknowledged row 1000 from
	// its binary log instead of committing it.
	cfg := p.srv.Config()
	cfg.ExtraArgs = append(cfg.ExtraArgs, replication.RejoinArgs()...)
	srv, err := mariadb.Start(ctx, cfg)
	require.NoError(t, err)
	stopAtCleanup(t, srv)
	old := attach(t, srv)
	ost := status(t, old)
	require.True(t, ost.ReadOnly)
	require.Equal(t, replication.RolePrimary, ost.Role, "no replica configuration yet")
	require.Equal(t, span(1, 60), ids(t, old), "row 1000 rolled back by semi-sync recovery")
	require.True(t, promotedAt.Covers(ost.BinlogPos), "old primary at %s has nothing the new one lacks (%s)", ost.BinlogPos, promotedAt)
	appOld := old.appDB(t)
	_, err = appOld.ExecContext(ctx, "INSERT INTO items (id) VALUES (2000)")
	requireReadOnlyError(t, err)

	require.ErrorIs(t, old.admin.ReplicateFrom(ctx, r1.srv.Addr(), repl), replication.ErrLocalTransactions)
	require.NoError(t, old.admin.RejoinAsReplica(ctx, r1.srv.Addr(), repl))
	waitCaughtUp(t, old, r1)
	require.Equal(t, span(1, 70), ids(t, old), "replicated the writes made after failover")
	ost = status(t, old)
	require.Equal(t, replication.RoleReplica, ost.Role)
	require.Equal(t, r1.srv.Addr(), ost.PrimaryAddr)
	require.True(t, ost.ReadOnly)
	_, err = appOld.ExecContext(ctx, "INSERT INTO items (id) VALUES (2000)")
	requireReadOnlyError(t, err)
	waitSemiSyncClients(t, r1, 2) // RejoinArgs made it a semi-sync replica
	require.Equal(t, span(1, 70), ids(t, r1))
}

// Semi-sync never falls back to async: with two replicas one
// acknowledgement suffices, so losing one replica costs nothing; with both
// gone, a commit blocks (the client gets its own deadline, never OK) and
// the primary keeps semi-sync on, so it acknowledges nothing a failover
// could lose. The blocked commit completes once a replica returns and has
// it.
func TestSemiSyncNeverFallsBackToAsync(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setup(t, 3)
	p, r1, r2 := b.primary, b.replicas[0], b.replicas[1]
	appP := p.appDB(t)
	insert(t, appP, 1, 1)

	// One replica down: the other acknowledges, nothing waits for a timeout.
	require.NoError(t, r1.srv.Kill())
	insert(t, appP, 2, 3)
	ss := semiSync(t, p)
	require.True(t, ss.Active)
	require.Zero(t, ss.NoTx)
	waitIDs(t, r2, span(1, 3))

	// Both down: the commit cannot complete; the caller's deadline ends it.
	require.NoError(t, r2.srv.Kill())
	waitSemiSyncClients(t, p, 0)
	dctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	_, err := appP.ExecContext(dctx, "INSERT INTO items (id) VALUES (4)")
	cancel()
	require.ErrorIs(t, err, context.DeadlineExceeded, "an isolated primary must not acknowledge a commit")
	ss = semiSync(t, p)
	require.False(t, ss.FellBack(), "no silent fallback to async: %+v", ss)
	require.True(t, ss.Blocked(), "the alarm condition: no replica connected")
	require.Equal(t, 1, ss.WaitSessions)
	require.Zero(t, ss.NoTx, "no commit was acknowledged without a replica")
	var waiting int
	require.NoError(t, p.root.QueryRowContext(ctx, "SELECT COUNT(*) FROM information_schema.processlist WHERE state LIKE '%semi-sync%'").Scan(&waiting))
	require.Equal(t, 1, waiting, "row 4's commit still waits for an acknowledgement")

	// r2 returns (as a semi-sync replica from its first connection, as the
	// bed starts replicas): it receives row 4 and acknowledges it, and the
	// commit completes.
	cfg := r2.srv.Config()
	cfg.ExtraArgs = append(cfg.ExtraArgs, "--rpl-semi-sync-slave-enabled=ON")
	srv, err := mariadb.Start(ctx, cfg)
	require.NoError(t, err)
	stopAtCleanup(t, srv)
	back := attach(t, srv)
	waitIDs(t, back, span(1, 4))
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		var n int
		assert.NoError(c, p.root.QueryRowContext(ctx, "SELECT COUNT(*) FROM information_schema.processlist WHERE state LIKE '%semi-sync%'").Scan(&n))
		assert.Zero(c, n, "row 4's commit completed")
	}, waitFor, tick)
	insert(t, appP, 5, 5)
	waitIDs(t, back, span(1, 5))
	require.Zero(t, semiSync(t, p).NoTx)
}

// TestPromotePrepareCommitsBeforeSemiSync: Promote's prepare writes on a
// detached, still read-only candidate, and its commit waits for no replica
// (semi-sync as a primary is not on yet), although none is attached: the
// failover stores the shard's epoch there instead of waiting for a
// repointed replica to connect. After Promote, semi-sync is on: an
// application commit with no replica attached waits.
func TestPromotePrepareCommitsBeforeSemiSync(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setup(t, 2)
	p, r := b.primary, b.replicas[0]
	insert(t, p.appDB(t), 1, 3)
	waitIDs(t, r, span(1, 3))
	require.NoError(t, p.srv.Kill())

	var prepared time.Duration
	var readOnly bool
	_, err := r.admin.Promote(ctx, 10*time.Second, func(ctx context.Context) error {
		start := time.Now()
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if err := r.root.QueryRowContext(pctx, "SELECT @@read_only").Scan(&readOnly); err != nil {
			return err
		}
		_, err := r.admin.DB().ExecContext(pctx, "INSERT INTO triage.items (id, note) VALUES (100, 'prepared')")
		prepared = time.Since(start)
		return err
	})
	require.NoError(t, err)
	require.True(t, readOnly, "prepare runs before read_only=0")
	require.Less(t, prepared, 2*time.Second, "prepare's commit waited for a replica")
	require.Equal(t, append(span(1, 3), 100), ids(t, r))

	require.True(t, semiSync(t, r).PrimaryEnabled, "semi-sync as a primary after Promote: %+v", semiSync(t, r))
	dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	_, err = r.appDB(t).ExecContext(dctx, "INSERT INTO items (id) VALUES (101)")
	require.ErrorIs(t, err, context.DeadlineExceeded, "with no replica attached, an application commit after Promote waits")
}

// TestFenceWithACommitWaitingForAnAcknowledgement: a deposed primary woken
// after its failover may hold a commit waiting for a semi-sync
// acknowledgement no replica will send. read_only=1 waits for commits in
// progress, so the fence gives up after its lock wait with
// ErrCommitsWaiting instead of hanging past the driver's read timeout,
// and the server stays unable to commit. A restart with RejoinArgs rolls
// the waiting transaction back and comes up fenced.
func TestFenceWithACommitWaitingForAnAcknowledgement(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setup(t, 2)
	p, r := b.primary, b.replicas[0]
	appP := p.appDB(t)
	insert(t, appP, 1, 1)
	waitIDs(t, r, span(1, 1))

	// The replica stops receiving (as a failover's fence does): the next
	// commit waits for an acknowledgement for good.
	require.NoError(t, r.admin.StopReceiving(ctx))
	waitSemiSyncClients(t, p, 0)
	waited := make(chan error, 1)
	go func() {
		_, err := appP.ExecContext(ctx, "INSERT INTO items (id) VALUES (2)")
		waited <- err
	}()
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		var n int
		assert.NoError(c, p.root.QueryRowContext(ctx, "SELECT COUNT(*) FROM information_schema.processlist WHERE state LIKE '%semi-sync%'").Scan(&n))
		assert.Equal(c, 1, n, "row 2's commit waits for an acknowledgement")
	}, waitFor, tick)

	// Without the lock wait bound this call outlives its context (20 s)
	// and fails with the driver's or the context's error instead.
	fctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	err := p.admin.SetReadOnly(fctx, true)
	cancel()
	require.ErrorIs(t, err, replication.ErrCommitsWaiting)
	require.ErrorIs(t, p.admin.RejoinAsReplica(ctx, r.srv.Addr(), repl), replication.ErrCommitsWaiting,
		"a rejoin fences first, and says why it cannot")
	select {
	case err := <-waited:
		t.Fatalf("row 2's commit returned while no replica acknowledged it: %v", err)
	default:
	}

	// Restarted with RejoinArgs, it rolls row 2 back and is fenced.
	require.NoError(t, p.srv.Kill())
	<-p.srv.Wait()
	cfg := p.srv.Config()
	cfg.ExtraArgs = append(cfg.ExtraArgs, replication.RejoinArgs()...)
	srv, err := mariadb.Start(ctx, cfg)
	require.NoError(t, err)
	stopAtCleanup(t, srv)
	back := attach(t, srv)
	require.True(t, status(t, back).ReadOnly)
	require.Equal(t, span(1, 1), ids(t, back), "the unacknowledged row 2 is rolled back")
	require.Error(t, <-waited, "row 2's commit was never acknowledged")
}
