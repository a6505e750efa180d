package bed

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/triage-queue/triage/cmd/triage/natsserver"
	"github.com/triage-queue/triage/cmd/triage/node"
	"github.com/triage-queue/triage/cmd/triage/provision"
	"github.com/triage-queue/triage/deploy/mariadb"
	"github.com/triage-queue/triage/deploy/wan"
	"github.com/triage-queue/triage/routing/auth"
	"github.com/triage-queue/triage/shardmap"
)

// DefaultRegions are the bed's regions, in port order.
var DefaultRegions = []string{"us-east", "eu-west", "ap-south"}

// Config of a bed.
type Config struct {
	// Dir holds bed.json and the shard map. Default ".triage".
	Dir string
	// Regions to run. Default: the first of DefaultRegions.
	Regions []string
	// ShardsPerRegion is the number of shard primaries per region. Default
	// 2 with one region, 1 with more (each shard then has a replica in
	// every other region).
	ShardsPerRegion int
	// SpareShardsPerRegion are shard primaries started (with replicas and
	// accounts, like the others) but left out of the shard map, numbered
	// after every region's shards, for adding online (triage shard add;
	// bed.json lists them with "spare": true). Default 0.
	SpareShardsPerRegion int
	// HTTPBase and GRPCBase are region 0's gateway and gRPC ports; region i
	// uses base+i. Default 8080 and 9090. 0 after Defaults means "pick free".
	HTTPBase, GRPCBase int
	// NATSPort is region 0's NATS client port; region i uses NATSPort+i.
	// Default 4222; -1 picks free ones.
	NATSPort int
	// WANLatency is the one-way latency of every cross-region link.
	// Default 20ms; negative means none (links still exist, for cuts).
	WANLatency time.Duration
	// OwnerTTL of dequeuer shard ownership. Default 10s.
	OwnerTTL time.Duration
	// Pprof, when set, serves net/http/pprof for region 0's node here.
	Pprof string
	// MariaDBArgs are extra mariadbd flags for every server.
	MariaDBArgs []string
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Auth turns authentication on: the bed writes a throwaway keys file
	// (keys.json in Dir) with one cluster-admin key, which bed.json and
	// `triage-bed up` give out (Layout.Token), and NATS logins
	// (natsserver.Auth): the nodes log in as the Triage user, and a
	// client user is refused the internal subjects (their passwords in
	// nats-triage.password and nats-client.password in Dir, 0600). It
	// also turns NATS TLS on: a throwaway CA (ca.crt in Dir; its key is
	// never written) signs the servers' certificate (nats-server.crt,
	// nats-server.key), every client connection and, with several
	// regions, every route is TLS, and the routes need a random route
	// login, held in memory only. It turns MySQLTLS on too. Default off
	// (tests, bench).
	Auth bool
	// MySQLTLS makes MySQL traffic TLS: the throwaway CA (ca.crt) signs
	// the mariadbd servers' certificate (mysql-server.crt,
	// mysql-server.key), the nodes' application and admin connections
	// verify it (node.Config.MySQL.TLS), the replicas connect to their
	// primary with MASTER_SSL=1 verifying chain and name
	// (node.Config.ReplicationTLS), and the application and replication
	// accounts are REQUIRE SSL, so their logins over plain TCP are
	// refused. Root, which the bed's own checks and drills use, may still
	// log in over plain TCP on loopback. Default: Auth.
	MySQLTLS bool
	// Progress, when set, receives one line per step of the bring-up, for
	// a person watching `triage-bed up`.
	Progress func(line string)
}

// Region is one region's endpoints.
type Region struct {
	Name string `json:"name"`
	HTTP string `json:"http"`
	GRPC string `json:"grpc"`
	// NATS is the client URL of the region's NATS server.
	NATS string `json:"nats,omitempty"`
	// Metrics is the node's metrics listener (node.Config.Metrics, on
	// 127.0.0.1), the address to scrape: the router's HTTP listener does
	// not serve /metrics.
	Metrics string `json:"metrics,omitempty"`
}

// Roles of processes in bed.json.
const (
	RolePrimary = "mysql-primary"
	RoleReplica = "mysql-replica"
	RoleNATS    = "nats"
	RoleTriage  = "triage"
)

// Process is one process of the bed. NATS servers and nodes run inside the
// bed's own process, so they carry its PID.
type Process struct {
	Role   string `json:"role"`
	Region string `json:"region,omitempty"`
	Shard  uint32 `json:"shard,omitempty"`
	Port   int    `json:"port,omitempty"`
	PID    int    `json:"pid"`
	// ClusterPort is a NATS server's route port (several regions only).
	ClusterPort int `json:"cluster_port,omitempty"`
	// Spare marks a shard's servers that are not in the shard map yet.
	Spare bool `json:"spare,omitempty"`
}

