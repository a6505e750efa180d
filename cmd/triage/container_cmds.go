package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/triage-queue/triage/deploy/compose"
	"github.com/triage-queue/triage/deploy/natsserver"
	"github.com/triage-queue/triage/deploy/node"
	"github.com/triage-queue/triage/deploy/wan"
)

// The verbs of this file run inside the compose bed's containers
// (deploy/compose), whose Triage image is FROM scratch: no shell, so the
// binary brings its own NATS server, bootstrap and health probe.

// natsCmd runs one embedded NATS server with JetStream, clustered with
// --routes, until a signal.
func natsCmd(ctx context.Context, args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("nats", flag.ContinueOnError)
	fs.SetOutput(stderr)
	name := fs.String("name", "triage", "server name (unique in the cluster)")
	host := fs.String("host", "0.0.0.0", "listen host of every port")
	port := fs.Int("port", 4222, "client port")
	httpPort := fs.Int("http-port", 8222, "monitoring port (/healthz); 0 for none")
	store := fs.String("store", "/data/nats", "JetStream store directory")
	cluster := fs.String("cluster", "triage", "cluster name (with --routes)")
	clusterPort := fs.Int("cluster-port", 6222, "route port (with --routes)")
	advertise := fs.String("cluster-advertise", "", "route address to tell peers (host:port), e.g. the WAN name")
	routes := fs.String("routes", "", "comma-separated peer routes, nats-route://host:port; empty: standalone")
	tags := fs.String("tags", "", "comma-separated server tags for placement, e.g. region:us-east")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	cfg := natsserver.Config{Name: *name, Host: *host, Port: *port, HTTPPort: *httpPort, StoreDir: *store,
		ClusterAdvertise: *advertise, NoAdvertise: true, Tags: split(*tags)}
	if r := split(*routes); len(r) > 0 {
		cfg.ClusterName, cfg.ClusterPort, cfg.Routes = *cluster, *clusterPort, r
	}
	s, err := natsserver.Start(cfg)
	if err != nil {
		fmt.Fprintln(stderr, "triage nats:", err)
		return 1
	}
	fmt.Fprintf(stderr, "triage nats: %s serving %s (routes %v, monitoring :%d)\n", *name, s.ClientURL(), cfg.Routes, *httpPort)
	<-ctx.Done()
	s.Shutdown()
	s.WaitForShutdown()
	return 0
}

func split(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// wanCmd runs a region's WAN gateway (wan.Gateway) until a signal.
func wanCmd(ctx context.Context, args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("wan", flag.ContinueOnError)
	fs.SetOutput(stderr)
	config := fs.String("config", "", "gateway config file (JSON; see deploy/wan.GatewayConfig)")
	level := fs.String("log-level", "info", "debug, info, warn or error")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	var cfg wan.GatewayConfig
	if err := readJSON(*config, &cfg); err != nil {
		fmt.Fprintln(stderr, "triage wan:", err)
		return 2
	}
	g, err := wan.StartGateway(cfg, logger(stderr, *level))
	if err != nil {
		fmt.Fprintln(stderr, "triage wan:", err)
		return 1
	}
	<-ctx.Done()
	g.Close()
	return 0
}

// bootstrapCmd runs compose.Bootstrap from a config file.
func bootstrapCmd(ctx context.Context, args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("bootstrap", flag.ContinueOnError)
	fs.SetOutput(stderr)
	config := fs.String("config", "", "bootstrap config file (JSON; see deploy/compose.Config)")
	level := fs.String("log-level", "info", "debug, info, warn or error")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	var cfg compose.Config
	if err := readJSON(*config, &cfg); err != nil {
		fmt.Fprintln(stderr, "triage bootstrap:", err)
		return 2
	}
	if err := compose.Bootstrap(ctx, cfg, logger(stderr, *level)); err != nil {
		fmt.Fprintln(stderr, "triage bootstrap:", err)
		return 1
	}
	return 0
}

// readJSON decodes file into v, refusing unknown fields.
func readJSON(file string, v any) error {
	if file == "" {
		return errors.New("--config is required")
	}
	data, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	dec := json.NewDecoder(strings.NewReader(string(data)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%s: %w", file, err)
	}
	return nil
}

// probeCmd GETs a URL and exits 0 on a 2xx answer: a container health
// check for an image without curl.
func probeCmd(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("probe", flag.ContinueOnError)
	fs.SetOutput(stderr)
	timeout := fs.Duration("timeout", 3*time.Second, "give up after this long")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() != 1 {
		fmt.Fprintln(stderr, "usage: triage probe [--timeout D] URL")
		return 2
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fs.Arg(0), nil)
	if err != nil {
		fmt.Fprintln(stderr, "triage probe:", err)
		return 2
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		fmt.Fprintln(stderr, "triage probe:", err)
		return 1
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode/100 != 2 {
		fmt.Fprintf(stderr, "triage probe: %s: %s %s\n", fs.Arg(0), resp.Status, strings.TrimSpace(string(body)))
		return 1
	}
	fmt.Fprint(stdout, string(body))
	return 0
}

// serveHealth serves GET /healthz on addr: 200 "ok" while n.Healthy, else
// 503 with the reason. It stops when ctx ends.
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
	srv := &http.Server{Addr: addr, Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.ListenAndServe() }()
	select {
	case err := <-errc:
		return nil, fmt.Errorf("health listener %s: %w", addr, err)
	case <-time.After(100 * time.Millisecond):
	}
	return func() { _ = srv.Close() }, nil
}
