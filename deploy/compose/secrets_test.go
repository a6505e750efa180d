package compose

import (
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/triage-queue/triage/routing/auth"
)

// TestWriteBedDir: a bed directory holds a cluster-admin key whose hash
// alone is in the keys file, NATS passwords, and a CA whose certificate
// verifies the NATS servers' one certificate for every NATS server's and
// gateway's name, as a server and as a client (the routes), and the
// MariaDB servers' for every MariaDB server's and gateway's name (another
// region's server is dialed as the gateway), both for localhost and
// 127.0.0.1 too; the directory is 0700, even when it existed before as
// up.sh's mkdir -p leaves it, the files in it the containers' user reads
// are 0644, the API key 0600, and the CA's key is nowhere. A complete
// directory is kept, an incomplete one made again.
func TestWriteBedDir(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "bed")
	require.NoError(t, os.Mkdir(dir, 0o755))
	top := DefaultTopology()
	wrote, err := WriteBedDir(dir, top)
	require.NoError(t, err)
	require.True(t, wrote)
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	require.ElementsMatch(t, bedFiles, names, "nothing else: the CA's key is never written")
	for _, f := range bedFiles {
		fi, err := os.Stat(filepath.Join(dir, f))
		require.NoError(t, err)
		want := os.FileMode(0o644)
		if f == bedToken {
			want = 0o600
		}
		require.Equal(t, want, fi.Mode().Perm(), f)
	}
	fi, err := os.Stat(dir)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o700), fi.Mode().Perm(), "the directory keeps the files from the host's other users")

	token, err := readToken(dir)
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(token, auth.TokenPrefix), token)
	keys, err := os.ReadFile(filepath.Join(dir, bedKeys))
	require.NoError(t, err)
	require.NotContains(t, string(keys), token)
	_, err = auth.ParseKeys(keys)
	require.NoError(t, err)
	require.Contains(t, string(keys), auth.HashToken(token))
	require.Contains(t, string(keys), `"cluster_admin": true`)

	pw := map[string]string{}
	for _, f := range []string{bedNATSTriage, bedNATSClient, bedNATSRoute} {
		data, err := os.ReadFile(filepath.Join(dir, f))
		require.NoError(t, err)
		pw[strings.TrimSpace(string(data))] = f
	}
	require.Len(t, pw, 3, "three different passwords")
	for p := range pw {
		require.GreaterOrEqual(t, len(p), 20)
	}

	caPEM, err := os.ReadFile(filepath.Join(dir, bedCA))
	require.NoError(t, err)
	pool := x509.NewCertPool()
	require.True(t, pool.AppendCertsFromPEM(caPEM))
	certOf := func(name string) *x509.Certificate {
		certPEM, err := os.ReadFile(filepath.Join(dir, name))
		require.NoError(t, err)
		block, _ := pem.Decode(certPEM)
		require.NotNil(t, block)
		cert, err := x509.ParseCertificate(block.Bytes)
		require.NoError(t, err)
		return cert
	}
	natsCert, mysqlCert := certOf(bedNATSCert), certOf(bedMySQLCert)
	for _, r := range top.Regions {
		for _, name := range []string{"nats-" + r, gateway(r)} {
			_, err := natsCert.Verify(x509.VerifyOptions{DNSName: name, Roots: pool,
				KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}})
			require.NoError(t, err, name)
		}
		_, err := mysqlCert.Verify(x509.VerifyOptions{DNSName: gateway(r), Roots: pool})
		require.NoError(t, err, gateway(r))
	}
	for _, s := range top.servers() {
		_, err := mysqlCert.Verify(x509.VerifyOptions{DNSName: s.service, Roots: pool})
		require.NoError(t, err, s.service)
	}
	for _, name := range []string{"localhost", "127.0.0.1"} {
		for _, cert := range []*x509.Certificate{natsCert, mysqlCert} {
			_, err := cert.Verify(x509.VerifyOptions{DNSName: name, Roots: pool})
			require.NoError(t, err, "%s for %s", cert.Subject.CommonName, name)
		}
	}
	_, err = natsCert.Verify(x509.VerifyOptions{DNSName: "nats.example.com", Roots: pool})
	require.Error(t, err, "a name the bed does not have")
	_, err = mysqlCert.Verify(x509.VerifyOptions{DNSName: "nats-us-east", Roots: pool})
	require.Error(t, err, "the MariaDB certificate names no NATS server")

	wrote, err = WriteBedDir(dir, top)
	require.NoError(t, err)
	require.False(t, wrote, "a complete directory is kept: a running bed uses it")
	again, err := readToken(dir)
	require.NoError(t, err)
	require.Equal(t, token, again)

	require.NoError(t, os.Remove(filepath.Join(dir, bedToken)))
	wrote, err = WriteBedDir(dir, top)
	require.NoError(t, err)
	require.True(t, wrote)
	again, err = readToken(dir)
	require.NoError(t, err)
	require.NotEqual(t, token, again, "an incomplete directory is made anew")
	ca2, err := os.ReadFile(filepath.Join(dir, bedCA))
	require.NoError(t, err)
	require.NotEqual(t, string(caPEM), string(ca2))
}

// TestDownRemovesTheBedDir: down.sh removes every file WriteBedDir
// writes, and nothing else of the directory.
func TestDownRemovesTheBedDir(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile("down.sh")
	require.NoError(t, err)
	require.Contains(t, string(data), "for f in "+strings.Join(bedFiles, " ")+"; do")
}
