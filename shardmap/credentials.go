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

// MySQLTLS is how a process verifies the MySQL servers it dials.
type MySQLTLS struct {
	// CAFile holds the PEM certificates of the CAs that sign the servers'
	// certificates. Required.
	CAFile string `json:"ca_file"`
	// ServerName is the name the certificates must carry. Default: the
	// host of the address dialed, which behind a WAN proxy (DialVia) is
	// the proxy's, so a bed with proxies sets it.
	ServerName string `json:"server_name,omitempty"`
}

// Resolve returns c with the password read from PasswordFile or
// PasswordEnv and TLS registered with the MySQL driver. It fails when more
// than one password source is given, when the file cannot be read or the
// variable is unset, so a typo never silently connects without a
// password.
func (c Credentials) Resolve() (Credentials, error) {
	n := 0
	for _, s := range []string{c.Password, c.PasswordFile, c.PasswordEnv} {
		if s != "" {
			n++
		}
	}
	if n > 1 {
		return c, fmt.Errorf("mysql user %q: give one of password, password_file and password_env", c.User)
	}
	switch {
	case c.PasswordFile != "":
		data, err := os.ReadFile(c.PasswordFile)
		if err != nil {
			return c, fmt.Errorf("mysql user %q: password_file: %w", c.User, err)
		}
		c.Password = strings.TrimRight(string(data), "\r\n")
		c.PasswordFile = ""
	case c.PasswordEnv != "":
		v, ok := os.LookupEnv(c.PasswordEnv)
		if !ok {
			return c, fmt.Errorf("mysql user %q: password_env: %s is not set", c.User, c.PasswordEnv)
		}
		c.Password = v
		c.PasswordEnv = ""
	}
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

// register makes the driver know t under a name derived from its content,
// so that resolving the same settings twice registers one config.
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
	sum := sha256.Sum256(append(append(pem, 0), t.ServerName...))
	name := "triage-" + hex.EncodeToString(sum[:8])
	err = mysql.RegisterTLSConfig(name, &tls.Config{RootCAs: pool, ServerName: t.ServerName, MinVersion: tls.VersionTLS12})
	return name, err
}