// Layout is bed.json.
type Layout struct {
	Regions   []Region  `json:"regions"`
	Processes []Process `json:"processes"`
	// NATS is region 0's NATS client URL.
	NATS     string `json:"nats"`
	ShardMap string `json:"shard_map"`
	// Links are the cross-region proxies, as of the last write of
	// bed.json (several regions only).
	Links []wan.LinkInfo `json:"links,omitempty"`
	// Control is the host:port of the bed's control endpoint, through
	// which a drill in another process injects faults (deploy/drill).
	// Empty while the bed serves none.
	Control   string    `json:"control,omitempty"`
	StartedAt time.Time `json:"started_at"`
	// Token is the bed's throwaway cluster-admin API key (Config.Auth),
	// and KeysFile the keys file holding its hash. bed.json is written
	// 0600 for it.
	Token    string `json:"token,omitempty"`
	KeysFile string `json:"keys_file,omitempty"`
	// NATSAuth is the Triage login of the bed's NATS servers (Config.Auth),
	// for processes that act as Triage (the bench); NATSClient the client
	// login, refused on triage.*, JetStream and KV. Passwords are in files.
	NATSAuth   *shardmap.NATSLogin `json:"nats_auth,omitempty"`
	NATSClient *shardmap.NATSLogin `json:"nats_client,omitempty"`
	// NATSTLS is how to reach the bed's NATS servers, which then require
	// TLS (Config.Auth): the throwaway CA's certificate.
	NATSTLS *shardmap.NATSTLS `json:"nats_tls,omitempty"`
	// MySQLTLS is how to reach the bed's MariaDB servers over TLS
	// (Config.MySQLTLS), which the application and replication accounts
	// must: the throwaway CA's certificate.
	MySQLTLS *shardmap.MySQLTLS `json:"mysql_tls,omitempty"`
}

// Via returns the address a process of region from dials to reach addr:
// the WAN link's listen address if addr is in another region, else addr.
func (l *Layout) Via(from, addr string) string {
	for _, k := range l.Links {
		if k.From == from && k.Upstream == addr {
			return k.Listen
		}
	}
	return addr
}

// Bed is a running bed.
type Bed struct {
	Layout Layout
	// Shards are the shard primaries as started, by shard ID. Prefer
	// Server, which follows Restart.
	Shards map[uint32]*mariadb.Server

	cfg Config
	log *slog.Logger
	tmp string
	// natsAuth are the NATS servers' logins (Config.Auth), nil for none;
	// natsTLS their certificate and routeAuth their route login.
	natsAuth  *natsserver.Auth
	natsTLS   *natsserver.TLS
	routeAuth *natsserver.Login
	// mysqlTLS are the MariaDB servers' certificate files
	// (Config.MySQLTLS), nil for plain TCP.
	mysqlTLS *mysqlTLS
	started  time.Time
	net      *wan.Net
	regions  []*region
	// via maps, per region, a remote server's address to the link from
	// that region.
	via map[string]map[string]string

	mu      sync.Mutex // guards servers, regions' dead flags, Layout.Processes, stopped, killed, cutOff
	servers []*dbServer
	stopped bool
	killed  map[uint32]*dbServer // per shard, the server the last primary-kill killed
	// cutOff is, per region, the servers that were shard primaries when
	// the region was partitioned or taken down (see rememberPrimaries).
	cutOff   map[string][]*dbServer
	bg       sync.WaitGroup // nodes stopping in the background after KillRegion
	control_ *http.Server   // the drill control endpoint
	nem      nemesisState   // the nemesis's faults in effect (faults.go)
}

// region is one region's in-process parts.
type region struct {
	name        string
	index       int
	nats        *server.Server
	natsCfg     natsserver.Config // to restart it after a nats-kill drill
	clusterPort int
	node        *node.Node
	dead        bool
}

// dbServer is one mariadbd of the bed.
type dbServer struct {
	shard  uint32
	role   string // RolePrimary or RoleReplica: the placement at start
	spare  bool   // not in the bootstrap shard map (SpareShardsPerRegion)
	region string
	srv    *mariadb.Server
	args   []string // mariadbd flags the bed started it with
}

