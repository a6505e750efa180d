package node

import (
	"cmp"
	"context"
	"errors"
	"expvar"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"

	"github.com/triage-queue/triage/dequeuer"
	"github.com/triage-queue/triage/enqueuer"
	peerv1 "github.com/triage-queue/triage/proto/triage/peer/v1"
	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
	"github.com/triage-queue/triage/regions"
	"github.com/triage-queue/triage/regions/replication"
	"github.com/triage-queue/triage/routing"
	"github.com/triage-queue/triage/routing/auth"
	"github.com/triage-queue/triage/routing/console"
	"github.com/triage-queue/triage/schema/itemid"
	"github.com/triage-queue/triage/schema/metrics"
	"github.com/triage-queue/triage/schema/store"
	"github.com/triage-queue/triage/schema/tracing"
	"github.com/triage-queue/triage/shardmap"
)

// Roles a node can run.
const (
	RoleRouter   = "router"
	RoleEnqueuer = "enqueuer"
	RoleDequeuer = "dequeuer"
	// RoleController campaigns to be the failover controller.
	RoleController = "controller"
)

// Config is a node's config file (JSON).
type Config struct {
	// Region the node serves. Required.
	Region string `json:"region"`
	// Roles to run. Default: router, enqueuer and dequeuer (and
	// controller when the shard map has replicas). Every node also runs a
	// health observer of the shard primaries.
	Roles []string `json:"roles,omitempty"`
	// NATS is the URL of the region's NATS server. Required.
	NATS string `json:"nats"`
	// NATSAuth is the Triage login of the NATS servers (natsserver.Auth):
	// the user that may publish on the internal triage.* subjects and use
	// JetStream, which client logins may not. Default none (a server
	// without auth).
	NATSAuth *shardmap.NATSLogin `json:"nats_auth,omitempty"`
	// NATSTLS connects to NATS over TLS, verifying the servers against
	// its CA (natsserver.TLS), with the node's own certificate when they
	// require one. Default plain TCP, which a server requiring TLS
	// refuses.
	NATSTLS *shardmap.NATSTLS `json:"nats_tls,omitempty"`
	// GRPC and HTTP are the router's listen addresses. Default
	// 127.0.0.1:9090 and 127.0.0.1:8080.
	GRPC string `json:"grpc,omitempty"`
	HTTP string `json:"http,omitempty"`
	// Pprof, when set, serves net/http/pprof on this address.
	Pprof string `json:"pprof,omitempty"`
	// Metrics, when set, serves /metrics, /readyz and /livez on this
	// address, which asks for no key: bind it to loopback or to an
	// address only the scraper reaches. It is the only listener that
	// serves /metrics, whose labels name namespaces, topics and every
	// shard primary's address; the router's HTTP listener serves
	// /readyz and /livez only. Default none: no /metrics at all (a fixed
	// default port would collide between the nodes of one host).
	Metrics string `json:"metrics,omitempty"`
	// Tracing, when set, turns OpenTelemetry tracing on: spans of every
	// RPC and gateway request, the enqueue buffer's publish and the
	// enqueuer's insert, exported over OTLP/gRPC (schema/tracing).
	// Default none: no tracing at all.
	Tracing *tracing.Config `json:"tracing,omitempty"`
	// DisableConsole turns off the web console the router serves at
	// /console on its HTTP listener (routing/console). Default on.
	DisableConsole bool `json:"disable_console,omitempty"`
	// MaxTopicLabels caps the topics per namespace that get their own
	// metric label; the rest add up under "_other". Default 100.
	MaxTopicLabels int `json:"max_topic_labels,omitempty"`
	// DepthEvery is the least time between two depth counts of the
	// region's shards for /metrics (router role). Default 5s.
	DepthEvery shardmap.Duration `json:"depth_every,omitempty"`
	// MySQL is the application account the router, enqueuer and dequeuer
	// reach shard primaries as: SELECT, INSERT, UPDATE and DELETE on the
	// shard database, nothing more (provision.EnsureAccounts). Its
	// password best comes from password_file or password_env. The user
	// is required, and an account that can write through read_only
	// (SUPER, READ_ONLY ADMIN, ALL PRIVILEGES: root) is refused
	// (shardmap.NewAppPool).
	MySQL shardmap.Credentials `json:"mysql"`
	// ShardMapFile bootstraps the shard map in NATS KV when none is stored.
	ShardMapFile string `json:"shard_map_file,omitempty"`
	// DequeuerID names the dequeuer. Default: region + random.
	DequeuerID string `json:"dequeuer_id,omitempty"`
	// OwnerTTL is the dequeuer's shard ownership TTL. Default 10s.
	OwnerTTL shardmap.Duration `json:"owner_ttl,omitempty"`
	// EnqueueAckWait is how long the enqueue buffer waits for an enqueuer's
	// ack before redelivering a batch to another enqueuer. Default 30s.
	EnqueueAckWait shardmap.Duration `json:"enqueue_ack_wait,omitempty"`
	// KVReplicas for the control-plane buckets. Default 1; 3 in a
	// three-region cluster, so losing a region keeps the control plane.
	KVReplicas int `json:"kv_replicas,omitempty"`
	// Admin is the account with SUPER the controller runs replication
	// statements as, the observer reads replica lag with, and schema
	// migrations run as (only when a shard's schema is not current, so a
	// node of a cluster its administrator migrated never uses it outside
	// the controller). Default root, no password; dial_via defaults to
	// mysql's.
	Admin shardmap.Credentials `json:"admin,omitempty"`
	// Replication is the account replicas connect to primaries as, which
	// the controller names in CHANGE MASTER TO when it repoints replicas
	// after a failover: {"user", "password_file" | "password_env" |
	// "password"}. Its password best comes from a file or the
	// environment; it is never part of the shard map. Default none (a
	// controller then cannot repoint replicas).
	Replication shardmap.Account `json:"replication,omitempty"`
	// ReplicationTLS makes the replicas the controller points connect to
	// their primary over TLS (CHANGE MASTER TO ... MASTER_SSL=1):
	// {"ca_file", "cert_file", "key_file", "verify_server_cert"}, paths as
	// the replicas' mariadbd see them (replication.TLS). Default none:
	// plain TCP.
	ReplicationTLS *replication.TLS `json:"replication_tls,omitempty"`
	// ReplicationVia[region][addr] is the address a server in region
	// reaches addr at (WAN links in the local bed). Missing: addr itself.
	ReplicationVia map[string]map[string]string `json:"replication_via,omitempty"`
	// FailoverDetect and FailoverCooldown tune the controller (defaults 2s
	// and 60s).
	FailoverDetect   shardmap.Duration `json:"failover_detect,omitempty"`
	FailoverCooldown shardmap.Duration `json:"failover_cooldown,omitempty"`
	// StreamReplicas for the region's enqueue stream. Default 1; 3 in a
	// three-region cluster, so a region's buffer survives losing it.
	StreamReplicas int `json:"stream_replicas,omitempty"`

	// KeysFile turns authentication and authorization on: the API keys,
	// client certificate names and roles of every caller (routing/auth),
	// re-read when the file changes. Default none: every caller may do
	// everything (cluster-admin), so a router without it refuses to start
	// on a non-loopback address unless Insecure says so.
	KeysFile string `json:"keys_file,omitempty"`
	// Insecure lets a router without KeysFile serve its gRPC, HTTP and
	// admin listeners on addresses other than loopback (127.0.0.0/8, ::1,
	// localhost), where everyone who reaches them may do everything.
	// `triage serve --insecure` sets it too. Default false: such a node
	// refuses to start, saying what to do.
	Insecure bool `json:"insecure,omitempty"`
	// AdminGRPC and AdminHTTP, when set, serve the Admin service on their
	// own addresses, where only cluster-admin identities are admitted;
	// cluster-admin RPCs (shard map, failover, shard changes) then leave
	// the public listeners. Default none: the public listeners serve them.
	AdminGRPC string `json:"admin_grpc,omitempty"`
	AdminHTTP string `json:"admin_http,omitempty"`
	// TLS, when set, serves the router's gRPC, HTTP and admin listeners
	// over TLS (optionally requiring client certificates). Default none.
	TLS *auth.TLSFiles `json:"tls,omitempty"`
	// MaxHeaderBytes bounds a request's headers, over HTTP and gRPC.
	// Default 64 KiB.
	MaxHeaderBytes int `json:"max_header_bytes,omitempty"`
	// MaxBodyBytes bounds a request's body over HTTP (413 above it) and its
	// message over gRPC. Default 64 MiB (routing.MaxRequestBytes).
	MaxBodyBytes int64 `json:"max_body_bytes,omitempty"`
	// HTTPReadTimeout bounds reading a whole HTTP request (body up to
	// MaxBodyBytes). Default 1m.
	HTTPReadTimeout shardmap.Duration `json:"http_read_timeout,omitempty"`
	// HTTPWriteTimeout bounds an HTTP request from its headers to the end
	// of its answer. Default 2m, above the longest dequeue wait (20s).
	HTTPWriteTimeout shardmap.Duration `json:"http_write_timeout,omitempty"`

	// Seams are hooks for tests that start nodes in-process; a config
	// file cannot set them.
	Seams Seams `json:"-"`

	// tracerProvider is the node's tracer provider: Seams' or the one
	// startTracing makes for Tracing.
	tracerProvider trace.TracerProvider
	// adminGiven: the config names an admin account (fill defaults it).
	adminGiven bool
	// repl is Replication with its password read (fill).
	repl replication.Credentials
}

