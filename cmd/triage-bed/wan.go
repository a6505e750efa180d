package main

import (
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/triage-queue/triage/cmd/internal/cli"
	"github.com/triage-queue/triage/deploy/wan"
)

// wanCommand runs a region's WAN gateway (wan.Gateway) of the compose bed
// until a signal. SIGUSR1 starts a latency spike (the config's spike,
// wan.Gateway.Spike) and SIGUSR2 ends it: the compose bed's wan-spike
// fault, sent with docker kill --signal. It lives in triage-bed, not triage: a simulated WAN is
// part of the test bed, and deploy/wan links toxiproxy, which the
// production binary must not (TestServeDoesNotLinkTheBed). The compose
// images carry both binaries.
func wanCommand() *cobra.Command {
	var config *cli.ConfigFile
	cmd := &cobra.Command{
		Use:     "wan --config FILE [flags]",
		GroupID: groupBed,
		Short:   "Run a region's WAN gateway of the compose bed: delays what leaves the region.",
		Args:    cli.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			var cfg wan.GatewayConfig
			log, err := config.Load(c, &cfg)
			if err != nil {
				return err
			}
			g, err := wan.StartGateway(cfg, log)
			if err != nil {
				return err
			}
			spikes := make(chan os.Signal, 1)
			signal.Notify(spikes, syscall.SIGUSR1, syscall.SIGUSR2)
			defer signal.Stop(spikes)
			for {
				select {
				case <-c.Context().Done():
					g.Close()
					return nil
				case s := <-spikes:
					if s == syscall.SIGUSR1 {
						g.Spike(g.ConfiguredSpike())
					} else {
						g.Spike(0)
					}
				}
			}
		},
	}
	config = cli.AddConfigFlags(cmd, "deploy/wan.GatewayConfig")
	return cmd
}
