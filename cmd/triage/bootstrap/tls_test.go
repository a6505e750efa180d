package bootstrap

import (
	"database/sql"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"

	"github.com/triage-queue/triage/cmd/triage/natsserver"
	"github.com/triage-queue/triage/deploy/mariadb"
	"github.com/triage-queue/triage/deploy/testlog"
	"github.com/triage-queue/triage/regions/replication"
	"github.com/triage-queue/triage/routing/auth/authtest"
	"github.com/triage-queue/triage/shardmap"
)

// TestRunOverTLS: with admin.tls, mysql_require_ssl and replication_tls the
// bootstrap provisions servers that offer TLS: the replica replicates from
// its primary over TLS (Master_SSL_Allowed), the application and
// replication accounts are REQUIRE SSL, so their logins over plain TCP are
// refused, and a node's application pool with mysql.tls gets an encrypted
// session. Real MariaDB and NATS.
func TestRunOverTLS(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ca := authtest.NewCA(t, "bootstrap test CA")
	crt, key := ca.Issue(t, "mariadb", true)
	caFile, crtFile, keyFile := filepath.Join(dir, "ca.crt"), filepath.Join(dir, "server.crt"), filepath.Join(dir, "server.key")
	authtest.Write(t, caFile, ca.PEM)
	authtest.Write(t, crtFile, crt)
	authtest.Write(t, keyFile, key)
	args := []string{"--ssl-ca=" + caFile, "--ssl-cert=" + crtFile, "--ssl-key=" + keyFile}
	srvs := make([]*mariadb.Server, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i := range srvs {
		wg.Go(func() {
			srvs[i], errs[i] = mariadb.Start(t.Context(), mariadb.Config{Dir: filepath.Join(dir, "db", string(rune('a'+i))), ServerID: i + 1, ExtraArgs: args})
		})
	}
	wg.Wait()
	for _, s := range srvs {
		if s != nil {
			t.Cleanup(func() { _ = s.Stop() })
		}
	}
	require.NoError(t, errors.Join(errs...))
	primary, replica := srvs[0], srvs[1]
	ns, err := natsserver.Start(natsserver.Config{StoreDir: t.TempDir()})
	require.NoError(t, err)
	t.Cleanup(ns.Shutdown)
	m, err := shardmap.New(shardmap.Map{Version: 1, Regions: []string{"us-east", "eu-west"}, Namespaces: []shardmap.Namespace{{Name: "default"}},
		Shards: []shardmap.Shard{{ID: 1, HomeRegion: "us-east", Primary: primary.Addr(), Database: "triage",
			Replicas: []string{replica.Addr()}, ReplicaRegions: []string{"eu-west"}}}})
	require.NoError(t, err)
	data, err := m.Marshal()
	require.NoError(t, err)
	mapFile := filepath.Join(dir, "shardmap.json")
	require.NoError(t, os.WriteFile(mapFile, data, 0o644))

	mysqlTLS := &shardmap.MySQLTLS{CAFile: caFile}
	cfg := Config{ShardMapFile: mapFile, NATS: []string{ns.ClientURL()}, Wait: shardmap.Duration(time.Minute),
		Admin:           shardmap.Credentials{TLS: mysqlTLS},
		MySQL:           shardmap.Account{PasswordFile: filepath.Join(dir, "mysql-app.password")},
		Replication:     shardmap.Account{PasswordFile: filepath.Join(dir, "mysql-repl.password")},
		MySQLRequireSSL: true, ReplicationTLS: &replication.TLS{CAFile: caFile}}
	require.NoError(t, Run(t.Context(), cfg, testlog.New(t, slog.LevelWarn)))

	ra, err := replication.Open(replica.DSN(""))
	require.NoError(t, err)
	defer ra.Close()
	st, err := ra.Status(t.Context())
	require.NoError(t, err)
	require.Equal(t, replication.RoleReplica, st.Role)
	require.Equal(t, "Yes", st.IORunning, st.LastIOError)
	require.True(t, st.TLS, "the replica connects to its primary over TLS (Master_SSL_Allowed)")

	appPW, err := shardmap.Secret("app", "", cfg.MySQL.PasswordFile, "")
	require.NoError(t, err)
	replPW, err := shardmap.Secret("repl", "", cfg.Replication.PasswordFile, "")
	require.NoError(t, err)
	for _, s := range srvs {
		for _, acc := range [][2]string{{"triage", appPW}, {"repl", replPW}} {
			mc := mysql.NewConfig()
			mc.User, mc.Passwd, mc.Net, mc.Addr, mc.Timeout = acc[0], acc[1], "tcp", s.Addr(), 5*time.Second
			db, err := sql.Open("mysql", mc.FormatDSN())
			require.NoError(t, err)
			err = db.PingContext(t.Context())
			db.Close()
			var me *mysql.MySQLError
			require.ErrorAs(t, err, &me, "%s on %s", acc[0], s.Addr())
			require.EqualValues(t, 1045, me.Number, "REQUIRE SSL refuses %s over plain TCP on %s: %v", acc[0], s.Addr(), err)
		}
	}

	c, err := shardmap.Credentials{User: "triage", PasswordFile: cfg.MySQL.PasswordFile, TLS: mysqlTLS}.Resolve()
	require.NoError(t, err)
	p := shardmap.NewAppPool(c)
	defer p.Close()
	db, _, err := p.Primary(m, 1)
	require.NoError(t, err)
	var name, cipher string
	require.NoError(t, db.QueryRowContext(t.Context(), "SHOW SESSION STATUS LIKE 'Ssl_cipher'").Scan(&name, &cipher))
	require.NotEmpty(t, cipher, "the node's application session is encrypted")
}
