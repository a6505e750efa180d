package bootstrap

import (
	"database/sql"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"

	"github.com/triage-queue/triage/cmd/triage/natsserver"
	"github.com/triage-queue/triage/deploy/mariadb/mariadbtest"
	"github.com/triage-queue/triage/deploy/testlog"
	"github.com/triage-queue/triage/shardmap"
)

// TestPlanProvisionsSparesOutsideTheMap: spare shards are replicated and
// their servers provisioned, after the map's and marked spare (migrated,
// not published); a spare that reuses a shard ID or a server of the map, or
// of another spare, is refused before anything is touched.
func TestPlanProvisionsSparesOutsideTheMap(t *testing.T) {
	m := &shardmap.Map{Shards: []shardmap.Shard{
		{ID: 1, HomeRegion: "a", Primary: "s1a:3306", Database: "triage", Replicas: []string{"s1b:3306"}, ReplicaRegions: []string{"b"}},
	}}
	spare := shardmap.Shard{ID: 2, HomeRegion: "b", Primary: "s2b:3306", Replicas: []string{"s2a:3306"}, ReplicaRegions: []string{"a"}}
	shards, servers, err := plan(m, []shardmap.Shard{spare})
	require.NoError(t, err)
	require.Equal(t, []uint32{1, 2}, []uint32{shards[0].ID, shards[1].ID})
	require.Equal(t, "triage", shards[1].Database, "the default database")
	type got struct {
		shard          uint32
		addr           string
		primary, spare bool
	}
	var list []got
	for _, s := range servers {
		list = append(list, got{s.shard.ID, s.addr, s.primary, s.spare})
	}
	require.Equal(t, []got{{1, "s1a:3306", true, false}, {1, "s1b:3306", false, false}, {2, "s2b:3306", true, true}, {2, "s2a:3306", false, true}}, list)

	_, servers, err = plan(m, nil)
	require.NoError(t, err)
	require.Len(t, servers, 2, "no spares: the map's servers only")

	for name, bad := range map[string][]shardmap.Shard{
		"the map's shard ID":        {{ID: 1, Primary: "s9:3306"}},
		"the map's primary":         {{ID: 2, Primary: "s1a:3306"}},
		"the map's replica":         {{ID: 2, Primary: "s2:3306", Replicas: []string{"s1b:3306"}, ReplicaRegions: []string{"b"}}},
		"another spare's ID":        {spare, {ID: 2, Primary: "s9:3306"}},
		"another spare's server":    {spare, {ID: 3, Primary: "s2a:3306"}},
		"no primary":                {{ID: 2}},
		"replicas without a region": {{ID: 2, Primary: "s2:3306", Replicas: []string{"s2x:3306"}}},
	} {
		_, _, err := plan(m, bad)
		require.Error(t, err, name)
	}
}

// TestRunLeavesNoKnownPassword: without a password for the application
// account the bootstrap refuses before it touches a server, so triage /
// triage never logs in; given a password_file that does not exist, it
// writes a random password there (0600) and gives it to the account (and
// likewise the replication account's). Real MariaDB and NATS.
func TestRunLeavesNoKnownPassword(t *testing.T) {
	t.Parallel()
	srv := mariadbtest.NewServer(t)
	ns, err := natsserver.Start(natsserver.Config{StoreDir: t.TempDir()})
	require.NoError(t, err)
	t.Cleanup(ns.Shutdown)
	dir := t.TempDir()
	m, err := shardmap.New(shardmap.Map{Version: 1, Regions: []string{"us-east"}, Namespaces: []shardmap.Namespace{{Name: "default"}},
		Shards: []shardmap.Shard{{ID: 1, HomeRegion: "us-east", Primary: srv.Addr(), Database: "triage"}}})
	require.NoError(t, err)
	data, err := m.Marshal()
	require.NoError(t, err)
	mapFile := filepath.Join(dir, "shardmap.json")
	require.NoError(t, os.WriteFile(mapFile, data, 0o644))
	log := testlog.New(t, slog.LevelWarn)
	login := func(user, password string) error {
		mc := mysql.NewConfig()
		mc.User, mc.Passwd, mc.Net, mc.Addr, mc.Timeout = user, password, "tcp", srv.Addr(), 5*time.Second
		db, err := sql.Open("mysql", mc.FormatDSN())
		require.NoError(t, err)
		defer db.Close()
		return db.PingContext(t.Context())
	}
	base := Config{ShardMapFile: mapFile, NATS: []string{ns.ClientURL()}, Wait: shardmap.Duration(time.Minute)}

	err = Run(t.Context(), base, log)
	require.ErrorContains(t, err, `bootstrap config mysql: no password for mysql user "triage"`)
	require.ErrorContains(t, login("triage", "triage"), "Access denied")

	cfg := base
	cfg.MySQL = shardmap.Account{PasswordFile: filepath.Join(dir, "mysql-app.password")}
	cfg.Replication = shardmap.Account{PasswordFile: filepath.Join(dir, "mysql-repl.password")}
	require.NoError(t, Run(t.Context(), cfg, log))
	secret := func(path string) string {
		fi, err := os.Stat(path)
		require.NoError(t, err)
		require.Equal(t, os.FileMode(0o600), fi.Mode().Perm(), path)
		data, err := os.ReadFile(path)
		require.NoError(t, err)
		pw := strings.TrimSpace(string(data))
		require.GreaterOrEqual(t, len(pw), 20, "a random password")
		return pw
	}
	app, repl := secret(cfg.MySQL.PasswordFile), secret(cfg.Replication.PasswordFile)
	require.NotEqual(t, app, repl)
	require.NoError(t, login("triage", app))
	require.NoError(t, login("repl", repl))
	require.ErrorContains(t, login("triage", "triage"), "Access denied")
	require.ErrorContains(t, login("repl", "repl"), "Access denied")
}

// TestPasswordSources: a password_file that exists is read and left as it
// is (a second bootstrap keeps the password the nodes read); one that does
// not is created with a random password, a new one each time; an account
// with no password, or an empty one, is refused.
func TestPasswordSources(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	log := testlog.New(t, slog.LevelWarn)
	given := filepath.Join(dir, "given")
	require.NoError(t, os.WriteFile(given, []byte("s3cret\n"), 0o600))
	pw, err := password(shardmap.Account{User: "triage", PasswordFile: given}, "mysql", log)
	require.NoError(t, err)
	require.Equal(t, "s3cret", pw)
	data, err := os.ReadFile(given)
	require.NoError(t, err)
	require.Equal(t, "s3cret\n", string(data))

	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	pa, err := password(shardmap.Account{User: "triage", PasswordFile: a}, "mysql", log)
	require.NoError(t, err)
	again, err := password(shardmap.Account{User: "triage", PasswordFile: a}, "mysql", log)
	require.NoError(t, err)
	require.Equal(t, pa, again, "read back, not made anew")
	pb, err := password(shardmap.Account{User: "triage", PasswordFile: b}, "mysql", log)
	require.NoError(t, err)
	require.NotEqual(t, pa, pb)

	empty := filepath.Join(dir, "empty")
	require.NoError(t, os.WriteFile(empty, []byte("\n"), 0o600))
	for name, acc := range map[string]shardmap.Account{
		"none":       {User: "triage"},
		"empty file": {User: "triage", PasswordFile: empty},
		"two":        {User: "triage", PasswordFile: a, Password: "x"},
	} {
		_, err := password(acc, "mysql", log)
		require.Error(t, err, name)
	}
}
