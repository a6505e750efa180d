package main

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/triage-queue/triage/cmd/internal/cli"
	"github.com/triage-queue/triage/cmd/triage/bootstrap"
	"github.com/triage-queue/triage/cmd/triage/natsserver"
	"github.com/triage-queue/triage/shardmap"
)

// The verbs of this file run inside the compose bed's containers
// (deploy/compose), whose Triage image is FROM scratch: no shell, so the
// binary brings its own NATS server, bootstrap and health probe.

// natsCommand runs one embedded NATS server with JetStream, clustered with
// --routes, until a signal. By default it listens on loopback, requires the
// Triage login (--triage-password-file, or --no-auth to serve without
// logins) and serves no monitoring port.
func natsCommand() *cobra.Command {
	n := &natsFlags{}
	cmd := &cobra.Command{
		Use:     "nats [flags]",
		GroupID: groupCompose,
		Short:   "Run an embedded NATS server with JetStream, clustered by --routes.",
		Long: `Run an embedded NATS server with JetStream, clustered by --routes.

It listens on 127.0.0.1 unless --host says otherwise, and refuses to start
without --triage-password-file (the login of Triage's own processes)
unless --no-auth: without logins anyone who reaches the port may publish
on Triage's internal subjects and rewrite the shard map. The monitoring
port (/healthz, /varz, /routez ...) is off unless --http-port is given.`,
		Args: cli.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			cfg, err := n.config()
			if err != nil {
				return err
			}
			return serveNATS(c, cfg)
		},
	}
	n.register(cmd.Flags())
	return cmd
}

// natsFlags are the flags of `triage nats`: the server's Config where a
// flag maps onto a field, and the raw values of the rest (cluster, logins,
// TLS files), which config checks and turns into Config.
type natsFlags struct {
	cfg                   natsserver.Config
	cluster, routes, tags string
	clusterPort           int
	triageUser, triagePW  string
	clientUser, clientPW  string
	routeUser, routePW    string
	noAuth                bool
	tlsFiles              natsserver.TLS
}

// register adds the flags of `triage nats` to f.
func (n *natsFlags) register(f *pflag.FlagSet) {
	f.StringVar(&n.cfg.Name, "name", "triage", "server name (unique in the cluster)")
	f.StringVar(&n.cfg.Host, "host", "127.0.0.1", "listen host of every port (0.0.0.0: every interface)")
	f.IntVar(&n.cfg.Port, "port", 4222, "client port")
	f.IntVar(&n.cfg.HTTPPort, "http-port", 0, "monitoring port (/healthz, /varz, /routez ..., no login), e.g. 8222; 0 for none")
	f.StringVar(&n.cfg.StoreDir, "store", "/data/nats", "JetStream store directory")
	f.StringVar(&n.cluster, "cluster", "triage", "cluster name (with --routes)")
	f.IntVar(&n.clusterPort, "cluster-port", 6222, "route port (with --routes)")
	f.StringVar(&n.cfg.ClusterAdvertise, "cluster-advertise", "", "route address to tell peers (host:port), e.g. the WAN name")
	f.StringVar(&n.routes, "routes", "", "comma-separated peer routes, nats-route://host:port; empty: standalone")
	f.StringVar(&n.tags, "tags", "", "comma-separated server tags for placement, e.g. region:us-east")
	f.StringVar(&n.triageUser, "triage-user", "triage", "user of Triage's own processes (may use triage.*, JetStream, KV)")
	f.StringVar(&n.triagePW, "triage-password-file", "", "file with the Triage user's password; required unless --no-auth")
	f.BoolVar(&n.noAuth, "no-auth", false, "serve every client without a login (tests, a host of its own)")
	f.StringVar(&n.clientUser, "client-user", "client", "user for everyone else (refused on triage.*, JetStream, KV)")
	f.StringVar(&n.clientPW, "client-password-file", "", "file with the client user's password (default: no client user)")
	f.StringVar(&n.routeUser, "route-user", "route", "user every route must log in as (with --route-password-file)")
	f.StringVar(&n.routePW, "route-password-file", "", "file with the route user's password; refuses routes without it (default: anyone who reaches the route port joins)")
	f.StringVar(&n.tlsFiles.CertFile, "tls-cert", "", "PEM certificate of the server; with --tls-key, clients must use TLS (default: plain TCP)")
	f.StringVar(&n.tlsFiles.KeyFile, "tls-key", "", "PEM private key of --tls-cert")
	f.StringVar(&n.tlsFiles.CAFile, "tls-ca", "", "PEM CA bundle that signs client certificates (--tls-verify-clients) and peers' (--tls-routes)")
	f.BoolVar(&n.tlsFiles.VerifyClients, "tls-verify-clients", false, "require a client certificate of --tls-ca (mTLS)")
	f.BoolVar(&n.tlsFiles.Routes, "tls-routes", false, "encrypt the routes too, each end verifying the other against --tls-ca")
}

