package compose

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
)

//go:generate go run ./gen

// Topology is what the bed's files are generated from: docker-compose.yml
// and config/. DefaultTopology is the checked-in bed; to add a region or a
// shard, change it and run `go generate ./deploy/compose`.
type Topology struct {
	// Regions in port order: region i's router publishes JSON on
	// 18080+i and gRPC on 19090+i. Shard homes follow this order too.
	Regions []string
	// ShardsPerRegion is the number of shards homed in each region
	// (region i's are i*n+1 ... i*n+n). Default 1.
	ShardsPerRegion int
}

// DefaultTopology is the checked-in bed: three regions, one shard homed
// in each.
func DefaultTopology() Topology {
	return Topology{Regions: []string{"us-east", "eu-west", "ap-south"}, ShardsPerRegion: 1}
}

// server is one MariaDB container.
type server struct {
	service  string
	shard    uint32
	region   string
	primary  bool // the shard's primary at start
	serverID int
}

// servers lists every MariaDB container: per shard its primary, then a
// replica in each other region, the next region's first. server_id is the
// shard for a primary and k*1000+shard for its k-th replica, as deploy/bed
// numbers them.
func (t Topology) servers() []server {
	var out []server
	n := max(t.ShardsPerRegion, 1)
	for i, home := range t.Regions {
		for j := range n {
			id := uint32(i*n + j + 1)
			out = append(out, server{fmt.Sprintf("mariadb-s%d-%s", id, home), id, home, true, int(id)})
			for k := 1; k < len(t.Regions); k++ {
				r := t.Regions[(i+k)%len(t.Regions)]
				out = append(out, server{fmt.Sprintf("mariadb-s%d-%s", id, r), id, r, false, k*1000 + int(id)})
			}
		}
	}
	return out
}

// roles are the Triage role containers of each region, in file order.
var roles = []string{"router", "enqueuer", "dequeuer", "controller"}

// The generated config files. Field order is the files' key order.
type (
	genShard struct {
		ID             uint32   `json:"id"`
		HomeRegion     string   `json:"home_region"`
		Primary        string   `json:"primary"`
		Replicas       []string `json:"replicas"`
		ReplicaRegions []string `json:"replica_regions"`
		Database       string   `json:"database"`
	}
	genShardMap struct {
		Version    int                 `json:"version"`
		Regions    []string            `json:"regions"`
		Namespaces []map[string]string `json:"namespaces"`
		Shards     []genShard          `json:"shards"`
	}
	genAccount struct {
		User     string `json:"user"`
		Password string `json:"password"`
	}
	genBootstrap struct {
		ShardMapFile   string     `json:"shard_map_file"`
		Admin          genAccount `json:"admin"`
		NATS           []string   `json:"nats"`
		KVReplicas     int        `json:"kv_replicas"`
		StreamReplicas int        `json:"stream_replicas"`
		OwnerTTL       string     `json:"owner_ttl"`
	}
	genMySQL struct {
		User     string            `json:"user"`
		Password string            `json:"password"`
		DialVia  map[string]string `json:"dial_via"`
	}
	// genReplication is replication.Credentials, which has no JSON tags.
	genReplication struct {
		User     string
		Password string
	}
	genNode struct {
		Region         string          `json:"region"`
		Roles          []string        `json:"roles"`
		NATS           string          `json:"nats"`
		GRPC           string          `json:"grpc,omitempty"`
		HTTP           string          `json:"http,omitempty"`
		MySQL          genMySQL        `json:"mysql"`
		Admin          *genAccount     `json:"admin,omitempty"`
		Replication    *genReplication `json:"replication,omitempty"`
		OwnerTTL       string          `json:"owner_ttl"`
		KVReplicas     int             `json:"kv_replicas"`
		StreamReplicas int             `json:"stream_replicas"`
	}
)

