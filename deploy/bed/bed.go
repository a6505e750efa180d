// Package bed runs a local Triage bed: real MariaDB shard primaries
// (mariadbd children in temp datadirs), an embedded NATS server with
// JetStream, and a node running every Triage role per region. `triage up`
// (make up) runs one in the foreground; e2e tests and `make bench` use it
// too.
//
// The bed writes its layout to <Dir>/bed.json so drills and scripts can find
// every process by role, region, shard, port and PID, and so `triage down`
// (make down) can stop a bed from another terminal by PID.
package bed

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/triage-queue/triage/deploy/mariadb"
	"github.com/triage-queue/triage/deploy/natsserver"
	"github.com/triage-queue/triage/deploy/node"
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
	// ShardsPerRegion is the number of shard primaries per region. Default 2.
	ShardsPerRegion int
	// HTTPBase and GRPCBase are region 0's gateway and gRPC ports; region i
	// uses base+i. Default 8080 and 9090. 0 after Defaults means "pick free".
	HTTPBase, GRPCBase int
	// NATSPort is the NATS client port. Default 4222; -1 picks a free one.
	NATSPort int
	// OwnerTTL of dequeuer shard ownership. Default 10s.
	OwnerTTL time.Duration
	// Pprof, when set, serves net/http/pprof for region 0's node here.
	Pprof string
	// MariaDBArgs are extra mariadbd flags for every shard.
	MariaDBArgs []string
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// Region is one region's endpoints.
type Region struct {
	Name string `json:"name"`
	HTTP string `json:"http"`
	GRPC string `json:"grpc"`
}

// Process is one process of the bed.
type Process struct {
	Role   string `json:"role"`
	Region string `json:"region,omitempty"`
	Shard  uint32 `json:"shard,omitempty"`
	Port   int    `json:"port,omitempty"`
	PID    int    `json:"pid"`
}

// Layout is bed.json.
type Layout struct {
	Regions   []Region  `json:"regions"`
	Processes []Process `json:"processes"`
	NATS      string    `json:"nats"`
	ShardMap  string    `json:"shard_map"`
	StartedAt time.Time `json:"started_at"`
}

// Bed is a running bed.
type Bed struct {
	Layout Layout
	// Shards are the shard primaries by shard ID.
	Shards map[uint32]*mariadb.Server

	cfg     Config
	tmp     string
	nats    *server.Server
	nodes   []*node.Node
	stopped bool
}

// Start brings a bed up. On error everything started so far is stopped.
func Start(ctx context.Context, cfg Config) (b *Bed, err error) {
	cfg.Dir = cmp.Or(cfg.Dir, ".triage")
	if len(cfg.Regions) == 0 {
		cfg.Regions = DefaultRegions[:1]
	}
	cfg.ShardsPerRegion = cmp.Or(cfg.ShardsPerRegion, 2)
	cfg.NATSPort = cmp.Or(cfg.NATSPort, 4222)
	cfg.OwnerTTL = cmp.Or(cfg.OwnerTTL, 10*time.Second)
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	log := cfg.Logger
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return nil, err
	}
	if err := refuseRunning(cfg.Dir); err != nil {
		return nil, err
	}
	b = &Bed{cfg: cfg, Shards: map[uint32]*mariadb.Server{}}
	defer func() {
		if err != nil {
			b.Stop()
			b = nil
		}
	}()
	if err := mariadb.EnsureInstalled(ctx, log); err != nil {
		return nil, err
	}
	if b.tmp, err = os.MkdirTemp("", "triage-bed-"); err != nil {
		return nil, err
	}
	// Shard primaries.
	m := shardmap.Map{Version: 1, Regions: cfg.Regions, Namespaces: []shardmap.Namespace{{Name: "default"}}}
	shard := uint32(0)
	for _, region := range cfg.Regions {
		for j := 0; j < cfg.ShardsPerRegion; j++ {
			shard++
			log.Info("starting mariadbd", "region", region, "shard", shard)
			s, err := mariadb.Start(ctx, mariadb.Config{
				Dir:       filepath.Join(b.tmp, "shard-"+strconv.Itoa(int(shard))),
				ServerID:  int(shard),
				ExtraArgs: cfg.MariaDBArgs,
			})
			if err != nil {
				return nil, fmt.Errorf("shard %d: %w", shard, err)
			}
			b.Shards[shard] = s
			if err := s.CreateDatabase(ctx, "triage"); err != nil {
				return nil, err
			}
			m.Shards = append(m.Shards, shardmap.Shard{ID: shard, HomeRegion: region, Primary: s.Addr(), Database: "triage"})
			b.Layout.Processes = append(b.Layout.Processes, Process{Role: "mysql-primary", Region: region, Shard: shard, Port: s.Port(), PID: s.PID()})
		}
	}
	sm, err := shardmap.New(m)
	if err != nil {
		return nil, err
	}
	data, err := sm.Marshal()
	if err != nil {
		return nil, err
	}
	b.Layout.ShardMap = filepath.Join(cfg.Dir, "shardmap.json")
	if err := os.WriteFile(b.Layout.ShardMap, data, 0o644); err != nil {
		return nil, err
	}
	// NATS.
	natsPort := cfg.NATSPort
	if natsPort < 0 {
		natsPort = 0
	}
	b.nats, err = natsserver.Start(natsserver.Config{Port: natsPort, StoreDir: filepath.Join(b.tmp, "nats")})
	if err != nil {
		return nil, err
	}
	b.Layout.NATS = b.nats.ClientURL()
	b.Layout.Processes = append(b.Layout.Processes, Process{Role: "nats", Port: natsserver.Port(b.nats), PID: os.Getpid()})
	// Triage roles, one node per region.
	for i, region := range cfg.Regions {
		n, err := node.Start(ctx, node.Config{
			Region:       region,
			NATS:         b.Layout.NATS,
			GRPC:         addr(cfg.GRPCBase, i),
			HTTP:         addr(cfg.HTTPBase, i),
			ShardMapFile: b.Layout.ShardMap,
			OwnerTTL:     shardmap.Duration(cfg.OwnerTTL),
			Pprof:        map[bool]string{true: cfg.Pprof}[i == 0],
		}, log)
		if err != nil {
			return nil, fmt.Errorf("region %s: %w", region, err)
		}
		b.nodes = append(b.nodes, n)
		b.Layout.Regions = append(b.Layout.Regions, Region{Name: region, HTTP: n.HTTPAddr, GRPC: n.GRPCAddr})
		b.Layout.Processes = append(b.Layout.Processes, Process{Role: "triage", Region: region, Port: port(n.GRPCAddr), PID: os.Getpid()})
	}
	b.Layout.StartedAt = time.Now().UTC()
	if err := b.writeLayout(); err != nil {
		return nil, err
	}
	return b, nil
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
	data, err := json.MarshalIndent(b.Layout, "", "  ")
	if err != nil {
		return err
	}
	tmp := LayoutPath(b.cfg.Dir) + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, LayoutPath(b.cfg.Dir))
}

// Stop stops everything the bed started, in reverse order, and removes its
// temp datadirs and bed.json.
func (b *Bed) Stop() {
	if b.stopped {
		return
	}
	b.stopped = true
	for i := len(b.nodes) - 1; i >= 0; i-- {
		b.nodes[i].Stop()
	}
	if b.nats != nil {
		b.nats.Shutdown()
		b.nats.WaitForShutdown()
	}
	for id, s := range b.Shards {
		if err := s.Stop(); err != nil {
			b.cfg.Logger.Warn("mariadbd stop", "shard", id, "err", err)
		}
	}
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
