package shardmap

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"

	"github.com/triage-queue/triage/deploy/mariadb/mariadbtest"
	"github.com/triage-queue/triage/schema"
)

// appBundle is a database on the package's server with a table, root's
// connection to it and a map whose shard 1 it is.
type appBundle struct {
	cfg  *mysql.Config // root's
	root *sql.DB
	m    *Map
}

func appSetup(t *testing.T) appBundle {
	t.Helper()
	cfg, err := mysql.ParseDSN(mariadbtest.Database(t))
	require.NoError(t, err)
	root, err := sql.Open("mysql", cfg.FormatDSN())
	require.NoError(t, err)
	t.Cleanup(func() { root.Close() })
	_, err = root.ExecContext(t.Context(), "CREATE TABLE t (id INT PRIMARY KEY, v INT NOT NULL)")
	require.NoError(t, err)
	_, err = root.ExecContext(t.Context(), "INSERT INTO t VALUES (1, 0)")
	require.NoError(t, err)
	m, err := New(Map{Version: 1, Regions: []string{"a"}, Shards: []Shard{{ID: 1, HomeRegion: "a", Primary: cfg.Addr, Database: cfg.DBName}}})
	require.NoError(t, err)
	return appBundle{cfg: cfg, root: root, m: m}
}

// account makes an account with a random name and the given grants (%s is
// the account; %r a role made for it) and drops it when the test ends.
func (b appBundle) account(t *testing.T, grants ...string) Credentials {
	t.Helper()
	var r [5]byte
	_, _ = rand.Read(r[:])
	user := "pool_" + hex.EncodeToString(r[:])
	account, role := "'"+user+"'@'%'", user+"_r"
	t.Cleanup(func() {
		_, _ = b.root.Exec("DROP USER IF EXISTS " + account)
		_, _ = b.root.Exec("DROP ROLE IF EXISTS " + role)
	})
	for _, g := range append([]string{"CREATE USER " + account + " IDENTIFIED BY 'pw'"}, grants...) {
		stmt := strings.ReplaceAll(strings.ReplaceAll(g, "%s", account), "%r", role)
		_, err := b.root.ExecContext(t.Context(), stmt)
		require.NoError(t, err, stmt)
	}
	return Credentials{User: user, Password: "pw"}
}

// appGrant is the application account's grant on the bundle's database.
func (b appBundle) appGrant() string {
	return "GRANT SELECT, INSERT, UPDATE, DELETE ON `" + b.cfg.DBName + "`.* TO %s"
}

// TestAppPoolRefusesAccountsThatWriteThroughReadOnly: the application
// pool hands out no session of an account that MariaDB lets write through
// the read_only fence (root, ALL PRIVILEGES, READ_ONLY ADMIN, also by its
// default role) or that holds SUPER: the first statement on the primary,
// which at node start is routing.MigrateShard's, fails with
// schema.ErrPrivilegedAccount naming the primary and the privilege. The
// application account works; the admin pool (NewPool) takes root.
func TestAppPoolRefusesAccountsThatWriteThroughReadOnly(t *testing.T) {
	t.Parallel()
	b := appSetup(t)
	for _, tc := range []struct {
		name string
		cred Credentials
		says string // "" when taken
	}{
		{"application account", b.account(t, b.appGrant()), ""},
		{"root", Credentials{User: b.cfg.User, Password: b.cfg.Passwd}, "ALL PRIVILEGES"},
		{"all privileges", b.account(t, "GRANT ALL PRIVILEGES ON *.* TO %s"), "ALL PRIVILEGES"},
		{"read_only admin", b.account(t, b.appGrant(), "GRANT READ_ONLY ADMIN ON *.* TO %s"), "READ_ONLY ADMIN"},
		{"super", b.account(t, b.appGrant(), "GRANT SUPER ON *.* TO %s"), "SUPER"},
		{"read_only admin by default role", b.account(t, b.appGrant(), "CREATE ROLE %r", "GRANT READ_ONLY ADMIN ON *.* TO %r",
			"GRANT %r TO %s", "SET DEFAULT ROLE %r FOR %s"), "READ_ONLY ADMIN on *.* through its role"},
	} {
		pool := NewAppPool(tc.cred)
		db, _, err := pool.Primary(b.m, 1)
		require.NoError(t, err, tc.name)
		var v int
		err = db.QueryRowContext(t.Context(), "SELECT v FROM t WHERE id = 1").Scan(&v)
		require.NoError(t, pool.Close())
		if tc.says == "" {
			require.NoError(t, err, tc.name)
			continue
		}
		require.ErrorIs(t, err, schema.ErrPrivilegedAccount, tc.name)
		require.ErrorContains(t, err, "shard primary "+b.cfg.Addr+": application account", tc.name)
		require.ErrorContains(t, err, tc.says, tc.name)
	}
	admin := NewPool(Credentials{User: b.cfg.User, Password: b.cfg.Passwd})
	defer admin.Close()
	db, _, err := admin.Primary(b.m, 1)
	require.NoError(t, err)
	require.NoError(t, db.PingContext(t.Context()), "the admin pool takes root")
}

