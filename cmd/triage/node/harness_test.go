package node

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jmoiron/sqlx"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/triage-queue/triage/cmd/triage/natsserver"
	"github.com/triage-queue/triage/cmd/triage/provision/provisiontest"
	"github.com/triage-queue/triage/deploy/mariadb/mariadbtest"
	"github.com/triage-queue/triage/deploy/testlog"
	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
	"github.com/triage-queue/triage/shardmap"
)

func TestMain(m *testing.M) { os.Exit(mariadbtest.Main(m)) }

// bed is one region with several shards (databases on the package's shared
// mariadbd), an embedded NATS server and a node running every role.
type bed struct {
	t       *testing.T
	ns      *server.Server
	natsURL string
	mapFile string
	shards  []*sqlx.DB
	node    *Node
	queue   triagev1.QueueClient
	admin   triagev1.AdminClient
	http    string
	// metrics is the node's metrics listener (Config.Metrics), the only
	// one that serves /metrics.
	metrics string
	// app is the application account the bed's nodes log in as (see
	// appAccount).
	app *provisiontest.App
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

func setup(t *testing.T, o bedOpts) *bed {
	t.Helper()
	if o.shards == 0 {
		o.shards = 2
	}
	b := &bed{t: t}
	var err error
	b.ns, err = natsserver.Start(natsserver.Config{StoreDir: t.TempDir(), Auth: o.natsAuth, TLS: o.natsTLS})
	require.NoError(t, err)
	t.Cleanup(b.ns.Shutdown)
	b.natsURL = b.ns.ClientURL()
	m := shardmap.Map{Version: 1, Regions: []string{"us-east"}, Namespaces: []shardmap.Namespace{{Name: "default", MaxAttempts: o.maxAttempts}, {Name: "other"}}}
	for i := 1; i <= o.shards; i++ {
		dsn := mariadbtest.Database(t)
		c, err := mysql.ParseDSN(dsn)
		require.NoError(t, err)
		m.Shards = append(m.Shards, shardmap.Shard{ID: uint32(i), HomeRegion: "us-east", Primary: c.Addr, Database: c.DBName})
		db := sqlx.MustConnect("mysql", dsn)
		t.Cleanup(func() { db.Close() })
		b.shards = append(b.shards, db)
	}
	sm, err := shardmap.New(m)
	require.NoError(t, err)
	data, err := sm.Marshal()
	require.NoError(t, err)
	b.mapFile = t.TempDir() + "/shardmap.json"
	require.NoError(t, os.WriteFile(b.mapFile, data, 0o644))
	if !o.noNode {
		b.startNode(Config{OwnerTTL: shardmap.Duration(o.ownerTTL)})
	}
	return b
}

func (b *bed) config(c Config) Config {
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

// appAccount returns the application account of the bed's nodes, made on
// first use with the databases of the shards in the bed's map file; a
// test that adds a shard grants its database (Grant). A node refuses root.
func (b *bed) appAccount() *provisiontest.App {
	if b.app == nil {
		b.app = provisiontest.ForTest(b.t)
		m, err := shardmap.Parse(mustRead(b.t, b.mapFile))
		require.NoError(b.t, err)
		require.NoError(b.t, b.app.GrantMap(b.ctx(), m))
	}
	return b.app
}

func (b *bed) startNode(c Config) *Node {
	t := b.t
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	n, err := Start(ctx, b.config(c), testLogger(t))
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
			if _, ok := b.node.router.Owner(uint32(i + 1)); !ok {
				return false
			}
		}
		return true
	}, 20*time.Second, 20*time.Millisecond)
}

func (b *bed) ctx() context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	b.t.Cleanup(cancel)
	return ctx
}

// rowCount counts rows of a table across shards.
func (b *bed) rowCount(table string) int {
	total := 0
	for _, db := range b.shards {
		var n int
		require.NoError(b.t, db.Get(&n, fmt.Sprintf("SELECT COUNT(*) FROM %s", table)))
		total += n
	}
	return total
}

// testLogger logs the node's warnings and errors to t.Log (see testlog).
func testLogger(t testing.TB) *slog.Logger { return testlog.New(t, slog.LevelWarn) }
