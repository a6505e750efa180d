package e2e

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/stretchr/testify/require"

	"github.com/triage-queue/triage/cmd/triage/natsserver"
	"github.com/triage-queue/triage/cmd/triage/node"
	"github.com/triage-queue/triage/routing/auth/authtest"
	"github.com/triage-queue/triage/shardmap"
)

// TestNATSTLS: against NATS servers that require TLS and a client
// certificate, a node configured with nats_tls (the CA, its own
// certificate) enqueues, dequeues and acks over an encrypted connection;
// a node without nats_tls, without its certificate, or trusting another
// CA does not start.
func TestNATSTLS(t *testing.T) {
	ca := authtest.NewCA(t, "nats-ca")
	dir := t.TempDir()
	cert, key, caFile := ca.PeerFiles(t, dir, "nats")
	natsAuth := &natsserver.Auth{Triage: natsserver.Login{User: "triage", Password: "nats-" + t.Name()}}
	b := setup(t, bedOpts{shards: 1, noNode: true, natsAuth: natsAuth,
		natsTLS: &natsserver.TLS{CertFile: cert, KeyFile: key, CAFile: caFile, VerifyClients: true}})
	login := &shardmap.NATSLogin{User: "triage", Password: natsAuth.Triage.Password}
	nodeCert, nodeKey := ca.Issue(t, "triage-node", false)
	certFile, keyFile := filepath.Join(dir, "node.crt"), filepath.Join(dir, "node.key")
	authtest.Write(t, certFile, nodeCert)
	authtest.Write(t, keyFile, nodeKey)
	otherCA := filepath.Join(dir, "other-ca.crt")
	authtest.Write(t, otherCA, authtest.NewCA(t, "other").PEM)

	for _, tc := range []struct {
		name string
		tls  *shardmap.NATSTLS
		// want: the error names one of these. With TLS 1.3 the client's
		// side of the handshake completes before the server refuses a
		// missing certificate, so the client sees either the server's
		// alert or the connection closed under its first write.
		want []string
	}{
		{"no tls", nil, []string{"certificate signed by unknown authority"}},
		{"no certificate", &shardmap.NATSTLS{CAFile: caFile}, []string{"certificate required", "connection closed by remote after TLS handshake"}},
		{"another ca", &shardmap.NATSTLS{CAFile: otherCA, CertFile: certFile, KeyFile: keyFile}, []string{"certificate signed by unknown authority"}},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		n, err := node.Start(ctx, b.config(node.Config{NATSAuth: login, NATSTLS: tc.tls}), slog.New(slog.NewTextHandler(io.Discard, nil)))
		cancel()
		if err == nil {
			n.Stop()
		}
		require.Error(t, err, tc.name)
		require.True(t, slices.ContainsFunc(tc.want, func(w string) bool { return strings.Contains(err.Error(), w) }), "%s: %v", tc.name, err)
	}

	b.startNode(node.Config{NATSAuth: login, NATSTLS: &shardmap.NATSTLS{CAFile: caFile, CertFile: certFile, KeyFile: keyFile}})
	// The server completed a TLS handshake with the node's connection,
	// which showed the node's certificate.
	connz, err := b.nats.Connz(&server.ConnzOptions{Username: true})
	require.NoError(t, err)
	var tlsConns int
	for _, c := range connz.Conns {
		if c.Name != "triage-us-east" {
			continue
		}
		require.NotEmpty(t, c.TLSVersion, "the node's NATS connection is not TLS")
		require.NotEmpty(t, c.TLSPeerCerts)
		require.Contains(t, c.TLSPeerCerts[0].Subject, "CN=triage-node")
		tlsConns++
	}
	require.Positive(t, tlsConns, "no connection of the node: %+v", connz.Conns)
	requireRoundTrip(t, b)
}
