package main

import (
	"context"
	"fmt"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/spf13/pflag"

	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
)

func init() {
	clientVerbs["failover"] = clientVerb{
		summary: "Move a shard's primary to one of its replicas (--to REGION picks the replica's region).\n" +
			"Planned by default: the old primary goes read-only first and nothing is lost; --emergency\n" +
			"fails over a primary that is down (after waiting out writers that may still trust it).",
		setup: failoverCmd,
	}
}

func failoverCmd(fs *pflag.FlagSet) clientRun {
	shard := fs.Uint("shard", 0, "shard to fail over (required)")
	to := fs.String("to", "", "region of the replica to promote (default: the most advanced replica)")
	emergency := fs.Bool("emergency", false, "the primary is down: do not require it to go read-only first")
	return func(ctx context.Context, e *clientEnv, _ []string) error {
		if *shard == 0 {
			return usagef("give --shard N")
		}
		rctx, cancel := e.rpc(ctx, 90*time.Second)
		defer cancel()
		resp, err := e.c.Admin.Failover(rctx, &triagev1.FailoverRequest{Shard: uint32(*shard), ToRegion: *to, Planned: !*emergency})
		if e.json && resp != nil {
			if perr := printJSON(e.stdout, resp); perr != nil {
				return perr
			}
		} else if resp != nil {
			tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
			for _, ev := range resp.Events {
				fmt.Fprintf(tw, "%s\t%s\t%s\n", ev.At.AsTime().Format("15:04:05.000"), ev.Step, ev.Details)
			}
			tw.Flush()
			if err == nil {
				fmt.Fprintf(e.stdout, "shard %d: primary %s, epoch %s\n", *shard, resp.NewPrimary, strconv.FormatUint(resp.Epoch, 10))
			}
		}
		return err
	}
}