// Seams are what a test starting a node in-process (e2e) may replace or
// watch inside it. Production leaves them zero.
type Seams struct {
	// RouterNow and DequeuerNow are the roles' local clocks (default
	// time.Now): one process with two skewed hosts.
	RouterNow, DequeuerNow func() time.Time
	// TracerProvider turns tracing on with this provider (an in-memory
	// exporter's) instead of Tracing's exporter.
	TracerProvider trace.TracerProvider
	// BeforeBuffer is the dequeuer's hook between a fetch's read and its
	// buffering (dequeuer.Config.BeforeBuffer), to widen race windows.
	BeforeBuffer func(shard uint32, keys []uint64)
}

func (c *Config) fill() error {
	if c.Region == "" || c.NATS == "" {
		return errors.New("node config: region and nats are required")
	}
	if len(c.Roles) == 0 {
		c.Roles = []string{RoleRouter, RoleEnqueuer, RoleDequeuer}
	}
	for _, r := range c.Roles {
		if r != RoleRouter && r != RoleEnqueuer && r != RoleDequeuer && r != RoleController {
			return fmt.Errorf("node config: role %q: allowed router, enqueuer, dequeuer, controller", r)
		}
	}
	if c.GRPC == "" {
		c.GRPC = "127.0.0.1:9090"
	}
	if c.HTTP == "" {
		c.HTTP = "127.0.0.1:8080"
	}
	c.MaxHeaderBytes = cmp.Or(c.MaxHeaderBytes, 64<<10)
	c.MaxBodyBytes = cmp.Or(c.MaxBodyBytes, routing.MaxRequestBytes)
	c.HTTPReadTimeout = cmp.Or(c.HTTPReadTimeout, shardmap.Duration(time.Minute))
	c.HTTPWriteTimeout = cmp.Or(c.HTTPWriteTimeout, shardmap.Duration(2*time.Minute))
	if c.MaxHeaderBytes < 0 || c.MaxBodyBytes < 0 || c.HTTPReadTimeout < 0 || c.HTTPWriteTimeout < 0 {
		return errors.New("node config: max_header_bytes, max_body_bytes, http_read_timeout and http_write_timeout must not be negative")
	}
	if err := c.checkOpen(); err != nil {
		return err
	}
	var err error
	if c.MySQL, err = c.MySQL.Resolve(); err != nil {
		return fmt.Errorf("node config mysql: %w", err)
	}
	if c.MySQL.User == "" {
		return fmt.Errorf("node config: set mysql.user: %w", shardmap.ErrNoAppUser)
	}
	c.adminGiven = c.Admin.User != "" || c.Admin.Password != "" || c.Admin.PasswordFile != "" || c.Admin.PasswordEnv != ""
	c.Admin.User = cmp.Or(c.Admin.User, "root")
	if c.Admin.DialVia == nil {
		c.Admin.DialVia = c.MySQL.DialVia
	}
	c.Admin.MaxOpenConns = cmp.Or(c.Admin.MaxOpenConns, 4)
	if c.Admin, err = c.Admin.Resolve(); err != nil {
		return fmt.Errorf("node config admin: %w", err)
	}
	if c.Replication.Given() {
		pw, err := c.Replication.Secret("mysql user")
		if err != nil {
			return fmt.Errorf("node config replication: %w", err)
		}
		c.repl = replication.Credentials{User: c.Replication.User, Password: pw, TLS: c.ReplicationTLS}
	}
	if c.ReplicationTLS != nil {
		if !c.Replication.Given() {
			return errors.New("node config: replication_tls needs replication, the account replicas log in with")
		}
		if err := c.ReplicationTLS.Validate(); err != nil {
			return fmt.Errorf("node config replication_tls: %w", err)
		}
	}
	return nil
}

