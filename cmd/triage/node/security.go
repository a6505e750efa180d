package node

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
	"github.com/triage-queue/triage/routing"
	"github.com/triage-queue/triage/routing/auth"
)

// security is what the router's listeners enforce: who may call what
// (routing/auth), TLS, and the limits on requests.
type security struct {
	cfg Config
	// public decides requests on the GRPC and HTTP listeners, admin on
	// the admin listeners. Without a keys file both admit everyone (as
	// "anonymous") but still split the admin RPCs and audit them.
	public, admin *auth.Authorizer
	tls           *tls.Config
	log           *slog.Logger
}

func (n *Node) security() (*security, error) {
	s := &security{cfg: n.cfg, log: n.log}
	var err error
	if n.cfg.TLS != nil {
		if s.tls, err = n.cfg.TLS.ServerConfig(n.log); err != nil {
			return nil, fmt.Errorf("node config: %w", err)
		}
	}
	var keys *auth.Keys
	if n.cfg.KeysFile != "" {
		if keys, err = auth.LoadKeys(n.cfg.KeysFile, n.log); err != nil {
			return nil, fmt.Errorf("node config keys_file: %w", err)
		}
	}
	split := n.cfg.AdminGRPC != "" || n.cfg.AdminHTTP != ""
	s.public = auth.New(keys, auth.Options{Logger: n.log, Snapshot: n.snapshot, ClusterElsewhere: split, NamespaceExists: n.namespaceExists})
	s.admin = auth.New(keys, auth.Options{Logger: n.log, Snapshot: n.snapshot, AdminOnly: true, NamespaceExists: n.namespaceExists})
	return s, nil
}

// grpcOptions are the options of a gRPC listener decided by a.
func (s *security) grpcOptions(a *auth.Authorizer) []grpc.ServerOption {
	opts := append(a.ServerOptions(),
		grpc.MaxHeaderListSize(uint32(s.cfg.MaxHeaderBytes)),
		grpc.MaxRecvMsgSize(int(s.cfg.MaxBodyBytes)),
		// A client that opens a connection and never finishes the
		// handshake is dropped.
		grpc.ConnectionTimeout(10*time.Second),
	)
	if s.tls != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(s.tls.Clone())))
	}
	return opts
}

// gatewayOptions are the options of a JSON gateway decided by a: the
// body limit, and a's check of the caller before a body is read.
func (s *security) gatewayOptions(a *auth.Authorizer) []routing.GatewayOption {
	return []routing.GatewayOption{routing.WithMaxBody(s.cfg.MaxBodyBytes), routing.WithAuthenticate(a.AuthenticateHTTP), routing.WithLogger(s.log)}
}

// httpServer is an HTTP listener's server with the limits of the config.
func (s *security) httpServer(h http.Handler) *http.Server {
	// Each listener gets its own copy of the TLS config (net/http sets up
	// HTTP/2 in it); they share the certificate reloader.
	var tc *tls.Config
	if s.tls != nil {
		tc = s.tls.Clone()
	}
	return &http.Server{Handler: auth.HTTP(h), TLSConfig: tc, MaxHeaderBytes: s.cfg.MaxHeaderBytes,
		ReadHeaderTimeout: 10 * time.Second, ReadTimeout: time.Duration(s.cfg.HTTPReadTimeout),
		WriteTimeout: time.Duration(s.cfg.HTTPWriteTimeout), IdleTimeout: 2 * time.Minute}
}

func (s *security) serveHTTP(srv *http.Server, l net.Listener) error {
	if s.tls != nil {
		return srv.ServeTLS(l, "", "") // the certificate comes from TLSConfig.GetCertificate
	}
	return srv.Serve(l)
}

// startAdmin serves the Admin service on Config.AdminGRPC and AdminHTTP.
func (n *Node) startAdmin(ctx context.Context, sec *security) error {
	if n.cfg.AdminGRPC != "" {
		l, err := net.Listen("tcp", n.cfg.AdminGRPC)
		if err != nil {
			return fmt.Errorf("admin grpc listen: %w", err)
		}
		n.AdminGRPCAddr = l.Addr().String()
		n.adminGRPC = routing.NewAdminGRPCServer(n.router, n.obs.health, append(n.obs.grpcOptions(), sec.grpcOptions(sec.admin)...)...)
		go func() { _ = n.adminGRPC.Serve(l) }()
	}
	if n.cfg.AdminHTTP != "" {
		gw, err := routing.NewGatewayFor(ctx, nil, auth.GuardAdmin(n.router.Admin(), sec.admin), nil, sec.gatewayOptions(sec.admin)...)
		if err != nil {
			return err
		}
		l, err := net.Listen("tcp", n.cfg.AdminHTTP)
		if err != nil {
			return fmt.Errorf("admin http listen: %w", err)
		}
		n.AdminHTTPAddr = l.Addr().String()
		n.adminHTTP = sec.httpServer(n.obs.traceHTTP(n.obs.logHTTP(gw)))
		go func() { _ = sec.serveHTTP(n.adminHTTP, l) }()
	}
	return nil
}

// snapshot is the state an admin RPC changes, for its audit line: the
// shard map version and the namespace or shard the request names, as
// JSON. Shard entries hold addresses, never credentials.
func (n *Node) snapshot(_ string, req any) any {
	m := n.maps.Current()
	out := map[string]any{"map_version": m.Version}
	if r, ok := req.(interface{ GetNamespace() string }); ok && r.GetNamespace() != "" {
		out["namespace"] = nil
		if ns, err := m.Namespace(r.GetNamespace()); err == nil {
			out["namespace"] = ns
		}
	}
	var shard uint32
	switch r := req.(type) {
	case interface{ GetShard() uint32 }:
		shard = r.GetShard()
	case *triagev1.AddShardRequest:
		shard = r.GetShard().GetId()
	}
	if shard != 0 {
		out["shard"] = nil
		if s, ok := m.Shard(shard); ok {
			out["shard"] = s
		}
	}
	data, err := json.Marshal(out)
	if err != nil {
		return err.Error()
	}
	return string(data)
}

// namespaceExists tells routing/auth whether PutNamespace would create
// the namespace (cluster-admin only) or change it (its admin may), by the
// node's current shard map: a namespace created a moment ago elsewhere
// may still count as new here, which refuses, never admits, too much.
func (n *Node) namespaceExists(ns string) bool {
	_, err := n.maps.Current().Namespace(ns)
	return err == nil
}
