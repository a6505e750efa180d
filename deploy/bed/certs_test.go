package bed

import (
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestBedCerts: the bed writes its CA's certificate and the NATS and
// MariaDB servers' certificates and keys into its directory, 0600, and
// nothing else (the CA's key is never written); both certificates verify
// against the CA for 127.0.0.1 and localhost, as server and client (a
// NATS route is a client of its peer), and the TLS settings name the
// files written.
func TestBedCerts(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	b := &Bed{cfg: Config{Dir: dir, Regions: []string{"us-east", "eu-west"}}}
	ca, err := b.newCA()
	require.NoError(t, err)
	mysql, err := b.writeMySQLCerts(ca)
	require.NoError(t, err)
	natsSrv, natsCli, err := b.writeNATSCerts(ca)
	require.NoError(t, err)

	caFile := filepath.Join(dir, "ca.crt")
	require.Equal(t, &mysqlTLS{CAFile: caFile, CertFile: filepath.Join(dir, "mysql-server.crt"), KeyFile: filepath.Join(dir, "mysql-server.key")}, mysql)
	require.Equal(t, caFile, natsSrv.CAFile)
	require.Equal(t, filepath.Join(dir, "nats-server.crt"), natsSrv.CertFile)
	require.Equal(t, filepath.Join(dir, "nats-server.key"), natsSrv.KeyFile)
	require.True(t, natsSrv.Routes, "two regions: the routes use TLS")
	require.Equal(t, caFile, natsCli.CAFile)

	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	var names []string
	for _, e := range entries {
		fi, err := e.Info()
		require.NoError(t, err)
		require.Equal(t, os.FileMode(0o600), fi.Mode().Perm(), e.Name())
		names = append(names, e.Name())
	}
	require.ElementsMatch(t, []string{"ca.crt", "nats-server.crt", "nats-server.key", "mysql-server.crt", "mysql-server.key"}, names,
		"nothing else: the CA's key is never written")

	caPEM, err := os.ReadFile(caFile)
	require.NoError(t, err)
	pool := x509.NewCertPool()
	require.True(t, pool.AppendCertsFromPEM(caPEM))
	for _, f := range []string{"nats-server.crt", "mysql-server.crt"} {
		data, err := os.ReadFile(filepath.Join(dir, f))
		require.NoError(t, err)
		block, _ := pem.Decode(data)
		require.NotNil(t, block, f)
		cert, err := x509.ParseCertificate(block.Bytes)
		require.NoError(t, err, f)
		for _, name := range []string{"127.0.0.1", "localhost"} {
			_, err := cert.Verify(x509.VerifyOptions{DNSName: name, Roots: pool,
				KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}})
			require.NoError(t, err, "%s for %s", f, name)
		}
		_, err = cert.Verify(x509.VerifyOptions{DNSName: "nats-us-east", Roots: pool})
		require.Error(t, err, "%s names the loopback only", f)
	}
}
