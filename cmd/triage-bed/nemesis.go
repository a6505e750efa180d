package main

import (
	"context"
	"errors"
	"time"

	"github.com/spf13/cobra"

	"github.com/triage-queue/triage/cmd/internal/cli"
	"github.com/triage-queue/triage/deploy/bed"
	"github.com/triage-queue/triage/deploy/compose"
	"github.com/triage-queue/triage/deploy/drill"
)

// openBed opens the bed --bed names: the process bed of --dir or the
// compose bed of --project.
func openBed(ctx context.Context, kind, dir, project string) (drill.Bed, error) {
	switch kind {
	case "process":
		return bed.Dial(dir)
	case "compose":
		return compose.Open(ctx, project)
	}
	return nil, cli.Usagef("--bed %q: want process or compose", kind)
}

func nemesisCommand() *cobra.Command {
	var (
		bedKind, dir, project, region string
		duration, lease, drain        time.Duration
		seed                          uint64
		producers, consumers          int
		asJSON                        bool
	)
	cmd := &cobra.Command{
		Use:     "nemesis [flags]",
		GroupID: groupDrill,
		Short:   "Run the workload through every router while a seeded schedule injects and heals faults; check the whole history.",
		Long: "Run the drills' workload (idempotent producers with dedup keys and retries, consumers that ack, nack and crash)\n" +
			"through every router of a running bed while a schedule drawn from --seed injects and heals faults, one or two at a\n" +
			"time (primary-kill, partition, mariadb-pause held past the clients' timeouts, nats-kill, dequeuer-kill,\n" +
			"enqueuer-kill, wan-spike; a light fault may overlap another in another region; region-down may close the run), then drain and\n" +
			"check the whole history: nothing acknowledged lost, no ack or nack undone, no key delivered again after its ack,\n" +
			"nothing early. Exits 1 on any violation and prints the seed and the fault timeline, so the run can be replayed.",
		Args: cli.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			if duration <= 0 || lease <= 0 || drain <= 0 || producers < 1 || consumers < 1 {
				return cli.Usagef("--duration, --lease and --drain must be positive; --producers and --consumers at least 1")
			}
			target, err := openBed(c.Context(), bedKind, dir, project)
			if err != nil {
				return err
			}
			if seed == 0 {
				seed = uint64(time.Now().UnixNano())
			}
			stdout := c.OutOrStdout()
			progress := stdout
			if asJSON {
				progress = c.ErrOrStderr()
			}
			rep, err := drill.Nemesis(c.Context(), drill.NemesisConfig{Bed: target, Region: region, Duration: duration, Seed: seed,
				Lease: lease, Producers: producers, Consumers: consumers, Drain: drain, Progress: progress})
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
	f.StringVar(&bedKind, "bed", "process", "the bed: process (make up --multi-region; found by --dir) or compose (make compose-up; found by --project)")
	f.StringVar(&dir, "dir", ".triage", "--bed process: the running bed's directory (bed.json)")
	f.StringVar(&project, "project", "triage", "--bed compose: the docker-compose project (COMPOSE_PROJECT_NAME)")
	f.StringVar(&region, "region", "", "region whose shards hold the workload's items (default: the first)")
	f.DurationVar(&duration, "duration", 10*time.Minute, "how long faults are injected")
	f.Uint64Var(&seed, "seed", 0, "seed of the fault schedule (default: the clock; printed, to replay a run)")
	f.DurationVar(&lease, "lease", 5*time.Second, "lease the consumers take")
	f.DurationVar(&drain, "drain", 90*time.Second, "after the last heal, how long to wait at most for every acknowledged item to be delivered")
	f.IntVar(&producers, "producers", 2, "producers per router")
	f.IntVar(&consumers, "consumers", 2, "consumers per router")
	f.BoolVar(&asJSON, "json", false, "print the report as JSON (progress goes to stderr)")
	return cmd
}
