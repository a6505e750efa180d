package scale

import (
	"cmp"
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/triage-queue/triage/cmd/triage/natsserver"
	"github.com/triage-queue/triage/cmd/triage/provision"
	"github.com/triage-queue/triage/deploy/mariadb"
	"github.com/triage-queue/triage/schema"
	"github.com/triage-queue/triage/shardmap"
)

// Region is the scale bed's region: its shards, primaries and nodes.
const Region = "us-east"

// replicaRegions are the other regions of a bed with Config.Failover,
// in the order every shard lists its replicas: each holds a replica of
// every server and a controller, no shards of its own. Two, as in
// production (a replica of every shard in every other region), so the
// replica a failover promotes still has a semi-sync replica: the other
// one, which the controller repoints to it.
var replicaRegions = [...]string{"eu-west", "ap-south"}

// Config of a scale bed.
type Config struct {
	// Dir holds the node configs, logs and shard map. Required.
	Dir string
	// Triage is the `triage` binary the nodes run. Required.
	Triage string
	// Shards is the number of logical shards. Required.
	Shards int
	// Servers is the number of mariadbd servers the shards are spread
	// over. Default min(4, Shards).
	Servers int
	// Topics is the number of topic configurations in the map. Default
	// 100 per shard, at most 100,000.
	Topics int
	// Namespaces in the map. Default Topics/10, at least 1.
	Namespaces int
	// ShardsPerNamespace is how many consecutive shards each namespace
	// uses. Default min(4, Shards).
	ShardsPerNamespace int
	// Dequeuers is the number of dequeuer processes. Default 2.
	Dequeuers int
	// OwnerTTL of a dequeuer's shard claims. Default 5s.
	OwnerTTL time.Duration
	// Failover gives the bed two more regions, eu-west and ap-south, for
	// the failover step: in each a replica of every server (GTID,
	// semi-sync AFTER_SYNC, read-only, replicating the whole server and
	// so every shard database on it) that the map lists for each of the
	// server's shards, and a controller, so that observers in three
	// regions watch the primaries; every controller gets the replication
	// account. Off, the bed has one region and no replication.
	Failover bool
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Progress receives one line per step, for a person watching.
	Progress func(line string)
}

func (c *Config) fill() error {
	if c.Dir == "" || c.Triage == "" || c.Shards < 1 {
		return fmt.Errorf("scale: dir, triage and a positive number of shards are required")
	}
	c.Servers = cmp.Or(c.Servers, min(4, c.Shards))
	c.Topics = cmp.Or(c.Topics, min(100*c.Shards, 100_000))
	c.Namespaces = cmp.Or(c.Namespaces, max(1, c.Topics/10))
	c.ShardsPerNamespace = cmp.Or(c.ShardsPerNamespace, min(4, c.Shards))
	c.Dequeuers = cmp.Or(c.Dequeuers, 2)
	c.OwnerTTL = cmp.Or(c.OwnerTTL, 5*time.Second)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Servers < 1 || c.Servers > c.Shards || c.ShardsPerNamespace > c.Shards || c.Topics < c.Namespaces {
		return fmt.Errorf("scale: %d servers, %d shards per namespace, %d topics over %d namespaces: want 1 <= servers <= shards, shards per namespace <= shards, topics >= namespaces",
			c.Servers, c.ShardsPerNamespace, c.Topics, c.Namespaces)
	}
	return nil
}

// Bed is a running scale bed.
type Bed struct {
	cfg     Config
	tmp     string
	servers []*mariadb.Server
	// replicas[k][i] is servers[i]'s replica in replicaRegions[k]
	// (Failover).
	replicas [][]*mariadb.Server
	nats     *server.Server
	mapFile  string
	// Spare is the migrated shard left out of the map (with Failover,
	// listing its server's replicas, as the map's shards do).
	Spare shardmap.Shard
	// spareAdded is set once the map change step added Spare.
	spareAdded bool
	// Nodes are the `triage serve` processes, the router first.
	Nodes   []*Node
	started time.Time
}

// Database is shard id's database name.
func Database(id uint32) string { return fmt.Sprintf("triage_%04d", id) }

