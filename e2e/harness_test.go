package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jmoiron/sqlx"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/triage-queue/triage/cmd/triage/natsserver"
	"github.com/triage-queue/triage/cmd/triage/node"
	"github.com/triage-queue/triage/cmd/triage/provision/provisiontest"
	"github.com/triage-queue/triage/deploy/freeport"
	"github.com/triage-queue/triage/deploy/mariadb/mariadbtest"
	"github.com/triage-queue/triage/deploy/testlog"
	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
	"github.com/triage-queue/triage/shardmap"
)

// The package's harness. Every test stands on a region (newRegion): shard
// databases on the package's shared mariadbd, an embedded NATS server and
// the shard map naming them. On it a bed (setup) runs nodes in the test's
// process, and a cluster (newCluster) runs them as `triage serve`
// processes to kill; the drills start whole beds with triage-bed.

// binDir holds the binaries binaries builds.
var binDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "triage-e2e-")
	if err != nil {
		panic(err)
	}
	binDir = dir
	code := mariadbtest.Main(m)
	os.RemoveAll(dir)
	os.Exit(code)
}

var (
	buildOnce sync.Once
	buildErr  error
)

// binaries returns the production binary (triage serve) and the
// development one (triage-bed up, down, drill, nemesis), built with -race
// once for the package, by the first test that needs them: a run of the
// in-process tests alone builds nothing.
func binaries(t *testing.T) (triage, triageBed string) {
	t.Helper()
	buildOnce.Do(func() {
		build := exec.Command("go", "build", "-race", "-o", binDir, "../cmd/triage", "../cmd/triage-bed")
		if out, err := build.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("building triage and triage-bed: %w\n%s", err, out)
		}
	})
	require.NoError(t, buildErr)
	return filepath.Join(binDir, "triage"), filepath.Join(binDir, "triage-bed")
}

// region is one region's shard databases, its embedded NATS server, which
// outlives the nodes under test, and the shard map file the nodes
// bootstrap from: the one place the package makes them.
type region struct {
	t   *testing.T
	dir string
	// nats is the server; natsCfg starts it again on the same port and
	// store (stopNATS, startNATS).
	nats    *server.Server
	natsCfg natsserver.Config
	natsURL string
	mapFile string
	// shards are the databases of the map's first shards, those on the
	// package's mariadbd.
	shards []*sqlx.DB
	// app is the application account the nodes log in as (appAccount).
	app *provisiontest.App
}

type regionOpts struct {
	// shards on the package's mariadbd, IDs 1 to shards.
	shards int
	// more shards of the map, on servers the test made.
	more       []shardmap.Shard
	namespaces []shardmap.Namespace
	// natsAuth, when set, makes the NATS server require logins.
	natsAuth *natsserver.Auth
	// natsTLS, when set, makes the NATS server require TLS.
	natsTLS *natsserver.TLS
}

func newRegion(t *testing.T, o regionOpts) *region {
	t.Helper()
	r := &region{t: t, dir: t.TempDir()}
	r.natsCfg = natsserver.Config{StoreDir: filepath.Join(r.dir, "nats"), Auth: o.natsAuth, TLS: o.natsTLS}
	r.startNATS()
	m := shardmap.Map{Version: 1, Regions: []string{"us-east"}, Namespaces: o.namespaces}
	for i := 1; i <= o.shards; i++ {
		dsn := mariadbtest.Database(t)
		c, err := mysql.ParseDSN(dsn)
		require.NoError(t, err)
		m.Shards = append(m.Shards, shardmap.Shard{ID: uint32(i), HomeRegion: "us-east", Primary: c.Addr, Database: c.DBName})
		db := sqlx.MustConnect("mysql", dsn)
		t.Cleanup(func() { db.Close() })
		r.shards = append(r.shards, db)
	}
	m.Shards = append(m.Shards, o.more...)
	sm, err := shardmap.New(m)
	require.NoError(t, err)
	data, err := sm.Marshal()
	require.NoError(t, err)
	r.mapFile = filepath.Join(r.dir, "shardmap.json")
	require.NoError(t, os.WriteFile(r.mapFile, data, 0o644))
	return r
}

// startNATS starts the region's NATS server: on a free port the first
// time, then on the same port and store.
func (r *region) startNATS() {
	ns, err := natsserver.Start(r.natsCfg)
	require.NoError(r.t, err)
	r.t.Cleanup(ns.Shutdown)
	r.nats, r.natsURL = ns, ns.ClientURL()
	r.natsCfg.Port = ns.Addr().(*net.TCPAddr).Port
}

