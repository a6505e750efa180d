package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/triage-queue/triage/cmd/internal/cli"
	"github.com/triage-queue/triage/deploy/bed"
	"github.com/triage-queue/triage/deploy/bench"
	"github.com/triage-queue/triage/deploy/drill"
)

func upCommand() *cobra.Command {
	var (
		dir, regions, level, pprofAddr string
		shards, spares                 int
		multi, freePorts               bool
		wanLatency                     time.Duration
		noAuth                         bool
	)
	cmd := &cobra.Command{
		Use:     "up [flags]",
		GroupID: groupBed,
		Short:   "Run the local bed in the foreground (make up); Ctrl-C or triage-bed down stops it.",
		Args:    cli.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			stdout := c.OutOrStdout()
			httpBase, grpcBase, natsPort := 8080, 9090, 0
			if freePorts {
				httpBase, grpcBase, natsPort = 0, 0, -1
			}
			regionList := strings.Split(regions, ",")
			if multi {
				regionList = bed.DefaultRegions
			}
			latency := wanLatency
			if latency == 0 {
				latency = -1 // bed.Config: negative means none, 0 the default
			}
			start := time.Now()
			fmt.Fprintf(stdout, "starting the Triage bed: regions %s (MariaDB shards, NATS, Triage roles)...\n", strings.Join(regionList, ", "))
			b, err := bed.Start(c.Context(), bed.Config{Dir: dir, Regions: regionList, ShardsPerRegion: shards, SpareShardsPerRegion: spares, WANLatency: latency,
				HTTPBase: httpBase, GRPCBase: grpcBase, NATSPort: natsPort, Pprof: pprofAddr, Logger: cli.Logger(c.ErrOrStderr(), level), Auth: !noAuth,
				Progress: func(line string) { fmt.Fprintln(stdout, "  "+line) }})
			if err != nil {
				return err
			}
			printBed(stdout, b, dir, time.Since(start))
			<-c.Context().Done()
			fmt.Fprintln(stdout, "\nstopping the bed...")
			b.Stop()
			fmt.Fprintln(stdout, "stopped.")
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&dir, "dir", ".triage", "where bed.json and the shard map go")
	f.IntVar(&shards, "shards", 0, "shard primaries per region (default 2 with one region, 1 with several)")
	f.IntVar(&spares, "spare-shards", 0, "spare shard primaries per region, started (with replicas) but not in the shard map: add them with triage shard add (bed.json lists them as spare)")
	f.StringVar(&regions, "regions", "us-east", "comma-separated regions, in port order (us-east,eu-west,ap-south)")
	f.BoolVar(&multi, "multi-region", false, "run the three regions us-east, eu-west and ap-south (same as --regions "+strings.Join(bed.DefaultRegions, ",")+")")
	f.DurationVar(&wanLatency, "wan-latency", 20*time.Millisecond, "one-way latency between regions (0 for none)")
	f.StringVar(&level, "log-level", "warn", "debug, info, warn or error")
	f.StringVar(&pprofAddr, "pprof", "", "serve net/http/pprof on this address (e.g. 127.0.0.1:6060)")
	f.BoolVar(&noAuth, "no-auth", false, "serve without authentication (by default the bed writes a throwaway keys file with one cluster-admin key and prints it as TRIAGE_TOKEN)")
	f.BoolVar(&freePorts, "free-ports", false, "pick free ports instead of 808x/909x/4222 (tests, or beside another bed)")
	return cmd
}

