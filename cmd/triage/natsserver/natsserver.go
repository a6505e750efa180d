package natsserver

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Config for one embedded server.
type Config struct {
	// Name of the server. Default "triage".
	Name string
	// Host to listen on. Default 127.0.0.1.
	Host string
	// Port for clients; 0 picks a free one.
	Port int
	// StoreDir holds JetStream data. Required.
	StoreDir string
	// ClusterName and ClusterPort join a cluster with Routes (nats://h:p).
	// Empty ClusterName: standalone.
	ClusterName string
	ClusterPort int
	Routes      []string
	// ClusterAdvertise is the route address this server tells its peers
	// about; they dial it when they learn of the server through another
	// one (gossip). Default: its cluster listen address. The local bed,
	// whose routes must all go through WAN proxies, sets an address that
	// refuses connections, so gossip never opens a direct route.
	ClusterAdvertise string
	// NoAdvertise keeps the server from telling its clients the other
	// cluster members' client URLs, so a client reconnects only to the
	// servers it was given (its own region's, in the bed).
	NoAdvertise bool
	// Tags are server tags for JetStream placement, e.g. "region:us-east".
	Tags []string
	// SyncInterval is JetStream's fsync interval. Default: the server's
	// (2 minutes). Triage acknowledges committed enqueues only after the
	// MariaDB commit, so this bounds only what BUFFERED enqueues can lose.
	SyncInterval time.Duration
	// HTTPPort, when set, serves the monitoring endpoints (/healthz,
	// /varz, /jsz ...) on Host. Default none. The compose bed's health
	// check asks /healthz, which fails until JetStream is current.
	HTTPPort int
	// Auth, when set, requires a login of every client (see Auth).
	// Default: none.
	Auth *Auth
	// TLS, when set, makes the client port TLS only (a plaintext client
	// is refused) and, with TLS.Routes, the routes too. Default: plain
	// TCP.
	TLS *TLS
	// RouteAuth, when set, is the login every route must present: a
	// server that dials this one's route port without it is refused and
	// never joins the cluster. The server presents it on the routes it
	// dials (Routes, unless a URL carries its own user info) and on the
	// routes gossip opens, so every server of a cluster gets the same.
	// Without TLS.Routes it crosses the network in the clear. Default:
	// none, anyone who reaches the route port joins.
	RouteAuth *Login
}

// tlsTimeout is how long a TLS handshake may take, in seconds. The
// server's default (2s) is tight for a route across a slow WAN link.
const tlsTimeout = 5

// Start runs a server and waits until it accepts clients. The process's
// first Start sets nats-server's Raft timing (raft.go).
func Start(cfg Config) (*server.Server, error) {
	tuneRaft()
	if cfg.StoreDir == "" {
		return nil, fmt.Errorf("natsserver: StoreDir is required")
	}
	if cfg.Host == "" {
		cfg.Host = "127.0.0.1"
	}
	if cfg.Name == "" {
		cfg.Name = "triage"
	}
	opts, err := options(cfg)
	if err != nil {
		return nil, err
	}
	return run(opts)
}

// options turns cfg, its defaults filled in, into nats-server's Options:
// JetStream on, the server's own signal handling and logging off, messages
// up to 8 MiB, and the logins, TLS and cluster cfg asks for.
func options(cfg Config) (*server.Options, error) {
	port := cfg.Port
	if port == 0 {
		port = server.RANDOM_PORT
	}
	opts := &server.Options{
		ServerName:         cfg.Name,
		Host:               cfg.Host,
		Port:               port,
		JetStream:          true,
		StoreDir:           cfg.StoreDir,
		SyncInterval:       cfg.SyncInterval,
		NoSigs:             true,
		NoLog:              true,
		MaxPayload:         8 << 20,
		JetStreamMaxMemory: 256 << 20,
		JetStreamMaxStore:  8 << 30,
		Tags:               cfg.Tags,
		HTTPHost:           cfg.Host,
		HTTPPort:           cfg.HTTPPort,
	}
	if cfg.Auth != nil {
		users, err := cfg.Auth.users()
		if err != nil {
			return nil, err
		}
		opts.Users = users
	}
	if cfg.TLS != nil {
		tc, err := cfg.TLS.clientConfig()
		if err != nil {
			return nil, err
		}
		opts.TLS, opts.TLSVerify, opts.TLSConfig, opts.TLSTimeout = true, cfg.TLS.VerifyClients, tc, tlsTimeout
	}
	switch {
	case cfg.ClusterName != "":
		if err := clusterOptions(opts, cfg); err != nil {
			return nil, err
		}
	case cfg.RouteAuth != nil || (cfg.TLS != nil && cfg.TLS.Routes):
		return nil, errors.New("natsserver: route auth and route TLS need a cluster (ClusterName)")
	}
	return opts, nil
}