// Generate returns the bed's files for t by path relative to this
// directory: docker-compose.yml and every file of config/.
func Generate(t Topology) (map[string][]byte, error) {
	if len(t.Regions) < 2 {
		return nil, fmt.Errorf("compose topology: %d region(s): want at least 2", len(t.Regions))
	}
	files := map[string][]byte{}
	put := func(name string, v any) error {
		data, err := json.MarshalIndent(v, "", "  ")
		if err != nil {
			return err
		}
		files[name] = append(data, '\n')
		return nil
	}
	servers := t.servers()

	smap := genShardMap{Version: 1, Regions: t.Regions, Namespaces: []map[string]string{{"name": "default"}}}
	for _, s := range servers {
		if s.primary {
			smap.Shards = append(smap.Shards, genShard{ID: s.shard, HomeRegion: s.region, Primary: s.service + ":3306", Database: "triage"})
			continue
		}
		sh := &smap.Shards[len(smap.Shards)-1]
		sh.Replicas = append(sh.Replicas, s.service+":3306")
		sh.ReplicaRegions = append(sh.ReplicaRegions, s.region)
	}
	if err := put("config/shardmap.json", smap); err != nil {
		return nil, err
	}
	boot := genBootstrap{ShardMapFile: "/etc/triage/shardmap.json", Admin: genAccount{"root", "root"},
		KVReplicas: 3, StreamReplicas: 3, OwnerTTL: "10s"}
	for _, r := range t.Regions {
		boot.NATS = append(boot.NATS, "nats://nats-"+r+":4222")
	}
	if err := put("config/bootstrap.json", boot); err != nil {
		return nil, err
	}
	for _, r := range t.Regions {
		via := map[string]string{}
		for _, s := range servers {
			if s.region == r {
				via[s.service+":3306"] = s.service + ".lan:3306"
			}
		}
		for _, role := range roles {
			c := genNode{Region: r, Roles: []string{role}, NATS: "nats://nats-" + r + ".lan:4222",
				MySQL: genMySQL{User: "triage", Password: "triage", DialVia: via}, OwnerTTL: "10s", KVReplicas: 3, StreamReplicas: 3}
			if role == "router" {
				c.GRPC, c.HTTP = "0.0.0.0:9090", "0.0.0.0:8080"
			}
			if role == "controller" {
				c.Admin = &genAccount{"root", "root"}
				c.Replication = &genReplication{"repl", "repl"}
			}
			if err := put(path.Join("config", r, role+".json"), c); err != nil {
				return nil, err
			}
		}
	}
	files["docker-compose.yml"] = composeFile(t, servers)
	return files, nil
}

// WriteFiles writes files (Generate's) under dir and removes every other
// file of dir/config, so a region taken out of the topology leaves no
// configs behind.
func WriteFiles(dir string, files map[string][]byte) error {
	stale, err := configFiles(dir)
	if err != nil {
		return err
	}
	for name, data := range files {
		delete(stale, name)
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(p, data, 0o644); err != nil {
			return err
		}
	}
	for name := range stale {
		if err := os.Remove(filepath.Join(dir, filepath.FromSlash(name))); err != nil {
			return err
		}
	}
	return nil
}

// configFiles lists the files under dir/config by slash path relative to
// dir.
func configFiles(dir string) (map[string]bool, error) {
	out := map[string]bool{}
	root := filepath.Join(dir, "config")
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		out[filepath.ToSlash(rel)] = true
		return err
	})
	if os.IsNotExist(err) {
		return out, nil
	}
	return out, err
}