func printBed(w io.Writer, b *bed.Bed, dir string, took time.Duration) {
	fmt.Fprintf(w, "\nTriage is up in %.1fs. Layout: %s\n\n", took.Seconds(), bed.LayoutPath(dir))
	for _, r := range b.Layout.Regions {
		fmt.Fprintf(w, "  region %-9s JSON http://%s   gRPC %s   NATS %s\n", r.Name, r.HTTP, r.GRPC, r.NATS)
	}
	for _, p := range b.Layout.Processes {
		switch p.Role {
		case bed.RolePrimary:
			spare := ""
			if p.Spare {
				spare = ", spare: not in the shard map"
			}
			fmt.Fprintf(w, "  shard %d  primary  %-9s mariadbd 127.0.0.1:%d (pid %d%s)\n", p.Shard, p.Region, p.Port, p.PID, spare)
		case bed.RoleReplica:
			fmt.Fprintf(w, "  shard %d  replica  %-9s mariadbd 127.0.0.1:%d (pid %d, read-only, semi-sync)\n", p.Shard, p.Region, p.Port, p.PID)
		}
	}
	if n := len(b.Layout.Links); n > 0 {
		fmt.Fprintf(w, "  %d WAN links, %.0f ms one way (listed in bed.json)\n", n, b.Layout.Links[0].LatencyMS)
	}
	http := b.Layout.Regions[0].HTTP
	curlAuth, grpcAuth := "", ""
	if b.Layout.Token != "" {
		fmt.Fprintf(w, `
Authentication is on (a throwaway cluster-admin key, in %s; --no-auth turns it off).
Every request needs it:
  export TRIAGE_TOKEN=%s
`, b.Layout.KeysFile, b.Layout.Token)
		if a, c := b.Layout.NATSAuth, b.Layout.NATSClient; a != nil && c != nil {
			fmt.Fprintf(w, "NATS wants a login: user %q (Triage's, password in %s); user %q (password in %s) is refused on triage.*, JetStream and KV.\n",
				a.User, a.PasswordFile, c.User, c.PasswordFile)
		}
		if t := b.Layout.NATSTLS; t != nil {
			fmt.Fprintf(w, "NATS wants TLS: verify it with the bed's throwaway CA, %s (nats --tlsca %[1]s).\n", t.CAFile)
		}
		fmt.Fprintf(w, "MySQL: the node logs in as the application account (no DDL, no SUPER; password in %s).\n", filepath.Join(dir, "mysql-app.password"))
		if t := b.Layout.MySQLTLS; t != nil {
			fmt.Fprintf(w, "MySQL wants TLS of the application and replication accounts: verify it with %s (mariadb --ssl-ca %[1]s); root still logs in over plain TCP on loopback.\n", t.CAFile)
		}
		curlAuth = ` -H "authorization: Bearer $TRIAGE_TOKEN"`
		grpcAuth = ` -H "authorization: Bearer $TRIAGE_TOKEN"`
	}
	fmt.Fprintf(w, `
Try (namespace "default" exists):
  curl -s%[3]s -H "content-type: application/json" -X POST http://%[1]s/v1/namespaces/default/topics/emails/items \
       -d '{"items":[{"payload":"aGVsbG8=","priority":1}]}'
  curl -s%[3]s -H "content-type: application/json" -X POST http://%[1]s/v1/namespaces/default:dequeue \
       -d '{"topics":[{"topic":"emails","count":1}],"lease_duration":"30s"}'
  grpcurl -plaintext%[4]s -d '{"namespace":"default","topics":[{"topic":"emails","count":1}]}' %[2]s triage.v1.Queue/Dequeue
  .bin/triage enqueue emails "hello"   .bin/triage dequeue --ack emails
`, http, b.Layout.Regions[0].GRPC, curlAuth, grpcAuth)
	if len(b.Layout.Regions) > 1 {
		last := b.Layout.Regions[len(b.Layout.Regions)-1]
		fmt.Fprintf(w, `  # store in %[2]s through %[3]s's router, read it back through %[4]s's:
  curl -s%[6]s -H "content-type: application/json" -X POST http://%[1]s/v1/namespaces/default/topics/emails/items \
       -d '{"region":"%[2]s","items":[{"payload":"aGVsbG8="}]}'
  curl -s%[6]s -H "content-type: application/json" -X POST http://%[5]s/v1/namespaces/default:dequeue \
       -d '{"region":"%[2]s","topics":[{"topic":"emails","count":1}],"lease_duration":"30s"}'
`, http, b.Layout.Regions[1].Name, b.Layout.Regions[0].Name, last.Name, last.HTTP, curlAuth)
	}
	fmt.Fprint(w, "\nCtrl-C or \"make down\" stops everything.\n")
}

func downCommand() *cobra.Command {
	var dir string
	cmd := &cobra.Command{
		Use:     "down [flags]",
		GroupID: groupBed,
		Short:   "Stop the bed started by up (make down), by the PIDs in bed.json.",
		Args:    cli.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			err := bed.Down(dir, 30*time.Second)
			switch {
			case bed.ErrNotRunning(err):
				fmt.Fprintln(c.OutOrStdout(), "no bed is running")
				return nil
			case err != nil:
				return err
			}
			fmt.Fprintln(c.OutOrStdout(), "bed stopped")
			return nil
		},
	}
	cmd.Flags().StringVar(&dir, "dir", ".triage", "the bed's directory")
	return cmd
}

