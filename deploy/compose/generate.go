package compose

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/triage-queue/triage/cmd/triage/provision"
	"github.com/triage-queue/triage/deploy/wan"
)

//go:generate go run ./gen

// Topology is what the bed's files are generated from: docker-compose.yml,
// docker-compose.spare.yml and config/. DefaultTopology is the checked-in
// bed; to add a region or a shard, change it and run `go generate
// ./deploy/compose`.
type Topology struct {
	// Regions in port order: region i's router publishes JSON on
	// 18080+i and gRPC on 19090+i. Shard homes follow this order too. At
	// least 2, at most 10.
	Regions []string
	// ShardsPerRegion is the number of shards homed in each region
	// (region i's are i*n+1 ... i*n+n). Default 1.
	ShardsPerRegion int
	// WANLatency is the gateways' one-way delay between regions. Default
	// 20ms.
	WANLatency time.Duration
	// SpareShards are shards outside the bootstrapped map, to grow the bed
	// online with `triage shard add` (as `triage-bed up --spare-shards`
	// does for the process bed). Their servers are in
	// docker-compose.spare.yml, an override that `make compose-up
	// SPARE_SHARDS=n` adds, so the bed without it stays as small as
	// before; the bootstrap provisions them (bootstrap-spare.json). Spare
	// k (from 0) is homed in region k mod len(Regions) and numbered after
	// the map's shards, so shard numbers do not depend on spares.
	SpareShards int
}

// DefaultTopology is the checked-in bed: three regions, one shard homed
// in each, 20 ms one way between regions, and one spare shard (homed in
// us-east; its three servers start only with the override).
func DefaultTopology() Topology {
	return Topology{Regions: []string{"us-east", "eu-west", "ap-south"}, ShardsPerRegion: 1, WANLatency: wan.DefaultLatency, SpareShards: 1}
}

// ownerTTL is the dequeuers' ownership TTL, as on the process bed's three
// regions: a cut-off owner's claim lapses this long after its last
// refresh, which is most of a partition's dequeue RTO.
const ownerTTL = "5s"

// Ports of the gateways (wan.Endpoint.Port): the MariaDB server of shard s
// in region i is 30000+10*s+i, the NATS route port of region i 36200+i.
func mysqlPort(shard uint32, region int) int { return 30000 + 10*int(shard) + region }
func natsPort(region int) int                { return 36200 + region }

// maxShard keeps mysqlPort below the NATS ports.
const maxShard = 619

// serverAt is the shard and region index of mysqlPort's port p.
func serverAt(p int) (shard uint32, region int, ok bool) {
	if p < mysqlPort(1, 0) || p > mysqlPort(maxShard, 9) {
		return 0, 0, false
	}
	return uint32((p - 30000) / 10), (p - 30000) % 10, true
}

// server is one MariaDB container.
type server struct {
	service  string
	shard    uint32
	region   string
	primary  bool // the shard's primary at start
	serverID int
	port     int  // its gateway port
	spare    bool // of a spare shard: in docker-compose.spare.yml, not in the map
}

func (s server) addr() string { return s.service + ":3306" }

// servers lists every MariaDB container, the spare shards' last: per shard
// its primary, then a replica in each other region, the next region's
// first. server_id is the shard for a primary and k*1000+shard for its k-th
// replica, as deploy/bed numbers them.
func (t Topology) servers() []server {
	var out []server
	shard := func(id uint32, i int, spare bool) {
		home := t.Regions[i]
		out = append(out, server{fmt.Sprintf("mariadb-s%d-%s", id, home), id, home, true, int(id), mysqlPort(id, i), spare})
		for k := 1; k < len(t.Regions); k++ {
			ri := (i + k) % len(t.Regions)
			r := t.Regions[ri]
			out = append(out, server{fmt.Sprintf("mariadb-s%d-%s", id, r), id, r, false, k*1000 + int(id), mysqlPort(id, ri), spare})
		}
	}
	n := max(t.ShardsPerRegion, 1)
	for i := range t.Regions {
		for j := range n {
			shard(uint32(i*n+j+1), i, false)
		}
	}
	for k := range t.SpareShards {
		shard(uint32(n*len(t.Regions)+k+1), k%len(t.Regions), true)
	}
	return out
}

// shards groups servers (in servers' order) into shard-map entries.
func shards(servers []server) []genShard {
	var out []genShard
	for _, s := range servers {
		if s.primary {
			out = append(out, genShard{ID: s.shard, HomeRegion: s.region, Primary: s.addr(), Database: "triage"})
			continue
		}
		sh := &out[len(out)-1]
		sh.Replicas = append(sh.Replicas, s.addr())
		sh.ReplicaRegions = append(sh.ReplicaRegions, s.region)
	}
	return out
}

