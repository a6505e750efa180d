package bed

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/triage-queue/triage/cmd/triage/natsserver"
	"github.com/triage-queue/triage/regions/replication"
	"github.com/triage-queue/triage/shardmap"
)

// certLifetime is how long the bed's throwaway certificates are valid: a
// bed is brought up afresh far more often than that.
const certLifetime = 90 * 24 * time.Hour

// bedCA is the bed's throwaway CA. Its certificate is ca.crt in the bed's
// directory; its private key lives in memory only while the bed starts,
// so nothing but the certificates the bed issues then is ever signed
// with it.
type bedCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	dir  string // the bed's directory, absolute
	file string // ca.crt
}

// newCA makes the bed's CA and writes its certificate, ca.crt, into the
// bed's directory.
func (b *Bed) newCA() (*bedCA, error) {
	now := time.Now()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{CommonName: "triage bed CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(certLifetime),
		IsCA: true, BasicConstraintsValid: true, MaxPathLenZero: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	dir, err := filepath.Abs(b.cfg.Dir)
	if err != nil {
		return nil, err
	}
	ca := &bedCA{cert: cert, key: key, dir: dir, file: filepath.Join(dir, "ca.crt")}
	return ca, writePEM(ca.file, "CERTIFICATE", der)
}

// issue makes a certificate for the bed's servers (127.0.0.1 and
// localhost, good for server and client authentication, so that NATS
// routes can use it both ways) and writes it and its key as name.crt and
// name.key (0600) into the bed's directory.
func (ca *bedCA) issue(name, commonName string) (certFile, keyFile string, err error) {
	now := time.Now()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{CommonName: commonName},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(certLifetime),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, DNSNames: []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return "", "", err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return "", "", err
	}
	certFile, keyFile = filepath.Join(ca.dir, name+".crt"), filepath.Join(ca.dir, name+".key")
	if err := writePEM(certFile, "CERTIFICATE", der); err != nil {
		return "", "", err
	}
	return certFile, keyFile, writePEM(keyFile, "EC PRIVATE KEY", keyDER)
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

func writePEM(path, typ string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600)
}

// serial is a random certificate serial number.
func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err) // crypto/rand does not fail
	}
	return n
}