// openListeners names the router's listeners that bind an address other
// than loopback: with no keys file, everyone who reaches one of them is
// cluster-admin.
func (c *Config) openListeners() []string {
	if c.KeysFile != "" || !slices.Contains(c.Roles, RoleRouter) {
		return nil
	}
	var open []string
	for _, l := range []struct{ name, addr string }{{"grpc", c.GRPC}, {"http", c.HTTP}, {"admin_grpc", c.AdminGRPC}, {"admin_http", c.AdminHTTP}} {
		if l.addr != "" && !loopback(l.addr) {
			open = append(open, fmt.Sprintf("%s %s", l.name, l.addr))
		}
	}
	return open
}

// checkOpen refuses a router that would serve everyone as cluster-admin
// on an address other hosts may reach, unless Insecure.
func (c *Config) checkOpen() error {
	open := c.openListeners()
	if len(open) == 0 || c.Insecure {
		return nil
	}
	return fmt.Errorf("node config: %s: not a loopback address, and without keys_file every caller may do everything (cluster-admin); "+
		"give keys_file (README, Security), bind 127.0.0.1, or set \"insecure\": true (triage serve --insecure) to serve it open on purpose",
		strings.Join(open, ", "))
}

// loopback reports whether the listen address addr binds loopback only:
// 127.0.0.0/8, ::1 or localhost. An empty host binds every interface; any
// other name counts as not loopback rather than be resolved here. An
// address that does not parse counts as loopback, so that net.Listen
// reports what is wrong with it.
func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return true
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Node is a running set of roles.
type Node struct {
	cfg  Config
	log  *slog.Logger
	nc   *nats.Conn
	pool *shardmap.Pool
	// admin is Config.Admin's pool, for migrations only; it opens no
	// connection unless a shard's schema is behind.
	admin *shardmap.Pool
	clock *shardmap.Clock // shard primaries' time, for every role (see dequeuer/doc.go)
	// writes is the router's and the dequeuer's: a shard's acks and
	// serves share a transaction (store.Batcher).
	writes *store.Batcher
	cancel context.CancelFunc

	enq    *enqueuer.Service
	deq    *dequeuer.Service
	local  atomic.Pointer[dequeuer.Service] // what the router calls in-process
	deqCfg dequeuer.Config
	router *routing.Router
	claim  *routing.NodeClaim
	kv     jetstream.KeyValue
	owners jetstream.KeyValue // presence and dequeuer sessions
	claims jetstream.KeyValue // shard claims
	maps   *shardmap.Holder
	grpc   *grpc.Server
	http   *http.Server
	// adminGRPC and adminHTTP serve Config.AdminGRPC and AdminHTTP.
	adminGRPC *grpc.Server
	adminHTTP *http.Server
	pprof     *http.Server
	obs       *observability
	tracing   *sdktrace.TracerProvider // the exporter's, flushed by Stop
	done      chan struct{}

	// Controller is the failover controller (controller role only).
	Controller *regions.Controller

	// GRPCAddr and HTTPAddr are the bound addresses (router role only).
	GRPCAddr, HTTPAddr string
	// MetricsAddr is the bound Config.Metrics address, if any.
	MetricsAddr string
	// AdminGRPCAddr and AdminHTTPAddr are the bound admin addresses, if
	// any.
	AdminGRPCAddr, AdminHTTPAddr string
}

