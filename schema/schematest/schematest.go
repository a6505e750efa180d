package schematest

import (
	"database/sql"
	"maps"
	"testing"

	"github.com/go-sql-driver/mysql"
	"github.com/jmoiron/sqlx"

	"github.com/triage-queue/triage/deploy/mariadb/mariadbtest"
	"github.com/triage-queue/triage/schema"
)

// DB returns a migrated, otherwise empty database of its own for t.
// params are extra session variables for the DSN, as in
// {"tx_isolation": "'READ-COMMITTED'"}; nil for none. The connection
// allows multiple statements per Exec, as schema.Migrate needs.
func DB(t testing.TB, params map[string]string) *sqlx.DB {
	t.Helper()
	cfg, err := mysql.ParseDSN(mariadbtest.Database(t))
	if err != nil {
		t.Fatalf("schematest: %v", err)
	}
	cfg.MultiStatements = true
	if len(params) > 0 {
		if cfg.Params == nil {
			cfg.Params = map[string]string{}
		}
		maps.Copy(cfg.Params, params)
	}
	root, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatalf("schematest: %v", err)
	}
	t.Cleanup(func() { root.Close() })
	if _, err := schema.Migrate(t.Context(), root); err != nil {
		t.Fatalf("schematest: migrate: %v", err)
	}
	return sqlx.NewDb(root, "mysql")
}
