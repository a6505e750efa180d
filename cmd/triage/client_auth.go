package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// dialSecurity are the dial options the environment asks for:
// TRIAGE_TOKEN sends "authorization: Bearer <key>" with every RPC, and
// TRIAGE_CA_FILE dials over TLS trusting that CA (PEM). Reading them from
// the environment, not flags, keeps keys out of shell history and ps.
func dialSecurity(getenv func(string) string) []grpc.DialOption {
	var opts []grpc.DialOption
	if tok := getenv("TRIAGE_TOKEN"); tok != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(bearer{token: tok, tls: getenv("TRIAGE_CA_FILE") != ""}))
	}
	if ca := getenv("TRIAGE_CA_FILE"); ca != "" {
		opts = append(opts, grpc.WithTransportCredentials(caCredentials(ca)))
	}
	return opts
}

// caCredentials trusts the CA in path; a file that cannot be used fails
// every RPC with a message saying so.
func caCredentials(path string) credentials.TransportCredentials {
	pool := x509.NewCertPool()
	data, err := os.ReadFile(path)
	if err == nil && !pool.AppendCertsFromPEM(data) {
		err = fmt.Errorf("%s holds no PEM certificate", path)
	}
	if err != nil {
		return credentials.NewTLS(&tls.Config{MinVersion: tls.VersionTLS12, VerifyConnection: func(tls.ConnectionState) error {
			return fmt.Errorf("TRIAGE_CA_FILE: %w", err)
		}})
	}
	return credentials.NewTLS(&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12})
}

// bearer sends a key with every RPC.
type bearer struct {
	token string
	tls   bool
}

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + b.token}, nil
}

// RequireTransportSecurity is false only without TRIAGE_CA_FILE, for a
// router on 127.0.0.1 (the local bed) where plaintext never leaves the host.
func (b bearer) RequireTransportSecurity() bool { return b.tls }