// stopNATS stops the region's NATS server and waits until it has.
func (r *region) stopNATS() {
	r.nats.Shutdown()
	r.nats.WaitForShutdown()
}

// appAccount returns the application account of the region's nodes, made
// on first use with the databases of the shards in the map file as it is
// then; a test that adds a shard grants its database (Grant). A node
// refuses root.
func (r *region) appAccount() *provisiontest.App {
	if r.app == nil {
		r.app = provisiontest.ForTest(r.t)
		m, err := shardmap.Parse(mustRead(r.t, r.mapFile))
		require.NoError(r.t, err)
		require.NoError(r.t, r.app.GrantMap(r.ctx(), m))
	}
	return r.app
}

// ctx is a context for one call, ended after 30 s or with the test.
func (r *region) ctx() context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	r.t.Cleanup(cancel)
	return ctx
}

// rowCount counts rows of a table across the shards.
func (r *region) rowCount(table string) int {
	total := 0
	for _, db := range r.shards {
		var n int
		require.NoError(r.t, db.Get(&n, fmt.Sprintf("SELECT COUNT(*) FROM %s", table)))
		total += n
	}
	return total
}

// bed is a region whose nodes run in the test's process, so a test can
// give them seams (node.Seams) and look inside them; its first node that
// runs a router serves the bed's clients.
type bed struct {
	*region
	node  *node.Node
	queue triagev1.QueueClient
	admin triagev1.AdminClient
	http  string
	// metrics is the node's metrics listener (Config.Metrics), the only
	// one that serves /metrics.
	metrics string
}

type bedOpts struct {
	shards      int
	maxAttempts int
	ownerTTL    time.Duration
	noNode      bool
	// natsAuth, when set, makes the NATS server require logins.
	natsAuth *natsserver.Auth
	// natsTLS, when set, makes the NATS server require TLS.
	natsTLS *natsserver.TLS
}

// setup makes a bed of o.shards shards (default 2) and namespaces
// "default" and "other", and starts a node running every role unless
// o.noNode.
func setup(t *testing.T, o bedOpts) *bed {
	t.Helper()
	if o.shards == 0 {
		o.shards = 2
	}
	b := &bed{region: newRegion(t, regionOpts{shards: o.shards, natsAuth: o.natsAuth, natsTLS: o.natsTLS,
		namespaces: []shardmap.Namespace{{Name: "default", MaxAttempts: o.maxAttempts}, {Name: "other"}}})}
	if !o.noNode {
		b.startNode(node.Config{OwnerTTL: shardmap.Duration(o.ownerTTL)})
	}
	return b
}

// config is c with the bed's region, NATS, map file and application
// account, and listeners on free loopback ports unless c names them.
func (b *bed) config(c node.Config) node.Config {
	c.Region = "us-east"
	c.NATS = b.natsURL
	c.ShardMapFile = b.mapFile
	if c.GRPC == "" {
		c.GRPC = "127.0.0.1:0"
	}
	if c.HTTP == "" {
		c.HTTP = "127.0.0.1:0"
	}
	if c.Metrics == "" {
		c.Metrics = "127.0.0.1:0"
	}
	if c.MySQL.User == "" {
		c.MySQL = b.appAccount().Credentials()
	}
	return c
}

