package compose

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/triage-queue/triage/cmd/triage/bootstrap"
	"github.com/triage-queue/triage/cmd/triage/node"
	"github.com/triage-queue/triage/cmd/triage/provision"
	"github.com/triage-queue/triage/regions/replication"
	"github.com/triage-queue/triage/shardmap"
)

// TestGeneratedFilesAreCurrent: docker-compose.yml and config/ are what
// the generator writes for DefaultTopology, and config/ holds nothing else.
func TestGeneratedFilesAreCurrent(t *testing.T) {
	t.Parallel()
	files, err := Generate(DefaultTopology())
	require.NoError(t, err)
	onDisk, err := generatedFiles(".")
	require.NoError(t, err)
	for name, want := range files {
		got, err := os.ReadFile(filepath.FromSlash(name))
		require.NoError(t, err, "run go generate ./deploy/compose")
		require.Equal(t, string(want), string(got), "%s is not what the generator writes: run go generate ./deploy/compose", name)
		delete(onDisk, name)
	}
	require.Empty(t, onDisk, "files under config/ (or docker-compose.spare.yml) the generator does not write: run go generate ./deploy/compose")
}

// TestGeneratedConfigsDecode: every node config is a node.Config and the
// bootstrap config a Config, field for field (triage serve and triage
// bootstrap refuse unknown fields), and the shard map parses. MySQL runs
// over TLS: every server gets the bed's certificate, every role's
// application account and the controllers' and bootstrap's admin account
// verify it with the bed's CA, the bootstrap makes the application
// account REQUIRE SSL, and every replica the bootstrap or a controller
// points connects over TLS.
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
	var boot, spare bootstrap.Config
	strict("config/bootstrap.json", &boot)
	require.NoError(t, boot.Fill())
	strict("config/bootstrap-spare.json", &spare)
	require.NoError(t, spare.Fill())
	require.Len(t, spare.SpareShards, top.SpareShards)
	spare.SpareShards = nil
	require.Equal(t, boot, spare, "bootstrap-spare.json is bootstrap.json and the spares")
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
			require.Equal(t, &shardmap.MySQLTLS{CAFile: secretPath(bedCA)}, c.MySQL.TLS, role)
			require.Equal(t, &shardmap.NATSLogin{User: natsUser, PasswordFile: secretPath(bedNATSTriage)}, c.NATSAuth, role)
			require.Equal(t, &shardmap.NATSTLS{CAFile: secretPath(bedCA)}, c.NATSTLS, role)
			require.Equal(t, "tls://nats-"+r+":4222", c.NATS, role)
			// Scraped on the region's network; the router listens on
			// every interface with API keys, so it needs no insecure.
			require.Equal(t, metricsListen, c.Metrics, role)
			require.False(t, c.Insecure, role)
			if role == "router" {
				require.Equal(t, keysPath, c.KeysFile)
			} else {
				require.Empty(t, c.KeysFile, role)
			}
			if role == "controller" {
				require.Equal(t, secretPath(adminSecret), c.Admin.PasswordFile)
				require.Empty(t, c.Admin.Password)
				require.Equal(t, &shardmap.MySQLTLS{CAFile: secretPath(bedCA)}, c.Admin.TLS)
				require.Equal(t, shardmap.Account{User: provision.BedAccounts.Repl.User, PasswordFile: secretPath(replSecret)}, c.Replication)
				require.Equal(t, &replication.TLS{CAFile: secretPath(bedCA)}, c.ReplicationTLS)
			} else {
				require.Zero(t, c.Admin, role)
				require.Zero(t, c.Replication, role)
				require.Nil(t, c.ReplicationTLS, role)
			}
		}
	}
	require.Equal(t, secretPath(adminSecret), boot.Admin.PasswordFile)
	require.Equal(t, &shardmap.NATSLogin{User: natsUser, PasswordFile: secretPath(bedNATSTriage)}, boot.NATSAuth)
	require.Equal(t, &shardmap.NATSTLS{CAFile: secretPath(bedCA)}, boot.NATSTLS)
	for _, u := range boot.NATS {
		require.True(t, strings.HasPrefix(u, "tls://"), u)
	}
	require.Empty(t, boot.Admin.Password)
	require.Equal(t, &shardmap.MySQLTLS{CAFile: secretPath(bedCA)}, boot.Admin.TLS)
	require.True(t, boot.MySQLRequireSSL, "the application account's plain logins are refused")
	require.Equal(t, &replication.TLS{CAFile: secretPath(bedCA)}, boot.ReplicationTLS, "the CA as the replicas' mariadbd see it")
	require.Equal(t, shardmap.Account{User: provision.BedAccounts.Repl.User, PasswordFile: secretPath(replSecret)}, boot.Replication)
	require.Equal(t, shardmap.Account{User: "triage", PasswordFile: secretPath(appSecret)}, boot.MySQL, "the application password the roles read")
	require.Equal(t, provision.BedAccounts.Repl.Password+"\n", string(files[replSecret]))
	yml := string(files["docker-compose.yml"])
	require.Equal(t, 1+len(roles)*len(top.Regions), strings.Count(yml, mountSecret(appSecret)), "the bootstrap and every role mount the application password")
	require.Equal(t, len(top.Regions), strings.Count(yml, `"--host", "0.0.0.0", "--http-port", "8222"`), "every NATS server listens on its network, with the monitoring port its health check asks")
	require.Equal(t, 1+len(top.Regions), strings.Count(yml, mountSecret(adminSecret)), "the bootstrap and the controllers mount the admin password")
	require.Equal(t, 1+(len(roles)+1)*len(top.Regions), strings.Count(yml, mountBed(bedNATSTriage)), "Triage's NATS login: bootstrap, roles, servers")
	servers := len(top.servers()) - top.SpareShards*len(top.Regions)
	require.Equal(t, 1+(len(roles)+1)*len(top.Regions)+servers, strings.Count(yml, mountBed(bedCA)), "the CA: bootstrap, roles, NATS and MariaDB servers")
	require.Equal(t, servers, strings.Count(yml, mountBed(bedMySQLKey)), "the MariaDB servers' private key: the MariaDB servers only")
	require.Equal(t, servers, strings.Count(yml, `    command: ["--ssl-ca=`+secretPath(bedCA)+`", "--ssl-cert=`+secretPath(bedMySQLCert)+`", "--ssl-key=`+secretPath(bedMySQLKey)+`"]`),
		"every MariaDB server offers TLS")
	require.Equal(t, len(top.Regions), strings.Count(yml, mountBed(bedNATSClient)), "the client login: the servers only")
	require.Equal(t, len(top.Regions), strings.Count(yml, mountBed(bedNATSKey)), "the servers' private key: the servers only")
	require.Equal(t, len(top.Regions), strings.Count(yml, bedDirVar+"/"+bedKeys+":"+keysPath+":ro"), "the keys file: the routers only")
	require.NotContains(t, yml, bedToken+":", "the API key itself is mounted nowhere")
	require.Equal(t, len(top.Regions), strings.Count(yml, `"--triage-password-file", "`+secretPath(bedNATSTriage)+`"`), "every NATS server requires logins")
	require.Equal(t, len(top.Regions), strings.Count(yml, `"--tls-ca", "`+secretPath(bedCA)+`", "--tls-routes"]`), "every NATS server requires TLS, routes included")
	require.Equal(t, 1+len(top.Regions), strings.Count(yml, mountSecret(replSecret)), "the bootstrap and the controllers mount the replication password")
	require.Equal(t, len(top.Regions), strings.Count(yml, mountBed(bedNATSRoute)), "the route login: the servers only")
	require.Equal(t, len(top.Regions), strings.Count(yml, `"--route-password-file", "`+secretPath(bedNATSRoute)+`"`), "every NATS server requires the route login")
}

