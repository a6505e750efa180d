package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/spf13/cobra"

	"github.com/triage-queue/triage/cmd/internal/cli"
	"github.com/triage-queue/triage/cmd/triage/node"
)

// nodeStartTimeout bounds a node's start: connecting to NATS, loading the
// shard map, migrating the shards.
const nodeStartTimeout = time.Minute

func serveCommand() *cobra.Command {
	var health string
	var insecure bool
	var config *cli.ConfigFile
	cmd := &cobra.Command{
		Use:     "serve --config FILE [flags]",
		GroupID: groupService,
		Short:   "Run the roles of a node config file until a signal.",
		Args:    cli.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			var cfg node.Config
			log, err := config.Load(c, &cfg)
			if err != nil {
				return err
			}
			cfg.Insecure = cfg.Insecure || insecure
			ctx := c.Context()
			startCtx, cancel := context.WithTimeout(ctx, nodeStartTimeout)
			n, err := node.Start(startCtx, cfg, log)
			cancel()
			if err != nil {
				return err
			}
			if health != "" {
				stopHealth, err := serveHealth(health, n)
				if err != nil {
					n.Stop()
					return err
				}
				defer stopHealth()
			}
			select {
			case <-ctx.Done():
			case <-n.Done():
			}
			log.Info("stopping")
			n.Stop()
			return nil
		},
	}
	config = cli.AddConfigFlags(cmd, "cmd/triage/node.Config")
	cmd.Flags().StringVar(&health, "health", "", "serve GET /healthz on this address (NATS, shard map, the region's primaries; its answer names them, so bind it to loopback)")
	cmd.Flags().BoolVar(&insecure, "insecure", false, "let a router without keys_file listen on addresses other than loopback, open to everyone (as config \"insecure\": true)")
	return cmd
}

// serveHealth serves GET /healthz on addr: 200 "ok" while n.Healthy, else
// 503 with the reason. The returned function stops it.
func serveHealth(addr string, n *node.Node) (func(), error) {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		hctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		w.Header().Set("Content-Type", "text/plain")
		if err := n.Healthy(hctx); err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintln(w, err)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("health listener: %w", err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(lis) }()
	return func() { _ = srv.Close() }, nil
}
