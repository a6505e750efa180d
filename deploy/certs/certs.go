package certs

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"time"
)

// Lifetime is how long a CA and the certificates it issues are valid: a
// bed is brought up afresh, with a new CA, far more often than that.
const Lifetime = 90 * 24 * time.Hour

// CA is a throwaway certificate authority held in memory: its key is
// never written, only its certificate (PEM).
type CA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte // cert, PEM-encoded
}

// NewCA makes a CA named commonName that signs end-entity certificates
// only (no intermediate CAs).
func NewCA(commonName string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := template(commonName)
	tmpl.IsCA, tmpl.BasicConstraintsValid, tmpl.MaxPathLenZero = true, true, true
	tmpl.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{cert: cert, key: key, pem: encode("CERTIFICATE", der)}, nil
}

// PEM is the CA's certificate, PEM-encoded: what clients verify the
// issued certificates with.
func (ca *CA) PEM() []byte { return ca.pem }

// Issue makes a new key and a certificate for it signed by ca, both
// PEM-encoded (the key as an "EC PRIVATE KEY", which NATS and MariaDB
// both read), named commonName and, as its subject alternative names,
// hosts: each is an IP address if it parses as one, else a DNS name. The
// certificate is good for server and client authentication, so that a
// NATS route can use it at both ends.
func (ca *CA) Issue(commonName string, hosts ...string) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl := template(commonName)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return nil, nil, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return encode("CERTIFICATE", der), encode("EC PRIVATE KEY", keyDER), nil
}

// template is what a CA's and an issued certificate share: a random
// serial number, the subject, and validity from an hour ago for Lifetime.
func template(commonName string) *x509.Certificate {
	now := time.Now()
	return &x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{CommonName: commonName},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(Lifetime),
	}
}

// encode is der as a PEM block of type typ.
func encode(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}

// serial is a random certificate serial number of 127 bits, positive as
// RFC 5280 requires.
func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err) // crypto/rand does not fail
	}
	return n
}