// Start connects to NATS, loads the shard map, migrates the region's
// shards and starts the roles.
func Start(ctx context.Context, cfg Config, logger *slog.Logger) (*Node, error) {
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	if open := cfg.openListeners(); len(open) > 0 {
		logger.Warn("serving without authentication on addresses other hosts may reach (insecure)", "listeners", strings.Join(open, ", "))
	}
	n := &Node{cfg: cfg, log: logger, pool: shardmap.NewAppPool(cfg.MySQL), admin: shardmap.NewPool(cfg.Admin), done: make(chan struct{})}
	n.clock = &shardmap.Clock{Server: n.pool.ServerOf}
	n.writes = &store.Batcher{Now: n.clock.Now}
	n.obs = newObservability(cfg, logger)
	ok := false
	defer func() {
		if !ok {
			n.Stop()
		}
	}()
	if err := n.startTracing(ctx); err != nil {
		return nil, err
	}
	js, err := n.connectNATS()
	if err != nil {
		return nil, err
	}
	kv, err := shardmap.OpenBucket(ctx, js, cfg.KVReplicas)
	if err != nil {
		return nil, err
	}
	m, err := loadMap(ctx, kv, &cfg)
	if err != nil {
		return nil, err
	}
	maps := shardmap.NewHolder(m)
	n.kv = kv
	n.maps = maps
	var runCtx context.Context
	runCtx, n.cancel = context.WithCancel(context.WithoutCancel(ctx))
	if err := n.watchMap(ctx, runCtx, js); err != nil {
		return nil, err
	}
	if err := n.migrate(ctx, m); err != nil {
		return nil, err
	}
	if err := n.startRegions(ctx, runCtx, js); err != nil {
		return nil, err
	}
	if err := n.startRoles(ctx, runCtx, js); err != nil {
		return nil, err
	}
	if err := n.startServers(); err != nil {
		return nil, err
	}
	go n.obs.readiness(runCtx, n.Healthy)
	go n.prunePools(runCtx, maps)
	ok = true
	logger.Info("node started", "region", cfg.Region, "roles", cfg.Roles, "grpc", n.GRPCAddr, "http", n.HTTPAddr, "metrics", n.MetricsAddr)
	return n, nil
}

