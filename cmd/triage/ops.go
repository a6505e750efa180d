package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/triage-queue/triage/deploy/bed"
	"github.com/triage-queue/triage/deploy/bench"
	"github.com/triage-queue/triage/deploy/compose"
	"github.com/triage-queue/triage/regions/drill"
)

func benchCmd(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	quick := fs.Bool("quick", false, "short smoke run (under two minutes); numbers mean little")
	dir := fs.String("dir", ".triage", "where bench.json goes")
	shards := fs.Int("shards", 2, "shard primaries of the benchmark bed")
	only := fs.String("only", "", "comma-separated scenarios to run (default: all): "+strings.Join(bench.Names, ", "))
	profile := fs.String("profile", "", "directory for a CPU profile per scenario (this process: load, node, NATS; not mariadbd)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	cfg := bench.Config{Quick: *quick, Dir: *dir, Shards: *shards, ProfileDir: *profile}
	if *only != "" {
		cfg.Only = strings.Split(*only, ",")
	}
	if _, err := bench.Run(ctx, cfg, stdout); err != nil {
		fmt.Fprintln(stderr, "triage bench:", err)
		return 1
	}
	return 0
}

func drillCmd(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("drill", flag.ContinueOnError)
	fs.SetOutput(stderr)
	bedKind := fs.String("bed", "process", "the bed to drill: process (make up; found by --dir) or compose (make compose-up; found by --project)")
	dir := fs.String("dir", ".triage", "--bed process: the running bed's directory (bed.json)")
	project := fs.String("project", "triage", "--bed compose: the docker-compose project (COMPOSE_PROJECT_NAME)")
	region := fs.String("region", "us-east", "region to fault; the workload's items live there")
	via := fs.String("via", "", "comma-separated regions whose routers carry the workload (default: every region's, the faulted one included)")
	shard := fs.Uint("shard", 0, "primary-kill: the shard to kill (default: the region's lowest)")
	warmup := fs.Duration("warmup", 5*time.Second, "workload before the fault")
	hold := fs.Duration("hold", 15*time.Second, "how long the fault lasts before it is healed")
	drain := fs.Duration("drain", 90*time.Second, "after the heal, how long to wait at most for every acknowledged item to be delivered")
	lease := fs.Duration("lease", 5*time.Second, "lease the consumers take")
	producers := fs.Int("producers", 2, "producers per router")
	consumers := fs.Int("consumers", 2, "consumers per router")
	asJSON := fs.Bool("json", false, "print the report as JSON (progress goes to stderr)")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: triage drill [flags] SCENARIO\n\nscenarios: %v\n\n", drill.Scenarios)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return 2
	}
	if *producers < 1 || *consumers < 1 || *lease <= 0 || *hold <= 0 || *warmup < 0 || *drain <= 0 {
		fmt.Fprintln(stderr, "triage drill: --producers and --consumers must be at least 1; --lease, --hold and --drain positive; --warmup not negative")
		return 2
	}
	var target drill.Bed
	var err error
	switch *bedKind {
	case "process":
		target, err = bed.Dial(*dir)
	case "compose":
		target, err = compose.Open(ctx, *project)
	default:
		fmt.Fprintf(stderr, "triage drill: --bed %q: want process or compose\n", *bedKind)
		return 2
	}
	if err != nil {
		fmt.Fprintln(stderr, "triage drill:", err)
		return 1
	}
	progress := stdout
	if *asJSON {
		progress = stderr
	}
	rep, err := drill.Run(ctx, drill.Config{Scenario: fs.Arg(0), Bed: target, Via: split(*via), Region: *region,
		Shard: uint32(*shard), Warmup: *warmup, Hold: *hold, Drain: *drain, Lease: *lease,
		Producers: *producers, Consumers: *consumers, Progress: progress})
	if err != nil {
		fmt.Fprintln(stderr, "triage drill:", err)
		if _, ok := errors.AsType[*drill.ConfigError](err); ok {
			return 2
		}
		return 1
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(rep)
	} else {
		rep.Print(stdout)
	}
	if len(rep.Violations) > 0 {
		return 1
	}
	return 0
}