func (c *Config) fill() {
	c.Dir = cmp.Or(c.Dir, ".triage")
	if len(c.Regions) == 0 {
		c.Regions = DefaultRegions[:1]
	}
	if len(c.Regions) == 1 {
		c.ShardsPerRegion = cmp.Or(c.ShardsPerRegion, 2)
	} else {
		c.ShardsPerRegion = cmp.Or(c.ShardsPerRegion, 1)
	}
	c.NATSPort = cmp.Or(c.NATSPort, 4222)
	c.MySQLTLS = c.MySQLTLS || c.Auth
	switch {
	case c.WANLatency == 0:
		c.WANLatency = 20 * time.Millisecond
	case c.WANLatency < 0:
		c.WANLatency = 0
	}
	// Several regions: a shorter ownership TTL, so another region adopts a
	// dead region's shards sooner (region-down RTO).
	c.OwnerTTL = cmp.Or(c.OwnerTTL, map[bool]time.Duration{true: 10 * time.Second, false: 5 * time.Second}[len(c.Regions) == 1])
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

func (c *Config) validate() error {
	seen := map[string]bool{}
	for _, r := range c.Regions {
		if r == "" || seen[r] {
			return fmt.Errorf("bed: regions %q: want distinct, non-empty names", c.Regions)
		}
		seen[r] = true
	}
	if c.ShardsPerRegion < 1 {
		return fmt.Errorf("bed: %d shards per region: want at least 1", c.ShardsPerRegion)
	}
	if c.SpareShardsPerRegion < 0 || c.SpareShardsPerRegion > 8 {
		return fmt.Errorf("bed: %d spare shards per region: allowed 0 to 8", c.SpareShardsPerRegion)
	}
	return nil
}

// Start brings a bed up. On error everything started so far is stopped.
func Start(ctx context.Context, cfg Config) (b *Bed, err error) {
	if err := prepare(&cfg); err != nil {
		return nil, err
	}
	var token, keysFile string
	if cfg.Auth {
		if token, keysFile, err = writeKeys(cfg.Dir); err != nil {
			return nil, err
		}
	}
	b = &Bed{cfg: cfg, log: cfg.Logger, started: time.Now(), Shards: map[uint32]*mariadb.Server{}, via: map[string]map[string]string{}}
	b.Layout.Token, b.Layout.KeysFile = token, keysFile
	if err := b.writeCredentials(); err != nil {
		return nil, err
	}
	for i, name := range cfg.Regions {
		b.regions = append(b.regions, &region{name: name, index: i})
		b.via[name] = map[string]string{}
	}
	started := b // b is nil by the time a failing return runs the defer
	defer func() {
		if err != nil {
			started.Stop()
		}
	}()
	if err := b.bringUp(ctx); err != nil {
		return nil, err
	}
	b.progress("bed is up")
	return b, nil
}

// prepare fills cfg's defaults, checks it and readies its directory,
// refusing one a live bed runs from.
func prepare(cfg *Config) error {
	cfg.fill()
	if err := cfg.validate(); err != nil {
		return err
	}
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return err
	}
	return refuseRunning(cfg.Dir)
}

// writeCredentials makes up what the bed's servers and clients
// authenticate and encrypt with, before anything starts: the throwaway CA
// and the MariaDB servers' certificate (Config.MySQLTLS), and the NATS
// logins, certificate and route login (Config.Auth).
func (b *Bed) writeCredentials() error {
	var ca *bedCA
	var err error
	if b.cfg.Auth || b.cfg.MySQLTLS {
		if ca, err = b.newCA(); err != nil {
			return err
		}
	}
	if b.cfg.MySQLTLS {
		if b.mysqlTLS, err = b.writeMySQLCerts(ca); err != nil {
			return err
		}
		b.Layout.MySQLTLS = b.mysqlTLS.client()
	}
	if !b.cfg.Auth {
		return nil
	}
	if err := b.writeNATSLogins(); err != nil {
		return err
	}
	if b.natsTLS, b.Layout.NATSTLS, err = b.writeNATSCerts(ca); err != nil {
		return err
	}
	if b.multi() {
		b.routeAuth = &natsserver.Login{User: "route", Password: rand.Text()}
	}
	return nil
}