// Start brings a scale bed up: the servers, the shard databases, the map,
// NATS and the nodes. On error everything started is stopped.
func Start(ctx context.Context, cfg Config) (b *Bed, err error) {
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	b = &Bed{cfg: cfg, started: time.Now()}
	started := b // b is nil by the time a failing return runs the defer
	defer func() {
		if err != nil {
			started.Stop()
		}
	}()
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return nil, err
	}
	if err := mariadb.EnsureInstalled(ctx, cfg.Logger); err != nil {
		return nil, err
	}
	if b.tmp, err = os.MkdirTemp("", "triage-scale-"); err != nil {
		return nil, err
	}
	steps := []func(context.Context) error{b.startServers, b.createShards, b.writeMap, b.startNATS, b.startNodes}
	for _, step := range steps {
		if err := step(ctx); err != nil {
			return nil, err
		}
	}
	b.progress("scale bed is up: %d shards on %d servers, %d namespaces, %d topics, %d nodes",
		cfg.Shards, cfg.Servers, cfg.Namespaces, cfg.Topics, len(b.Nodes))
	return b, nil
}

func (b *Bed) progress(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	b.cfg.Logger.Info("scale: " + msg)
	if b.cfg.Progress != nil {
		b.cfg.Progress(fmt.Sprintf("[%6.1fs] %s", time.Since(b.started).Seconds(), msg))
	}
}

// serverArgs let one mariadbd hold hundreds of shard databases: the
// system tablespace instead of a file per table (creating ten thousand
// .ibd files is most of a bring-up), room for every node's connections
// to every shard database, and table caches that hold every table of
// every shard for each of the connections using it at once (each
// connection opens its own handle; the cache is split in
// table_open_cache_instances parts).
var serverArgs = []string{
	"--innodb-file-per-table=0",
	"--max-connections=4000",
	"--table-open-cache=40000",
	"--table-definition-cache=10000",
	"--open-files-limit=65535",
	"--innodb-buffer-pool-size=128M",
	"--thread-cache-size=64",
}

// threadPool serves the plain bed's thousands of connections with about
// a thread per core: a thread per connection spent 56 % of a server's
// CPU switching threads under the 1,000-shard load (perf; this VM's
// context switches are costly). The replicated bed (Config.Failover)
// keeps a thread per connection: its one 1,000-shard run with the pool
// failed no shard over and its load failed 12,356 enqueues, which is not
// understood yet (a commit waiting for its semi-sync acknowledgement may
// hold a pool thread).
var threadPool = []string{"--thread-handling=pool-of-threads"}

func (b *Bed) startServers(ctx context.Context) error {
	if b.cfg.Failover {
		return b.startReplicated(ctx)
	}
	b.progress("starting %d mariadbd servers", b.cfg.Servers)
	b.servers = make([]*mariadb.Server, b.cfg.Servers)
	return provision.Parallel(b.cfg.Servers, func(i int) error {
		s, err := mariadb.Start(ctx, mariadb.Config{Dir: filepath.Join(b.tmp, fmt.Sprintf("mysql%d", i)), ServerID: i + 1,
			ExtraArgs: append(slices.Clone(serverArgs), threadPool...), Logger: b.cfg.Logger})
		if err != nil {
			return err
		}
		b.servers[i] = s
		return provision.EnsureAccounts(ctx, s.DSN(""), provision.BedAccounts)
	})
}

// server is the server shard id (1-based) lives on.
func (b *Bed) server(id uint32) *mariadb.Server { return b.servers[int(id-1)%len(b.servers)] }

// createShards creates, migrates and grants every shard's database and the
// spare's, two at a time per server.
func (b *Bed) createShards(ctx context.Context) error {
	n := b.cfg.Shards + 1
	b.progress("creating and migrating %d shard databases", n)
	var done atomic.Int64
	next := make(chan uint32, n)
	for id := 1; id <= n; id++ {
		next <- uint32(id)
	}
	close(next)
	return provision.Parallel(2*len(b.servers), func(int) error {
		for id := range next {
			if err := b.createShard(ctx, id); err != nil {
				return fmt.Errorf("shard %d: %w", id, err)
			}
			if d := done.Add(1); d%100 == 0 || int(d) == n {
				b.progress("  %d of %d shard databases ready", d, n)
			}
		}
		return nil
	})
}

