// Command triage is Triage's one binary: the service roles (serve), the
// local bed (up, down), failover drills and benchmarks, and client verbs
// that talk to a router.
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
	shards := fs.Int("shards", 2, "shard primaries per region")
	regions := fs.String("regions", "us-east", "comma-separated regions (us-east,eu-west,ap-south)")
	level := fs.String("log-level", "warn", "debug, info, warn or error")
	pprofAddr := fs.String("pprof", "", "serve net/http/pprof on this address (e.g. 127.0.0.1:6060)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	log := logger(stderr, *level)
	start := time.Now()
	fmt.Fprintln(stdout, "starting the Triage bed (MariaDB shards, NATS, Triage roles)...")
	b, err := bed.Start(ctx, bed.Config{Dir: *dir, Regions: strings.Split(*regions, ","), ShardsPerRegion: *shards, HTTPBase: 8080, GRPCBase: 9090, Pprof: *pprofAddr, Logger: log})
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
		fmt.Fprintf(w, "  region %-9s JSON http://%s   gRPC %s\n", r.Name, r.HTTP, r.GRPC)
	}
	for _, p := range b.Layout.Processes {
		if p.Role == "mysql-primary" {
			fmt.Fprintf(w, "  shard %d  mariadbd 127.0.0.1:%d (pid %d)\n", p.Shard, p.Port, p.PID)
		}
	}
	fmt.Fprintf(w, "  NATS %s\n\n", b.Layout.NATS)
	http := b.Layout.Regions[0].HTTP
	fmt.Fprintf(w, `Try (namespace "default" exists):
  curl -s -X POST http://%[1]s/v1/namespaces/default/topics/emails/items \
       -d '{"items":[{"payload":"aGVsbG8=","priority":1}]}'
  curl -s -X POST http://%[1]s/v1/namespaces/default:dequeue \
       -d '{"topics":[{"topic":"emails","count":1}],"lease_duration":"30s"}'
  grpcurl -plaintext -d '{"namespace":"default","topics":[{"topic":"emails","count":1}]}' %[2]s triage.v1.Queue/Dequeue
  .bin/triage enqueue emails "hello"   .bin/triage dequeue --ack emails

Ctrl-C or "make down" stops everything.
`, http, b.Layout.Regions[0].GRPC)
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
