package certs_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/triage-queue/triage/deploy/certs"
)

// parse is the one certificate of certPEM.
func parse(t *testing.T, certPEM []byte) *x509.Certificate {
	t.Helper()
	block, rest := pem.Decode(certPEM)
	require.NotNil(t, block)
	require.Equal(t, "CERTIFICATE", block.Type)
	require.Empty(t, rest)
	cert, err := x509.ParseCertificate(block.Bytes)
	require.NoError(t, err)
	return cert
}

// TestCertsCA: a CA is a P-256 CA that signs end-entity certificates
// only, valid from an hour back for Lifetime.
func TestCertsCA(t *testing.T) {
	t.Parallel()
	before := time.Now()
	ca, err := certs.NewCA("test CA")
	require.NoError(t, err)
	cert := parse(t, ca.PEM())
	require.Equal(t, "test CA", cert.Subject.CommonName)
	require.True(t, cert.IsCA)
	require.True(t, cert.MaxPathLenZero)
	require.Equal(t, x509.KeyUsageCertSign|x509.KeyUsageDigitalSignature, cert.KeyUsage)
	require.Equal(t, elliptic.P256(), cert.PublicKey.(*ecdsa.PublicKey).Curve)
	require.WithinDuration(t, before.Add(-time.Hour), cert.NotBefore, 2*time.Second)
	require.WithinDuration(t, before.Add(certs.Lifetime), cert.NotAfter, 2*time.Second)
	require.NoError(t, cert.CheckSignatureFrom(cert), "self-signed")

	other, err := certs.NewCA("test CA")
	require.NoError(t, err)
	require.NotEqual(t, cert.SerialNumber, parse(t, other.PEM()).SerialNumber)
	require.NotEqual(t, cert.PublicKey, parse(t, other.PEM()).PublicKey, "every CA has a key of its own")
}

// TestCertsIssue: an issued certificate names its hosts, IP addresses as
// IP SANs and the rest as DNS SANs, verifies against its CA alone for
// server and client authentication, and pairs with its EC key.
func TestCertsIssue(t *testing.T) {
	t.Parallel()
	ca, err := certs.NewCA("test CA")
	require.NoError(t, err)
	certPEM, keyPEM, err := ca.Issue("test server", "localhost", "127.0.0.1", "nats-us-east")
	require.NoError(t, err)
	cert := parse(t, certPEM)
	require.Equal(t, "test server", cert.Subject.CommonName)
	require.Equal(t, []string{"localhost", "nats-us-east"}, cert.DNSNames)
	require.Len(t, cert.IPAddresses, 1)
	require.True(t, cert.IPAddresses[0].Equal(net.IPv4(127, 0, 0, 1)))
	require.False(t, cert.IsCA)
	require.Equal(t, x509.KeyUsageDigitalSignature, cert.KeyUsage)
	require.Equal(t, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}, cert.ExtKeyUsage)
	require.WithinDuration(t, cert.NotBefore.Add(certs.Lifetime+time.Hour), cert.NotAfter, time.Second)

	block, _ := pem.Decode(keyPEM)
	require.NotNil(t, block)
	require.Equal(t, "EC PRIVATE KEY", block.Type)
	_, err = tls.X509KeyPair(certPEM, keyPEM)
	require.NoError(t, err, "the key is the certificate's")

	pool := x509.NewCertPool()
	require.True(t, pool.AppendCertsFromPEM(ca.PEM()))
	usages := []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	for _, name := range []string{"localhost", "127.0.0.1", "nats-us-east"} {
		_, err := cert.Verify(x509.VerifyOptions{DNSName: name, Roots: pool, KeyUsages: usages})
		require.NoError(t, err, name)
	}
	_, err = cert.Verify(x509.VerifyOptions{DNSName: "nats-eu-west", Roots: pool})
	require.Error(t, err, "a name not issued for")

	other, err := certs.NewCA("test CA")
	require.NoError(t, err)
	otherPool := x509.NewCertPool()
	require.True(t, otherPool.AppendCertsFromPEM(other.PEM()))
	_, err = cert.Verify(x509.VerifyOptions{DNSName: "localhost", Roots: otherPool})
	require.Error(t, err, "another CA of the same name does not verify it")

	again, _, err := ca.Issue("test server", "localhost")
	require.NoError(t, err)
	require.NotEqual(t, cert.SerialNumber, parse(t, again).SerialNumber)
}