// endpoints are what the gateways carry between regions: every MariaDB
// server and every NATS server's route port.
func (t Topology) endpoints(servers []server) []wan.Endpoint {
	var out []wan.Endpoint
	for _, s := range servers {
		out = append(out, wan.Endpoint{Addr: s.addr(), Region: s.region, Port: s.port})
	}
	for i, r := range t.Regions {
		out = append(out, wan.Endpoint{Addr: "nats-" + r + ":6222", Region: r, Port: natsPort(i)})
	}
	return out
}

// gateway is region's gateway's host name, on its region's network and on
// "wan".
func gateway(region string) string { return "wan-" + region }

// via maps the address of every endpoint outside region to region's
// gateway: what processes of region dial instead.
func via(region string, eps []wan.Endpoint) map[string]string {
	out := map[string]string{}
	for _, e := range eps {
		if e.Region != region {
			out[e.Addr] = net.JoinHostPort(gateway(region), strconv.Itoa(e.Port))
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
		User         string `json:"user"`
		PasswordFile string `json:"password_file"`
	}
	genNATSTLS struct {
		CAFile string `json:"ca_file"`
	}
	// genTLS is a MySQL connection's TLS (shardmap.MySQLTLS) and a
	// replica's (replication.TLS): the bed's CA, checked against the name
	// dialed, which the servers' certificate carries.
	genTLS struct {
		CAFile string `json:"ca_file"`
	}
	// genAdmin is the admin account, over TLS.
	genAdmin struct {
		User         string  `json:"user"`
		PasswordFile string  `json:"password_file"`
		TLS          *genTLS `json:"tls"`
	}
	genBootstrap struct {
		ShardMapFile    string                       `json:"shard_map_file"`
		Admin           genAdmin                     `json:"admin"`
		NATS            []string                     `json:"nats"`
		NATSAuth        genAccount                   `json:"nats_auth"`
		NATSTLS         genNATSTLS                   `json:"nats_tls"`
		MySQL           genAccount                   `json:"mysql"`
		MySQLRequireSSL bool                         `json:"mysql_require_ssl"`
		Replication     genAccount                   `json:"replication"`
		ReplicationTLS  *genTLS                      `json:"replication_tls"`
		ReplicationVia  map[string]map[string]string `json:"replication_via"`
		KVReplicas      int                          `json:"kv_replicas"`
		StreamReplicas  int                          `json:"stream_replicas"`
		OwnerTTL        string                       `json:"owner_ttl"`
		SpareShards     []genShard                   `json:"spare_shards,omitempty"`
	}
	genMySQL struct {
		User         string            `json:"user"`
		PasswordFile string            `json:"password_file"`
		TLS          *genTLS           `json:"tls"`
		DialVia      map[string]string `json:"dial_via"`
	}
	genNode struct {
		Region         string                       `json:"region"`
		Roles          []string                     `json:"roles"`
		NATS           string                       `json:"nats"`
		NATSAuth       genAccount                   `json:"nats_auth"`
		NATSTLS        genNATSTLS                   `json:"nats_tls"`
		GRPC           string                       `json:"grpc,omitempty"`
		HTTP           string                       `json:"http,omitempty"`
		KeysFile       string                       `json:"keys_file,omitempty"`
		Metrics        string                       `json:"metrics"`
		MySQL          genMySQL                     `json:"mysql"`
		Admin          *genAdmin                    `json:"admin,omitempty"`
		Replication    *genAccount                  `json:"replication,omitempty"`
		ReplicationTLS *genTLS                      `json:"replication_tls,omitempty"`
		ReplicationVia map[string]map[string]string `json:"replication_via,omitempty"`
		OwnerTTL       string                       `json:"owner_ttl"`
		KVReplicas     int                          `json:"kv_replicas"`
		StreamReplicas int                          `json:"stream_replicas"`
	}
)

// Generate returns the bed's files for t by path relative to this
// directory: docker-compose.yml, every file of config/ and, with spare
// shards, SpareFile.
func Generate(t Topology) (map[string][]byte, error) {
	if err := t.check(); err != nil {
		return nil, err
	}
	g := newGeneration(t)
	smap := genShardMap{Version: 1, Regions: t.Regions, Namespaces: []map[string]string{{"name": "default"}}, Shards: shards(g.inMap)}
	if err := g.put("config/shardmap.json", smap); err != nil {
		return nil, err
	}
	g.putSecrets()
	if err := g.putBootstrap(); err != nil {
		return nil, err
	}
	for _, r := range t.Regions {
		if err := g.putRegion(r); err != nil {
			return nil, err
		}
	}
	g.files["config/prometheus.yml"] = prometheusConfig(t)
	g.files["docker-compose.yml"] = composeFile(t, g.inMap)
	return g.files, nil
}

// check refuses a topology the generated files cannot carry: the port
// scheme has room for 10 regions and maxShard shards.
func (t Topology) check() error {
	switch n := max(t.ShardsPerRegion, 1); {
	case len(t.Regions) < 2 || len(t.Regions) > 10:
		return fmt.Errorf("compose topology: %d region(s): want 2 to 10", len(t.Regions))
	case t.SpareShards < 0:
		return fmt.Errorf("compose topology: %d spare shards: want 0 or more", t.SpareShards)
	case n*len(t.Regions)+t.SpareShards > maxShard:
		return fmt.Errorf("compose topology: %d shards and %d spares: want at most %d in all", n*len(t.Regions), t.SpareShards, maxShard)
	case t.WANLatency < 0:
		return fmt.Errorf("compose topology: WAN latency %v: want 0 or more", t.WANLatency)
	}
	return nil
}

// generation is one run of Generate: the files so far and what several
// of them share.
type generation struct {
	t     Topology
	files map[string][]byte
	// servers are every MariaDB container, spares included: every config
	// knows the spare shards' servers (gateway ports, dial_via,
	// replication_via) whether they run or not, since a node dials them
	// only once they are added, and the gateways dial per connection.
	// inMap are those of the bootstrapped map, spares the rest.
	servers, inMap, spares []server
	// eps are the gateways' endpoints, and replVia, per region, what its
	// replicas and controller dial instead of another region's server.
	eps     []wan.Endpoint
	replVia map[string]map[string]string
	// replAccount is the replication account, its password a mounted
	// secret.
	replAccount genAccount
	// natsLogin is the Triage login of NATS for every role and the
	// bootstrap, natsTLS how they verify the servers: with the bed's CA.
	// Its password, the client login's and the route login's, the CA and
	// the servers' certificate are the bed directory's (WriteBedDir), new
	// for every bed.
	natsLogin genAccount
	natsTLS   genNATSTLS
	// mysqlTLS is every MySQL connection's TLS. Every server offers TLS
	// with the bed directory's certificate (mysqlArgs), which names every
	// server and every gateway, so every connection verifies the server
	// against the host it dials, its own region's server by name or
	// another region's as the gateway. The application and replication
	// accounts are REQUIRE SSL (the bootstrap's mysql_require_ssl and
	// replication_tls), so their logins over plain TCP are refused; root
	// is not, for the bed's own checks and fault injection from the
	// Docker host. The CA's path is the same in every container,
	// MariaDB's included, which reads it for CHANGE MASTER TO ...
	// MASTER_SSL_CA.
	mysqlTLS *genTLS
	// admin is the admin account (root), over mysqlTLS.
	admin genAdmin
}

// newGeneration works out what t's files share.
func newGeneration(t Topology) *generation {
	g := &generation{t: t, files: map[string][]byte{}, servers: t.servers(), replVia: map[string]map[string]string{}}
	g.eps = t.endpoints(g.servers)
	for _, r := range t.Regions {
		g.replVia[r] = via(r, g.eps[:len(g.servers)])
	}
	g.inMap = slices.DeleteFunc(slices.Clone(g.servers), func(s server) bool { return s.spare })
	g.spares = g.servers[len(g.inMap):]
	g.replAccount = genAccount{provision.BedAccounts.Repl.User, secretPath(replSecret)}
	g.natsLogin = genAccount{natsUser, secretPath(bedNATSTriage)}
	g.natsTLS = genNATSTLS{secretPath(bedCA)}
	g.mysqlTLS = &genTLS{secretPath(bedCA)}
	g.admin = genAdmin{adminUser, secretPath(adminSecret), g.mysqlTLS}
	return g
}

// put adds the config file name: v as indented JSON.
func (g *generation) put(name string, v any) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	g.files[name] = append(data, '\n')
	return nil
}

