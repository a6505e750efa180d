package authtest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/triage-queue/triage/routing/auth"
)

// CA is a throwaway certificate authority.
type CA struct {
	Cert *x509.Certificate
	key  *ecdsa.PrivateKey
	// PEM is the CA certificate, PEM-encoded.
	PEM []byte
}

var serial atomic.Int64

// NewCA makes a CA named name.
func NewCA(t testing.TB, name string) *CA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &CA{Cert: cert, key: key, PEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// Pool is a pool holding the CA, for a client's RootCAs.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

// Issue returns a PEM certificate and key for cn: a server certificate
// for 127.0.0.1 and localhost when server is set, else a client
// certificate with cn and dns as names.
func (ca *CA) Issue(t testing.TB, cn string, server bool, dns ...string) (certPEM, keyPEM []byte) {
	t.Helper()
	return ca.issue(t, cn, server, !server, dns...)
}

// PeerFiles writes a certificate and key good for both ends of a TLS
// connection (server and client authentication, for 127.0.0.1 and
// localhost), as NATS cluster routes need, and the CA, into dir as
// name.crt, name.key and ca.crt, and returns their paths.
func (ca *CA) PeerFiles(t testing.TB, dir, name string) (certFile, keyFile, caFile string) {
	t.Helper()
	c, k := ca.issue(t, name, true, true)
	certFile, keyFile, caFile = filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key"), filepath.Join(dir, "ca.crt")
	Write(t, certFile, c)
	Write(t, keyFile, k)
	Write(t, caFile, ca.PEM)
	return certFile, keyFile, caFile
}

// issue makes a certificate for cn, for servers at 127.0.0.1 and
// localhost when server is set, for clients when client is.
func (ca *CA) issue(t testing.TB, cn string, server, client bool, dns ...string) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano() + serial.Add(1)), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, DNSNames: dns,
	}
	if server {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
		tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1)}
		tmpl.DNSNames = append(tmpl.DNSNames, "localhost")
	}
	if client {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageClientAuth)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
}

// ClientCert is Issue for a client, as a tls.Certificate.
func (ca *CA) ClientCert(t testing.TB, cn string) tls.Certificate {
	t.Helper()
	c, k := ca.Issue(t, cn, false)
	pair, err := tls.X509KeyPair(c, k)
	if err != nil {
		t.Fatal(err)
	}
	return pair
}

// ServerFiles writes a server certificate and key of ca, and the CA
// itself, into dir and returns the TLS config naming them.
func (ca *CA) ServerFiles(t testing.TB, dir, clientAuth string) auth.TLSFiles {
	t.Helper()
	c, k := ca.Issue(t, "triage-test-server", true)
	f := auth.TLSFiles{CertFile: filepath.Join(dir, "server.crt"), KeyFile: filepath.Join(dir, "server.key"),
		ClientCAFile: filepath.Join(dir, "ca.crt"), ClientAuth: clientAuth}
	Write(t, f.CertFile, c)
	Write(t, f.KeyFile, k)
	Write(t, f.ClientCAFile, ca.PEM)
	return f
}

// Write writes data to path or fails t.
func Write(t testing.TB, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// KeysFile writes keys as a keys file at path.
func KeysFile(t testing.TB, path string, keys ...auth.Key) {
	t.Helper()
	data, err := json.MarshalIndent(auth.File{Keys: keys}, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	Write(t, path, data)
}

// Token makes a key for a keys file entry: it returns the key to send and
// sets the entry's hash.
func Token(t testing.TB, k *auth.Key) string {
	t.Helper()
	tok, hash, err := auth.NewToken()
	if err != nil {
		t.Fatal(err)
	}
	k.SHA256 = hash
	return tok
}

// Keys makes a key for every entry that has no client certificates, writes
// the entries as a keys file at path, and returns the keys to send by
// entry name.
func Keys(t testing.TB, path string, keys ...auth.Key) map[string]string {
	t.Helper()
	tokens := map[string]string{}
	for i := range keys {
		if keys[i].ClientCerts == nil {
			tokens[keys[i].Name] = Token(t, &keys[i])
		}
	}
	KeysFile(t, path, keys...)
	return tokens
}
