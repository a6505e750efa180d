package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/triage-queue/triage/deploy/bed"
	"github.com/triage-queue/triage/deploy/node"
)

const usage = `triage — a multi-region priority queue on sharded MySQL

Service:
  triage serve --config FILE     run the roles in a node config file
  triage up [flags]              run the local bed in the foreground (make up)
  triage down                    stop the bed started by up (make down)
  triage bench [--quick]         benchmarks beside their baselines (make bench)
  triage drill SCENARIO          failover drill against a running bed
                                 (primary-kill, region-down, partition, nats-kill, dequeuer-kill)

Containers (the compose bed, deploy/compose):
  triage nats [flags]            an embedded NATS server with JetStream, clustered by --routes
  triage bootstrap --config FILE accounts, schema, replication, buckets and shard map of a bed
  triage wan --config FILE       a region's WAN gateway: delays what leaves the region
  triage probe URL               GET URL, exit 0 on 2xx (health checks in FROM-scratch images)

Client (talk to a router; --addr or TRIAGE_ADDR, default 127.0.0.1:9090):
  triage enqueue TOPIC [PAYLOAD...]   triage dequeue TOPIC
  triage ack ID:TOKEN...              triage nack ID:TOKEN...
  triage extend ID:TOKEN              triage get ID
  triage update ID                    triage delete ID
  triage stats TOPIC                  triage topics
  triage shardmap                     triage deadletters TOPIC
  triage redrive TOPIC [ID...]        triage namespace get NAME
  triage namespace put NAME           triage failover --shard N [--to REGION]

Run "triage COMMAND -h" for a command's flags.
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprint(stdout, usage)
		return 0
	}
	verb, rest := args[0], args[1:]
	switch verb {
	case "serve":
		return serve(ctx, rest, stderr)
	case "up":
		return up(ctx, rest, stdout, stderr)
	case "down":
		return down(rest, stdout, stderr)
	case "bench":
		return benchCmd(ctx, rest, stdout, stderr)
	case "drill":
		return drillCmd(ctx, rest, stdout, stderr)
	case "nats":
		return natsCmd(ctx, rest, stderr)
	case "bootstrap":
		return bootstrapCmd(ctx, rest, stderr)
	case "wan":
		return wanCmd(ctx, rest, stderr)
	case "probe":
		return probeCmd(ctx, rest, stdout, stderr)
	}
	if handled, code := runClientCommand(ctx, verb, rest, stdout, stderr); handled {
		return code
	}
	fmt.Fprintf(stderr, "triage: unknown command %q\n\n%s", verb, usage)
	return 2
}

func logger(w io.Writer, level string) *slog.Logger {
	var l slog.Level
	_ = l.UnmarshalText([]byte(level))
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: l}))
}

func serve(ctx context.Context, args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	config := fs.String("config", "", "node config file (JSON; see deploy/node.Config)")
	level := fs.String("log-level", "info", "debug, info, warn or error")
	health := fs.String("health", "", "serve GET /healthz on this address (NATS, shard map, the region's primaries)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *config == "" {
		fmt.Fprintln(stderr, "triage serve: --config is required")
		return 2
	}
	data, err := os.ReadFile(*config)
	if err != nil {
		fmt.Fprintln(stderr, "triage serve:", err)
		return 1
	}
	var cfg node.Config
	dec := json.NewDecoder(strings.NewReader(string(data)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&cfg); err != nil {
		fmt.Fprintf(stderr, "triage serve: %s: %v\n", *config, err)
		return 1
	}
	log := logger(stderr, *level)
	startCtx, cancel := context.WithTimeout(ctx, time.Minute)
	n, err := node.Start(startCtx, cfg, log)
	cancel()
	if err != nil {
		fmt.Fprintln(stderr, "triage serve:", err)
		return 1
	}
	if *health != "" {
		stopHealth, err := serveHealth(*health, n)
		if err != nil {
			n.Stop()
			fmt.Fprintln(stderr, "triage serve:", err)
			return 1
		}
		defer stopHealth()
	}
	select {
	case <-ctx.Done():
	case <-n.Done():
	}
	log.Info("stopping")
	n.Stop()
	return 0
}

func up(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("up", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dir := fs.String("dir", ".triage", "where bed.json and the shard map go")
	shards := fs.Int("shards", 0, "shard primaries per region (default 2 with one region, 1 with several)")
	regions := fs.String("regions", "us-east", "comma-separated regions, in port order (us-east,eu-west,ap-south)")
	multi := fs.Bool("multi-region", false, "run the three regions us-east, eu-west and ap-south (same as --regions "+strings.Join(bed.DefaultRegions, ",")+")")
	wanLatency := fs.Duration("wan-latency", 20*time.Millisecond, "one-way latency between regions (0 for none)")
	level := fs.String("log-level", "warn", "debug, info, warn or error")
	pprofAddr := fs.String("pprof", "", "serve net/http/pprof on this address (e.g. 127.0.0.1:6060)")
	freePorts := fs.Bool("free-ports", false, "pick free ports instead of 808x/909x/4222 (tests, or beside another bed)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	httpBase, grpcBase, natsPort := 8080, 9090, 0
	if *freePorts {
		httpBase, grpcBase, natsPort = 0, 0, -1
	}
	regionList := strings.Split(*regions, ",")
	if *multi {
		regionList = bed.DefaultRegions
	}
	latency := *wanLatency
	if latency == 0 {
		latency = -1 // bed.Config: negative means none, 0 the default
	}
	log := logger(stderr, *level)
	start := time.Now()
	fmt.Fprintf(stdout, "starting the Triage bed: regions %s (MariaDB shards, NATS, Triage roles)...\n", strings.Join(regionList, ", "))
	b, err := bed.Start(ctx, bed.Config{Dir: *dir, Regions: regionList, ShardsPerRegion: *shards, WANLatency: latency,
		HTTPBase: httpBase, GRPCBase: grpcBase, NATSPort: natsPort, Pprof: *pprofAddr, Logger: log,
		Progress: func(line string) { fmt.Fprintln(stdout, "  "+line) }})
	if err != nil {
		fmt.Fprintln(stderr, "triage up:", err)
		return 1
	}
	printBed(stdout, b, *dir, time.Since(start))
	<-ctx.Done()
	fmt.Fprintln(stdout, "\nstopping the bed...")
	b.Stop()
	fmt.Fprintln(stdout, "stopped.")
	return 0
}

func printBed(w io.Writer, b *bed.Bed, dir string, took time.Duration) {
	fmt.Fprintf(w, "\nTriage is up in %.1fs. Layout: %s\n\n", took.Seconds(), bed.LayoutPath(dir))
	for _, r := range b.Layout.Regions {
		fmt.Fprintf(w, "  region %-9s JSON http://%s   gRPC %s   NATS %s\n", r.Name, r.HTTP, r.GRPC, r.NATS)
	}
	for _, p := range b.Layout.Processes {
		switch p.Role {
		case bed.RolePrimary:
			fmt.Fprintf(w, "  shard %d  primary  %-9s mariadbd 127.0.0.1:%d (pid %d)\n", p.Shard, p.Region, p.Port, p.PID)
		case bed.RoleReplica:
			fmt.Fprintf(w, "  shard %d  replica  %-9s mariadbd 127.0.0.1:%d (pid %d, read-only, semi-sync)\n", p.Shard, p.Region, p.Port, p.PID)
		}
	}
	if n := len(b.Layout.Links); n > 0 {
		fmt.Fprintf(w, "  %d WAN links, %.0f ms one way (listed in bed.json)\n", n, b.Layout.Links[0].LatencyMS)
	}
	http := b.Layout.Regions[0].HTTP
	fmt.Fprintf(w, `