// putSecrets adds the MySQL password files. They are secrets mounted into
// the containers that need them: the application account's into every
// role and the bootstrap (which has no default for it), the admin's
// (root) and the replication account's into the controllers and the
// bootstrap only. provision.BedAccounts and the MariaDB image's
// ROOT_PASSWORD fix their values.
func (g *generation) putSecrets() {
	g.files[appSecret] = []byte(provision.BedAccounts.App.Password + "\n")
	g.files[adminSecret] = []byte(adminPassword + "\n")
	g.files[replSecret] = []byte(provision.BedAccounts.Repl.Password + "\n")
}

// putBootstrap adds the bootstrap's config and, with spare shards, the
// same with the spares (bootstrap-spare.json) and SpareFile.
func (g *generation) putBootstrap() error {
	boot := genBootstrap{ShardMapFile: "/etc/triage/shardmap.json", Admin: g.admin, ReplicationVia: g.replVia,
		NATSAuth: g.natsLogin, NATSTLS: g.natsTLS, MySQL: genAccount{provision.BedAccounts.App.User, secretPath(appSecret)}, MySQLRequireSSL: true,
		Replication: g.replAccount, ReplicationTLS: g.mysqlTLS, KVReplicas: 3, StreamReplicas: 3, OwnerTTL: ownerTTL}
	for _, r := range g.t.Regions {
		boot.NATS = append(boot.NATS, natsURL(r))
	}
	if err := g.put("config/bootstrap.json", boot); err != nil {
		return err
	}
	if len(g.spares) == 0 {
		return nil
	}
	boot.SpareShards = shards(g.spares)
	if err := g.put("config/bootstrap-spare.json", boot); err != nil {
		return err
	}
	g.files[SpareFile] = spareFile(g.t, g.spares)
	return nil
}