// composeYAML is what the tests read of a generated compose file.
type composeYAML struct {
	Version  string `yaml:"version"`
	Services map[string]struct {
		Command     []string                     `yaml:"command"`
		Entrypoint  []string                     `yaml:"entrypoint"`
		Image       string                       `yaml:"image"`
		Ports       []string                     `yaml:"ports"`
		Environment map[string]string            `yaml:"environment"`
		Volumes     []string                     `yaml:"volumes"`
		Labels      map[string]string            `yaml:"labels"`
		Networks    names                        `yaml:"networks"`
		DependsOn   map[string]map[string]string `yaml:"depends_on"`
	} `yaml:"services"`
	Volumes map[string]any `yaml:"volumes"`
}

// names are a list, or the keys of a map (as docker-compose config
// writes networks).
type names []string

func (n *names) UnmarshalYAML(v *yaml.Node) error {
	if v.Kind == yaml.MappingNode {
		for i := 0; i < len(v.Content); i += 2 {
			*n = append(*n, v.Content[i].Value)
		}
		return nil
	}
	return v.Decode((*[]string)(n))
}

func parseCompose(t *testing.T, data []byte) composeYAML {
	t.Helper()
	var c composeYAML
	require.NoError(t, yaml.Unmarshal(data, &c))
	return c
}

