package e2e

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"

	"github.com/triage-queue/triage/cmd/triage/natsserver"
	"github.com/triage-queue/triage/cmd/triage/node"
	"github.com/triage-queue/triage/cmd/triage/provision"
	"github.com/triage-queue/triage/deploy/mariadb"
	"github.com/triage-queue/triage/deploy/mariadb/mariadbtest"
	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
	"github.com/triage-queue/triage/regions/replication"
	"github.com/triage-queue/triage/routing"
	"github.com/triage-queue/triage/routing/auth/authtest"
	"github.com/triage-queue/triage/schema"
	"github.com/triage-queue/triage/shardmap"
)

// appAccount creates, on the shared server, an application account and a
// replication account (provision.EnsureAccounts, as the beds do) for
// database, with random names and passwords, dropped when the test ends.
func appAccount(t *testing.T, database string) replication.Credentials {
	t.Helper()
	random := func() string {
		var b [6]byte
		_, _ = rand.Read(b[:])
		return hex.EncodeToString(b[:])
	}
	acc := provision.Accounts{
		App:  replication.Credentials{User: "app_" + random(), Password: random(), Database: database},
		Repl: replication.Credentials{User: "repl_" + random(), Password: random()},
	}
	root := mariadbtest.Server(t).DSN("")
	require.NoError(t, provision.EnsureAccounts(t.Context(), root, acc))
	t.Cleanup(func() {
		db, err := sql.Open("mysql", root)
		if err != nil {
			return
		}
		defer db.Close()
		for _, u := range []string{acc.App.User, acc.Repl.User} {
			_, _ = db.Exec("DROP USER IF EXISTS '" + u + "'@'%'")
		}
	})
	return acc.App
}

// mysqlErr is the server's error number of err, 0 if it is none.
func mysqlErr(err error) uint16 {
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		return me.Number
	}
	return 0
}

// TestLeastPrivilegeAccount: a node whose roles log in as the application
// account, its password read from a file, migrates the fresh shard through
// its admin account (the application account has no DDL) and then
// enqueues, dequeues and acks; the application account cannot create or
// drop tables or lift read_only, and never appears in the shard map. NATS
// requires logins: the node's Triage login (password from the
// environment) has every subject the roles use.
func TestLeastPrivilegeAccount(t *testing.T) {
	natsAuth := &natsserver.Auth{Triage: natsserver.Login{User: "triage", Password: "nats-" + t.Name()},
		Clients: []natsserver.Login{{User: "client", Password: "client-" + t.Name()}}}
	t.Setenv("TRIAGE_TEST_NATS_PASSWORD", natsAuth.Triage.Password)
	b := setup(t, bedOpts{shards: 1, noNode: true, natsAuth: natsAuth})
	m, err := shardmap.Parse(mustRead(t, b.mapFile))
	require.NoError(t, err)
	shard := m.Shards[0]
	app := appAccount(t, shard.Database)
	pwFile := filepath.Join(t.TempDir(), "mysql-app.password")
	require.NoError(t, os.WriteFile(pwFile, []byte(app.Password+"\n"), 0o600))

	b.startNode(node.Config{MySQL: shardmap.Credentials{User: app.User, PasswordFile: pwFile},
		NATSAuth: &shardmap.NATSLogin{User: "triage", PasswordEnv: "TRIAGE_TEST_NATS_PASSWORD"}})
	requireRoundTrip(t, b)

	// The health checks and the observer ping as the application account.
	require.NoError(t, b.node.Healthy(b.ctx()))
	require.Eventually(t, func() bool {
		resp, err := http.Get(b.metrics + "/metrics")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		data, _ := io.ReadAll(resp.Body)
		return strings.Contains(string(data), `triage_shard_primary_up{shard="1"} 1`)
	}, 10*time.Second, 50*time.Millisecond, "the observer reaches the primary as the application account")

	sm, err := b.admin.GetShardMap(b.ctx(), &triagev1.GetShardMapRequest{})
	require.NoError(t, err)
	require.NotContains(t, sm.String(), app.Password)
	require.NotContains(t, sm.String(), app.User)

	// The account itself, outside Triage: rows yes, schema and server no.
	cfg := mysql.NewConfig()
	cfg.User, cfg.Passwd, cfg.Net, cfg.Addr, cfg.DBName = app.User, app.Password, "tcp", shard.Primary, shard.Database
	db, err := sql.Open("mysql", cfg.FormatDSN())
	require.NoError(t, err)
	defer db.Close()
	ctx := b.ctx()
	var n int
	require.NoError(t, db.QueryRowContext(ctx, "SELECT COUNT(*) FROM items").Scan(&n))
	const (
		erTableAccessDenied    = 1142 // CREATE, DROP, ALTER ... command denied to user
		erSpecificAccessDenied = 1227 // needs SUPER (or another admin privilege)
	)
	for stmt, want := range map[string]uint16{
		"CREATE TABLE evil (id INT PRIMARY KEY)": erTableAccessDenied,
		"DROP TABLE items":                       erTableAccessDenied,
		"ALTER TABLE items ADD COLUMN evil INT":  erTableAccessDenied,
		"CREATE INDEX evil ON items (priority)":  erTableAccessDenied,
		"SET GLOBAL read_only = ON":              erSpecificAccessDenied,
	} {
		_, err := db.ExecContext(ctx, stmt)
		require.Error(t, err, stmt)
		require.Equal(t, want, mysqlErr(err), "%s: %v", stmt, err)
	}
	// Server-wide statements: some access error, whichever MariaDB picks.
	for _, stmt := range []string{
		"CREATE DATABASE evil_" + app.User,
		"GRANT SELECT ON *.* TO '" + app.User + "'@'%'",
		"CREATE USER evil_" + app.User + " IDENTIFIED BY 'x'",
		"SET GLOBAL rpl_semi_sync_master_enabled = OFF",
	} {
		_, err := db.ExecContext(ctx, stmt)
		require.Error(t, err, stmt)
		require.Contains(t, []uint16{1044, 1045, 1142, 1227}, mysqlErr(err), "%s: %v", stmt, err)
	}
	var readOnly int
	require.NoError(t, db.QueryRowContext(ctx, "SELECT @@global.read_only").Scan(&readOnly))
	require.Zero(t, readOnly)
}