// putRegion adds region r's configs: its gateway's and one per role.
func (g *generation) putRegion(r string) error {
	latency := wan.Duration(g.t.WANLatency)
	gateways := map[string]string{}
	for _, o := range g.t.Regions {
		gateways[o] = gateway(o)
	}
	gw := wan.GatewayConfig{Region: r, Latency: &latency, Gateways: gateways, Endpoints: g.eps, Health: "127.0.0.1:7070"}
	if err := g.put(path.Join("config", r, "wan.json"), gw); err != nil {
		return err
	}
	for _, role := range roles {
		if err := g.put(path.Join("config", r, role+".json"), g.node(r, role)); err != nil {
			return err
		}
	}
	return nil
}

// node is the config of region r's role container.
func (g *generation) node(r, role string) genNode {
	c := genNode{Region: r, Roles: []string{role}, NATS: natsURL(r), NATSAuth: g.natsLogin, NATSTLS: g.natsTLS,
		MySQL:    genMySQL{User: provision.BedAccounts.App.User, PasswordFile: secretPath(appSecret), TLS: g.mysqlTLS, DialVia: via(r, g.eps[:len(g.servers)])},
		OwnerTTL: ownerTTL, KVReplicas: 3, StreamReplicas: 3, Metrics: metricsListen}
	if role == "router" {
		// Every interface of the container, published on the host's
		// loopback only, and API keys on: the bed's one key
		// (cluster-admin) is the bed directory's, which the tour, the
		// drills and TestCompose read on the host.
		c.GRPC, c.HTTP, c.KeysFile = "0.0.0.0:9090", "0.0.0.0:8080", keysPath
	}
	if role == "controller" {
		admin, repl := g.admin, g.replAccount
		c.Admin = &admin
		c.Replication = &repl
		c.ReplicationTLS = g.mysqlTLS
		c.ReplicationVia = g.replVia
	}
	return c
}

// metricsListen is every role container's metrics listener
// (node.Config.Metrics): /metrics on the region's network, for the bed's
// Prometheus, which joins every region's (prometheus.go); not published
// on the host.
const metricsListen = "0.0.0.0:9100"

// The MySQL password files under config/, and where containers see them.
// They are committed: the drills log in with the same fixed passwords
// (provision.BedAccounts).
const (
	appSecret   = "config/secrets/mysql-app"
	adminSecret = "config/secrets/mysql-admin"
	replSecret  = "config/secrets/mysql-repl"
)

// The NATS users of the bed (natsserver.Auth); their passwords are the bed
// directory's.
const (
	natsUser       = "triage"
	natsClientUser = "client"
	natsRouteUser  = "route"
)

// natsURL is region's NATS server as the region's containers dial it:
// TLS only.
func natsURL(region string) string { return "tls://nats-" + region + ":4222" }

func secretPath(name string) string { return "/run/secrets/" + path.Base(name) }

// mountSecret is the volume line that shows the committed secret name to
// a container.
func mountSecret(name string) string {
	return fmt.Sprintf("      - ./%s:%s:ro\n", name, secretPath(name))
}

// mountBed is the volume line that shows the bed directory's file name to
// a container at /run/secrets/name.
func mountBed(name string) string {
	return fmt.Sprintf("      - %s/%s:%s:ro\n", bedDirVar, name, secretPath(name))
}