// startTracing sets the node's tracer provider: the one Seams gives, or
// else, when the config asks for tracing, one of its own.
func (n *Node) startTracing(ctx context.Context) error {
	n.cfg.tracerProvider = n.cfg.Seams.TracerProvider
	if n.cfg.Tracing != nil && n.cfg.tracerProvider == nil {
		tp, err := tracing.New(ctx, *n.cfg.Tracing, "triage", n.cfg.Region)
		if err != nil {
			return fmt.Errorf("node config: %w", err)
		}
		n.tracing = tp
		n.cfg.tracerProvider = tp
	}
	n.obs.tracer = n.cfg.tracerProvider
	return nil
}

// connectNATS connects to NATS, reconnecting for ever, and opens
// JetStream.
func (n *Node) connectNATS() (jetstream.JetStream, error) {
	cfg := &n.cfg
	natsOpts, err := shardmap.NATSOptions(cfg.NATSAuth, cfg.NATSTLS)
	if err != nil {
		return nil, fmt.Errorf("node config %w", err)
	}
	n.nc, err = nats.Connect(cfg.NATS, append(natsOpts, nats.Name("triage-"+cfg.Region), nats.MaxReconnects(-1), nats.ReconnectWait(250*time.Millisecond))...)
	if err != nil {
		return nil, fmt.Errorf("connect nats %s: %w", cfg.NATS, err)
	}
	return jetstream.New(n.nc)
}

// loadMap returns the stored shard map, storing the one in
// cfg.ShardMapFile first when none is stored yet, and checks that it
// names the node's region.
func loadMap(ctx context.Context, kv jetstream.KeyValue, cfg *Config) (*shardmap.Map, error) {
	var m *shardmap.Map
	if cfg.ShardMapFile != "" {
		data, err := os.ReadFile(cfg.ShardMapFile)
		if err != nil {
			return nil, err
		}
		boot, err := shardmap.Parse(data)
		if err != nil {
			return nil, err
		}
		if m, err = shardmap.Bootstrap(ctx, kv, boot); err != nil {
			return nil, err
		}
	} else {
		var err error
		if m, err = shardmap.Load(ctx, kv); err != nil {
			return nil, fmt.Errorf("%w (give shard_map_file to bootstrap one)", err)
		}
	}
	if !m.HasRegion(cfg.Region) {
		return nil, fmt.Errorf("region %q is not in the shard map (regions: %v)", cfg.Region, m.Regions)
	}
	return m, nil
}

// watchMap keeps n.maps current for as long as runCtx runs, and waits
// until the store has confirmed it: no role starts on a map that would
// go stale MaxStaleness after start and refuse every write.
func (n *Node) watchMap(ctx, runCtx context.Context, js jetstream.JetStream) error {
	// Attributed like the roles' logs: a bed runs every region's node in
	// one process, and a stuck watch must say whose it is.
	go shardmap.Watch(runCtx, js, n.kv, n.maps, n.log.With("role", "shardmap", "region", n.cfg.Region))
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	defer wcancel()
	return n.maps.WaitConfirmed(wctx)
}