// TestSpareShards: spare shards are numbered after the map's, homed round
// the regions, and outside the map; their servers (a primary in the home
// region, a replica in every other, labelled spare) are in
// docker-compose.spare.yml only, which also points the bootstrap at
// bootstrap-spare.json and makes it wait for them; every region's
// gateway, dial_via and replication_via already reach them.
func TestSpareShards(t *testing.T) {
	t.Parallel()
	top := DefaultTopology()
	top.ShardsPerRegion, top.SpareShards = 2, 4
	files, err := Generate(top)
	require.NoError(t, err)

	m, err := shardmap.Parse(files["config/shardmap.json"])
	require.NoError(t, err)
	for _, s := range m.Shards {
		require.LessOrEqual(t, s.ID, uint32(6), "spares are not in the map")
	}
	var boot bootstrap.Config
	require.NoError(t, json.Unmarshal(files["config/bootstrap-spare.json"], &boot))
	wantHomes := []string{"us-east", "eu-west", "ap-south", "us-east"}
	require.Len(t, boot.SpareShards, 4)
	spareAddrs := map[string]string{} // address: region
	for k, s := range boot.SpareShards {
		id := uint32(7 + k)
		home := wantHomes[k]
		require.Equal(t, id, s.ID)
		require.Equal(t, home, s.HomeRegion)
		require.Equal(t, fmt.Sprintf("mariadb-s%d-%s:3306", id, home), s.Primary)
		require.Equal(t, "triage", s.Database)
		i := slices.Index(top.Regions, home)
		require.Equal(t, []string{top.Regions[(i+1)%3], top.Regions[(i+2)%3]}, s.ReplicaRegions, "the next region's replica first")
		spareAddrs[s.Primary] = home
		for j, r := range s.Replicas {
			require.Equal(t, fmt.Sprintf("mariadb-s%d-%s:3306", id, s.ReplicaRegions[j]), r)
			spareAddrs[r] = s.ReplicaRegions[j]
		}
	}
	require.Len(t, spareAddrs, 12)

	base := parseCompose(t, files["docker-compose.yml"])
	over := parseCompose(t, files[SpareFile])
	require.Equal(t, base.Version, over.Version, "docker-compose refuses files of different versions")
	for addr := range spareAddrs {
		svc := strings.TrimSuffix(addr, ":3306")
		require.NotContains(t, base.Services, svc)
		require.NotContains(t, base.Volumes, svc)
		require.Contains(t, over.Volumes, svc)
		c, ok := over.Services[svc]
		require.True(t, ok, svc)
		require.Contains(t, c.Image, "TRIAGE_MARIADB_IMAGE", "the x-mariadb anchor of the override itself")
		require.Equal(t, []string{svc + ":/var/lib/mysql", mountTarget(bedCA), mountTarget(bedMySQLCert), mountTarget(bedMySQLKey)}, c.Volumes)
		require.Equal(t, []string{"--ssl-ca=" + secretPath(bedCA), "--ssl-cert=" + secretPath(bedMySQLCert), "--ssl-key=" + secretPath(bedMySQLKey)}, c.Command, "TLS")
		require.Equal(t, names{spareAddrs[addr]}, c.Networks)
		require.Equal(t, "true", c.Labels[LabelSpare], svc)
		require.Equal(t, addr, c.Labels[LabelAddr])
		require.Equal(t, spareAddrs[addr], c.Labels[LabelRegion])
		require.Equal(t, "mariadb", c.Labels[LabelRole])
		primary := strings.HasSuffix(svc, "-"+c.Labels[LabelRegion]) && slices.ContainsFunc(boot.SpareShards, func(s shardmap.Shard) bool { return s.Primary == addr })
		if primary {
			require.Equal(t, "primary", c.Labels[LabelStartedAs])
			require.Equal(t, "OFF", c.Environment["READ_ONLY"])
			require.Equal(t, c.Labels[LabelShard], c.Environment["SERVER_ID"])
		} else {
			require.Equal(t, "replica", c.Labels[LabelStartedAs])
			require.Equal(t, "ON", c.Environment["READ_ONLY"])
		}
		require.Equal(t, "service_healthy", over.Services["bootstrap"].DependsOn[svc]["condition"])
	}
	require.Len(t, over.Services, 12+1, "the spares' servers and the bootstrap")
	for name, c := range base.Services {
		require.Empty(t, c.Labels[LabelSpare], name)
	}
	bs := over.Services["bootstrap"]
	require.Equal(t, []string{"bootstrap", "--config", "/etc/triage/bootstrap-spare.json"}, bs.Command)
	require.Equal(t, []string{"./config/bootstrap-spare.json:/etc/triage/bootstrap-spare.json:ro"}, bs.Volumes)
	require.Len(t, bs.DependsOn, 12)

	// Every region reaches the spares' other-region servers through its
	// gateway, on their gateway ports, and nothing else.
	for i, r := range top.Regions {
		var gw struct {
			Endpoints []struct {
				Addr, Region string
				Port         int
			}
		}
		require.NoError(t, json.Unmarshal(files["config/"+r+"/wan.json"], &gw))
		var c node.Config
		require.NoError(t, json.Unmarshal(files["config/"+r+"/controller.json"], &c))
		found := 0
		for _, e := range gw.Endpoints {
			if spareAddrs[e.Addr] == "" {
				continue
			}
			found++
			shard, ri, ok := serverAt(e.Port)
			require.True(t, ok, e.Addr)
			require.Equal(t, e.Addr, fmt.Sprintf("mariadb-s%d-%s:3306", shard, top.Regions[ri]))
			require.Equal(t, spareAddrs[e.Addr], e.Region)
			if e.Region == r {
				require.NotContains(t, c.MySQL.DialVia, e.Addr, "its own region's servers are dialled directly")
				continue
			}
			want := fmt.Sprintf("wan-%s:%d", r, e.Port)
			require.Equal(t, want, c.MySQL.DialVia[e.Addr])
			require.Equal(t, want, c.ReplicationVia[r][e.Addr])
			require.Equal(t, want, boot.ReplicationVia[r][e.Addr])
		}
		require.Equal(t, 12, found, "region %d's gateway", i)
	}
}

