package schema

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
)

//go:embed migrations/*.up.sql
var migrations embed.FS

// Migration is one numbered schema step.
type Migration struct {
	Version int
	Name    string
	SQL     string
}

// All returns the embedded migrations in version order.
func All() ([]Migration, error) {
	names, err := fs.Glob(migrations, "migrations/*.up.sql")
	if err != nil {
		return nil, err
	}
	var out []Migration
	for _, n := range names {
		base := strings.TrimPrefix(n, "migrations/")
		num, _, ok := strings.Cut(base, "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil {
			return nil, fmt.Errorf("migration %s: name must start with a number and '_'", base)
		}
		body, err := migrations.ReadFile(n)
		if err != nil {
			return nil, err
		}
		out = append(out, Migration{Version: v, Name: base, SQL: string(body)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	return out, nil
}

// Migrate applies the migrations db has not seen yet and returns how many it
// applied. db must allow multiple statements per Exec.
func Migrate(ctx context.Context, db *sql.DB) (int, error) {
	all, err := All()
	if err != nil {
		return 0, err
	}
	conn, err := db.Conn(ctx)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	var got sql.NullInt64
	if err := conn.QueryRowContext(ctx, "SELECT GET_LOCK('triage_migrate', 60)").Scan(&got); err != nil || got.Int64 != 1 {
		return 0, fmt.Errorf("migrate: could not take the migration lock: %v", err)
	}
	defer conn.ExecContext(context.WithoutCancel(ctx), "DO RELEASE_LOCK('triage_migrate')")
	if _, err := conn.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
		version INT NOT NULL PRIMARY KEY, name VARCHAR(255) NOT NULL, applied_at BIGINT NOT NULL) ENGINE=InnoDB`); err != nil {
		return 0, fmt.Errorf("migrate: %w", err)
	}
	applied := map[int]bool{}
	rows, err := conn.QueryContext(ctx, "SELECT version FROM schema_migrations")
	if err != nil {
		return 0, fmt.Errorf("migrate: %w", err)
	}
	for rows.Next() {
		var v int
		if err := rows.Scan(&v); err != nil {
			rows.Close()
			return 0, err
		}
		applied[v] = true
	}
	rows.Close()
	n := 0
	for _, m := range all {
		if applied[m.Version] {
			continue
		}
		// MySQL commits DDL implicitly, so a migration is made of idempotent
		// statements (IF NOT EXISTS) and recorded after it ran.
		if _, err := conn.ExecContext(ctx, m.SQL); err != nil {
			return n, fmt.Errorf("migrate %s: %w", m.Name, err)
		}
		if _, err := conn.ExecContext(ctx, "INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)",
			m.Version, m.Name, time.Now().UnixMicro()); err != nil {
			return n, fmt.Errorf("migrate %s: record: %w", m.Name, err)
		}
		n++
	}
	return n, nil
}

// errNoSuchTable is ER_NO_SUCH_TABLE.
const errNoSuchTable = 1146

// Pending returns how many migrations db has not applied yet. It only
// reads (schema_migrations), so the application account, which may not
// run DDL, can tell whether an admin needs to migrate: nodes and the
// router's AddShard migrate through the admin account only when this is
// not zero.
func Pending(ctx context.Context, db *sql.DB) (int, error) {
	all, err := All()
	if err != nil {
		return 0, err
	}
	var applied int
	err = db.QueryRowContext(ctx, "SELECT COUNT(*) FROM schema_migrations").Scan(&applied)
	var me *mysql.MySQLError
	switch {
	case errors.As(err, &me) && me.Number == errNoSuchTable:
		return len(all), nil
	case err != nil:
		return 0, fmt.Errorf("pending migrations: %w", err)
	}
	return max(len(all)-applied, 0), nil
}