// bringUp starts the bed's parts in dependency order: MariaDB and its
// replication, the shard map, NATS, the nodes, then, once the nodes are
// ready, the control endpoint and bed.json. The caller stops whatever
// started when it fails.
func (b *Bed) bringUp(ctx context.Context) error {
	var err error
	if err := mariadb.EnsureInstalled(ctx, b.log); err != nil {
		return err
	}
	if b.tmp, err = os.MkdirTemp("", "triage-bed-"); err != nil {
		return err
	}
	if b.multi() {
		b.net = wan.New(b.log)
	}
	if err := b.startMariaDB(ctx); err != nil {
		return err
	}
	if err := b.setUpReplication(ctx); err != nil {
		return err
	}
	if err := b.writeShardMap(); err != nil {
		return err
	}
	if err := b.startNATS(ctx); err != nil {
		return err
	}
	if err := b.startNodes(ctx); err != nil {
		return err
	}
	if err := b.waitReady(ctx); err != nil {
		return err
	}
	if err := b.serveControl(); err != nil {
		return err
	}
	b.Layout.StartedAt = time.Now().UTC()
	return b.writeLayout()
}

// multi reports whether the bed has several regions (replicas, WAN, a
// NATS cluster).
func (b *Bed) multi() bool { return len(b.cfg.Regions) > 1 }

func (b *Bed) progress(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	b.log.Info("bed: " + msg)
	if b.cfg.Progress != nil {
		b.cfg.Progress(fmt.Sprintf("[%5.1fs] %s", time.Since(b.started).Seconds(), msg))
	}
}

// startNodes starts one node per region: region 0's first, then the
// others at once (each mostly waits on JetStream round trips across the
// WAN). Region 0's node creates the shared KV buckets alone because
// nats-server (2.15.2) wedges a replicated stream that several clients
// create concurrently: every creator but one times out, and so do later
// updates. Concurrent updates of an existing bucket are fine.
func (b *Bed) startNodes(ctx context.Context) error {
	b.progress("starting %d Triage node(s) (router, enqueuer, dequeuer)", len(b.regions))
	replicas := min(len(b.regions), 3)
	password, err := b.writeAppPassword()
	if err != nil {
		return err
	}
	repl, err := b.replAccount()
	if err != nil {
		return err
	}
	startOne := func(i int) error {
		r := b.regions[i]
		roles := []string{node.RoleRouter, node.RoleEnqueuer, node.RoleDequeuer}
		if b.multi() {
			roles = append(roles, node.RoleController)
		}
		n, err := node.Start(ctx, node.Config{
			Roles:          roles,
			Replication:    repl,
			ReplicationTLS: b.mysqlTLS.replication(),
			ReplicationVia: b.via,
			Region:         r.name,
			NATS:           r.nats.ClientURL(),
			GRPC:           addr(b.cfg.GRPCBase, i),
			HTTP:           addr(b.cfg.HTTPBase, i),
			MySQL:          b.appMySQL(r.name, password),
			Admin:          shardmap.Credentials{TLS: b.mysqlTLS.client()}, // root, over TLS when the servers offer it
			ShardMapFile:   b.Layout.ShardMap,
			OwnerTTL:       shardmapDuration(b.cfg.OwnerTTL),
			Pprof:          map[bool]string{true: b.cfg.Pprof}[i == 0],
			Metrics:        "127.0.0.1:0",
			KVReplicas:     replicas,
			StreamReplicas: replicas,
			KeysFile:       b.Layout.KeysFile,
			NATSAuth:       b.Layout.NATSAuth,
			NATSTLS:        b.Layout.NATSTLS,
		}, b.log)
		if err != nil {
			return fmt.Errorf("region %s: %w", r.name, err)
		}
		r.node = n
		return nil
	}
	err = startOne(0)
	if err == nil {
		err = provision.Parallel(len(b.regions)-1, func(i int) error { return startOne(i + 1) })
	}
	if err != nil {
		return err
	}
	for _, r := range b.regions {
		b.Layout.Regions = append(b.Layout.Regions, Region{Name: r.name, HTTP: r.node.HTTPAddr, GRPC: r.node.GRPCAddr, NATS: r.nats.ClientURL(), Metrics: r.node.MetricsAddr})
		b.Layout.Processes = append(b.Layout.Processes, Process{Role: RoleTriage, Region: r.name, Port: port(r.node.GRPCAddr), PID: os.Getpid()})
		b.progress("region %s: JSON http://%s  gRPC %s  metrics http://%s/metrics", r.name, r.node.HTTPAddr, r.node.GRPCAddr, r.node.MetricsAddr)
	}
	return nil
}

func addr(base, i int) string {
	if base == 0 {
		return "127.0.0.1:0"
	}
	return "127.0.0.1:" + strconv.Itoa(base+i)
}

func port(a string) int {
	_, p, _ := net.SplitHostPort(a)
	n, _ := strconv.Atoi(p)
	return n
}

