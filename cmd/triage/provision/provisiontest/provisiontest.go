package provisiontest

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/triage-queue/triage/cmd/triage/provision"
	"github.com/triage-queue/triage/regions/replication"
	"github.com/triage-queue/triage/shardmap"
)

// App is one test's application account: a random user and password with
// SELECT, INSERT, UPDATE and DELETE on the databases granted to it, and a
// replication account EnsureAccounts makes beside it. Drop removes both
// from every server they were made on.
type App struct {
	acc provision.Accounts

	mu      sync.Mutex
	servers map[string]bool // addresses the accounts were made on
}

// New returns an application account made on no server yet, for code
// without a testing.TB (a bed that examples share); it calls Drop.
func New() *App {
	return &App{servers: map[string]bool{}, acc: provision.Accounts{
		App:  replication.Credentials{User: "app_" + random(), Password: random()},
		Repl: replication.Credentials{User: "repl_" + random(), Password: random()},
	}}
}

// ForTest is New, dropped when t ends.
func ForTest(t testing.TB) *App {
	a := New()
	t.Cleanup(a.Drop)
	return a
}

// Credentials are the account as a node's config names it (mysql).
func (a *App) Credentials() shardmap.Credentials {
	return shardmap.Credentials{User: a.acc.App.User, Password: a.acc.App.Password}
}

// Grant makes the account on the server at addr (whose root logs in
// without a password, as the test servers' does) and lets it use
// database.
func (a *App) Grant(ctx context.Context, addr, database string) error {
	acc := a.acc
	acc.App.Database = database
	a.mu.Lock()
	a.servers[addr] = true
	a.mu.Unlock()
	if err := provision.EnsureAccounts(ctx, rootDSN(addr), acc); err != nil {
		return fmt.Errorf("provisiontest: application account on %s for %s: %w", addr, database, err)
	}
	return nil
}

// GrantMap grants the database of every shard of m on its primary.
func (a *App) GrantMap(ctx context.Context, m *shardmap.Map) error {
	for _, s := range m.Shards {
		if err := a.Grant(ctx, s.Primary, s.Database); err != nil {
			return err
		}
	}
	return nil
}

// Drop removes the accounts from every server they were made on; a
// server that is down is skipped.
func (a *App) Drop() {
	a.mu.Lock()
	defer a.mu.Unlock()
	for addr := range a.servers {
		db, err := sql.Open("mysql", rootDSN(addr))
		if err != nil {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		for _, u := range []string{a.acc.App.User, a.acc.Repl.User} {
			_, _ = db.ExecContext(ctx, "DROP USER IF EXISTS '"+u+"'@'%'")
		}
		cancel()
		db.Close()
	}
	clear(a.servers)
}

func rootDSN(addr string) string {
	c := mysql.NewConfig()
	c.User, c.Net, c.Addr = "root", "tcp", addr
	c.Timeout = 5 * time.Second
	return c.FormatDSN()
}

func random() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
