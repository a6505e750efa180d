package mariadbtest_test

import (
	"os"
	"strings"
	"testing"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/triage-queue/triage/deploy/mariadb/mariadbtest"
)

func TestMain(m *testing.M) { os.Exit(mariadbtest.Main(m)) }

func TestDatabaseIsFreshAndIsolated(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"a", "b/with spaces & UPPER " + strings.Repeat("x", 80)} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			dsn := mariadbtest.Database(t)
			db := sqlx.MustConnect("mysql", dsn)
			defer db.Close()
			var dbName string
			require.NoError(t, db.Get(&dbName, "SELECT DATABASE()"))
			require.True(t, strings.HasPrefix(dbName, "t_testdatabaseisfreshandisolated_"), dbName)
			require.LessOrEqual(t, len(dbName), 64)
			var n int
			require.NoError(t, db.Get(&n, "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE()"))
			require.Zero(t, n, "fresh database is empty")
			db.MustExec("CREATE TABLE t (id INT PRIMARY KEY)")
		})
	}
}

func TestSharedServerRestartsAfterKill(t *testing.T) {
	// Not parallel: it kills the server other tests share.
	s := mariadbtest.Server(t)
	require.NoError(t, s.Kill())
	s2 := mariadbtest.Server(t)
	require.NotEqual(t, s.PID(), s2.PID())
	require.Equal(t, s.Port(), s2.Port(), "earlier DSNs stay valid")
	db := sqlx.MustConnect("mysql", mariadbtest.Database(t))
	require.NoError(t, db.Ping())
	db.Close()
}

func TestNewServerIsDedicated(t *testing.T) {
	t.Parallel()
	s := mariadbtest.NewServer(t)
	require.NotEqual(t, mariadbtest.Server(t).Port(), s.Port())
	db := sqlx.MustConnect("mysql", s.DSN(""))
	defer db.Close()
	require.NoError(t, db.Ping())
}