// startRegions starts what watches the region: the observer of its
// shards' health and metrics, and, on a controller's node, the failover
// controller.
func (n *Node) startRegions(ctx, runCtx context.Context, js jetstream.JetStream) error {
	cfg, met, controller := &n.cfg, n.obs.set, slices.Contains(n.cfg.Roles, RoleController)
	hkv, err := regions.OpenHealth(ctx, js, cfg.KVReplicas)
	if err != nil {
		return err
	}
	met.RegisterShardMap(n.maps)
	obs := &regions.Observer{Region: cfg.Region, Maps: n.maps, Dial: n.pool.Addr, Cred: cfg.MySQL, Logger: n.log, Metrics: met}
	if controller {
		// A controller's node reports for its region, which failover
		// detection reads; the region's other nodes only keep their
		// metrics, at a slower pace (see regions.Observer).
		obs.KV, obs.NC = hkv, n.nc
	} else {
		obs.Every = regions.ObserveMetricsEvery
	}
	if cfg.adminGiven || controller {
		// Replica lag needs more than the application account; a node
		// that was given no admin account reports it unknown rather than
		// knock on every replica with root every ping.
		obs.Monitor = &cfg.Admin
	}
	go obs.Run(runCtx)
	if !controller {
		return nil
	}
	ctl, err := regions.New(regions.Config{
		ID: cfg.Region + "-" + nuid.Next(), Region: cfg.Region, Maps: n.maps, MapKV: n.kv, NC: n.nc, JS: js,
		Admin: cfg.Admin, Repl: cfg.repl, Dial: n.pool.Addr, ReplicationVia: cfg.ReplicationVia,
		Detect: time.Duration(cfg.FailoverDetect), Cooldown: time.Duration(cfg.FailoverCooldown),
		KVReplicas: cfg.KVReplicas, Logger: n.log, Metrics: met,
	})
	if err != nil {
		return err
	}
	if err := ctl.Run(runCtx); err != nil {
		return err
	}
	n.Controller = ctl
	return nil
}

// startRoles starts the queue's roles the node runs: enqueuer, dequeuer
// and router, in that order.
func (n *Node) startRoles(ctx, runCtx context.Context, js jetstream.JetStream) error {
	cfg, met := &n.cfg, n.obs.set
	var err error
	// The ownership bucket also carries the roles' presence per region.
	if n.owners, err = dequeuer.OpenOwners(ctx, js, time.Duration(cfg.OwnerTTL), cfg.KVReplicas); err != nil {
		return err
	}
	if n.claims, err = dequeuer.OpenClaims(ctx, js, cfg.KVReplicas); err != nil {
		return err
	}
	if slices.Contains(cfg.Roles, RoleEnqueuer) {
		n.enq, err = enqueuer.New(enqueuer.Config{Region: cfg.Region, Maps: n.maps, Pool: n.pool, NC: n.nc, JS: js,
			Stream: enqueuer.StreamConfig{Replicas: cfg.StreamReplicas}, Presence: n.owners, PlaceLeaders: cfg.StreamReplicas > 1,
			FastCopies: cfg.StreamReplicas > 1,
			AckWait:    time.Duration(cfg.EnqueueAckWait), Logger: n.log, Metrics: met, Tracer: cfg.tracerProvider})
		if err != nil {
			return err
		}
		if err := n.enq.Start(runCtx); err != nil {
			return err
		}
	}
	if slices.Contains(cfg.Roles, RoleDequeuer) {
		n.deqCfg = dequeuer.Config{Region: cfg.Region, ID: cfg.DequeuerID, Maps: n.maps, Pool: n.pool, NC: n.nc, JS: js,
			OwnerTTL: time.Duration(cfg.OwnerTTL), KVReplicas: cfg.KVReplicas, Logger: n.log, Now: cfg.Seams.DequeuerNow, Clock: n.clock, Writes: n.writes, Metrics: met, Tracer: cfg.tracerProvider,
			BeforeBuffer: cfg.Seams.BeforeBuffer}
		n.deq, err = dequeuer.New(n.deqCfg)
		if err != nil {
			return err
		}
		if err := n.deq.Start(runCtx); err != nil {
			return err
		}
	}
	if slices.Contains(cfg.Roles, RoleRouter) {
		return n.startRouter(ctx, runCtx, js, n.maps)
	}
	return nil
}

// startServers starts the debug (pprof) and metrics listeners the config
// names.
func (n *Node) startServers() error {
	if n.cfg.Pprof != "" {
		mux := http.NewServeMux()
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
		mux.Handle("/debug/vars", expvar.Handler())
		n.pprof = &http.Server{Addr: n.cfg.Pprof, Handler: mux}
		go func() { _ = n.pprof.ListenAndServe() }()
	}
	if n.cfg.Metrics != "" {
		var err error
		if n.MetricsAddr, err = n.obs.serve(n.cfg.Metrics, n.maps.Current); err != nil {
			return err
		}
	}
	return nil
}

