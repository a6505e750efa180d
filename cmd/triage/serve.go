package main

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/triage-queue/triage/cmd/internal/cli"
	"github.com/triage-queue/triage/cmd/triage/node"
)

// nodeStartTimeout bounds one attempt at a node's start: connecting to
// NATS, loading the shard map, migrating the shards.
const nodeStartTimeout = time.Minute

// startRetryMax caps the wait between start attempts.
const startRetryMax = 10 * time.Second

// startNode starts the node, again and again while the start fails for a
// reason that passes (NATS, its JetStream or a shard primary not
// answering yet), until ctx ends: a process restarted while another fault
// holds the KV buckets without a quorum, or started before its NATS
// server, waits for them instead of exiting, which under a supervisor
// that does not restart it would leave the role down for good. A config
// error ends it at once.
func startNode(ctx context.Context, cfg node.Config, log *slog.Logger) (*node.Node, error) {
	wait := time.Second
	for {
		startCtx, cancel := context.WithTimeout(ctx, nodeStartTimeout)
		n, err := node.Start(startCtx, cfg, log)
		cancel()
		if err == nil || !transient(err) || ctx.Err() != nil {
			return n, err
		}
		log.Warn("node did not start; retrying", "in", wait, "err", err)
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(wait):
		}
		wait = min(2*wait, startRetryMax)
	}
}

// transient reports whether a start failed on something that passes: a
// timeout, NATS or JetStream not answering, a network error, a MySQL
// connection lost.
func transient(err error) bool {
	var apiErr *jetstream.APIError
	var netErr net.Error
	var opErr *net.OpError
	switch {
	case errors.As(err, &opErr) && opErr.Op == "listen":
		return false // an address in use or not ours: the config's
	case errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, nats.ErrTimeout), errors.Is(err, nats.ErrNoServers), errors.Is(err, nats.ErrNoResponders),
		errors.Is(err, nats.ErrConnectionClosed), errors.Is(err, nats.ErrConnectionReconnecting),
		errors.Is(err, jetstream.ErrNoStreamResponse), errors.Is(err, nats.ErrNoStreamResponse),
		errors.Is(err, mysql.ErrInvalidConn), errors.Is(err, driver.ErrBadConn):
		return true
	case errors.As(err, &apiErr):
		// 503: JetStream or a stream without a leader; 408 and 504:
		// timeouts inside the cluster.
		return apiErr.Code == 503 || apiErr.Code == 408 || apiErr.Code == 504
	case errors.As(err, &netErr):
		return true
	}
	return false
}

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
			n, err := startNode(ctx, cfg, log)
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
