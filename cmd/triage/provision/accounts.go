package provision

import (
	"cmp"
	"context"
	"database/sql"
	"fmt"

	_ "github.com/go-sql-driver/mysql" // the "mysql" driver of sql.Open

	"github.com/triage-queue/triage/regions/replication"
)

// Accounts are the two MariaDB accounts every server of a deployment gets.
type Accounts struct {
	// App is the account nodes use; App.Database is the shard database
	// whose rows it may read and change (no DDL).
	App replication.Credentials
	// Repl is the account replicas log in to their primary with.
	Repl replication.Credentials
}

// BedAccounts are the accounts of the local bed (deploy/bed) and the compose
// bed (deploy/compose), whose node configs name them too. They are fixed
// because both beds are test rigs on loopback or a private Docker network,
// and because a drill in another process must log in without reading a
// secret from bed.json.
var BedAccounts = Accounts{
	App:  replication.Credentials{User: "triage", Password: "triage", Database: "triage"},
	Repl: replication.Credentials{User: "repl", Password: "repl"},
}

// EnsureAccounts creates, or brings up to date, acc's accounts on the
// server of the admin DSN dsn (see replication.Admin.EnsureUsers): the
// application account gets SELECT, INSERT, UPDATE and DELETE on its
// database and nothing else. Schema migrations run as the admin account
// (bootstrap, or a node's admin when a shard's schema is behind), so a
// leaked application password can change rows but not tables, and cannot
// lift read_only. What an existing account held beyond that is revoked:
// DDL on the database, every global privilege (a node refuses an account
// with SUPER, READ_ONLY ADMIN or ALL PRIVILEGES: schema.CheckGrants) and
// its default role, whose privileges a session would hold too. An account
// whose RequireSSL is set is created REQUIRE SSL: its login over plain TCP
// is refused. The statements are unlogged like every admin statement, so
// that they create no GTID.
func EnsureAccounts(ctx context.Context, dsn string, acc Accounts) error {
	a, err := replication.Open(dsn)
	if err != nil {
		return err
	}
	defer a.Close()
	if err := a.EnsureUsers(ctx, acc.Repl, acc.App); err != nil {
		return err
	}
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	c, err := db.Conn(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	// EnsureUsers has validated the names, so they can be spliced in
	// quoted; the defaults are EnsureUsers' too. EnsureUsers granted on
	// the database, so the grant row exists and the REVOKE cannot fail
	// for want of one.
	database, account := cmp.Or(acc.App.Database, "triage"), "'"+acc.App.User+"'@'"+cmp.Or(acc.App.Host, "%")+"'"
	for _, stmt := range []string{
		"SET SESSION sql_log_bin = 0",
		"REVOKE CREATE, DROP, ALTER, INDEX ON `" + database + "`.* FROM " + account,
		// Global privileges only: the grant on the database stays.
		"REVOKE ALL PRIVILEGES ON *.* FROM " + account,
		"SET DEFAULT ROLE NONE FOR " + account,
	} {
		if _, err := c.ExecContext(ctx, stmt); err != nil {
			return fmt.Errorf("revoke what %s holds beyond its rows on %s: %w", acc.App.User, a.Addr(), err)
		}
	}
	return nil
}