// WriteFiles writes files (Generate's) under dir and removes every other
// file of dir/config, and SpareFile unless it is one of them, so a region
// or the spares taken out of the topology leave nothing behind.
func WriteFiles(dir string, files map[string][]byte) error {
	stale, err := generatedFiles(dir)
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

// generatedFiles lists the files under dir/config, and SpareFile if it
// exists, by slash path relative to dir: what the generator may have
// written.
func generatedFiles(dir string) (map[string]bool, error) {
	out := map[string]bool{}
	if _, err := os.Stat(filepath.Join(dir, SpareFile)); err == nil {
		out[SpareFile] = true
	} else if !os.IsNotExist(err) {
		return nil, err
	}
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

// Labels of the bed's containers, which deploy/compose.Bed finds them by.
const (
	// LabelRegion is the region a container belongs to (none: bootstrap).
	LabelRegion = "triage.region"
	// LabelRegionIndex is the region's place in the region order.
	LabelRegionIndex = "triage.region-index"
	// LabelRole is wan, mariadb, nats, router, enqueuer, dequeuer,
	// controller or bootstrap.
	LabelRole = "triage.role"
	// LabelShard is a MariaDB container's shard.
	LabelShard = "triage.shard"
	// LabelAddr is a MariaDB container's address in the shard map.
	LabelAddr = "triage.addr"
	// LabelStartedAs is "primary" or "replica": a MariaDB container's
	// place when the bed was created.
	LabelStartedAs = "triage.started-as"
	// LabelSpare is "true" on the servers of a spare shard (SpareFile),
	// which the bootstrapped map does not name.
	LabelSpare = "triage.spare"
)

// writer appends formatted text to a generated file.
type writer struct{ bytes.Buffer }

func (b *writer) w(format string, args ...any) { fmt.Fprintf(b, format, args...) }

// labels writes a service's labels.
func (b *writer) labels(kv ...string) {
	b.w("    labels:\n")
	for i := 0; i < len(kv); i += 2 {
		b.w("      %s: %q\n", kv[i], kv[i+1])
	}
}

// mariadb writes the service of MariaDB server s (its region's index i),
// which uses the file's x-mariadb anchor.
func (b *writer) mariadb(s server, i int) {
	what, ro, as := "primary at start", "OFF", "primary"
	if !s.primary {
		what, ro, as = "replica at start (read-only)", "ON", "replica"
	}
	if s.spare {
		what += ", spare: not in the shard map"
	}
	b.w("\n  # shard %d's server in %s: %s.\n  %s:\n    <<: *mariadb\n", s.shard, s.region, what, s.service)
	b.w("    environment:\n      SERVER_ID: \"%d\"\n      READ_ONLY: \"%s\"\n      ROOT_PASSWORD: root\n", s.serverID, ro)
	// TLS with the bed directory's certificate (the entrypoint passes its
	// arguments to mariadbd): every server offers it, and the accounts
	// that require it are the bootstrap's business.
	b.w("    command: [\"--ssl-ca=%s\", \"--ssl-cert=%s\", \"--ssl-key=%s\"]\n",
		secretPath(bedCA), secretPath(bedMySQLCert), secretPath(bedMySQLKey))
	b.w("    volumes:\n      - %s:/var/lib/mysql\n", s.service)
	b.w("%s%s%s", mountBed(bedCA), mountBed(bedMySQLCert), mountBed(bedMySQLKey))
	kv := []string{LabelRegion, s.region, LabelRegionIndex, strconv.Itoa(i), LabelRole, "mariadb",
		LabelShard, strconv.Itoa(int(s.shard)), LabelAddr, s.addr(), LabelStartedAs, as}
	if s.spare {
		kv = append(kv, LabelSpare, "true")
	}
	b.labels(kv...)
	b.w("    networks: [%s]\n", s.region)
}

// composeFile writes docker-compose.yml: every container but the spare
// shards'.
func composeFile(t Topology, servers []server) []byte {
	var b writer
	ex := mysqlPort(1, 1)
	b.w(composeHeader, t.WANLatency, ex, t.Regions[1], t.Regions[0], gateway(t.Regions[0]), ex, gateway(t.Regions[1]), t.Regions[1], PrometheusPort)
	b.w("%s", mariadbAnchor)
	b.w("%s", triageAnchor)
	b.w("\nservices:\n")
	region := map[string]int{}
	for i, r := range t.Regions {
		region[r] = i
		b.gatewayService(r, i)
	}
	for _, s := range servers {
		b.mariadb(s, region[s.region])
	}
	for i, r := range t.Regions {
		b.natsService(t, r, i)
	}
	b.bootstrapService(t, servers)
	for i, r := range t.Regions {
		for _, role := range roles {
			b.roleService(r, i, role)
		}
	}
	b.prometheusService(t)
	b.networksAndVolumes(t, servers)
	return b.Bytes()
}

// gatewayService writes the service of region r's WAN gateway (r is
// region i).
func (b *writer) gatewayService(r string, i int) {
	w := b.w
	w("\n  # %s's WAN gateway (`triage-bed wan`), the region's only container on \"wan\":\n", r)
	w("  # the region's processes reach other regions' servers through it (delayed),\n")
	w("  # other regions reach this region's servers through it (as is).\n")
	w("  %s:\n    image: %s\n", gateway(r), bedImage)
	w("    entrypoint: [\"/triage-bed\"]\n")
	w("    command: [\"wan\", \"--config\", \"/etc/triage/wan.json\"]\n")
	w("%s", probe)
	w("    volumes:\n      - ./config/%s/wan.json:/etc/triage/wan.json:ro\n", r)
	b.labels(LabelRegion, r, LabelRegionIndex, strconv.Itoa(i), LabelRole, "wan")
	w("    networks: [%s, wan]\n", r)
}

// natsService writes the service of region r's NATS server (r is region
// i of t), routed to every other region's through the gateways.
func (b *writer) natsService(t Topology, r string, i int) {
	w := b.w
	svc := "nats-" + r
	var routes []string
	for j, o := range t.Regions {
		if o != r {
			routes = append(routes, "nats-route://"+net.JoinHostPort(gateway(r), strconv.Itoa(natsPort(j))))
		}
	}
	w("\n  # NATS of %s, routed to the others through %s; it advertises an address\n", r, gateway(r))
	w("  # nobody can dial, so gossip opens no route around the gateways.\n")
	w("  %s:\n    image: %s\n", svc, triageImage)
	w("    command: [\"nats\", \"--name\", \"%s\", \"--store\", \"/data/nats\", \"--tags\", \"region:%s\",\n", svc, r)
	// Every interface (the region's network), and the monitoring port
	// the health check and the drills ask.
	w("              \"--host\", \"0.0.0.0\", \"--http-port\", \"8222\",\n")
	w("              \"--cluster-advertise\", \"127.0.0.1:1\", \"--routes\", \"%s\",\n", strings.Join(routes, ","))
	w("              \"--triage-user\", \"%s\", \"--triage-password-file\", \"%s\",\n", natsUser, secretPath(bedNATSTriage))
	w("              \"--client-user\", \"%s\", \"--client-password-file\", \"%s\",\n", natsClientUser, secretPath(bedNATSClient))
	w("              \"--route-user\", \"%s\", \"--route-password-file\", \"%s\",\n", natsRouteUser, secretPath(bedNATSRoute))
	// TLS on the client port and on the routes, which dial the
	// gateways by name: the one certificate carries every server's
	// and every gateway's name.
	w("              \"--tls-cert\", \"%s\", \"--tls-key\", \"%s\", \"--tls-ca\", \"%s\", \"--tls-routes\"]\n",
		secretPath(bedNATSCert), secretPath(bedNATSKey), secretPath(bedCA))
	// Healthy means JetStream answers and the server has its route to
	// every other region's: core NATS (the enqueue and dequeue replies)
	// crosses only direct routes, and a partial mesh still has a
	// JetStream quorum.
	w("    healthcheck:\n      test: [\"CMD\", \"/triage\", \"probe\", \"--nats-peers\", \"%d\", \"http://127.0.0.1:8222\"]\n", len(t.Regions)-1)
	w("      interval: 15s\n      timeout: 30s\n      retries: 120\n")
	w("    volumes:\n      - %s:/data\n", svc)
	w("%s%s%s", mountBed(bedNATSTriage), mountBed(bedNATSClient), mountBed(bedNATSRoute))
	w("%s%s%s", mountBed(bedCA), mountBed(bedNATSCert), mountBed(bedNATSKey))
	b.labels(LabelRegion, r, LabelRegionIndex, strconv.Itoa(i), LabelRole, "nats")
	w("    networks: [%s]\n", r)
}

// bootstrapService writes the one-shot bootstrap's service, which waits
// for every gateway, MariaDB server of servers and NATS server to be
// healthy.
func (b *writer) bootstrapService(t Topology, servers []server) {
	w := b.w
	w("\n  # One-shot: accounts, schema, replication, NATS buckets and the shard map\n")
	w("  # (triage bootstrap, cmd/triage/bootstrap.Run). The roles start after it.\n")
	w("  # An administrator's job, on every region's network; it exits before\n")
	w("  # anything is served.\n")
	w("  bootstrap:\n    image: %s\n", triageImage)
	w("    command: [\"bootstrap\", \"--config\", \"/etc/triage/bootstrap.json\"]\n")
	w("    volumes:\n      - ./config/bootstrap.json:/etc/triage/bootstrap.json:ro\n")
	w("      - ./config/shardmap.json:/etc/triage/shardmap.json:ro\n")
	w("%s%s%s%s%s", mountSecret(appSecret), mountSecret(adminSecret), mountSecret(replSecret), mountBed(bedNATSTriage), mountBed(bedCA))
	b.labels(LabelRole, "bootstrap")
	w("    networks: [%s]\n    restart: \"no\"\n    depends_on:\n", strings.Join(t.Regions, ", "))
	for _, r := range t.Regions {
		w("      %s:\n        condition: service_healthy\n", gateway(r))
	}
	for _, s := range servers {
		w("      %s:\n        condition: service_healthy\n", s.service)
	}
	for _, r := range t.Regions {
		w("      nats-%s:\n        condition: service_healthy\n", r)
	}
}

// roleService writes the service of region r's (region i's) Triage role
// container, which uses the file's x-triage anchor; the router's ports
// are published on the host's loopback.
func (b *writer) roleService(r string, i int, role string) {
	w := b.w
	svc := role + "-" + r
	w("\n  %s:\n    <<: *triage\n", svc)
	w("    command: [\"serve\", \"--config\", \"/etc/triage/%s.json\", \"--health\", \"127.0.0.1:7070\"]\n", role)
	w("    volumes:\n      - ./config/%s/%s.json:/etc/triage/%s.json:ro\n", r, role, role)
	w("%s%s%s", mountSecret(appSecret), mountBed(bedNATSTriage), mountBed(bedCA))
	if role == "controller" {
		w("%s%s", mountSecret(adminSecret), mountSecret(replSecret))
	}
	if role == "router" {
		w("      - %s/%s:%s:ro\n", bedDirVar, bedKeys, keysPath)
		env := strings.ToUpper(strings.ReplaceAll(r, "-", "_"))
		w("    ports:\n      - \"127.0.0.1:${TRIAGE_HTTP_%s:-%d}:8080\"\n", env, 18080+i)
		w("      - \"127.0.0.1:${TRIAGE_GRPC_%s:-%d}:9090\"\n", env, 19090+i)
	}
	b.labels(LabelRegion, r, LabelRegionIndex, strconv.Itoa(i), LabelRole, role)
	w("    networks: [%s]\n", r)
}

// networksAndVolumes writes the file's networks (one per region, and
// "wan" between the gateways) and volumes (every server of servers' and
// every NATS server's).
func (b *writer) networksAndVolumes(t Topology, servers []server) {
	w := b.w
	w("\nnetworks:\n")
	for _, r := range t.Regions {
		w("  %s:\n", r)
	}
	w("  # Between regions: the gateways only. A partition disconnects a region's\n")
	w("  # gateway from it (docker network disconnect).\n")
	w("  wan:\n")
	w("\nvolumes:\n")
	for _, s := range servers {
		w("  %s:\n", s.service)
	}
	for _, r := range t.Regions {
		w("  nats-%s:\n", r)
	}
}

// SpareFile is the override with the spare shards' servers, beside
// docker-compose.yml.
const SpareFile = "docker-compose.spare.yml"

// spareFile writes SpareFile: the spare shards' servers, and the bootstrap
// switched to bootstrap-spare.json and made to wait for them too. Compose
// merges it into docker-compose.yml (-f both): depends_on and volumes add
// up, command is replaced.
func spareFile(t Topology, spares []server) []byte {
	var b writer
	w := b.w
	region := map[string]int{}
	for i, r := range t.Regions {
		region[r] = i
	}
	var ids []string
	for _, s := range spares {
		if s.primary {
			ids = append(ids, strconv.Itoa(int(s.shard)))
		}
	}
	w(spareHeader, len(ids), strings.Join(ids, ", "))
	for _, sh := range shards(spares) {
		w("#   triage shard add %d --home %s --primary %s", sh.ID, sh.HomeRegion, sh.Primary)
		for i, r := range sh.Replicas {
			w(" \\\n#     --replica %s@%s", r, sh.ReplicaRegions[i])
		}
		w("\n")
	}
	w("%s", spareHeaderEnd)
	w("%s", mariadbAnchor)
	w("\nservices:\n")
	for _, s := range spares {
		b.mariadb(s, region[s.region])
	}
	w("\n  # The bootstrap provisions the spare shards as well (spare_shards of\n")
	w("  # bootstrap-spare.json: accounts, database and schema, replication) but\n")
	w("  # publishes only the map.\n")
	w("  bootstrap:\n")
	w("    command: [\"bootstrap\", \"--config\", \"/etc/triage/bootstrap-spare.json\"]\n")
	w("    volumes:\n      - ./config/bootstrap-spare.json:/etc/triage/bootstrap-spare.json:ro\n")
	w("    depends_on:\n")
	for _, s := range spares {
		w("      %s:\n        condition: service_healthy\n", s.service)
	}
	w("\nvolumes:\n")
	for _, s := range spares {
		w("  %s:\n", s.service)
	}
	return b.Bytes()
}

// triageImage is the production image (deploy/image: the triage binary
// alone, run as uid 65532), which every Triage container runs: the roles,
// NATS, the bootstrap.
const triageImage = "${TRIAGE_IMAGE:?run deploy/compose/build-images.sh and pass --env-file}"

// bedImage is the bed-tools image: the production image plus triage-bed,
// which only the WAN gateways run, so no test-bed code reaches the
// production image.
const bedImage = "${TRIAGE_BED_IMAGE:?run deploy/compose/build-images.sh and pass --env-file}"

// Health checks run every 15 s (the first 15 s after start). Each is a
// docker exec, a runc process and the probe, and on a 2-core machine
// checks every second or every 5 s across the bed's 27-31 containers take
// most of both cores (an idle bed with 40 runnable processes, a docker
// exec taking 10 s). Docker 20.10 has no start_interval, so the bed waits
// up to 15 s more per stage of its start (servers, then roles) instead.
// A check may take up to 30 s: under a heavy load the exec alone takes
// over 5 s, and a shorter timeout keeps a ready node "starting" until
// up.sh gives up.

const probe = `    healthcheck:
      test: ["CMD", "/triage", "probe", "http://127.0.0.1:7070/healthz"]
      interval: 15s
      timeout: 30s
      retries: 120
`

// composeHeader takes the WAN latency, an example (see composeFile) and
// PrometheusPort.
const composeHeader = `# The multi-region compose bed of Triage, written by generate.go (go generate
# ./deploy/compose; do not edit). One Docker network per region and "wan"
# between them, on which only the regions' gateways sit. Per region: a WAN
# gateway, the primaries of the region's shards and replicas of the other
# regions' shards (MariaDB, GTID, semi-sync), one NATS server of a JetStream
# cluster, and the Triage roles router, enqueuer, dequeuer and controller in
# containers of their own; and one Prometheus on every region's network. See
# README.md beside this file.
#
# Images come from build-images.sh (no registry), the bed's API key, NATS
# passwords and NATS certificates from a bed directory that
# go run ./deploy/compose/beddir DIR makes (TRIAGE_BED_DIR): run both, then
#   TRIAGE_BED_DIR=DIR docker-compose --env-file .images.env -p triage up -d
# or just ` + "`make compose-up`" + ` at the top of the repository.
#
# Names: containers reach their own region's servers by service name
# (mariadb-s1-us-east:3306), and every other region's through their own
# region's gateway, on the server's gateway port (mysql.dial_via,
# replication_via, NATS routes in config/): the gateway delays every byte
# %v each way. E.g. port %d is %s's server of shard 1: %s's
# processes dial %s:%d, the gateway forwards it over "wan"
# to %s, which relays it to mariadb-s1-%s:3306. The routers'
# JSON gateways and gRPC are published on 127.0.0.1:18080... and 19090...
# (region order); TRIAGE_HTTP_US_EAST, TRIAGE_GRPC_US_EAST ... override
# them (0: a free port, see docker port). They want the bed's API key
# (authorization: Bearer $(cat $TRIAGE_BED_DIR/token)); NATS wants TLS and
# a login. Prometheus is published on 127.0.0.1:%d (TRIAGE_PROMETHEUS).
version: "3.9"
`

// mariadbAnchor is the MariaDB servers' common part (x-mariadb), in each
// file that has servers: YAML anchors do not reach across files.
const mariadbAnchor = `
x-mariadb: &mariadb
  image: ${TRIAGE_MARIADB_IMAGE:?run deploy/compose/build-images.sh and pass --env-file}
  healthcheck:
    test: ["CMD", "mariadb", "-uroot", "--socket=/run/mysqld/mysqld.sock", "-e", "SELECT 1"]
    interval: 15s
    timeout: 30s
    retries: 120
  stop_grace_period: 20s
`

// triageAnchor is the Triage role containers' common part (x-triage).
const triageAnchor = `
x-triage: &triage
  image: ${TRIAGE_IMAGE:?run deploy/compose/build-images.sh and pass --env-file}
  healthcheck:
    test: ["CMD", "/triage", "probe", "http://127.0.0.1:7070/healthz"]
    interval: 15s
    timeout: 30s
    retries: 120
  depends_on:
    bootstrap:
      condition: service_completed_successfully
  stop_grace_period: 20s
`

// spareHeader takes the number of spare shards and their IDs; the add
// commands and spareHeaderEnd follow it.
const spareHeader = `# Spare shards of the compose bed, written by generate.go (go generate
# ./deploy/compose; do not edit): an override of docker-compose.yml that adds
# %d spare shard(s) (%s), each a primary in its home region and a replica in
# every other one, replicated like the others but not in the shard map, to
# grow the bed online. ` + "`make compose-up SPARE_SHARDS=n`" + ` uses it, or
#   docker-compose -f docker-compose.yml -f docker-compose.spare.yml --env-file .images.env -p triage up -d
# Every config under config/ already knows their servers (gateway ports,
# dial_via, replication_via). Add them with (TRIAGE_ADDR: a router's gRPC):
`

const spareHeaderEnd = `# and, for namespaces that list their shards, triage namespace add-shard
# (README.md, "Spare shards").
version: "3.9"
`
