package schema_test

import (
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"

	"github.com/go-sql-driver/mysql"

	"github.com/stretchr/testify/require"

	"github.com/triage-queue/triage/deploy/mariadb/mariadbtest"
	"github.com/triage-queue/triage/schema"
	"github.com/triage-queue/triage/schema/schematest"
)

// TestCheckServerTakesTheTestServer: the MariaDB the tests run on (the
// version README's commands install) passes the check every shard meets.
func TestCheckServerTakesTheTestServer(t *testing.T) {
	db := schematest.DB(t, nil)
	require.NoError(t, schema.CheckServer(t.Context(), db.DB))
}

// TestCheckAccountOnTheServer: on the MariaDB the tests run on, an account
// that MariaDB lets write through read_only, or one with SUPER, is refused
// by CheckAccount, also when the privilege comes with its default role;
// the application account (DML on its database) is taken, and so is a
// role it holds that is no bypass. What is refused is checked against the
// server itself: with read_only on, the refused accounts' writes get
// through where they have READ_ONLY ADMIN, the application account's do
// not.
func TestCheckAccountOnTheServer(t *testing.T) {
	ctx := t.Context()
	dsn := mariadbtest.Database(t)
	root, err := sql.Open("mysql", dsn)
	require.NoError(t, err)
	t.Cleanup(func() { root.Close() })
	cfg, err := mysql.ParseDSN(dsn)
	require.NoError(t, err)
	_, err = root.ExecContext(ctx, "CREATE TABLE fence (id INT PRIMARY KEY)")
	require.NoError(t, err)
	var b [4]byte
	_, _ = rand.Read(b[:])
	suffix := hex.EncodeToString(b[:])
	dml := "GRANT SELECT, INSERT, UPDATE, DELETE ON `" + cfg.DBName + "`.* TO %s"
	for i, tc := range []struct {
		name   string
		grants []string // %s is the account
		says   string   // "" when taken
		// writes: MariaDB lets the account write with read_only on.
		writes bool
	}{
		{name: "application account", grants: []string{dml}},
		{name: "harmless default role", grants: []string{dml, "CREATE ROLE %[1]s_r", "GRANT SELECT ON `" + cfg.DBName + "`.* TO %[1]s_r",
			"GRANT %[1]s_r TO %[1]s", "SET DEFAULT ROLE %[1]s_r FOR %[1]s"}},
		{name: "root", says: "holds ALL PRIVILEGES on *.*", writes: true},
		{name: "all privileges", grants: []string{"GRANT ALL PRIVILEGES ON *.* TO %s"}, says: "holds ALL PRIVILEGES on *.*", writes: true},
		{name: "read_only admin", grants: []string{dml, "GRANT READ_ONLY ADMIN ON *.* TO %s"}, says: "holds READ_ONLY ADMIN on *.*", writes: true},
		{name: "super", grants: []string{dml, "GRANT SUPER ON *.* TO %s"}, says: "holds SUPER on *.*"},
		{name: "read_only admin by default role", grants: []string{dml, "CREATE ROLE %[1]s_r", "GRANT READ_ONLY ADMIN ON *.* TO %[1]s_r",
			"GRANT %[1]s_r TO %[1]s", "SET DEFAULT ROLE %[1]s_r FOR %[1]s"}, says: "holds READ_ONLY ADMIN on *.* through its role", writes: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			login := *cfg
			if tc.grants != nil {
				user := fmt.Sprintf("chk%d_%s", i, suffix)
				account := "'" + user + "'@'%'"
				t.Cleanup(func() {
					_, _ = root.Exec("DROP USER IF EXISTS " + account)
					_, _ = root.Exec("DROP ROLE IF EXISTS " + user + "_r")
				})
				stmts := append([]string{"CREATE USER " + account + " IDENTIFIED BY 'pw'"}, tc.grants...)
				for _, g := range stmts {
					stmt := strings.ReplaceAll(g, "%[1]s_r", user+"_r")
					stmt = strings.ReplaceAll(strings.ReplaceAll(stmt, "%[1]s", account), "%s", account)
					_, err := root.ExecContext(ctx, stmt)
					require.NoError(t, err, stmt)
				}
				login.User, login.Passwd = user, "pw"
			}
			db, err := sql.Open("mysql", login.FormatDSN())
			require.NoError(t, err)
			defer db.Close()
			err = schema.CheckAccount(ctx, db)
			if tc.says == "" {
				require.NoError(t, err)
			} else {
				require.ErrorIs(t, err, schema.ErrPrivilegedAccount)
				require.ErrorContains(t, err, tc.says)
			}
			// What the server does with read_only on, on one connection
			// (the global is read at the statement).
			conn, err := db.Conn(ctx)
			require.NoError(t, err)
			defer conn.Close()
			_, err = root.ExecContext(ctx, "SET GLOBAL read_only = ON")
			require.NoError(t, err)
			_, werr := conn.ExecContext(ctx, "INSERT INTO fence (id) VALUES (?) ON DUPLICATE KEY UPDATE id = id", i)
			_, err = root.ExecContext(ctx, "SET GLOBAL read_only = OFF")
			require.NoError(t, err)
			if tc.writes {
				require.NoError(t, werr, "MariaDB lets this account write through read_only")
			} else {
				require.ErrorContains(t, werr, "read-only", "read_only stops this account")
			}
		})
	}
}