// config checks the flags and builds the server's Config: the client
// logins, the cluster and its route login, and TLS. A combination that
// would leave a flag without effect, or the server open to anyone, is a
// usage error.
func (n *natsFlags) config() (natsserver.Config, error) {
	cfg := &n.cfg
	cfg.NoAdvertise, cfg.Tags = true, split(n.tags)
	a, err := n.auth()
	if err != nil {
		return natsserver.Config{}, err
	}
	cfg.Auth = a
	if r := split(n.routes); len(r) > 0 {
		cfg.ClusterName, cfg.ClusterPort, cfg.Routes = n.cluster, n.clusterPort, r
	}
	if n.routePW != "" {
		if cfg.ClusterName == "" {
			return natsserver.Config{}, cli.Usagef("--route-password-file needs --routes")
		}
		pw, err := shardmap.Secret("nats route user "+n.routeUser, "", n.routePW, "")
		if err != nil {
			return natsserver.Config{}, err
		}
		cfg.RouteAuth = &natsserver.Login{User: n.routeUser, Password: pw}
	}
	if n.tlsFiles.CertFile != "" || n.tlsFiles.KeyFile != "" {
		cfg.TLS = &n.tlsFiles
	} else if n.tlsFiles.CAFile != "" || n.tlsFiles.VerifyClients || n.tlsFiles.Routes {
		return natsserver.Config{}, cli.Usagef("--tls-ca, --tls-verify-clients and --tls-routes need --tls-cert and --tls-key")
	}
	return *cfg, nil
}

// auth returns the client logins the flags ask for: nil with --no-auth,
// else the Triage login and, with --client-password-file, the client
// one. Serving without a login must be asked for, since anyone who
// reaches the port could then rewrite the shard map.
func (n *natsFlags) auth() (*natsserver.Auth, error) {
	switch {
	case n.triagePW != "" && n.noAuth:
		return nil, cli.Usagef("--no-auth and --triage-password-file: choose one")
	case n.triagePW != "":
		return natsAuth(n.triageUser, n.triagePW, n.clientUser, n.clientPW)
	case n.clientPW != "":
		return nil, cli.Usagef("--client-password-file needs --triage-password-file: without the Triage login nobody is refused anything")
	case !n.noAuth:
		return nil, cli.Usagef("no login: give --triage-password-file (and --client-password-file for other clients), or --no-auth to let every client in without one")
	}
	return nil, nil
}

// serveNATS starts the server of cfg, says on stderr where it serves (and
// warns when plain TCP leaves loopback), and shuts it down when the
// command's context ends.
func serveNATS(c *cobra.Command, cfg natsserver.Config) error {
	s, err := natsserver.Start(cfg)
	if err != nil {
		return err
	}
	monitoring := "monitoring off"
	if cfg.HTTPPort != 0 {
		monitoring = "monitoring " + net.JoinHostPort(cfg.Host, strconv.Itoa(cfg.HTTPPort))
	}
	fmt.Fprintf(c.ErrOrStderr(), "triage nats: %s serving %s (routes %v, %s)\n", cfg.Name, s.ClientURL(), cfg.Routes, monitoring)
	if cfg.TLS == nil && !loopbackHost(cfg.Host) {
		fmt.Fprintf(c.ErrOrStderr(), "triage nats: plain TCP on %s: logins and envelopes cross the network in the clear (--tls-cert, --tls-key)\n", cfg.Host)
	}
	<-c.Context().Done()
	s.Shutdown()
	s.WaitForShutdown()
	return nil
}

