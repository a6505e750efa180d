package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/triage-queue/triage/cmd/triage/natsserver"
	"github.com/triage-queue/triage/cmd/triage/node"
	"github.com/triage-queue/triage/cmd/triage/provision/provisiontest"
	"github.com/triage-queue/triage/deploy/freeport"
	"github.com/triage-queue/triage/deploy/mariadb/mariadbtest"
	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
	"github.com/triage-queue/triage/shardmap"
)

// The binaries, built once for the package: binary is the production
// one (triage serve), bedBinary the development one (triage-bed up, down,
// drill).
var binary, bedBinary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "triage-e2e-")
	if err != nil {
		panic(err)
	}
	binary, bedBinary = filepath.Join(dir, "triage"), filepath.Join(dir, "triage-bed")
	build := exec.Command("go", "build", "-race", "-o", dir, "../cmd/triage", "../cmd/triage-bed")
	build.Stdout, build.Stderr = os.Stdout, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building triage and triage-bed:", err)
		os.Exit(1)
	}
	code := mariadbtest.Main(m)
	os.RemoveAll(dir)
	os.Exit(code)
}

// cluster is one region: shard databases, an embedded NATS server that
// outlives the processes under test, and the processes.
type cluster struct {
	t       *testing.T
	dir     string
	natsURL string
	mapFile string
	shards  []*sqlx.DB
	// app is the application account the processes log in as; a test
	// that adds a shard grants its database.
	app *provisiontest.App
}

func newCluster(t *testing.T, shards int) *cluster {
	c := &cluster{t: t, dir: t.TempDir()}
	ns, err := natsserver.Start(natsserver.Config{StoreDir: filepath.Join(c.dir, "nats")})
	require.NoError(t, err)
	t.Cleanup(ns.Shutdown)
	c.natsURL = ns.ClientURL()
	m := shardmap.Map{Version: 1, Regions: []string{"us-east"}, Namespaces: []shardmap.Namespace{
		// A short default lease: what a killed dequeuer had prefetched comes
		// back within it.
		{Name: "default", DefaultLeaseDuration: shardmap.Duration(3 * time.Second)}}}
	for i := 1; i <= shards; i++ {
		dsn := mariadbtest.Database(t)
		cfg, err := mysql.ParseDSN(dsn)
		require.NoError(t, err)
		m.Shards = append(m.Shards, shardmap.Shard{ID: uint32(i), HomeRegion: "us-east", Primary: cfg.Addr, Database: cfg.DBName})
		db := sqlx.MustConnect("mysql", dsn)
		t.Cleanup(func() { db.Close() })
		c.shards = append(c.shards, db)
	}
	sm, err := shardmap.New(m)
	require.NoError(t, err)
	c.app = provisiontest.ForTest(t)
	require.NoError(t, c.app.GrantMap(t.Context(), sm))
	data, err := sm.Marshal()
	require.NoError(t, err)
	c.mapFile = filepath.Join(c.dir, "shardmap.json")
	require.NoError(t, os.WriteFile(c.mapFile, data, 0o644))
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
		cfg.MySQL = c.app.Credentials()
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
	p.cmd = exec.Command(binary, "serve", "--config", file, "--log-level", "info")
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

func (c *cluster) rows() int {
	total := 0
	for _, db := range c.shards {
		var n int
		require.NoError(c.t, db.Get(&n, "SELECT COUNT(*) FROM items"))
		total += n
	}
	return total
}

func ms(d time.Duration) shardmap.Duration { return shardmap.Duration(d) }