// composeFile writes docker-compose.yml.
func composeFile(t Topology, servers []server) []byte {
	var b bytes.Buffer
	w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	w("%s", composeHeader)
	nets := func(svc, region string) {
		w("    networks:\n      %s:\n        aliases: [%s.lan]\n      wan:\n        aliases: [%s.wan]\n", region, svc, svc)
	}
	for _, s := range servers {
		what, ro := "primary at start", "OFF"
		if !s.primary {
			what, ro = "replica at start (read-only)", "ON"
		}
		w("\n\n  # shard %d's server in %s: %s.\n  %s:\n    <<: *mariadb\n", s.shard, s.region, what, s.service)
		w("    environment:\n      SERVER_ID: \"%d\"\n      READ_ONLY: \"%s\"\n      ROOT_PASSWORD: root\n", s.serverID, ro)
		w("    volumes:\n      - %s:/var/lib/mysql\n", s.service)
		nets(s.service, s.region)
	}
	for _, r := range t.Regions {
		svc := "nats-" + r
		var routes []string
		for _, o := range t.Regions {
			if o != r {
				routes = append(routes, "nats-route://nats-"+o+":6222")
			}
		}
		w("\n\n  %s:\n    image: %s\n", svc, triageImage)
		w("    command: [\"nats\", \"--name\", \"%s\", \"--store\", \"/data/nats\", \"--tags\", \"region:%s\",\n", svc, r)
		w("              \"--cluster-advertise\", \"%s:6222\", \"--routes\", \"%s\"]\n", svc, strings.Join(routes, ","))
		w("    healthcheck:\n      test: [\"CMD\", \"/triage\", \"probe\", \"http://127.0.0.1:8222/healthz\"]\n")
		w("      interval: 1s\n      timeout: 5s\n      retries: 120\n")
		w("    volumes:\n      - %s:/data\n", svc)
		nets(svc, r)
	}
	w("\n\n  # One-shot: accounts, schema, replication, NATS buckets and the shard map\n")
	w("  # (triage bootstrap, deploy/compose.Bootstrap). The roles start after it.\n")
	w("  bootstrap:\n    image: %s\n", triageImage)
	w("    command: [\"bootstrap\", \"--config\", \"/etc/triage/bootstrap.json\"]\n")
	w("    volumes:\n      - ./config/bootstrap.json:/etc/triage/bootstrap.json:ro\n")
	w("      - ./config/shardmap.json:/etc/triage/shardmap.json:ro\n")
	w("    networks: [wan]\n    restart: \"no\"\n    depends_on:")
	for _, s := range servers {
		w("\n      %s:\n        condition: service_healthy", s.service)
	}
	for _, r := range t.Regions {
		w("\n      nats-%s:\n        condition: service_healthy", r)
	}
	for i, r := range t.Regions {
		for _, role := range roles {
			svc := role + "-" + r
			w("\n\n  %s:\n    <<: *triage\n", svc)
			w("    command: [\"serve\", \"--config\", \"/etc/triage/%s.json\", \"--health\", \"127.0.0.1:7070\"]\n", role)
			w("    volumes:\n      - ./config/%s/%s.json:/etc/triage/%s.json:ro\n", r, role, role)
			if role == "router" {
				env := strings.ToUpper(strings.ReplaceAll(r, "-", "_"))
				w("    ports:\n      - \"127.0.0.1:${TRIAGE_HTTP_%s:-%d}:8080\"\n", env, 18080+i)
				w("      - \"127.0.0.1:${TRIAGE_GRPC_%s:-%d}:9090\"\n", env, 19090+i)
			}
			nets(svc, r)
		}
	}
	w("\n\nnetworks:")
	for _, r := range append(t.Regions[:len(t.Regions):len(t.Regions)], "wan") {
		w("\n  %s:", r)
	}
	w("\n\nvolumes:")
	for _, s := range servers {
		w("\n  %s:", s.service)
	}
	for _, r := range t.Regions {
		w("\n  nats-%s:", r)
	}
	w("\n")
	return b.Bytes()
}

const triageImage = "${TRIAGE_IMAGE:?run deploy/compose/build-images.sh and pass --env-file}"

const composeHeader = `# The multi-region compose bed of Triage: three regions (us-east, eu-west,
# ap-south), one Docker network per region plus "wan" between them. Per
# region: the primary of the region's shard and replicas of the other two
# regions' shards (MariaDB, semi-sync), one NATS server of a three-node
# JetStream cluster, and the Triage roles router, enqueuer, dequeuer and
# controller in containers of their own. See README.md beside this file.
#
# Images come from build-images.sh (no registry): run it, then
#   docker-compose --env-file .images.env -p triage up -d
# or just ` + "`make compose-up`" + ` at the top of the repository.
#
# Names: every container is reachable as NAME.lan on its region's network
# and as NAME.wan (and NAME) on the WAN. Node configs dial their own
# region's servers by NAME.lan (mysql.dial_via), everything else by NAME,
# which from another region resolves only on the WAN. The WAN adds no
# delay yet (see README.md: this kernel has no sch_netem). The routers'
# JSON gateways and gRPC are published on 127.0.0.1:18080-18082 and
# 19090-19092 (region order); TRIAGE_HTTP_US_EAST, TRIAGE_GRPC_US_EAST ...
# override them (0: a free port, see docker-compose port).
version: "3.9"

x-mariadb: &mariadb
  image: ${TRIAGE_MARIADB_IMAGE:?run deploy/compose/build-images.sh and pass --env-file}
  healthcheck:
    test: ["CMD", "mariadb", "-uroot", "--socket=/run/mysqld/mysqld.sock", "-e", "SELECT 1"]
    interval: 1s
    timeout: 5s
    retries: 120
  stop_grace_period: 20s

x-triage: &triage
  image: ${TRIAGE_IMAGE:?run deploy/compose/build-images.sh and pass --env-file}
  healthcheck:
    test: ["CMD", "/triage", "probe", "http://127.0.0.1:7070/healthz"]
    interval: 1s
    timeout: 5s
    retries: 120
  depends_on:
    bootstrap:
      condition: service_completed_successfully
  stop_grace_period: 20s

services:`
