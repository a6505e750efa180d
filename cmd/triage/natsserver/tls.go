package natsserver

import (
	"crypto/tls"
	"errors"
	"fmt"

	"github.com/nats-io/nats-server/v2/server"
)

// TLS makes a server speak TLS to its clients and, with Routes, to the
// other servers of its cluster. Files are read once, at start.
type TLS struct {
	// CertFile and KeyFile are the server's PEM certificate (chain) and
	// private key. Both required.
	CertFile string
	KeyFile  string
	// CAFile is a PEM bundle of the CAs that sign client certificates
	// (VerifyClients) and the cluster peers' certificates (Routes).
	// Required with either.
	CAFile string
	// VerifyClients requires every client to present a certificate signed
	// by CAFile (mTLS), on top of its login. Default: clients need only
	// trust the server's certificate.
	VerifyClients bool
	// Routes encrypts the cluster's routes too, with the same certificate,
	// and requires every peer's certificate to be signed by CAFile (both
	// ways: a route is a client of its peer). The certificate must then
	// allow both server and client authentication (extended key usage).
	// Default: routes in the clear, which is only fit for a private
	// network; Config.RouteAuth still keeps strangers out.
	Routes bool
}

// clientConfig is the tls.Config of the client port.
func (t *TLS) clientConfig() (*tls.Config, error) {
	if t.CertFile == "" || t.KeyFile == "" {
		return nil, errors.New("natsserver: tls: cert and key files are both required")
	}
	if (t.VerifyClients || t.Routes) && t.CAFile == "" {
		return nil, errors.New("natsserver: tls: verifying clients or routes needs a CA file")
	}
	cfg, err := server.GenTLSConfig(&server.TLSConfigOpts{CertFile: t.CertFile, KeyFile: t.KeyFile, CaFile: t.CAFile, Verify: t.VerifyClients})
	if err != nil {
		return nil, fmt.Errorf("natsserver: tls: %w", err)
	}
	return cfg, nil
}

// routeConfig is the tls.Config of the route port and of the routes the
// server dials: peers verify each other against CAFile, as nats-server
// does for a cluster block's tls (it mirrors the CAs into RootCAs).
func (t *TLS) routeConfig() (*tls.Config, error) {
	cfg, err := server.GenTLSConfig(&server.TLSConfigOpts{CertFile: t.CertFile, KeyFile: t.KeyFile, CaFile: t.CAFile, Verify: true})
	if err != nil {
		return nil, fmt.Errorf("natsserver: route tls: %w", err)
	}
	cfg.RootCAs = cfg.ClientCAs
	return cfg, nil
}