// prunePools closes the pools to servers that are no longer a shard's
// primary (shardmap.Pool.Prune) every PruneEvery until ctx ends.
func (n *Node) prunePools(ctx context.Context, maps *shardmap.Holder) {
	t := time.NewTicker(shardmap.PruneEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		m := maps.Current()
		if closed := n.pool.Prune(m) + n.admin.Prune(m); closed > 0 {
			n.log.Info("closed the connection pools of former primaries", "pools", closed)
		}
	}
}

func (n *Node) migrate(ctx context.Context, m *shardmap.Map) error {
	for _, id := range m.RegionShards(n.cfg.Region) {
		if err := routing.MigrateShard(ctx, n.pool, n.admin, m, id); err != nil {
			s, _ := m.Shard(id)
			return fmt.Errorf("shard %d at %s: %w", id, s.Primary, err)
		}
	}
	return nil
}

func (n *Node) startRouter(ctx, runCtx context.Context, js jetstream.JetStream, maps *shardmap.Holder) error {
	owners, err := dequeuer.WatchOwners(runCtx, n.owners, n.claims)
	if err != nil {
		return err
	}
	n.claim, err = routing.ClaimNode(ctx, js, "router-"+n.cfg.Region, n.cfg.KVReplicas, func(err error) {
		n.log.Error("item id node lost; stopping the router so no id is reused", "err", err)
		go n.Stop()
	})
	if err != nil {
		return err
	}
	gen, err := itemid.NewGenerator(n.claim.Node)
	if err != nil {
		return err
	}
	drills, err := routing.OpenDrills(ctx, js, n.cfg.KVReplicas)
	if err != nil {
		return err
	}
	rc := routing.Config{Region: n.cfg.Region, Maps: maps, Pool: n.pool, Migrator: n.admin, NC: n.nc, JS: js, Owners: owners, IDs: gen, Claim: n.claim, Drills: drills, Logger: n.log,
		FastCopies: n.cfg.StreamReplicas > 1,
		Publisher:  kvPublisher{kv: n.kv, maps: maps}, Now: n.cfg.Seams.RouterNow, Clock: n.clock, Writes: n.writes, Metrics: n.obs.set, Tracer: n.cfg.tracerProvider}
	if n.deq != nil {
		n.local.Store(n.deq)
		rc.Local = localDequeuer{n}
	}
	n.router, err = routing.New(rc)
	if err != nil {
		return err
	}
	if err := n.router.Start(ctx); err != nil {
		return err
	}
	sec, err := n.security()
	if err != nil {
		return err
	}
	gl, err := net.Listen("tcp", n.cfg.GRPC)
	if err != nil {
		return fmt.Errorf("grpc listen: %w", err)
	}
	hl, err := net.Listen("tcp", n.cfg.HTTP)
	if err != nil {
		gl.Close()
		return fmt.Errorf("http listen: %w", err)
	}
	n.GRPCAddr, n.HTTPAddr = gl.Addr().String(), hl.Addr().String()
	n.grpc = routing.NewGRPCServer(n.router, n.obs.health, append(n.obs.grpcOptions(), sec.grpcOptions(sec.public)...)...)
	n.obs.rpc.InitializeMetrics(n.grpc)
	// The router counts its region's items for /metrics.
	depthEvery := time.Duration(n.cfg.DepthEvery)
	if depthEvery == 0 {
		depthEvery = 5 * time.Second
	}
	n.obs.set.RegisterDepth(metrics.DepthConfig{Region: n.cfg.Region, Maps: maps, Pool: n.pool, Clock: n.clock, MinInterval: depthEvery})
	var q triagev1.QueueServer = n.router
	var a triagev1.AdminServer = n.router.Admin()
	if sec.public != nil {
		q, a = auth.GuardQueue(n.router, sec.public), auth.GuardAdmin(n.router.Admin(), sec.public)
	}
	extra := n.obs.probes(false) // no /metrics: see Config.Metrics
	extra[OpenAPIPath] = openAPIHandler()
	if !n.cfg.DisableConsole {
		extra = console.Register(extra)
	}
	gw, err := routing.NewGatewayFor(runCtx, q, a, extra, sec.gatewayOptions(sec.public)...)
	if err != nil {
		return err
	}
	n.http = sec.httpServer(n.obs.traceHTTP(n.obs.logHTTP(gw)))
	go func() { _ = n.grpc.Serve(gl) }()
	go func() { _ = sec.serveHTTP(n.http, hl) }()
	return n.startAdmin(runCtx, sec)
}