// TestMigrateShardNeedsAdminOnlyWhenBehind: a shard whose schema is
// current needs no admin account (a node of a bootstrapped cluster never
// logs in as one); a fresh shard does, and a wrong admin password fails
// its migration instead of leaving it half done.
func TestMigrateShardNeedsAdminOnlyWhenBehind(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	var shards []shardmap.Shard
	for i := 1; i <= 2; i++ {
		c, err := mysql.ParseDSN(mariadbtest.Database(t))
		require.NoError(t, err)
		shards = append(shards, shardmap.Shard{ID: uint32(i), HomeRegion: "us-east", Primary: c.Addr, Database: c.DBName})
	}
	m, err := shardmap.New(shardmap.Map{Version: 1, Regions: []string{"us-east"}, Shards: shards, Namespaces: []shardmap.Namespace{{Name: "default"}}})
	require.NoError(t, err)
	pool := func(c shardmap.Credentials) *shardmap.Pool {
		p := shardmap.NewPool(c)
		t.Cleanup(func() { p.Close() })
		return p
	}
	root := pool(shardmap.Credentials{})
	badAdmin := pool(shardmap.Credentials{User: "root", Password: "not-the-password"})
	// Shard 1 migrated by an administrator; shard 2 fresh.
	require.NoError(t, routing.MigrateShard(ctx, root, root, m, 1))
	for _, s := range shards {
		app := appAccount(t, s.Database)
		appPool := pool(shardmap.Credentials{User: app.User, Password: app.Password})
		if s.ID == 1 {
			require.NoError(t, routing.MigrateShard(ctx, appPool, badAdmin, m, s.ID), "current schema: no admin login")
			continue
		}
		err := routing.MigrateShard(ctx, appPool, badAdmin, m, s.ID)
		require.Error(t, err)
		require.Equal(t, uint16(1045), mysqlErr(err), "access denied for the wrong admin password: %v", err)
		require.ErrorContains(t, err, "schema migration(s) pending and this node's admin account may not run them", "the refusal says what to do")
		require.ErrorContains(t, err, "migrate the shard as an administrator first")
		err = routing.MigrateShard(ctx, appPool, appPool, m, s.ID)
		require.Equal(t, uint16(1142), mysqlErr(err), "the application account cannot migrate: %v", err)
		require.NoError(t, routing.MigrateShard(ctx, appPool, root, m, s.ID))
		require.NoError(t, routing.MigrateShard(ctx, appPool, badAdmin, m, s.ID), "now current")
	}
}

