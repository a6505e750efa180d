package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/triage-queue/triage/cmd/internal/cli"
	"github.com/triage-queue/triage/deploy/scale"
)

func scaleCommand() *cobra.Command {
	var (
		sizes, dir, out, triage, level string
		servers, topics, namespaces    int
		failover                       bool
		opt                            scale.Options
	)
	cmd := &cobra.Command{
		Use:     "scale [flags]",
		GroupID: groupBed,
		Short:   "Run the control plane at many shards (logical shards as databases on a few mariadbd) and measure it, size by size.",
		Args:    cli.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			w := c.OutOrStdout()
			if triage == "" {
				self, err := os.Executable()
				if err != nil {
					return err
				}
				triage = filepath.Join(filepath.Dir(self), "triage")
			}
			var failed []string
			for _, f := range strings.Split(sizes, ",") {
				n, err := strconv.Atoi(strings.TrimSpace(f))
				if err != nil || n < 1 {
					return cli.Usagef("--shards %q: want a comma-separated list of positive numbers", sizes)
				}
				fmt.Fprintf(w, "scale run: %d shards\n", n)
				rec, err := scale.Run(c.Context(), scale.Config{Dir: filepath.Join(dir, fmt.Sprintf("scale-%d", n)), Triage: triage, Shards: n,
					Servers: servers, Topics: topics, Namespaces: namespaces, Failover: failover, Logger: cli.Logger(c.ErrOrStderr(), level),
					Progress: func(line string) { fmt.Fprintln(w, "  "+line) }}, opt)
				if err != nil {
					return fmt.Errorf("%d shards: %w", n, err)
				}
				rec.Print(w)
				if err := scale.Save(out, *rec); err != nil {
					return err
				}
				for _, f := range rec.Failed() {
					failed = append(failed, fmt.Sprintf("%d shards: %s %.1f > %.0f", n, f.Name, f.Value, f.Limit))
				}
			}
			fmt.Fprintf(w, "records in %s\n", out)
			if len(failed) > 0 {
				return errors.New("bounds missed:\n  " + strings.Join(failed, "\n  "))
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&sizes, "shards", "10,100,1000", "comma-separated numbers of shards, one run each")
	f.IntVar(&servers, "servers", 0, "mariadbd servers the shards are spread over (default 4)")
	f.IntVar(&topics, "topics", 0, "topic configurations in the map (default 100 per shard, at most 100,000)")
	f.IntVar(&namespaces, "namespaces", 0, "namespaces (default topics/10)")
	f.BoolVar(&failover, "failover", false, "add regions eu-west and ap-south, each with a replica of every server and a controller, and end with a primary-kill drill of one server")
	f.DurationVar(&opt.FailoverHold, "failover-hold", 20*time.Second, "how long the failover drill holds the killed server down")
	f.StringVar(&dir, "dir", ".triage", "where the node configs and logs go (a scale-N folder per size)")
	f.StringVar(&out, "out", ".triage/scale.json", "the records file (one record per size, and one per size with --failover, replaced by a new run of that size and kind)")
	f.StringVar(&triage, "triage", "", "the triage binary the nodes run (default: the one beside triage-bed)")
	f.StringVar(&level, "log-level", "warn", "debug, info, warn or error")
	f.DurationVar(&opt.IdleFor, "idle-for", 20*time.Second, "how long idle CPU is sampled")
	f.StringVar(&opt.ProfileDir, "profile", "", "write a CPU profile of every node over the idle step into this folder")
	f.Float64Var(&opt.Rate, "rate", 200, "offered enqueue load during the load step (items/s)")
	f.DurationVar(&opt.LoadFor, "load-for", 20*time.Second, "length of the load step's measured part")
	f.DurationVar(&opt.WarmFor, "warm-for", 0, "load before the measured part, unmeasured (default: --load-for)")
	return cmd
}