// TestAppPoolNeedsAUser: the application pool never assumes root; without
// a user it opens nothing and says what to set.
func TestAppPoolNeedsAUser(t *testing.T) {
	t.Parallel()
	m, err := New(Map{Version: 1, Regions: []string{"a"}, Shards: []Shard{{ID: 1, HomeRegion: "a", Primary: "127.0.0.1:1", Database: "triage"}}})
	require.NoError(t, err)
	pool := NewAppPool(Credentials{})
	defer pool.Close()
	_, _, err = pool.Primary(m, 1)
	require.ErrorIs(t, err, ErrNoAppUser)
	_, err = pool.Writer(NewHolder(m), 1)
	require.ErrorIs(t, err, ErrNoAppUser)
	require.ErrorContains(t, err, "no user for the application account")
}

// TestAppSessionsGiveUpBeforeTheClient: a session of the application pool
// waits for a row lock for schema.LockWaitTimeout and runs a statement
// for schema.StatementTimeout at most, both below the driver's read
// timeout, so a statement the client gave up on has already failed on the
// server. MariaDB's defaults (50 s lock wait, no statement limit) let it
// run, and commit, long after.
func TestAppSessionsGiveUpBeforeTheClient(t *testing.T) {
	t.Parallel()
	b := appSetup(t)
	pool := NewAppPool(b.account(t, b.appGrant()))
	defer pool.Close()
	db, _, err := pool.Primary(b.m, 1)
	require.NoError(t, err)
	var lockWait, statement float64
	require.NoError(t, db.QueryRowContext(t.Context(), "SELECT @@session.innodb_lock_wait_timeout, @@session.max_statement_time").Scan(&lockWait, &statement))
	dsn, err := mysql.ParseDSN(pool.DSN(b.m.Shards[0]))
	require.NoError(t, err)
	require.Equal(t, schema.LockWaitTimeout.Seconds(), lockWait)
	require.Equal(t, schema.StatementTimeout.Seconds(), statement)
	require.Equal(t, schema.ReadTimeout, dsn.ReadTimeout)
	require.Less(t, lockWait, statement, "a lock wait fails as itself, before the statement limit")
	require.Less(t, statement, dsn.ReadTimeout.Seconds(), "the server gives up before the client")
}

// TestAbandonedStatementDoesNotCommit: a transaction of the application
// pool blocked on a row lock fails on the server (1205) before the
// client's read timeout, and nothing of it commits when the lock is
// released. Without the session bounds the client gave up first
// ("invalid connection") and the server, still waiting, applied and
// committed the transaction once the lock was released: an ack reported
// failed was applied after all. The bounds are shortened here (1 s lock
// wait, 2 s statement, 3 s read), in the order of the real ones.
func TestAbandonedStatementDoesNotCommit(t *testing.T) {
	t.Parallel()
	b := appSetup(t)
	pool := NewAppPool(b.account(t, b.appGrant()))
	pool.app.lockWait, pool.app.statement, pool.app.read = time.Second, 2*time.Second, 3*time.Second
	defer pool.Close()
	db, _, err := pool.Primary(b.m, 1)
	require.NoError(t, err)

	// Another session holds row 1 past the client's read timeout.
	ctx := t.Context()
	holder, err := b.root.Conn(ctx)
	require.NoError(t, err)
	defer holder.Close()
	_, err = holder.ExecContext(ctx, "BEGIN")
	require.NoError(t, err)
	_, err = holder.ExecContext(ctx, "UPDATE t SET v = 1 WHERE id = 1")
	require.NoError(t, err)
	released := make(chan error, 1)
	go func() {
		time.Sleep(4 * time.Second)
		_, err := holder.ExecContext(context.Background(), "COMMIT")
		released <- err
	}()

	start := time.Now()
	_, err = db.ExecContext(ctx, "START TRANSACTION; UPDATE t SET v = 100 WHERE id = 1; COMMIT")
	took := time.Since(start)
	var me *mysql.MySQLError
	require.True(t, errors.As(err, &me), "a server error, not the client's timeout: %v after %s", err, took)
	require.Equal(t, uint16(1205), me.Number, "lock wait timeout: %v", err)
	require.Less(t, took, 3*time.Second, "the server gave up before the client's read timeout")

	require.NoError(t, <-released)
	time.Sleep(500 * time.Millisecond) // what the server would still apply, it has
	var v int
	require.NoError(t, b.root.QueryRowContext(ctx, "SELECT v FROM t WHERE id = 1").Scan(&v))
	require.Equal(t, 1, v, "the failed transaction committed nothing; the lock holder's write stands")
}