// startNode starts a node with b.config(c), stopped when the test ends.
func (b *bed) startNode(c node.Config) *node.Node {
	t := b.t
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	n, err := node.Start(ctx, b.config(c), testLogger(t))
	require.NoError(t, err)
	t.Cleanup(n.Stop)
	if n.GRPCAddr != "" && b.node == nil {
		b.node = n
		conn, err := grpc.NewClient(n.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		require.NoError(t, err)
		t.Cleanup(func() { conn.Close() })
		b.queue = triagev1.NewQueueClient(conn)
		b.admin = triagev1.NewAdminClient(conn)
		b.http = "http://" + n.HTTPAddr
		b.metrics = "http://" + n.MetricsAddr
		b.waitOwned()
	}
	return n
}

// waitOwned waits until a dequeuer owns every shard, so dequeues are served.
func (b *bed) waitOwned() {
	require.Eventually(b.t, func() bool {
		for i := range b.shards {
			if _, ok := b.node.ShardOwner(uint32(i + 1)); !ok {
				return false
			}
		}
		return true
	}, 20*time.Second, 20*time.Millisecond)
}

// publishMap publishes next, made from prev, to the shard map bucket as
// an admin RPC would, and waits until the bed's node serves it.
func (b *bed) publishMap(prev, next *shardmap.Map) {
	t := b.t
	t.Helper()
	nc, err := nats.Connect(b.natsURL)
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	kv, err := js.KeyValue(b.ctx(), shardmap.Bucket)
	require.NoError(t, err)
	require.NoError(t, shardmap.Publish(b.ctx(), kv, prev, next))
	require.Eventually(t, func() bool { return b.node.ShardMap().Version >= next.Version }, 10*time.Second, 10*time.Millisecond,
		"the node never saw shard map version %d", next.Version)
}

// testLogger logs the node's warnings and errors to t.Log (see testlog).
func testLogger(t testing.TB) *slog.Logger { return testlog.New(t, slog.LevelWarn) }

// cluster is a region whose nodes are `triage serve` processes, which a
// test kills.
type cluster struct {
	*region
	binary string
}

// newCluster makes a cluster of shards shards and namespace "default".
func newCluster(t *testing.T, shards int) *cluster {
	triage, _ := binaries(t)
	c := &cluster{binary: triage, region: newRegion(t, regionOpts{shards: shards, namespaces: []shardmap.Namespace{
		// A short default lease: what a killed dequeuer had prefetched comes
		// back within it.
		{Name: "default", DefaultLeaseDuration: shardmap.Duration(3 * time.Second)}}})}
	c.appAccount()
	return c
}

// proc is a `triage serve` child process.
type proc struct {
	name string
	cmd  *exec.Cmd
	grpc string
	done chan struct{}
}

func freeAddr(t *testing.T) string {
	a, err := freeport.Addr()
	require.NoError(t, err)
	return a
}

// start runs `triage serve` with cfg (region, NATS and shard map filled in).
func (c *cluster) start(name string, cfg node.Config) *proc {
	t := c.t
	cfg.Region = "us-east"
	cfg.NATS = c.natsURL
	cfg.ShardMapFile = c.mapFile
	if cfg.MySQL.User == "" {
		cfg.MySQL = c.appAccount().Credentials()
	}
	p := &proc{name: name, done: make(chan struct{})}
	for _, r := range cfg.Roles {
		if r == node.RoleRouter {
			cfg.GRPC, cfg.HTTP = freeAddr(t), freeAddr(t)
			p.grpc = cfg.GRPC
		}
	}
	data, err := json.Marshal(cfg)
	require.NoError(t, err)
	file := filepath.Join(c.dir, name+".json")
	require.NoError(t, os.WriteFile(file, data, 0o644))
	logf, err := os.Create(filepath.Join(c.dir, name+".log"))
	require.NoError(t, err)
	p.cmd = exec.Command(c.binary, "serve", "--config", file, "--log-level", "info")
	p.cmd.Stdout, p.cmd.Stderr = logf, logf
	require.NoError(t, p.cmd.Start())
	go func() {
		_ = p.cmd.Wait()
		logf.Close()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.stop()
		if t.Failed() {
			out, _ := os.ReadFile(logf.Name())
			t.Logf("--- %s log ---\n%s", name, out)
		}
	})
	if p.grpc != "" {
		c.waitHealthy(p)
	}
	return p
}

func (c *cluster) waitHealthy(p *proc) {
	conn, err := grpc.NewClient(p.grpc, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(c.t, err)
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)
	require.Eventually(c.t, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{})
		return err == nil && r.Status == healthpb.HealthCheckResponse_SERVING
	}, 30*time.Second, 50*time.Millisecond, "%s never became healthy", p.name)
}

// kill sends SIGKILL: no soft stop, no lease hand-back, no nak.
func (p *proc) kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// stop sends SIGTERM and waits; SIGKILL after 15 s.
func (p *proc) stop() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(15 * time.Second):
		p.kill()
	}
}

func (c *cluster) client(p *proc) triagev1.QueueClient {
	conn, err := grpc.NewClient(p.grpc, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(c.t, err)
	c.t.Cleanup(func() { conn.Close() })
	return triagev1.NewQueueClient(conn)
}

func (c *cluster) rows() int { return c.rowCount("items") }

func ms(d time.Duration) shardmap.Duration { return shardmap.Duration(d) }

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	return data
}
