package shardmap

import (
	"cmp"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/go-sql-driver/mysql"
	"github.com/nats-io/nats.go"

	"github.com/triage-queue/triage/proto/triage/peer"
)

// Credentials are the MySQL account a process connects to shards as.
//
// The password is given by one of Password, PasswordFile or PasswordEnv.
// The last two keep it out of the config file, which is often world-
// readable or checked in; none of them is ever part of the shard map,
// which every caller of GetShardMap reads.
type Credentials struct {
	User     string `json:"user"`
	Password string `json:"password,omitempty"`
	// PasswordFile is a file holding the password (a trailing newline is
	// dropped), e.g. a mounted container secret.
	PasswordFile string `json:"password_file,omitempty"`
	// PasswordEnv is the name of an environment variable holding the
	// password.
	PasswordEnv string `json:"password_env,omitempty"`
	// TLS, when set, connects over TLS and verifies the server's
	// certificate. Default: plain TCP.
	TLS *MySQLTLS `json:"tls,omitempty"`
	// MaxOpenConns per shard primary. Default 64.
	MaxOpenConns int `json:"max_open_conns,omitempty"`
	// DialVia maps a server's address as the shard map names it to the
	// address this process must dial instead (a local proxy in front of a
	// remote region, as the local bed sets up to inject WAN latency).
	DialVia map[string]string `json:"dial_via,omitempty"`

	// tlsName is the name Resolve registered TLS under with the driver.
	tlsName string
}

// MySQLTLS is how a process verifies the MySQL servers it dials and, when
// they ask for one, the certificate it shows them.
type MySQLTLS struct {
	// CAFile holds the PEM certificates of the CAs that sign the servers'
	// certificates. Required.
	CAFile string `json:"ca_file"`
	// ServerName is the name the certificates must carry. Default: the
	// host of the address dialed, which behind a WAN proxy (DialVia) is
	// the proxy's, so a bed with proxies sets it.
	ServerName string `json:"server_name,omitempty"`
	// CertFile and KeyFile are the process's own certificate and key, for
	// an account created REQUIRE X509 (or ISSUER, SUBJECT). Default none.
	CertFile string `json:"cert_file,omitempty"`
	KeyFile  string `json:"key_file,omitempty"`
}

// Resolve returns c with the password read from PasswordFile or
// PasswordEnv and TLS registered with the MySQL driver. It fails when more
// than one password source is given, when the file cannot be read or the
// variable is unset, so a typo never silently connects without a
// password.
func (c Credentials) Resolve() (Credentials, error) {
	var err error
	if c.Password, err = Secret("mysql user "+c.User, c.Password, c.PasswordFile, c.PasswordEnv); err != nil {
		return c, err
	}
	c.PasswordFile, c.PasswordEnv = "", ""
	if c.TLS != nil && c.tlsName == "" {
		name, err := c.TLS.register()
		if err != nil {
			return c, fmt.Errorf("mysql user %q: tls: %w", c.User, err)
		}
		c.tlsName = name
	}
	return c, nil
}

// Apply sets c's user, password and TLS in a driver config. User defaults
// to root, as it always has, so that tests against a bare server work.
func (c Credentials) Apply(cfg *mysql.Config) {
	cfg.User = cmp.Or(c.User, "root")
	cfg.Passwd = c.Password
	if c.tlsName != "" {
		cfg.TLSConfig = c.tlsName
	}
}

// register makes the driver know t under a name derived from its content
// (the files', not their names), so that resolving the same settings twice
// registers one config. The files are read now: a wrong path fails the
// start, not every connection.
func (t *MySQLTLS) register() (string, error) {
	if t.CAFile == "" {
		return "", errors.New("ca_file is required")
	}
	pem, err := os.ReadFile(t.CAFile)
	if err != nil {
		return "", err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return "", fmt.Errorf("%s: no PEM certificate", t.CAFile)
	}
	cfg := &tls.Config{RootCAs: pool, ServerName: t.ServerName, MinVersion: tls.VersionTLS12}
	h := sha256.New()
	for _, part := range [][]byte{pem, []byte(t.ServerName)} {
		h.Write(part)
		h.Write([]byte{0})
	}
	switch {
	case t.CertFile != "" && t.KeyFile != "":
		certPEM, err := os.ReadFile(t.CertFile)
		if err != nil {
			return "", err
		}
		keyPEM, err := os.ReadFile(t.KeyFile)
		if err != nil {
			return "", err
		}
		pair, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			return "", fmt.Errorf("cert_file %s and key_file %s: %w", t.CertFile, t.KeyFile, err)
		}
		cfg.Certificates = []tls.Certificate{pair}
		h.Write(certPEM)
		h.Write([]byte{0})
		h.Write(keyPEM)
	case t.CertFile != "" || t.KeyFile != "":
		return "", errors.New("cert_file and key_file go together")
	}
	name := "triage-" + hex.EncodeToString(h.Sum(nil)[:8])
	return name, mysql.RegisterTLSConfig(name, cfg)
}

