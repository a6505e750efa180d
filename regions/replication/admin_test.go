package replication_test

import (
	"database/sql"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/triage-queue/triage/regions/replication"
)

// unreachable is an Admin whose server does not exist: every test below
// must fail on validation, before any connection is attempted.
func unreachable(t *testing.T) *replication.Admin {
	t.Helper()
	a, err := replication.Open("root@tcp(127.0.0.1:1)/?timeout=100ms")
	require.NoError(t, err, "Open does not dial")
	t.Cleanup(func() { require.NoError(t, a.Close()) })
	return a
}

func TestOpen(t *testing.T) {
	t.Parallel()
	a := unreachable(t)
	require.Equal(t, "127.0.0.1:1", a.Addr())
	require.Equal(t, "mariadb", a.Flavor().Name())

	_, err := replication.Open("root@unix(/tmp/mysql.sock)/")
	require.ErrorContains(t, err, "TCP address")
	_, err = replication.Open("not a dsn")
	require.ErrorContains(t, err, "replication: Open")

	_, err = replication.New(nil, "127.0.0.1:3306", replication.MariaDB)
	require.ErrorContains(t, err, "db is nil")
	db, err := sql.Open("mysql", "root@tcp(127.0.0.1:1)/")
	require.NoError(t, err)
	defer db.Close()
	_, err = replication.New(db, "127.0.0.1:3306", nil)
	require.ErrorContains(t, err, "flavor is nil")
	_, err = replication.New(db, "no-port", replication.MariaDB)
	require.ErrorContains(t, err, "want host:port")
	b, err := replication.New(db, "db-eu.internal:3306", replication.MariaDB)
	require.NoError(t, err)
	require.NoError(t, b.Close())
	require.NotContains(t, db.Ping().Error(), "database is closed", "Close leaves a caller's pool alone")
}

func TestMySQL8IsNotSupportedYet(t *testing.T) {
	t.Parallel()
	f, err := replication.MySQL8()
	require.Nil(t, f)
	require.ErrorIs(t, err, replication.ErrNotSupported)
	require.ErrorContains(t, err, "MySQL 8")
}

func TestBadInputIsRejectedBeforeConnecting(t *testing.T) {
	t.Parallel()
	a := unreachable(t)
	ctx := t.Context()
	good := replication.Credentials{User: "repl", Password: "pw"}
	app := replication.Credentials{User: "app", Password: "pw"}
	for _, tc := range []struct {
		name      string
		repl, app replication.Credentials
		want      string
	}{
		{"no user", replication.Credentials{Password: "pw"}, app, "want 1 to 80 characters"},
		{"long user", replication.Credentials{User: string(make([]byte, 81)), Password: "pw"}, app, "want 1 to 80"},
		{"no password", replication.Credentials{User: "repl"}, app, "a password is required"},
		{"backslash", replication.Credentials{User: "repl", Password: `p\w`}, app, "without backslashes"},
		{"newline", good, replication.Credentials{User: "a\npp", Password: "pw"}, "control characters"},
		{"bad host", replication.Credentials{User: "repl", Password: "pw", Host: "a b"}, app, `host "a b"`},
		{"bad database", good, replication.Credentials{User: "app", Password: "pw", Database: "tri-age"}, `database "tri-age"`},
		{"same account", good, good, "must differ"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := a.EnsureUsers(ctx, tc.repl, tc.app)
			require.ErrorContains(t, err, tc.want)
			require.NotContains(t, err.Error(), "connect", "validated before dialing")
		})
	}

	for _, addr := range []string{"", "host", "host:0", "host:65536", "host:x", "a b:3306", "%:3306"} {
		err := a.ReplicateFrom(ctx, addr, good)
		require.ErrorContains(t, err, "address", "%q", addr)
		require.ErrorContains(t, a.RejoinAsReplica(ctx, addr, good), "address", "%q", addr)
	}
	require.ErrorContains(t, a.ReplicateFrom(ctx, "127.0.0.1:3306", replication.Credentials{User: "repl"}), "password")
	_, err := a.Promote(ctx, 0, nil)
	require.ErrorContains(t, err, "want more than 0")
	_, err = replication.MostAdvanced(ctx, nil)
	require.ErrorContains(t, err, "no replicas")
}

func TestRejoinArgs(t *testing.T) {
	t.Parallel()
	args := replication.RejoinArgs()
	require.Contains(t, args, "--init-rpl-role=SLAVE", "crash recovery cuts unacknowledged transactions")
	require.Contains(t, args, "--read-only=ON", "the role alone does not fence")
	require.Contains(t, args, "--skip-slave-start")
	args[0] = "mutated"
	require.Equal(t, "--init-rpl-role=SLAVE", replication.RejoinArgs()[0], "each call returns a fresh slice")
	// TestFailover restarts a killed primary with these arguments and checks
	// their effect on a real mariadbd.
}

func TestSemiSyncFellBack(t *testing.T) {
	t.Parallel()
	require.True(t, replication.SemiSync{PrimaryEnabled: true}.FellBack())
	require.False(t, replication.SemiSync{PrimaryEnabled: true, Active: true}.FellBack())
	require.False(t, replication.SemiSync{ReplicaEnabled: true}.FellBack(), "a replica never falls back")
}