// LayoutPath is where a bed in dir writes its layout.
func LayoutPath(dir string) string { return filepath.Join(dir, "bed.json") }

func (b *Bed) writeLayout() error {
	if b.net != nil {
		b.Layout.Links = b.net.Links()
	}
	data, err := json.MarshalIndent(b.Layout, "", "  ")
	if err != nil {
		return err
	}
	tmp := LayoutPath(b.cfg.Dir) + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil { // it may hold the bed's key
		return err
	}
	return os.Rename(tmp, LayoutPath(b.cfg.Dir))
}

// Stop stops everything the bed started, nodes first, then NATS, the WAN
// links and the mariadbd processes (by the PIDs it started), and removes
// its temp datadirs and bed.json. It is idempotent.
func (b *Bed) Stop() {
	b.mu.Lock()
	if b.stopped {
		b.mu.Unlock()
		return
	}
	b.stopped = true
	b.mu.Unlock()
	if b.control_ != nil {
		_ = b.control_.Close()
	}
	b.bg.Wait()
	_ = provision.Parallel(len(b.regions), func(i int) error {
		if n := b.regions[i].node; n != nil {
			n.Stop()
		}
		return nil
	})
	_ = provision.Parallel(len(b.regions), func(i int) error {
		if s := b.regions[i].nats; s != nil {
			s.Shutdown()
			s.WaitForShutdown()
		}
		return nil
	})
	if b.net != nil {
		b.net.Close()
	}
	b.mu.Lock()
	servers := b.servers
	b.mu.Unlock()
	_ = provision.Parallel(len(servers), func(i int) error {
		if err := servers[i].srv.Stop(); err != nil {
			b.log.Warn("mariadbd stop", "shard", servers[i].shard, "role", servers[i].role, "err", err)
		}
		return nil
	})
	if b.tmp != "" {
		_ = os.RemoveAll(b.tmp)
	}
	_ = os.Remove(LayoutPath(b.cfg.Dir))
}

// ReadLayout reads the bed.json of a running bed in dir.
func ReadLayout(dir string) (*Layout, error) {
	data, err := os.ReadFile(LayoutPath(dir))
	if err != nil {
		return nil, err
	}
	var l Layout
	if err := json.Unmarshal(data, &l); err != nil {
		return nil, fmt.Errorf("%s: %w", LayoutPath(dir), err)
	}
	return &l, nil
}

// refuseRunning fails when dir's bed.json names a live process: two beds
// would fight over the ports.
func refuseRunning(dir string) error {
	l, err := ReadLayout(dir)
	if err != nil {
		return nil
	}
	for _, p := range l.Processes {
		if p.PID > 0 && alive(p.PID) {
			return fmt.Errorf("a bed is already running (pid %d, see %s); stop it with `make down`", p.PID, LayoutPath(dir))
		}
	}
	return nil
}

var errNotRunning = errors.New("no bed is running")

// writeNATSLogins makes up the NATS servers' logins (Config.Auth) and
// writes their passwords into files of the bed's directory.
func (b *Bed) writeNATSLogins() error {
	b.natsAuth = &natsserver.Auth{Triage: natsserver.Login{User: "triage", Password: rand.Text()},
		Clients: []natsserver.Login{{User: "client", Password: rand.Text()}}}
	for _, l := range []struct {
		login natsserver.Login
		to    **shardmap.NATSLogin
	}{{b.natsAuth.Triage, &b.Layout.NATSAuth}, {b.natsAuth.Clients[0], &b.Layout.NATSClient}} {
		path, err := filepath.Abs(filepath.Join(b.cfg.Dir, "nats-"+l.login.User+".password"))
		if err != nil {
			return err
		}
		if err := os.WriteFile(path, []byte(l.login.Password+"\n"), 0o600); err != nil {
			return err
		}
		*l.to = &shardmap.NATSLogin{User: l.login.User, PasswordFile: path}
	}
	return nil
}

// writeKeys writes a keys file with one new cluster-admin key into dir and
// returns the key and the file's path.
func writeKeys(dir string) (token, path string, err error) {
	token, hash, err := auth.NewToken()
	if err != nil {
		return "", "", err
	}
	data, err := json.MarshalIndent(auth.File{Keys: []auth.Key{{Name: "bed", SHA256: hash, ClusterAdmin: true}}}, "", "  ")
	if err != nil {
		return "", "", err
	}
	path = filepath.Join(dir, "keys.json")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		return "", "", err
	}
	abs, err := filepath.Abs(path)
	return token, abs, err
}
