package replication

import (
	"database/sql"
	"testing"

	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"

	"github.com/triage-queue/triage/deploy/mariadb/mariadbtest"
)

// TestExecStopsAtTheFirstFailure: exec sends a step's statements in one
// round trip (a promotion across the WAN paid one per statement), and they
// keep their order and their all-or-stop meaning: those after a failing
// one do not run. Promote relies on it: read_only=0 follows the semi-sync
// settings only if they took.
func TestExecStopsAtTheFirstFailure(t *testing.T) {
	ctx := t.Context()
	cfg, err := mysql.ParseDSN(mariadbtest.Database(t))
	require.NoError(t, err)
	a, err := Open(cfg.FormatDSN())
	require.NoError(t, err)
	t.Cleanup(func() { a.Close() })
	require.True(t, a.multi)

	var first, after sql.NullInt64
	err = a.session(ctx, func(c *sql.Conn) error {
		if err := a.exec(ctx, c, "batch", "SET @first = 1", "SET @second = 2"); err != nil {
			return err
		}
		if err := c.QueryRowContext(ctx, "SELECT @first + @second").Scan(&first); err != nil {
			return err
		}
		err := a.exec(ctx, c, "failing batch", "SET @before = 1", "SELECT no_such_column", "SET @after = 1")
		require.ErrorContains(t, err, "failing batch")
		require.ErrorContains(t, err, "no_such_column")
		return c.QueryRowContext(ctx, "SELECT @after").Scan(&after)
	})
	require.NoError(t, err)
	require.EqualValues(t, 3, first.Int64)
	require.False(t, after.Valid, "a statement after the failing one ran")
}