func benchCommand() *cobra.Command {
	var (
		cfg  bench.Config
		only string
	)
	cmd := &cobra.Command{
		Use:     "bench [flags]",
		GroupID: groupDrill,
		Short:   "Benchmarks beside their baselines (make bench).",
		Args:    cli.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			if only != "" {
				cfg.Only = strings.Split(only, ",")
			}
			_, err := bench.Run(c.Context(), cfg, c.OutOrStdout())
			return err
		},
	}
	f := cmd.Flags()
	f.BoolVar(&cfg.Quick, "quick", false, "short smoke run (under two minutes); numbers mean little")
	f.StringVar(&cfg.Dir, "dir", ".triage", "where bench.json goes")
	f.IntVar(&cfg.Shards, "shards", 2, "shard primaries of the benchmark bed")
	f.StringVar(&only, "only", "", "comma-separated scenarios to run (default: all): "+strings.Join(bench.Names, ", "))
	f.StringVar(&cfg.ProfileDir, "profile", "", "directory for a CPU profile per scenario (this process: load, node, NATS; not mariadbd)")
	f.StringVar(&cfg.TraceDir, "trace", "", "directory for an execution trace of the last 3 s of each scenario (go tool trace -pprof=sched FILE: where goroutines waited to run); costs CPU")
	return cmd
}

func drillCommand() *cobra.Command {
	var (
		bedKind, dir, project      string
		region, via                string
		shard                      uint
		warmup, hold, drain, lease time.Duration
		producers, consumers       int
		asJSON, noReport           bool
	)
	cmd := &cobra.Command{
		Use:     "drill [flags] SCENARIO",
		GroupID: groupDrill,
		Short:   "Run a failover drill against a running bed.",
		Long: fmt.Sprintf("Run a failover drill against a running bed (--bed process: of --dir; --bed compose: of --project): a workload on the routers of --via,\n"+
			"a fault in --region, the heal, and a report of what was lost, duplicated or undone.\n\nscenarios: %s",
			strings.Join(drill.Scenarios, ", ")),
		Args: cli.ExactArgs(1, "one SCENARIO"),
		RunE: func(c *cobra.Command, args []string) error {
			if producers < 1 || consumers < 1 || lease <= 0 || hold <= 0 || warmup < 0 || drain <= 0 {
				return cli.Usagef("--producers and --consumers must be at least 1; --lease, --hold and --drain positive; --warmup not negative")
			}
			target, err := openBed(c.Context(), bedKind, dir, project)
			if err != nil {
				return err
			}
			stdout := c.OutOrStdout()
			progress := stdout
			if asJSON {
				progress = c.ErrOrStderr()
			}
			var viaList []string
			if via != "" {
				viaList = strings.Split(via, ",")
			}
			rep, err := drill.Run(c.Context(), drill.Config{Scenario: args[0], Bed: target, Via: viaList, Region: region,
				Shard: uint32(shard), Warmup: warmup, Hold: hold, Drain: drain, Lease: lease,
				Producers: producers, Consumers: consumers, Progress: progress, Report: !noReport})
			if err != nil {
				if _, ok := errors.AsType[*drill.ConfigError](err); ok {
					return cli.Usagef("%v", err)
				}
				return err
			}
			return printReport(stdout, rep, asJSON, len(rep.Violations))
		},
	}
	f := cmd.Flags()
	f.StringVar(&bedKind, "bed", "process", "the bed to drill: process (make up; found by --dir) or compose (make compose-up; found by --project)")
	f.StringVar(&dir, "dir", ".triage", "--bed process: the running bed's directory (bed.json)")
	f.StringVar(&project, "project", "triage", "--bed compose: the docker-compose project (COMPOSE_PROJECT_NAME)")
	f.StringVar(&region, "region", "us-east", "region to fault; the workload's items live there")
	f.StringVar(&via, "via", "", "comma-separated regions whose routers carry the workload (default: every region's, the faulted one included)")
	f.UintVar(&shard, "shard", 0, "primary-kill: the shard to kill (default: the region's lowest)")
	f.DurationVar(&warmup, "warmup", 5*time.Second, "workload before the fault")
	f.DurationVar(&hold, "hold", 15*time.Second, "how long the fault lasts before it is healed")
	f.DurationVar(&drain, "drain", 90*time.Second, "after the heal, how long to wait at most for every acknowledged item to be delivered")
	f.DurationVar(&lease, "lease", 5*time.Second, "lease the consumers take")
	f.IntVar(&producers, "producers", 2, "producers per router")
	f.IntVar(&consumers, "consumers", 2, "consumers per router")
	f.BoolVar(&asJSON, "json", false, "print the report as JSON (progress goes to stderr)")
	f.BoolVar(&noReport, "no-report", false, "do not report the drill's progress to the routers (ReportDrill; the console's Drills view)")
	return cmd
}

// printReport writes a drill's or the nemesis's report, as indented JSON
// or for a reader, and exits 1 when it found violations.
func printReport(w io.Writer, rep interface{ Print(io.Writer) }, asJSON bool, violations int) error {
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(rep)
	} else {
		rep.Print(w)
	}
	if violations > 0 {
		return cli.Exit(1)
	}
	return nil
}