func (b *Bed) createShard(ctx context.Context, id uint32) error {
	s, name := b.server(id), Database(id)
	if err := s.CreateDatabase(ctx, name); err != nil {
		return err
	}
	db, err := sql.Open("mysql", s.DSN(name))
	if err != nil {
		return err
	}
	defer db.Close()
	if _, err := schema.Migrate(ctx, db); err != nil {
		return err
	}
	app := provision.BedAccounts.App
	_, err = db.ExecContext(ctx, "GRANT SELECT, INSERT, UPDATE, DELETE ON `"+name+"`.* TO '"+app.User+"'@'%'")
	return err
}

// writeMap writes the bootstrap map (see the package comment).
func (b *Bed) writeMap(context.Context) error {
	m := Map(b.cfg, func(id uint32) string { return b.server(id).Addr() })
	if b.cfg.Failover {
		b.addReplicas(&m)
	}
	spare := uint32(b.cfg.Shards + 1)
	b.Spare = b.withReplicas(shardmap.Shard{ID: spare, HomeRegion: Region, Primary: b.server(spare).Addr(), Database: Database(spare)})
	sm, err := shardmap.New(m)
	if err != nil {
		return err
	}
	data, err := sm.Marshal()
	if err != nil {
		return err
	}
	b.mapFile = filepath.Join(b.cfg.Dir, "shardmap.json")
	b.progress("shard map: %d shards, %d namespaces, %d topics, %d bytes", len(m.Shards), len(m.Namespaces), b.cfg.Topics, len(data))
	return os.WriteFile(b.mapFile, data, 0o644)
}

// Map is the scale bed's map for cfg, its shards' primaries at addr(id).
func Map(cfg Config, addr func(id uint32) string) shardmap.Map {
	m := shardmap.Map{Version: 1, Regions: []string{Region}}
	for id := uint32(1); id <= uint32(cfg.Shards); id++ {
		m.Shards = append(m.Shards, shardmap.Shard{ID: id, HomeRegion: Region, Primary: addr(id), Database: Database(id)})
	}
	for i := range cfg.Namespaces {
		ns := shardmap.Namespace{Name: NamespaceName(i), Topics: map[string]shardmap.TopicConfig{}}
		var ids []uint32
		for k := range cfg.ShardsPerNamespace {
			ids = append(ids, uint32((i*cfg.ShardsPerNamespace+k)%cfg.Shards)+1)
		}
		ns.Shards = map[string][]uint32{Region: ids}
		// Topics i, i+Namespaces, ... belong to namespace i.
		for t := i; t < cfg.Topics; t += cfg.Namespaces {
			ns.Topics[TopicName(t/cfg.Namespaces)] = shardmap.TopicConfig{MaxAttempts: 3 + t%5}
		}
		m.Namespaces = append(m.Namespaces, ns)
	}
	return m
}

// NamespaceName is the i-th namespace's name.
func NamespaceName(i int) string { return fmt.Sprintf("ns%05d", i) }

// TopicName is the i-th topic of a namespace.
func TopicName(i int) string { return fmt.Sprintf("t%d", i) }

func (b *Bed) startNATS(context.Context) error {
	b.progress("starting NATS with JetStream")
	s, err := natsserver.Start(natsserver.Config{StoreDir: filepath.Join(b.tmp, "nats")})
	if err != nil {
		return err
	}
	b.nats = s
	return nil
}

// NATSURL is the bed's NATS client URL.
func (b *Bed) NATSURL() string { return b.nats.ClientURL() }

// Stop stops the nodes, NATS and the servers (the replicas too), by the
// PIDs the bed started, and removes the datadirs.
func (b *Bed) Stop() {
	_ = provision.Parallel(len(b.Nodes), func(i int) error { b.Nodes[i].Stop(); return nil })
	if b.nats != nil {
		b.nats.Shutdown()
		b.nats.WaitForShutdown()
	}
	all := slices.Concat(append([][]*mariadb.Server{b.servers}, b.replicas...)...)
	_ = provision.Parallel(len(all), func(i int) error {
		if s := all[i]; s != nil {
			_ = s.Stop()
		}
		return nil
	})
	if b.tmp != "" {
		_ = os.RemoveAll(b.tmp)
	}
}

// ServerPIDs are the mariadbd processes' PIDs.
func (b *Bed) ServerPIDs() []int {
	var pids []int
	for _, s := range b.servers {
		if s != nil {
			pids = append(pids, s.PID())
		}
	}
	return pids
}
