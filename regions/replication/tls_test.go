package replication_test

import (
	"crypto/tls"
	"crypto/x509"
	"database/sql"
	"errors"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/triage-queue/triage/deploy/mariadb"
	"github.com/triage-queue/triage/regions/replication"
	"github.com/triage-queue/triage/routing/auth/authtest"
)

// tlsFiles are a test CA, a server certificate it signed (127.0.0.1 and
// localhost) and another CA that signed nothing.
type tlsFiles struct {
	ca, otherCA, cert, key string
	pool                   *x509.CertPool
}

func writeTLSFiles(t *testing.T) tlsFiles {
	t.Helper()
	dir := t.TempDir()
	ca := authtest.NewCA(t, "replication test CA")
	crt, key := ca.Issue(t, "mariadb", true)
	f := tlsFiles{ca: filepath.Join(dir, "ca.crt"), otherCA: filepath.Join(dir, "other-ca.crt"),
		cert: filepath.Join(dir, "server.crt"), key: filepath.Join(dir, "server.key"), pool: ca.Pool()}
	authtest.Write(t, f.ca, ca.PEM)
	authtest.Write(t, f.otherCA, authtest.NewCA(t, "another CA").PEM)
	authtest.Write(t, f.cert, crt)
	authtest.Write(t, f.key, key)
	return f
}

// startTLSNodes is startNodes with every server offering TLS with f's
// certificate.
func startTLSNodes(t *testing.T, n int, f tlsFiles) []*node {
	t.Helper()
	args := []string{"--ssl-ca=" + f.ca, "--ssl-cert=" + f.cert, "--ssl-key=" + f.key}
	srvs := make([]*mariadb.Server, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		dir := t.TempDir()
		wg.Go(func() {
			srvs[i], errs[i] = mariadb.Start(t.Context(), mariadb.Config{Dir: dir, ServerID: i + 1, ExtraArgs: args})
		})
	}
	wg.Wait()
	for _, s := range srvs {
		if s != nil {
			stopAtCleanup(t, s)
		}
	}
	require.NoError(t, errors.Join(errs...))
	nodes := make([]*node, n)
	for i, s := range srvs {
		nodes[i] = attach(t, s)
	}
	return nodes
}

// replicaColumn is one column of the server's SHOW SLAVE STATUS.
func replicaColumn(t *testing.T, n *node, col string) string {
	t.Helper()
	rows, err := n.root.QueryContext(t.Context(), "SHOW SLAVE STATUS")
	require.NoError(t, err)
	defer rows.Close()
	cols, err := rows.Columns()
	require.NoError(t, err)
	require.True(t, rows.Next(), "%s replicates from somebody", n.srv.Addr())
	vals := make([]sql.NullString, len(cols))
	ptrs := make([]any, len(cols))
	for i := range vals {
		ptrs[i] = &vals[i]
	}
	require.NoError(t, rows.Scan(ptrs...))
	for i, c := range cols {
		if c == col {
			return vals[i].String
		}
	}
	t.Fatalf("SHOW SLAVE STATUS has no column %s", col)
	return ""
}

// waitIOError waits until the replica's IO thread reports error number
// errno, and returns its message.
func waitIOError(t *testing.T, n *node, errno int) string {
	t.Helper()
	var msg string
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		st, err := n.admin.Status(t.Context())
		if !assert.NoError(c, err) {
			return
		}
		assert.NotEqual(c, "Yes", st.IORunning)
		assert.Equal(c, errno, st.LastIOErrno, st.LastIOError)
		msg = st.LastIOError
	}, waitFor, tick)
	return msg
}

