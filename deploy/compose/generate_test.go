package compose

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/triage-queue/triage/cmd/triage/bootstrap"
	"github.com/triage-queue/triage/cmd/triage/node"
	"github.com/triage-queue/triage/shardmap"
)

// TestGeneratedFilesAreCurrent: docker-compose.yml and config/ are what
// the generator writes for DefaultTopology, and config/ holds nothing else.
func TestGeneratedFilesAreCurrent(t *testing.T) {
	t.Parallel()
	files, err := Generate(DefaultTopology())
	require.NoError(t, err)
	onDisk, err := configFiles(".")
	require.NoError(t, err)
	for name, want := range files {
		got, err := os.ReadFile(filepath.FromSlash(name))
		require.NoError(t, err, "run go generate ./deploy/compose")
		require.Equal(t, string(want), string(got), "%s is not what the generator writes: run go generate ./deploy/compose", name)
		delete(onDisk, name)
	}
	require.Empty(t, onDisk, "files under config/ the generator does not write: run go generate ./deploy/compose")
}

// TestGeneratedConfigsDecode: every node config is a node.Config and the
// bootstrap config a Config, field for field (triage serve and triage
// bootstrap refuse unknown fields), and the shard map parses.
func TestGeneratedConfigsDecode(t *testing.T) {
	t.Parallel()
	top := DefaultTopology()
	top.ShardsPerRegion = 2
	files, err := Generate(top)
	require.NoError(t, err)
	strict := func(name string, v any) {
		dec := json.NewDecoder(bytes.NewReader(files[name]))
		dec.DisallowUnknownFields()
		require.NoError(t, dec.Decode(v), name)
	}
	var boot bootstrap.Config
	strict("config/bootstrap.json", &boot)
	require.NoError(t, boot.Fill())
	m, err := shardmap.Parse(files["config/shardmap.json"])
	require.NoError(t, err)
	require.Len(t, m.Shards, 2*len(top.Regions))
	for _, r := range top.Regions {
		for _, role := range roles {
			var c node.Config
			strict("config/"+r+"/"+role+".json", &c)
			require.Equal(t, r, c.Region)
			require.Equal(t, []string{role}, c.Roles)
			// Least privilege: every role logs in as the application
			// account with its password from a mounted secret; only the
			// controller holds the admin account.
			require.Equal(t, "triage", c.MySQL.User, role)
			require.Empty(t, c.MySQL.Password, role)
			require.Equal(t, secretPath(appSecret), c.MySQL.PasswordFile, role)
			require.Equal(t, &shardmap.NATSLogin{User: natsUser, PasswordFile: secretPath(natsSecret)}, c.NATSAuth, role)
			if role == "controller" {
				require.Equal(t, secretPath(adminSecret), c.Admin.PasswordFile)
				require.Empty(t, c.Admin.Password)
			} else {
				require.Zero(t, c.Admin, role)
			}
		}
	}
	require.Equal(t, secretPath(adminSecret), boot.Admin.PasswordFile)
	require.Equal(t, &shardmap.NATSLogin{User: natsUser, PasswordFile: secretPath(natsSecret)}, boot.NATSAuth)
	require.Empty(t, boot.Admin.Password)
	yml := string(files["docker-compose.yml"])
	require.Equal(t, len(roles)*len(top.Regions), strings.Count(yml, mountSecret(appSecret)), "every role mounts the application password, the bootstrap does not")
	require.Equal(t, 1+len(top.Regions), strings.Count(yml, mountSecret(adminSecret)), "the bootstrap and the controllers mount the admin password")
	require.Equal(t, 1+(len(roles)+1)*len(top.Regions), strings.Count(yml, mountSecret(natsSecret)), "Triage's NATS login: bootstrap, roles, servers")
	require.Equal(t, len(top.Regions), strings.Count(yml, mountSecret(natsClientSecret)), "the client login: the servers only")
	require.Equal(t, len(top.Regions), strings.Count(yml, `"--triage-password-file", "`+secretPath(natsSecret)+`"`), "every NATS server requires logins")
}