// clusterOptions fills in opts's cluster: its listener, the route login
// every peer must present, route TLS, and the routes to dial. A route
// URL without user info gets the route login, so this server can join
// peers that require it.
func clusterOptions(opts *server.Options, cfg Config) error {
	opts.Cluster = server.ClusterOpts{Name: cfg.ClusterName, Host: cfg.Host, Port: cfg.ClusterPort,
		Advertise: cfg.ClusterAdvertise, NoAdvertise: cfg.NoAdvertise}
	if a := cfg.RouteAuth; a != nil {
		if a.User == "" || a.Password == "" {
			return errors.New("natsserver: route auth needs a user and a password")
		}
		opts.Cluster.Username, opts.Cluster.Password = a.User, a.Password
	}
	if cfg.TLS != nil && cfg.TLS.Routes {
		tc, err := cfg.TLS.routeConfig()
		if err != nil {
			return err
		}
		opts.Cluster.TLSConfig, opts.Cluster.TLSTimeout = tc, tlsTimeout
	}
	for _, r := range cfg.Routes {
		u, err := url.Parse(r)
		if err != nil {
			return fmt.Errorf("natsserver: route %q: %w", r, err)
		}
		if a := cfg.RouteAuth; a != nil && u.User == nil {
			u.User = url.UserPassword(a.User, a.Password)
		}
		opts.Routes = append(opts.Routes, u)
	}
	return nil
}

// run starts a server with opts and waits up to readyWithin for it to
// accept clients. A listener that cannot bind is a fatal error to the
// server, which then never becomes ready: run reports it at once, with
// its cause, rather than wait out the deadline.
func run(opts *server.Options) (*server.Server, error) {
	s, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("natsserver: %w", err)
	}
	fatal := fatalLogger(make(chan string, 1))
	s.SetLoggerV2(fatal, false, false, false)
	go s.Start()
	for deadline := time.Now().Add(readyWithin); ; {
		select {
		case msg := <-fatal:
			s.Shutdown()
			return nil, fmt.Errorf("natsserver: %s", msg)
		default:
		}
		if s.ReadyForConnections(50 * time.Millisecond) {
			return s, nil
		}
		if time.Now().After(deadline) {
			s.Shutdown()
			return nil, fmt.Errorf("natsserver: not ready within %v", readyWithin)
		}
	}
}

// readyWithin bounds how long Start waits for the server's listeners.
const readyWithin = 10 * time.Second

// fatalLogger keeps the server as quiet as NoLog does, but hands the
// first fatal error (a port that cannot be bound, JetStream that cannot
// start) to Start.
type fatalLogger chan string

func (l fatalLogger) Fatalf(format string, v ...any) {
	select {
	case l <- fmt.Sprintf(format, v...):
	default:
	}
}
func (fatalLogger) Noticef(string, ...any) {}
func (fatalLogger) Warnf(string, ...any)   {}
func (fatalLogger) Errorf(string, ...any)  {}
func (fatalLogger) Debugf(string, ...any)  {}
func (fatalLogger) Tracef(string, ...any)  {}

// Port returns the client port a started server listens on.
func Port(s *server.Server) int {
	return s.Addr().(*net.TCPAddr).Port
}