// TestReplicationOverTLS: with Credentials.TLS the replica connects to its
// primary over TLS (Master_SSL_Allowed = Yes, the server's name checked),
// at setup, after a failover's promotion and when the deposed primary
// rejoins; the accounts made REQUIRE SSL refuse a login over plain TCP,
// the application's and the replication account's (a replica pointed
// without TLS), and a replica whose CA did not sign the primary's
// certificate does not connect.
func TestReplicationOverTLS(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	f := writeTLSFiles(t)
	nodes := startTLSNodes(t, 2, f)
	p, r := nodes[0], nodes[1]
	replTLS := repl
	replTLS.RequireSSL, replTLS.TLS = true, &replication.TLS{CAFile: f.ca}
	appTLS := app
	appTLS.RequireSSL = true
	for _, nd := range nodes {
		require.NoError(t, nd.admin.EnsureUsers(ctx, replTLS, appTLS))
	}
	require.NoError(t, p.admin.EnableSemiSync(ctx, true))
	require.NoError(t, r.admin.EnableSemiSync(ctx, false))
	require.NoError(t, r.admin.ReplicateFrom(ctx, p.srv.Addr(), replTLS))
	waitSemiSyncClients(t, p, 1)
	exec(t, p.root, "CREATE DATABASE triage")
	exec(t, p.root, "CREATE TABLE triage.items (id BIGINT PRIMARY KEY, note VARCHAR(64) NOT NULL DEFAULT '')")
	waitCaughtUp(t, r, p)
	require.True(t, status(t, r).TLS, "the replica connects over TLS")
	require.Equal(t, "Yes", replicaColumn(t, r, "Master_SSL_Allowed"))
	require.Equal(t, f.ca, replicaColumn(t, r, "Master_SSL_CA_File"))
	require.Equal(t, "Yes", replicaColumn(t, r, "Master_SSL_Verify_Server_Cert"), "the certificate must name 127.0.0.1")

	// The application account logs in over TLS only.
	require.NoError(t, mysql.RegisterTLSConfig("replication-test", &tls.Config{RootCAs: f.pool, MinVersion: tls.VersionTLS12}))
	login := func(n *node, c replication.Credentials, tlsName string) (string, error) {
		cfg := mysql.NewConfig()
		cfg.User, cfg.Passwd, cfg.Net, cfg.Addr, cfg.TLSConfig, cfg.Timeout = c.User, c.Password, "tcp", n.srv.Addr(), tlsName, 5*time.Second
		db, err := sql.Open("mysql", cfg.FormatDSN())
		require.NoError(t, err)
		defer db.Close()
		var name, cipher string
		err = db.QueryRowContext(ctx, "SHOW SESSION STATUS LIKE 'Ssl_cipher'").Scan(&name, &cipher)
		return cipher, err
	}
	cipher, err := login(p, appTLS, "replication-test")
	require.NoError(t, err)
	require.NotEmpty(t, cipher)
	for _, c := range []replication.Credentials{appTLS, replTLS} {
		_, err = login(p, c, "")
		var me *mysql.MySQLError
		require.ErrorAs(t, err, &me, c.User)
		require.EqualValues(t, 1045, me.Number, "REQUIRE SSL refuses %s over plain TCP: %v", c.User, err)
	}

	// Failover: fence the primary, promote the replica, rejoin the old
	// primary as its replica. Both CHANGE MASTER TOs use TLS.
	insert(t, p.appDBTLS(t), 1, 5)
	require.NoError(t, p.admin.SetReadOnly(ctx, true))
	waitCaughtUp(t, r, p)
	_, err = r.admin.Promote(ctx, waitFor, nil)
	require.NoError(t, err)
	require.NoError(t, p.admin.RejoinAsReplica(ctx, r.srv.Addr(), replTLS))
	waitSemiSyncClients(t, r, 1)
	insert(t, r.appDBTLS(t), 6, 8)
	waitIDs(t, p, span(1, 8))
	waitCaughtUp(t, p, r)
	require.True(t, status(t, p).TLS, "the rejoined primary connects over TLS")
	require.Equal(t, "Yes", replicaColumn(t, p, "Master_SSL_Allowed"))

	// A repoint without TLS keeps the replica's TLS options; with them
	// turned off, the replication account is refused; with a CA that did
	// not sign the primary's certificate, the handshake fails.
	plain := replTLS
	plain.TLS = nil
	require.NoError(t, p.admin.ReplicateFrom(ctx, r.srv.Addr(), plain))
	require.Equal(t, "Yes", replicaColumn(t, p, "Master_SSL_Allowed"), "CHANGE MASTER TO without TLS options keeps the replica's")
	waitCaughtUp(t, p, r)
	rootNoBinlog(t, p, "STOP SLAVE", "CHANGE MASTER TO MASTER_SSL = 0", "START SLAVE")
	require.Equal(t, "No", replicaColumn(t, p, "Master_SSL_Allowed"))
	waitIOError(t, p, 1045)
	wrongCA := replTLS
	wrongCA.TLS = &replication.TLS{CAFile: f.otherCA}
	require.NoError(t, p.admin.ReplicateFrom(ctx, r.srv.Addr(), wrongCA))
	msg := waitIOError(t, p, 2026)
	require.Contains(t, msg, "SSL", "the handshake fails: %s", msg)

	require.NoError(t, p.admin.ReplicateFrom(ctx, r.srv.Addr(), replTLS))
	waitCaughtUp(t, p, r)
	require.True(t, status(t, p).TLS)
}

// appDBTLS is appDB over TLS (the test's registered CA).
func (n *node) appDBTLS(t *testing.T) *sql.DB {
	t.Helper()
	cfg := mysql.NewConfig()
	cfg.User, cfg.Passwd, cfg.Net, cfg.Addr, cfg.DBName, cfg.TLSConfig = app.User, app.Password, "tcp", n.srv.Addr(), "triage", "replication-test"
	db, err := sql.Open("mysql", cfg.FormatDSN())
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// TestTLSValidate: a TLS without a CA, a certificate without its key and
// a path that cannot be quoted under every sql_mode are refused before a
// statement is sent.
func TestTLSValidate(t *testing.T) {
	require.NoError(t, (&replication.TLS{CAFile: "/etc/ca.crt"}).Validate())
	require.NoError(t, (&replication.TLS{CAFile: "/etc/ca.crt", CertFile: "/etc/r.crt", KeyFile: "/etc/r.key"}).Validate())
	for _, bad := range []replication.TLS{
		{},
		{CAFile: "/etc/ca.crt", CertFile: "/etc/r.crt"},
		{CAFile: `C:\ca.crt`},
		{CAFile: "/etc/ca.crt\n"},
	} {
		require.Error(t, bad.Validate(), "%+v", bad)
		c := repl
		c.TLS = &bad
		require.Error(t, c.TLS.Validate())
	}
}