// natsAuth reads the logins of `triage nats` from their password files.
func natsAuth(triageUser, triageFile, clientUser, clientFile string) (*natsserver.Auth, error) {
	pw, err := shardmap.Secret("nats user "+triageUser, "", triageFile, "")
	if err != nil {
		return nil, err
	}
	a := &natsserver.Auth{Triage: natsserver.Login{User: triageUser, Password: pw}}
	if clientFile != "" {
		if pw, err = shardmap.Secret("nats user "+clientUser, "", clientFile, ""); err != nil {
			return nil, err
		}
		a.Clients = append(a.Clients, natsserver.Login{User: clientUser, Password: pw})
	}
	return a, nil
}

// loopbackHost reports whether the listen host reaches loopback only.
func loopbackHost(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// split returns the comma-separated fields of a flag, trimmed, without
// empty ones.
func split(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// bootstrapCommand runs bootstrap.Run from a config file.
func bootstrapCommand() *cobra.Command {
	var config *cli.ConfigFile
	cmd := &cobra.Command{
		Use:     "bootstrap --config FILE [flags]",
		GroupID: groupCompose,
		Short:   "Set up the accounts, schema, replication, buckets and shard map of a bed.",
		Args:    cli.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			var cfg bootstrap.Config
			log, err := config.Load(c, &cfg)
			if err != nil {
				return err
			}
			return bootstrap.Run(c.Context(), cfg, log)
		},
	}
	config = cli.AddConfigFlags(cmd, "cmd/triage/bootstrap.Config")
	return cmd
}

// probeCommand GETs a URL and exits 0 on a 2xx answer: a container health
// check for an image without curl.
func probeCommand() *cobra.Command {
	var (
		timeout time.Duration
		peers   int
	)
	cmd := &cobra.Command{
		Use:     "probe [flags] URL",
		GroupID: groupCompose,
		Short:   "GET URL and exit 0 on a 2xx answer (health checks in FROM-scratch images).",
		Long: `GET URL and exit 0 on a 2xx answer (health checks in FROM-scratch images).

With --nats-peers N, URL is a NATS server's monitoring address: its /healthz
must answer 2xx and its /routez must list routes to at least N other
servers. JetStream is healthy with a quorum, while core NATS delivers
between two servers only over their direct route: a cluster missing one
drops the replies between those two regions.`,
		Args: cli.ExactArgs(1, "one URL"),
		RunE: func(c *cobra.Command, args []string) error {
			ctx, cancel := context.WithTimeout(c.Context(), timeout)
			defer cancel()
			if peers == 0 {
				body, err := get(ctx, args[0])
				if err != nil {
					return err
				}
				_, err = c.OutOrStdout().Write(body)
				return err
			}
			base := strings.TrimRight(args[0], "/")
			if _, err := get(ctx, base+"/healthz"); err != nil {
				return err
			}
			body, err := get(ctx, base+"/routez")
			if err != nil {
				return err
			}
			names, err := routePeers(body)
			if err != nil {
				return fmt.Errorf("%s/routez: %w", base, err)
			}
			if len(names) < peers {
				return fmt.Errorf("routes to %d other server(s) %v, want %d", len(names), names, peers)
			}
			_, err = fmt.Fprintf(c.OutOrStdout(), "ok: routes to %v\n", names)
			return err
		},
	}
	cmd.Flags().DurationVar(&timeout, "timeout", 3*time.Second, "give up after this long")
	cmd.Flags().IntVar(&peers, "nats-peers", 0, "URL is a NATS monitoring address; require /healthz and routes to this many other servers")
	return cmd
}

// get GETs url and returns its body (up to 1 MiB), or an error for an
// answer other than 2xx.
func get(ctx context.Context, url string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, cli.Usagef("%v", err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode/100 != 2 {
		return nil, fmt.Errorf("%s: %s %s", url, resp.Status, strings.TrimSpace(string(body[:min(len(body), 4096)])))
	}
	return body, nil
}

// routePeers reads a NATS /routez answer and returns the names of the
// servers it has routes to, each once (a route pool holds several
// connections per server).
func routePeers(body []byte) ([]string, error) {
	var rz struct {
		Routes []struct {
			RemoteID   string `json:"remote_id"`
			RemoteName string `json:"remote_name"`
		} `json:"routes"`
	}
	if err := json.Unmarshal(body, &rz); err != nil {
		return nil, err
	}
	var names []string
	for _, r := range rz.Routes {
		if n := cmp.Or(r.RemoteName, r.RemoteID); n != "" && !slices.Contains(names, n) {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	return names, nil
}
