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

	"github.com/triage-queue/triage/deploy/natsserver"
	"github.com/triage-queue/triage/shardmap"
)

// certLifetime is how long the bed's throwaway certificates are valid: a
// bed is brought up afresh far more often than that.
const certLifetime = 90 * 24 * time.Hour

// writeNATSCerts makes a throwaway CA, issues the NATS servers' one
// certificate with it (127.0.0.1 and localhost, good for server and client
// authentication so that the routes can use it both ways), and writes
// nats-ca.crt, nats-server.crt and nats-server.key (0600) into the bed's
// directory. The CA's private key is never written: nothing else is ever
// signed with it. It returns the servers' TLS settings and the clients'.
func (b *Bed) writeNATSCerts() (*natsserver.TLS, *shardmap.NATSTLS, error) {
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	caTmpl := &x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{CommonName: "triage bed NATS CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(certLifetime),
		IsCA: true, BasicConstraintsValid: true, MaxPathLenZero: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, nil, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{CommonName: "triage bed NATS"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(certLifetime),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, DNSNames: []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, nil, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	dir, err := filepath.Abs(b.cfg.Dir)
	if err != nil {
		return nil, nil, err
	}
	srv := &natsserver.TLS{CertFile: filepath.Join(dir, "nats-server.crt"), KeyFile: filepath.Join(dir, "nats-server.key"),
		CAFile: filepath.Join(dir, "nats-ca.crt"), Routes: b.multi()}
	for _, f := range []struct {
		path, typ string
		der       []byte
	}{{srv.CAFile, "CERTIFICATE", caDER}, {srv.CertFile, "CERTIFICATE", der}, {srv.KeyFile, "EC PRIVATE KEY", keyDER}} {
		if err := os.WriteFile(f.path, pem.EncodeToMemory(&pem.Block{Type: f.typ, Bytes: f.der}), 0o600); err != nil {
			return nil, nil, err
		}
	}
	return srv, &shardmap.NATSTLS{CAFile: srv.CAFile}, nil
}

// serial is a random certificate serial number.
func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err) // crypto/rand does not fail
	}
	return n
}