// TestMySQLTLS: with mysql.tls the application pool verifies the server's
// certificate against ca_file and the session is encrypted, so an account
// that REQUIREs SSL logs in; a CA that did not sign the server's
// certificate is refused, and so is the account without TLS. With
// cert_file and key_file the pool shows its certificate, so an account
// that REQUIREs X509 logs in too, and is refused without it.
func TestMySQLTLS(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ca := authtest.NewCA(t, "mysql test CA")
	crt, key := ca.Issue(t, "mariadb", true)
	authtest.Write(t, filepath.Join(dir, "server.crt"), crt)
	authtest.Write(t, filepath.Join(dir, "server.key"), key)
	authtest.Write(t, filepath.Join(dir, "ca.crt"), ca.PEM)
	authtest.Write(t, filepath.Join(dir, "other-ca.crt"), authtest.NewCA(t, "another CA").PEM)
	clientCrt, clientKey := ca.Issue(t, "triage-node", false)
	authtest.Write(t, filepath.Join(dir, "client.crt"), clientCrt)
	authtest.Write(t, filepath.Join(dir, "client.key"), clientKey)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	srv, err := mariadb.Start(ctx, mariadb.Config{Dir: filepath.Join(dir, "db"), ExtraArgs: []string{
		"--ssl-ca=" + filepath.Join(dir, "ca.crt"), "--ssl-cert=" + filepath.Join(dir, "server.crt"), "--ssl-key=" + filepath.Join(dir, "server.key")}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = srv.Stop() })
	require.NoError(t, srv.CreateDatabase(ctx, "triage"))
	root, err := sql.Open("mysql", srv.DSN(""))
	require.NoError(t, err)
	defer root.Close()
	for _, stmt := range []string{"CREATE USER tls_app IDENTIFIED BY 'pw' REQUIRE SSL", "GRANT SELECT ON triage.* TO tls_app",
		"CREATE USER x509_app IDENTIFIED BY 'pw' REQUIRE X509", "GRANT SELECT ON triage.* TO x509_app"} {
		_, err := root.ExecContext(ctx, stmt)
		require.NoError(t, err, stmt)
	}
	m, err := shardmap.New(shardmap.Map{Version: 1, Regions: []string{"us-east"}, Namespaces: []shardmap.Namespace{{Name: "default"}},
		Shards: []shardmap.Shard{{ID: 1, HomeRegion: "us-east", Primary: srv.Addr(), Database: "triage"}}})
	require.NoError(t, err)
	cipher := func(c shardmap.Credentials) (string, error) {
		c, err := c.Resolve()
		require.NoError(t, err)
		p := shardmap.NewAppPool(c)
		defer p.Close()
		db, _, err := p.Primary(m, 1)
		require.NoError(t, err)
		var name, value string
		err = db.QueryRowContext(ctx, "SHOW SESSION STATUS LIKE 'Ssl_cipher'").Scan(&name, &value)
		return value, err
	}
	got, err := cipher(shardmap.Credentials{User: "tls_app", Password: "pw", TLS: &shardmap.MySQLTLS{CAFile: filepath.Join(dir, "ca.crt")}})
	require.NoError(t, err)
	require.NotEmpty(t, got, "the session is encrypted")
	_, err = cipher(shardmap.Credentials{User: "tls_app", Password: "pw", TLS: &shardmap.MySQLTLS{CAFile: filepath.Join(dir, "other-ca.crt")}})
	require.ErrorContains(t, err, "certificate", "a server certificate from another CA is refused")
	_, err = cipher(shardmap.Credentials{User: "tls_app", Password: "pw"})
	require.Equal(t, uint16(1045), mysqlErr(err), "REQUIRE SSL refuses a plain login: %v", err)

	withCert := &shardmap.MySQLTLS{CAFile: filepath.Join(dir, "ca.crt"), CertFile: filepath.Join(dir, "client.crt"), KeyFile: filepath.Join(dir, "client.key")}
	got, err = cipher(shardmap.Credentials{User: "x509_app", Password: "pw", TLS: withCert})
	require.NoError(t, err)
	require.NotEmpty(t, got, "the session is encrypted")
	_, err = cipher(shardmap.Credentials{User: "x509_app", Password: "pw", TLS: &shardmap.MySQLTLS{CAFile: filepath.Join(dir, "ca.crt")}})
	require.Equal(t, uint16(1045), mysqlErr(err), "REQUIRE X509 refuses a login without a certificate: %v", err)
	_, err = shardmap.Credentials{User: "x509_app", TLS: &shardmap.MySQLTLS{CAFile: withCert.CAFile, CertFile: withCert.CertFile}}.Resolve()
	require.ErrorContains(t, err, "cert_file and key_file go together")
}

