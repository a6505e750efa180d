package client_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/stretchr/testify/require"

	"github.com/triage-queue/triage/client"
	"github.com/triage-queue/triage/cmd/triage/natsserver"
	"github.com/triage-queue/triage/cmd/triage/node"
	"github.com/triage-queue/triage/cmd/triage/provision/provisiontest"
	"github.com/triage-queue/triage/deploy/mariadb/mariadbtest"
	"github.com/triage-queue/triage/shardmap"
)

func TestMain(m *testing.M) { os.Exit(mariadbtest.MainCheckingLeaks(m)) }

// bed is a one-region Triage: an embedded NATS server, shards as
// databases on the package's shared mariadbd, and nodes (routers,
// enqueuers, dequeuers) started in-process with the production composition
// root (cmd/triage/node), so the client talks to real routers over gRPC.
type bed struct {
	nats    *server.Server
	natsDir string
	mapFile string
	dropDBs []func()
	// app is the application account the nodes log in as.
	app   *provisiontest.App
	nodes []*node.Node
	// Addr is the gRPC address of the first node's router.
	Addr string
}

// bedOpts configure the namespace "default" and the bed's shape.
type bedOpts struct {
	shards      int
	maxAttempts int
}

// startBed starts a bed without a testing.TB, so examples can use it too;
// Stop releases everything.
func startBed(name string, o bedOpts) (b *bed, err error) {
	b = &bed{}
	defer func() {
		if err != nil {
			b.Stop()
		}
	}()
	if o.shards == 0 {
		o.shards = 1
	}
	if b.natsDir, err = os.MkdirTemp("", "clientbed-"); err != nil {
		return nil, err
	}
	if b.nats, err = natsserver.Start(natsserver.Config{StoreDir: b.natsDir}); err != nil {
		return nil, err
	}
	srv, err := mariadbtest.Shared()
	if err != nil {
		return nil, err
	}
	m := shardmap.Map{Version: 1, Regions: []string{"us-east"}, Namespaces: []shardmap.Namespace{{Name: "default", MaxAttempts: o.maxAttempts}}}
	for i := 1; i <= o.shards; i++ {
		db := fmt.Sprintf("c_%s_%d_%d", name, time.Now().UnixNano()%1e9, i)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err := srv.CreateDatabase(ctx, db)
		cancel()
		if err != nil {
			return nil, err
		}
		b.dropDBs = append(b.dropDBs, func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			_ = srv.DropDatabase(ctx, db)
		})
		c, err := mysql.ParseDSN(srv.DSN(db))
		if err != nil {
			return nil, err
		}
		m.Shards = append(m.Shards, shardmap.Shard{ID: uint32(i), HomeRegion: "us-east", Primary: c.Addr, Database: c.DBName})
	}
	b.app = provisiontest.New()
	b.dropDBs = append(b.dropDBs, b.app.Drop)
	sm, err := shardmap.New(m)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := b.app.GrantMap(ctx, sm); err != nil {
		return nil, err
	}
	data, err := sm.Marshal()
	if err != nil {
		return nil, err
	}
	b.mapFile = b.natsDir + "/shardmap.json"
	if err := os.WriteFile(b.mapFile, data, 0o644); err != nil {
		return nil, err
	}
	n, err := b.StartNode()
	if err != nil {
		return nil, err
	}
	b.Addr = n.GRPCAddr
	return b, b.waitServing(n.GRPCAddr)
}

// StartNode starts another node with the given roles (default: all).
func (b *bed) StartNode(roles ...string) (*node.Node, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	n, err := node.Start(ctx, node.Config{Region: "us-east", Roles: roles, NATS: b.nats.ClientURL(), ShardMapFile: b.mapFile, MySQL: b.app.Credentials(),
		GRPC: "127.0.0.1:0", HTTP: "127.0.0.1:0"}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		return nil, err
	}
	b.nodes = append(b.nodes, n)
	return n, nil
}

// waitServing waits until the router at addr serves dequeues (a dequeuer
// owns the shards).
func (b *bed) waitServing(addr string) error {
	c, err := client.Dial(context.Background(), addr)
	if err != nil {
		return err
	}
	defer c.Close()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := c.Dequeue(ctx, "default", "probe", 1, 0, 0)
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("router %s not serving dequeues: %w", addr, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Stop stops the nodes, NATS and drops the databases.
func (b *bed) Stop() {
	for i := len(b.nodes) - 1; i >= 0; i-- {
		b.nodes[i].Stop()
	}
	if b.nats != nil {
		b.nats.Shutdown()
		b.nats.WaitForShutdown()
	}
	for _, drop := range b.dropDBs {
		drop()
	}
	if b.natsDir != "" {
		_ = os.RemoveAll(b.natsDir)
	}
}

// newBed is startBed for a test: it fails the test on error and stops the
// bed at cleanup.
func newBed(t *testing.T, o bedOpts) *bed {
	t.Helper()
	name := strings.ToLower(strings.NewReplacer("/", "_", " ", "_").Replace(t.Name()))
	b, err := startBed(name[:min(len(name), 30)], o)
	require.NoError(t, err)
	t.Cleanup(b.Stop)
	return b
}

// dial connects a client to the bed's first router, closed at cleanup.
func (b *bed) dial(t *testing.T, opts ...client.Option) *client.Client {
	t.Helper()
	c, err := client.Dial(t.Context(), b.Addr, opts...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// quietLogger keeps the worker's expected warnings out of test output
// unless -v.
func quietLogger(t *testing.T) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

var errBoom = errors.New("boom")