// Stop shuts the roles down gracefully: servers first (in-flight requests
// finish, bounded by 10 s), then the dequeuer drops its buffers and hands
// back ownership, the enqueuer naks what it pulled, then NATS closes.
func (n *Node) Stop() {
	select {
	case <-n.done:
		return
	default:
		close(n.done)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if n.obs != nil {
		n.obs.stop()
	}
	if n.http != nil {
		_ = n.http.Shutdown(ctx)
	}
	if n.grpc != nil {
		stopGRPC(ctx, n.grpc)
	}
	if n.adminHTTP != nil {
		_ = n.adminHTTP.Shutdown(ctx)
	}
	if n.adminGRPC != nil {
		stopGRPC(ctx, n.adminGRPC)
	}
	if n.pprof != nil {
		_ = n.pprof.Close()
	}
	if n.router != nil {
		n.router.Stop()
	}
	if n.deq != nil {
		n.deq.Stop()
	}
	if n.enq != nil {
		n.enq.Stop()
	}
	if n.claim != nil {
		n.claim.Release(ctx)
	}
	if n.cancel != nil {
		n.cancel()
	}
	if n.nc != nil {
		n.nc.Close()
	}
	n.pool.Close()
	n.admin.Close()
	if n.tracing != nil {
		_ = n.tracing.Shutdown(ctx) // flushes the spans still batched
	}
}

// stopGRPC stops s gracefully, and at once when ctx ends first.
func stopGRPC(ctx context.Context, s *grpc.Server) {
	stopped := make(chan struct{})
	go func() { s.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-ctx.Done():
		s.Stop()
	}
}

// Done is closed once Stop has begun.
func (n *Node) Done() <-chan struct{} { return n.done }

// kvPublisher publishes shard maps to the KV bucket and installs them in
// this node's holder at once, so the router that made a change serves it
// on its next request; other nodes see it through their watch.
type kvPublisher struct {
	kv   jetstream.KeyValue
	maps *shardmap.Holder
}

func (p kvPublisher) PublishMap(ctx context.Context, prev, next *shardmap.Map) error {
	if err := shardmap.Publish(ctx, p.kv, prev, next); err != nil {
		return err
	}
	p.maps.Offer(next)
	return nil
}

// localDequeuer lets the router call whichever dequeuer the node runs now
// (a drill may crash and restart it).
type localDequeuer struct{ n *Node }

func (l localDequeuer) ID() string { return l.n.local.Load().ID() }

func (l localDequeuer) Dequeue(ctx context.Context, req *triagev1.DequeueRequest, shards []uint32) ([]*triagev1.LeasedItem, error) {
	return l.n.local.Load().Dequeue(ctx, req, shards)
}

func (l localDequeuer) Ready(r *peerv1.ItemsReady) { l.n.local.Load().Ready(r) }

func (l localDequeuer) Unbuffer(ctx context.Context, ns string, shard uint32, keys []uint64) error {
	return l.n.local.Load().Unbuffer(ctx, ns, shard, keys)
}

// CrashDequeuer stops the node's dequeuer as a kill would (see
// dequeuer.Service.Crash). Drills use it.
func (n *Node) CrashDequeuer() error {
	if n.deq == nil {
		return errors.New("node runs no dequeuer")
	}
	n.deq.Crash()
	return nil
}

// RestartDequeuer starts a new dequeuer (a new ID) after CrashDequeuer.
func (n *Node) RestartDequeuer(ctx context.Context) error {
	cfg := n.deqCfg
	cfg.ID = "" // a restarted process gets a new identity
	d, err := dequeuer.New(cfg)
	if err != nil {
		return err
	}
	if err := d.Start(context.WithoutCancel(ctx)); err != nil {
		return err
	}
	n.deq = d
	n.local.Store(d)
	return nil
}

// ShardMap returns the node's current shard map.
func (n *Node) ShardMap() *shardmap.Map { return n.maps.Current() }

// Dequeuer returns the dequeuer the node runs now, nil without the
// dequeuer role; RestartDequeuer replaces it.
func (n *Node) Dequeuer() *dequeuer.Service { return n.deq }

// ShardOwner returns the ID of the dequeuer the node's router sees owning
// shard, and false while it sees none (dequeues of the shard are then
// UNAVAILABLE). Router role only.
func (n *Node) ShardOwner(shard uint32) (string, bool) { return n.router.Owner(shard) }