// requireRoundTrip enqueues two items, dequeues them most urgent first and
// acks them, leaving no row behind: the node works with whatever logins
// and transport the test gave it.
func requireRoundTrip(t *testing.T, b *bed) {
	t.Helper()
	res := enqueue(t, b, "jobs", &triagev1.NewItem{Payload: []byte("a"), Priority: 1}, &triagev1.NewItem{Payload: []byte("b"), Priority: 0})
	require.Len(t, res, 2)
	got := dequeue(t, b, "jobs", 2, 0)
	require.Len(t, got, 2)
	require.Equal(t, "b", string(got[0].Payload))
	for _, r := range ack(t, b, got...) {
		require.True(t, r.Ok, r.Error)
	}
	require.Equal(t, 0, b.rowCount("items"))
}

// TestNodeRefusesAccountsThatWriteThroughReadOnly: a node whose
// application account MariaDB lets write through read_only (root; an
// account with READ_ONLY ADMIN) or that holds SUPER does not start: the
// failover's fence would not stop its writes on a deposed primary. The
// error says which privilege and what the account must be. A config
// without mysql.user does not start either, saying what to set; root is
// never assumed.
func TestNodeRefusesAccountsThatWriteThroughReadOnly(t *testing.T) {
	b := setup(t, bedOpts{shards: 1, noNode: true})
	m, err := shardmap.Parse(mustRead(t, b.mapFile))
	require.NoError(t, err)
	shard := m.Shards[0]
	root, err := sql.Open("mysql", mariadbtest.Server(t).DSN(""))
	require.NoError(t, err)
	defer root.Close()
	privileged := func(privilege string) shardmap.Credentials {
		app := appAccount(t, shard.Database)
		_, err := root.ExecContext(t.Context(), "GRANT "+privilege+" ON *.* TO '"+app.User+"'@'%'")
		require.NoError(t, err)
		return shardmap.Credentials{User: app.User, Password: app.Password}
	}
	start := func(cred shardmap.Credentials) error {
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		cfg := b.config(node.Config{})
		cfg.MySQL = cred
		n, err := node.Start(ctx, cfg, testLogger(t))
		if err == nil {
			n.Stop()
		}
		return err
	}
	for _, tc := range []struct {
		name string
		cred shardmap.Credentials
		says string
	}{
		{"root", shardmap.Credentials{User: "root"}, "holds ALL PRIVILEGES on *.*"},
		{"read_only admin", privileged("READ_ONLY ADMIN"), "holds READ_ONLY ADMIN on *.*"},
		{"super", privileged("SUPER"), "holds SUPER on *.*"},
	} {
		err := start(tc.cred)
		require.ErrorIs(t, err, schema.ErrPrivilegedAccount, tc.name)
		require.ErrorContains(t, err, tc.says, tc.name)
		require.ErrorContains(t, err, "shard 1 at "+shard.Primary, tc.name)
	}
	err = start(shardmap.Credentials{})
	require.ErrorIs(t, err, shardmap.ErrNoAppUser)
	require.ErrorContains(t, err, "node config: set mysql.user")
}