// Secret returns the secret given either as value, in the file named by
// file (a trailing newline is dropped) or in the environment variable
// named by env; what names it in errors. More than one source, an
// unreadable file or an unset variable is an error, so that a typo never
// silently leaves the secret empty.
func Secret(what, value, file, env string) (string, error) {
	n := 0
	for _, s := range []string{value, file, env} {
		if s != "" {
			n++
		}
	}
	switch {
	case n > 1:
		return "", fmt.Errorf("%s: give one of password, password_file and password_env", what)
	case file != "":
		data, err := os.ReadFile(file)
		if err != nil {
			return "", fmt.Errorf("%s: password_file: %w", what, err)
		}
		return strings.TrimRight(string(data), "\r\n"), nil
	case env != "":
		v, ok := os.LookupEnv(env)
		if !ok {
			return "", fmt.Errorf("%s: password_env: %s is not set", what, env)
		}
		return v, nil
	}
	return value, nil
}

// Account is a MySQL account a process hands to servers rather than logs
// in as: the replication account, which the controller names in CHANGE
// MASTER TO ... MASTER_PASSWORD when it points replicas at a new primary.
// Its password comes from Password, PasswordFile or PasswordEnv, like
// Credentials'; the JSON field names match any case, so a config written
// as {"User", "Password"} still reads.
type Account struct {
	User         string `json:"user"`
	Password     string `json:"password,omitempty"`
	PasswordFile string `json:"password_file,omitempty"`
	PasswordEnv  string `json:"password_env,omitempty"`
}

// Given reports whether a names anything at all.
func (a Account) Given() bool {
	return a.User != "" || a.Password != "" || a.PasswordFile != "" || a.PasswordEnv != ""
}

// Secret returns a's password from wherever a says it is (see Secret);
// what names the account in errors.
func (a Account) Secret(what string) (string, error) {
	return Secret(what+" "+a.User, a.Password, a.PasswordFile, a.PasswordEnv)
}

// NATSLogin is the user a Triage process logs in to NATS as: the Triage
// login of natsserver.Auth, which may use the internal subjects that
// clients may not. It is an Account (the password from Password,
// PasswordFile or PasswordEnv), which Option reads it through.
type NATSLogin Account

// Option returns the nats.go option that logs in as l; nil l is no login
// (a server without auth).
func (l *NATSLogin) Option() (nats.Option, error) {
	if l == nil {
		return func(*nats.Options) error { return nil }, nil
	}
	if l.User == "" {
		return nil, errors.New("nats login: user is required")
	}
	pw, err := Account(*l).Secret("nats user")
	if err != nil {
		return nil, err
	}
	return nats.UserInfo(l.User, pw), nil
}

// NATSTLS is how a Triage process connects to NATS servers that require
// TLS (natsserver.TLS): the CA it verifies them with and, when they
// verify clients, its own certificate.
type NATSTLS struct {
	// CAFile holds the PEM certificates of the CAs that sign the servers'
	// certificates. Required: the system roots would trust any public
	// certificate for the name.
	CAFile string `json:"ca_file"`
	// CertFile and KeyFile are the process's own certificate and key, for
	// servers that require client certificates. Default none.
	CertFile string `json:"cert_file,omitempty"`
	KeyFile  string `json:"key_file,omitempty"`
	// ServerName is the name the servers' certificates must carry.
	// Default: the host of the URL dialed.
	ServerName string `json:"server_name,omitempty"`
}

// Option returns the nats.go option that connects over TLS as t says; nil
// t is plain TCP (a server that requires TLS then refuses the process,
// since nats.go upgrades but verifies against the system roots). Files are
// read now, so a wrong path fails the start rather than every reconnect.
func (t *NATSTLS) Option() (nats.Option, error) {
	if t == nil {
		return func(*nats.Options) error { return nil }, nil
	}
	if t.CAFile == "" {
		return nil, errors.New("nats tls: ca_file is required")
	}
	pem, err := os.ReadFile(t.CAFile)
	if err != nil {
		return nil, fmt.Errorf("nats tls: ca_file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("nats tls: ca_file %s holds no PEM certificate", t.CAFile)
	}
	cfg := &tls.Config{RootCAs: pool, ServerName: t.ServerName, MinVersion: tls.VersionTLS12}
	switch {
	case t.CertFile != "" && t.KeyFile != "":
		pair, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("nats tls: cert_file %s and key_file %s: %w", t.CertFile, t.KeyFile, err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	case t.CertFile != "" || t.KeyFile != "":
		return nil, errors.New("nats tls: cert_file and key_file go together")
	}
	return nats.Secure(cfg), nil
}

// NATSOptions are the options of a Triage process's NATS connection: its
// login and its TLS, either of which may be nil, and the reply prefix
// peer.InboxPrefix, which the servers' Triage login may use and client
// logins may not (natsserver.TriagePermissions): every request, JetStream
// call and KV watch of the connection gets its answers there.
func NATSOptions(login *NATSLogin, t *NATSTLS) ([]nats.Option, error) {
	l, err := login.Option()
	if err != nil {
		return nil, fmt.Errorf("nats_auth: %w", err)
	}
	o, err := t.Option()
	if err != nil {
		return nil, fmt.Errorf("nats_tls: %w", err)
	}
	return []nats.Option{l, o, nats.CustomInboxPrefix(peer.InboxPrefix)}, nil
}
