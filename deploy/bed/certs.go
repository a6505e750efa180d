package bed

import (
	"os"
	"path/filepath"

	"github.com/triage-queue/triage/cmd/triage/natsserver"
	"github.com/triage-queue/triage/deploy/certs"
	"github.com/triage-queue/triage/regions/replication"
	"github.com/triage-queue/triage/shardmap"
)

// bedCA is the bed's throwaway CA (certs.CA). Its certificate is ca.crt in
// the bed's directory; its private key lives in memory only while the bed
// starts, so nothing but the certificates the bed issues then is ever
// signed with it.
type bedCA struct {
	ca   *certs.CA
	dir  string // the bed's directory, absolute
	file string // ca.crt
}

// newCA makes the bed's CA and writes its certificate, ca.crt (0600), into
// the bed's directory.
func (b *Bed) newCA() (*bedCA, error) {
	ca, err := certs.NewCA("triage bed CA")
	if err != nil {
		return nil, err
	}
	dir, err := filepath.Abs(b.cfg.Dir)
	if err != nil {
		return nil, err
	}
	bca := &bedCA{ca: ca, dir: dir, file: filepath.Join(dir, "ca.crt")}
	return bca, os.WriteFile(bca.file, ca.PEM(), 0o600)
}

// issue makes a certificate for the bed's servers (127.0.0.1 and
// localhost, which every process of the bed dials) and writes it and its
// key as name.crt and name.key (0600) into the bed's directory.
func (ca *bedCA) issue(name, commonName string) (certFile, keyFile string, err error) {
	cert, key, err := ca.ca.Issue(commonName, "127.0.0.1", "localhost")
	if err != nil {
		return "", "", err
	}
	certFile, keyFile = filepath.Join(ca.dir, name+".crt"), filepath.Join(ca.dir, name+".key")
	if err := os.WriteFile(certFile, cert, 0o600); err != nil {
		return "", "", err
	}
	return certFile, keyFile, os.WriteFile(keyFile, key, 0o600)
}

// writeNATSCerts issues the NATS servers' one certificate with ca
// (nats-server.crt, nats-server.key) and returns the servers' TLS
// settings and the clients'.
func (b *Bed) writeNATSCerts(ca *bedCA) (*natsserver.TLS, *shardmap.NATSTLS, error) {
	cert, key, err := ca.issue("nats-server", "triage bed NATS")
	if err != nil {
		return nil, nil, err
	}
	srv := &natsserver.TLS{CertFile: cert, KeyFile: key, CAFile: ca.file, Routes: b.multi()}
	return srv, &shardmap.NATSTLS{CAFile: ca.file}, nil
}

// mysqlTLS are the files of the MariaDB servers' TLS (Config.MySQLTLS):
// the CA and the one certificate every mariadbd of the bed serves.
type mysqlTLS struct {
	CAFile, CertFile, KeyFile string
}

// writeMySQLCerts issues the MariaDB servers' certificate with ca
// (mysql-server.crt, mysql-server.key).
func (b *Bed) writeMySQLCerts(ca *bedCA) (*mysqlTLS, error) {
	cert, key, err := ca.issue("mysql-server", "triage bed MariaDB")
	if err != nil {
		return nil, err
	}
	return &mysqlTLS{CAFile: ca.file, CertFile: cert, KeyFile: key}, nil
}

// serverArgs are the mariadbd flags that make a server offer TLS with the
// bed's certificate; none without Config.MySQLTLS.
func (t *mysqlTLS) serverArgs() []string {
	if t == nil {
		return nil
	}
	return []string{"--ssl-ca=" + t.CAFile, "--ssl-cert=" + t.CertFile, "--ssl-key=" + t.KeyFile}
}

// client is how the bed's processes verify the servers: the CA, against
// the address they dial (127.0.0.1, which the certificate names, also
// through a WAN link); nil without Config.MySQLTLS.
func (t *mysqlTLS) client() *shardmap.MySQLTLS {
	if t == nil {
		return nil
	}
	return &shardmap.MySQLTLS{CAFile: t.CAFile}
}

// replication is how the bed's replicas reach their primary: over TLS,
// verifying the chain and the name (127.0.0.1, through a WAN link too);
// nil without Config.MySQLTLS.
func (t *mysqlTLS) replication() *replication.TLS {
	if t == nil {
		return nil
	}
	return &replication.TLS{CAFile: t.CAFile}
}
