package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/triage-queue/triage/deploy/bed"
	"github.com/triage-queue/triage/deploy/bench"
	"github.com/triage-queue/triage/regions/drill"
)

func benchCmd(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	quick := fs.Bool("quick", false, "short smoke run (under two minutes); numbers mean little")
	dir := fs.String("dir", ".triage", "where bench.json goes")
	shards := fs.Int("shards", 2, "shard primaries of the benchmark bed")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if _, err := bench.Run(ctx, bench.Config{Quick: *quick, Dir: *dir, Shards: *shards}, stdout); err != nil {
		fmt.Fprintln(stderr, "triage bench:", err)
		return 1
	}
	return 0
}

func drillCmd(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("drill", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dir := fs.String("dir", ".triage", "the running bed's directory (bed.json)")
	region := fs.String("region", "us-east", "region to fault; the workload's items live there")
	via := fs.String("via", "", "region whose router the workload uses (default: another region than --region when there is one)")
	shard := fs.Uint("shard", 0, "primary-kill: the shard to kill (default: the region's first)")
	hold := fs.Duration("hold", 15*time.Second, "how long the fault lasts before it is healed")
	asJSON := fs.Bool("json", false, "print the report as JSON")
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
	l, err := bed.ReadLayout(*dir)
	if err != nil {
		fmt.Fprintln(stderr, "triage drill: no running bed found (start one with make up):", err)
		return 1
	}
	if l.Control == "" {
		fmt.Fprintln(stderr, "triage drill: this bed has no control endpoint")
		return 1
	}
	router := ""
	for _, r := range l.Regions {
		if (*via != "" && r.Name == *via) || (*via == "" && r.Name != *region && router == "") {
			router = r.GRPC
		}
	}
	if router == "" && len(l.Regions) > 0 {
		router = l.Regions[0].GRPC
	}
	progress := stdout
	if *asJSON {
		progress = stderr
	}
	rep, err := drill.Run(ctx, drill.Config{Scenario: fs.Arg(0), Control: l.Control, Router: router, Region: *region,
		Shard: uint32(*shard), Hold: *hold, Progress: progress})
	if err != nil {
		fmt.Fprintln(stderr, "triage drill:", err)
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
