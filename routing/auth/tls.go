package auth

import (
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"
)

// Client certificate policies of TLSFiles.ClientAuth.
const (
	ClientAuthNone          = "none"
	ClientAuthVerifyIfGiven = "verify_if_given"
	ClientAuthRequire       = "require"
)

// TLSFiles is the TLS part of a node's config.
type TLSFiles struct {
	// CertFile and KeyFile are the PEM certificate (chain) and private key
	// of the listeners. Both required. Re-read when they change.
	CertFile string `json:"cert_file"`
	KeyFile  string `json:"key_file"`
	// ClientCAFile is a PEM bundle of the CAs client certificates must
	// chain to. Required unless ClientAuth is none. Read at start.
	ClientCAFile string `json:"client_ca_file,omitempty"`
	// ClientAuth is none (default without ClientCAFile), verify_if_given
	// (default with it) or require (mTLS: a client without a certificate
	// from ClientCAFile cannot connect).
	ClientAuth string `json:"client_auth,omitempty"`
}

// ServerConfig returns the tls.Config of a listener serving f. Errors say
// which file is wrong and how.
func (f TLSFiles) ServerConfig(log *slog.Logger) (*tls.Config, error) {
	if f.CertFile == "" || f.KeyFile == "" {
		return nil, errors.New("tls: cert_file and key_file are both required")
	}
	c := &certReloader{cert: f.CertFile, key: f.KeyFile, log: log, every: time.Second}
	if err := c.load(time.Now()); err != nil {
		return nil, err
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: c.get, NextProtos: []string{"h2", "http/1.1"}}
	mode := f.ClientAuth
	if mode == "" {
		mode = ClientAuthNone
		if f.ClientCAFile != "" {
			mode = ClientAuthVerifyIfGiven
		}
	}
	switch mode {
	case ClientAuthNone:
		return cfg, nil
	case ClientAuthVerifyIfGiven:
		cfg.ClientAuth = tls.VerifyClientCertIfGiven
	case ClientAuthRequire:
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	default:
		return nil, fmt.Errorf("tls: client_auth %q: allowed none, verify_if_given, require", f.ClientAuth)
	}
	if f.ClientCAFile == "" {
		return nil, fmt.Errorf("tls: client_auth %s needs client_ca_file", mode)
	}
	pem, err := os.ReadFile(f.ClientCAFile)
	if err != nil {
		return nil, fmt.Errorf("tls: client_ca_file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("tls: client_ca_file %s holds no PEM certificate", f.ClientCAFile)
	}
	cfg.ClientCAs = pool
	return cfg, nil
}

// certReloader serves a certificate pair from files, re-reading them when
// either changes (checked at most every `every`, during a handshake).
type certReloader struct {
	cert, key string
	log       *slog.Logger
	every     time.Duration

	mu      sync.Mutex
	pair    *tls.Certificate
	stamp   [sha256.Size]byte // of both files' contents
	checked time.Time
}

// load re-reads the pair if either file's content changed; c.mu is held
// or c is not shared yet.
func (c *certReloader) load(now time.Time) error {
	c.checked = now
	certPEM, err := os.ReadFile(c.cert)
	if err != nil {
		return fmt.Errorf("tls: cert_file: %w", err)
	}
	keyPEM, err := os.ReadFile(c.key)
	if err != nil {
		return fmt.Errorf("tls: key_file: %w", err)
	}
	stamp := sha256.Sum256(append(append(certPEM, 0), keyPEM...))
	if stamp == c.stamp {
		return nil
	}
	c.stamp = stamp
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return fmt.Errorf("tls: cert_file %s and key_file %s: %w", c.cert, c.key, err)
	}
	c.pair = &pair
	return nil
}

func (c *certReloader) get(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if now := time.Now(); now.Sub(c.checked) >= c.every {
		// A half-written renewal (new cert, old key) fails here and keeps
		// the last good pair; the next change is tried again.
		if err := c.load(now); err != nil && c.log != nil {
			c.log.Error("TLS certificate not reloaded; keeping the last good one", "err", err)
		}
	}
	return c.pair, nil
}