Try (namespace "default" exists):
  curl -s -X POST http://%[1]s/v1/namespaces/default/topics/emails/items \
       -d '{"items":[{"payload":"aGVsbG8=","priority":1}]}'
  curl -s -X POST http://%[1]s/v1/namespaces/default:dequeue \
       -d '{"topics":[{"topic":"emails","count":1}],"lease_duration":"30s"}'
  grpcurl -plaintext -d '{"namespace":"default","topics":[{"topic":"emails","count":1}]}' %[2]s triage.v1.Queue/Dequeue
  .bin/triage enqueue emails "hello"   .bin/triage dequeue --ack emails
`, http, b.Layout.Regions[0].GRPC)
	if len(b.Layout.Regions) > 1 {
		last := b.Layout.Regions[len(b.Layout.Regions)-1]
		fmt.Fprintf(w, `  # store in %[2]s through %[3]s's router, read it back through %[4]s's:
  curl -s -X POST http://%[1]s/v1/namespaces/default/topics/emails/items \
       -d '{"region":"%[2]s","items":[{"payload":"aGVsbG8="}]}'
  curl -s -X POST http://%[5]s/v1/namespaces/default:dequeue \
       -d '{"region":"%[2]s","topics":[{"topic":"emails","count":1}],"lease_duration":"30s"}'
`, http, b.Layout.Regions[1].Name, b.Layout.Regions[0].Name, last.Name, last.HTTP)
	}
	fmt.Fprint(w, "\nCtrl-C or \"make down\" stops everything.\n")
}

func down(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("down", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dir := fs.String("dir", ".triage", "the bed's directory")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	err := bed.Down(*dir, 30*time.Second)
	switch {
	case bed.ErrNotRunning(err):
		fmt.Fprintln(stdout, "no bed is running")
		return 0
	case err != nil:
		fmt.Fprintln(stderr, "triage down:", err)
		return 1
	}
	fmt.Fprintln(stdout, "bed stopped")
	return 0
}
