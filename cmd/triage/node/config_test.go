package node

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/triage-queue/triage/regions/replication"
	"github.com/triage-queue/triage/shardmap"
)

// Unit tests of Config: what fill resolves and refuses, and which
// listeners count as open. The queue's integration tests, which start
// nodes, are in e2e.

// TestLoopbackAddresses: only 127.0.0.0/8, ::1 and localhost count as
// loopback; an empty host, the unspecified addresses, other IPs and other
// names do not.
func TestLoopbackAddresses(t *testing.T) {
	t.Parallel()
	for addr, want := range map[string]bool{
		"127.0.0.1:9090": true, "127.3.4.5:1": true, "[::1]:8080": true, "localhost:0": true, "LocalHost:1": true,
		"0.0.0.0:9090": false, ":9090": false, "[::]:0": false, "10.0.0.1:80": false, "192.0.2.7:0": false,
		"example.com:80": false, "localhost.example.com:1": false,
	} {
		require.Equal(t, want, loopback(addr), addr)
	}
	for _, tc := range []struct {
		name string
		cfg  Config
		want []string
	}{
		{"router on loopback", Config{Roles: []string{RoleRouter}, GRPC: "127.0.0.1:9090", HTTP: "localhost:8080"}, nil},
		{"router open", Config{Roles: []string{RoleRouter}, GRPC: "0.0.0.0:9090", HTTP: "127.0.0.1:8080", AdminHTTP: ":9443"},
			[]string{"grpc 0.0.0.0:9090", "admin_http :9443"}},
		{"router open with keys", Config{Roles: []string{RoleRouter}, GRPC: "0.0.0.0:9090", KeysFile: "keys.json"}, nil},
		{"no router: no listeners", Config{Roles: []string{RoleEnqueuer, RoleDequeuer}, GRPC: "0.0.0.0:9090"}, nil},
	} {
		require.Equal(t, tc.want, tc.cfg.openListeners(), tc.name)
	}
}

// TestCredentialsResolve: a password from a file (trailing newline
// dropped) or a variable; none of them silently empty.
func TestCredentialsResolve(t *testing.T) {
	file := filepath.Join(t.TempDir(), "pw")
	require.NoError(t, os.WriteFile(file, []byte("s3cret\n"), 0o600))
	c, err := shardmap.Credentials{User: "app", PasswordFile: file}.Resolve()
	require.NoError(t, err)
	require.Equal(t, "s3cret", c.Password)
	t.Setenv("TRIAGE_TEST_MYSQL_PASSWORD", "from-env")
	c, err = shardmap.Credentials{User: "app", PasswordEnv: "TRIAGE_TEST_MYSQL_PASSWORD"}.Resolve()
	require.NoError(t, err)
	require.Equal(t, "from-env", c.Password)
	for _, bad := range []shardmap.Credentials{
		{User: "app", PasswordFile: file + ".missing"},
		{User: "app", PasswordEnv: "TRIAGE_TEST_UNSET_VARIABLE"},
		{User: "app", Password: "x", PasswordFile: file},
		{User: "app", TLS: &shardmap.MySQLTLS{CAFile: file}}, // no PEM in it
		{User: "app", TLS: &shardmap.MySQLTLS{}},
	} {
		_, err := bad.Resolve()
		require.Error(t, err, "%+v", bad)
	}
	var cfg Config
	cfg.Region, cfg.NATS = "us-east", "nats://127.0.0.1:1"
	cfg.MySQL = shardmap.Credentials{User: "app", PasswordEnv: "TRIAGE_TEST_UNSET_VARIABLE"}
	require.ErrorContains(t, cfg.fill(), "TRIAGE_TEST_UNSET_VARIABLE")
}

// TestReplicationAccount: the replication account the controller names in
// CHANGE MASTER TO takes its password from a file or a variable like the
// other accounts; a config in the old form ({"User", "Password"}) still
// reads; a missing file or variable, or two sources, stop the node.
func TestReplicationAccount(t *testing.T) {
	file := filepath.Join(t.TempDir(), "mysql-repl")
	require.NoError(t, os.WriteFile(file, []byte("r3pl\n"), 0o600))
	t.Setenv("TRIAGE_TEST_REPL_PASSWORD", "from-env")
	for _, tc := range []struct {
		name, json string
		want       replication.Credentials
		err        string
	}{
		{"file", `{"user": "repl", "password_file": "` + file + `"}`, replication.Credentials{User: "repl", Password: "r3pl"}, ""},
		{"env", `{"user": "repl", "password_env": "TRIAGE_TEST_REPL_PASSWORD"}`, replication.Credentials{User: "repl", Password: "from-env"}, ""},
		{"old form", `{"User": "repl", "Password": "inline"}`, replication.Credentials{User: "repl", Password: "inline"}, ""},
		{"none", `{}`, replication.Credentials{}, ""},
		{"missing file", `{"user": "repl", "password_file": "` + file + `.gone"}`, replication.Credentials{}, "password_file"},
		{"unset variable", `{"user": "repl", "password_env": "TRIAGE_TEST_UNSET_VARIABLE"}`, replication.Credentials{}, "TRIAGE_TEST_UNSET_VARIABLE"},
		{"two sources", `{"user": "repl", "password": "x", "password_file": "` + file + `"}`, replication.Credentials{}, "give one of"},
	} {
		var cfg Config
		require.NoError(t, json.Unmarshal([]byte(`{"region": "us-east", "nats": "nats://127.0.0.1:1", "mysql": {"user": "app"}, "replication": `+tc.json+`}`), &cfg), tc.name)
		err := cfg.fill()
		if tc.err != "" {
			require.ErrorContains(t, err, tc.err, tc.name)
			require.ErrorContains(t, err, "node config replication", tc.name)
			continue
		}
		require.NoError(t, err, tc.name)
		require.Equal(t, tc.want, cfg.repl, tc.name)
	}
}

// TestReplicationTLSConfig: replication_tls reaches the replication
// account the controller points replicas with (verifying the primary's
// name unless told not to); without a CA, or without the account it
// belongs to, the node does not start.
func TestReplicationTLSConfig(t *testing.T) {
	base := `{"region": "us-east", "nats": "nats://127.0.0.1:1", "mysql": {"user": "app"}`
	parse := func(rest string) (Config, error) {
		var cfg Config
		require.NoError(t, json.Unmarshal([]byte(base+rest+`}`), &cfg))
		return cfg, cfg.fill()
	}
	cfg, err := parse(`, "replication": {"user": "repl", "password": "r"}, "replication_tls": {"ca_file": "/etc/mysql/ca.crt"}`)
	require.NoError(t, err)
	require.Equal(t, &replication.TLS{CAFile: "/etc/mysql/ca.crt"}, cfg.repl.TLS)
	cfg, err = parse(`, "replication": {"user": "repl", "password": "r"}, "replication_tls": {"ca_file": "/ca.crt", "verify_server_cert": false}`)
	require.NoError(t, err)
	require.False(t, *cfg.repl.TLS.VerifyServerCert)
	cfg, err = parse(`, "replication": {"user": "repl", "password": "r"}`)
	require.NoError(t, err)
	require.Nil(t, cfg.repl.TLS, "plain TCP by default")
	_, err = parse(`, "replication": {"user": "repl", "password": "r"}, "replication_tls": {}`)
	require.ErrorContains(t, err, "ca_file is required")
	_, err = parse(`, "replication_tls": {"ca_file": "/ca.crt"}`)
	require.ErrorContains(t, err, "replication_tls needs replication")
}