// mountTarget is mountBed's volume as YAML reads it.
func mountTarget(name string) string {
	return strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(mountBed(name)), "- "))
}

// TestNoSpareShards: without spares there is no override and no
// bootstrap-spare.json, and WriteFiles removes the ones a topology with
// spares wrote.
func TestNoSpareShards(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	files, err := Generate(DefaultTopology())
	require.NoError(t, err)
	require.Contains(t, files, SpareFile)
	require.NoError(t, WriteFiles(dir, files))
	top := DefaultTopology()
	top.SpareShards = 0
	files, err = Generate(top)
	require.NoError(t, err)
	require.NotContains(t, files, SpareFile)
	require.NotContains(t, files, "config/bootstrap-spare.json")
	require.NoError(t, WriteFiles(dir, files))
	require.NoFileExists(t, filepath.Join(dir, SpareFile))
	require.NoFileExists(t, filepath.Join(dir, "config", "bootstrap-spare.json"))
	require.FileExists(t, filepath.Join(dir, "config", "bootstrap.json"))

	top.SpareShards = -1
	_, err = Generate(top)
	require.ErrorContains(t, err, "spare shards")
	top.SpareShards = maxShard
	_, err = Generate(top)
	require.ErrorContains(t, err, "at most")
}

// TestComposeFilesValidate: docker-compose itself accepts the checked-in
// docker-compose.yml alone and with the spare override, and merges the
// override's bootstrap into the base's (a static check: nothing starts).
func TestComposeFilesValidate(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("docker-compose"); err != nil {
		if os.Getenv("TRIAGE_SKIP_DOCKER") == "1" {
			t.Skip("TRIAGE_SKIP_DOCKER=1")
		}
		t.Fatalf("docker-compose is needed to validate the compose files (or TRIAGE_SKIP_DOCKER=1): %v", err)
	}
	run := func(args ...string) string {
		t.Helper()
		cmd := exec.Command("docker-compose", append([]string{"-p", "triage-config-check"}, args...)...)
		cmd.Env = append(os.Environ(), "TRIAGE_IMAGE=triage:check", "TRIAGE_BED_IMAGE=triage-bed:check", "TRIAGE_MARIADB_IMAGE=triage-mariadb:check",
			"TRIAGE_PROMETHEUS_IMAGE=triage-prometheus:check", "TRIAGE_BED_DIR=/nonexistent/bed")
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		require.NoError(t, err, "docker-compose %s: %s", strings.Join(args, " "), stderr.String())
		return string(out)
	}
	base := strings.Fields(run("-f", "docker-compose.yml", "config", "--services"))
	both := strings.Fields(run("-f", "docker-compose.yml", "-f", SpareFile, "config", "--services"))
	spares := []string{"mariadb-s4-ap-south", "mariadb-s4-eu-west", "mariadb-s4-us-east"}
	for _, s := range spares {
		require.NotContains(t, base, s)
		require.Contains(t, both, s)
	}
	require.Len(t, both, len(base)+len(spares))
	merged := parseCompose(t, []byte(run("-f", "docker-compose.yml", "-f", SpareFile, "config")))
	bs := merged.Services["bootstrap"]
	require.Equal(t, []string{"bootstrap", "--config", "/etc/triage/bootstrap-spare.json"}, bs.Command)
	require.Len(t, bs.Volumes, 8, "shardmap.json, bootstrap.json, bootstrap-spare.json, the admin, application and replication passwords, and the NATS password and CA")
	require.Contains(t, bs.Volumes, "/nonexistent/bed/"+bedCA+":"+secretPath(bedCA)+":ro")
	require.True(t, slices.ContainsFunc(bs.Volumes, func(v string) bool { return strings.HasSuffix(v, ":/etc/triage/bootstrap-spare.json:ro") }))
	require.Contains(t, bs.DependsOn, "mariadb-s1-us-east", "the base's servers")
	for _, s := range spares {
		require.Contains(t, bs.DependsOn, s)
	}
	require.Equal(t, "service_completed_successfully", merged.Services["router-us-east"].DependsOn["bootstrap"]["condition"])
	require.Equal(t, names{"eu-west"}, merged.Services["mariadb-s4-eu-west"].Networks)
}
