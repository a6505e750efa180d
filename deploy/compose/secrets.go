package compose

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/triage-queue/triage/routing/auth"
	"github.com/triage-queue/triage/shardmap"
)

// The files of a bed directory (TRIAGE_BED_DIR): what a running bed's
// containers mount besides config/, made by WriteBedDir when up.sh starts
// the bed and removed by down.sh. Unlike config/, nothing here is
// committed: the API key, the NATS passwords and the servers' private keys
// are new for every bed, as the process bed's are.
const (
	// bedKeys is the routers' keys file: the hash of bedToken, cluster-admin.
	bedKeys = "keys.json"
	// bedToken is the API key itself, which no container mounts: the
	// drills, TestCompose and the tour read it on the host.
	bedToken = "token"
	// bedCA is the throwaway CA's certificate (its key is never written),
	// which every NATS and MariaDB client verifies the servers with.
	bedCA = "ca.crt"
	// bedNATSCert and bedNATSKey are the NATS servers' one certificate and
	// key, which serve the client port and both ends of every route.
	bedNATSCert = "nats-server.crt"
	bedNATSKey  = "nats-server.key"
	// bedMySQLCert and bedMySQLKey are the MariaDB servers' one
	// certificate and key (--ssl-cert, --ssl-key), for the nodes' pools and
	// the replicas' connections to their primary.
	bedMySQLCert = "mysql-server.crt"
	bedMySQLKey  = "mysql-server.key"
	// The NATS passwords: Triage's login, the client login applications
	// use, and the route login.
	bedNATSTriage = "nats-triage"
	bedNATSClient = "nats-client"
	bedNATSRoute  = "nats-route"
)

// bedFiles are every file WriteBedDir writes, in the order down.sh lists
// them.
var bedFiles = []string{bedKeys, bedToken, bedCA, bedNATSCert, bedNATSKey, bedMySQLCert, bedMySQLKey, bedNATSTriage, bedNATSClient, bedNATSRoute}

// bedDirVar is how docker-compose.yml names the bed directory; without
// TRIAGE_BED_DIR docker-compose refuses the file, saying who makes it.
const bedDirVar = "${TRIAGE_BED_DIR:?made by up.sh}"

// keysPath is where the routers see the keys file (node.Config.KeysFile).
const keysPath = "/etc/triage/keys.json"

// bedCertLifetime is how long the bed's throwaway certificates are valid: a
// bed is brought up afresh far more often than that (up.sh reuses a
// directory only while the bed it was made for runs).
const bedCertLifetime = 90 * 24 * time.Hour

// WriteBedDir makes dir a bed directory for t, unless it is one already
// (it holds every file of one): a new cluster-admin API key and the keys
// file with its hash, random NATS passwords, and a throwaway CA with the
// NATS servers' certificate for every NATS server's and every gateway's
// name (the routes dial the gateways) and the MariaDB servers' for every
// MariaDB server's and every gateway's name (another region's server is
// dialed as its gateway, by nodes and replicas alike, and is verified
// against the name dialed). Files are 0600 but the CA's certificate and
// the keys file, which hold nothing secret. It reports whether it wrote
// anything.
func WriteBedDir(dir string, t Topology) (bool, error) {
	complete := true
	for _, f := range bedFiles {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			complete = false
		}
	}
	if complete {
		return false, nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return false, err
	}
	token, hash, err := auth.NewToken()
	if err != nil {
		return false, err
	}
	keys, err := json.MarshalIndent(auth.File{Keys: []auth.Key{{Name: "bed", SHA256: hash, ClusterAdmin: true}}}, "", "  ")
	if err != nil {
		return false, err
	}
	var natsNames, mysqlNames []string
	for _, r := range t.Regions {
		natsNames = append(natsNames, "nats-"+r, gateway(r))
		mysqlNames = append(mysqlNames, gateway(r))
	}
	for _, s := range t.servers() {
		mysqlNames = append(mysqlNames, s.service)
	}
	ca, err := newCA()
	if err != nil {
		return false, err
	}
	natsCert, natsKey, err := ca.issue("triage compose bed NATS", natsNames)
	if err != nil {
		return false, err
	}
	mysqlCert, mysqlKey, err := ca.issue("triage compose bed MariaDB", mysqlNames)
	if err != nil {
		return false, err
	}
	files := []struct {
		name string
		data []byte
		perm os.FileMode
	}{
		{bedKeys, append(keys, '\n'), 0o644},
		{bedCA, ca.pem, 0o644},
		{bedNATSCert, natsCert, 0o600},
		{bedNATSKey, natsKey, 0o600},
		{bedMySQLCert, mysqlCert, 0o600},
		{bedMySQLKey, mysqlKey, 0o600},
		{bedNATSTriage, []byte(rand.Text() + "\n"), 0o600},
		{bedNATSClient, []byte(rand.Text() + "\n"), 0o600},
		{bedNATSRoute, []byte(rand.Text() + "\n"), 0o600},
		// Last: a directory without it is one whose writing did not
		// finish, and is written again whole.
		{bedToken, []byte(token + "\n"), 0o600},
	}
	for _, f := range files {
		if err := os.WriteFile(filepath.Join(dir, f.name), f.data, f.perm); err != nil {
			return false, err
		}
		if err := os.Chmod(filepath.Join(dir, f.name), f.perm); err != nil {
			return false, err
		}
	}
	return true, nil
}

// throwawayCA is the bed's CA while WriteBedDir runs: its key is dropped
// with it, so nothing but the bed's two server certificates is ever signed
// with it.
type throwawayCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte // the certificate
}

func newCA() (*throwawayCA, error) {
	now := time.Now()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serialNumber(), Subject: pkix.Name{CommonName: "triage compose bed CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(bedCertLifetime),
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
	return &throwawayCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}, nil
}

// issue makes a certificate and key (PEM) for names (and localhost), good
// for server and client authentication: a NATS route is a client of its
// peer.
func (ca *throwawayCA) issue(commonName string, names []string) (cert, key []byte, err error) {
	now := time.Now()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serialNumber(), Subject: pkix.Name{CommonName: commonName},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(bedCertLifetime),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		DNSNames:    append([]string{"localhost"}, names...), IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &k.PublicKey, ca.key)
	if err != nil {
		return nil, nil, err
	}
	keyDER, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), nil
}

// serialNumber is a random certificate serial number.
func serialNumber() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err) // crypto/rand does not fail
	}
	return n
}

// bedDirOf finds the bed directory of a running bed on the host: the
// source of the keys file mounted into the router container id.
func bedDirOf(ctx context.Context, id string) (string, error) {
	src, err := docker(ctx, "inspect", "-f", `{{range .Mounts}}{{if eq .Destination "`+keysPath+`"}}{{.Source}}{{end}}{{end}}`, id)
	if err != nil {
		return "", err
	}
	if src == "" {
		return "", fmt.Errorf("router container %s mounts no keys file at %s: a bed from before keys, or not made by up.sh", id, keysPath)
	}
	return filepath.Dir(src), nil
}

// readToken reads the API key of the bed directory dir.
func readToken(dir string) (string, error) {
	data, err := os.ReadFile(filepath.Join(dir, bedToken))
	if err != nil {
		return "", fmt.Errorf("the compose bed's API key: %w", err)
	}
	token := strings.TrimSpace(string(data))
	if token == "" {
		return "", errors.New("the compose bed's API key: " + filepath.Join(dir, bedToken) + " is empty")
	}
	return token, nil
}

// Dir is the bed's directory on the host (TRIAGE_BED_DIR of up.sh): its
// API key, NATS passwords and certificates (WriteBedDir).
func (b *Bed) Dir() string { return b.dir }

// Token is the bed's cluster-admin API key, which Routers gives every
// router.
func (b *Bed) Token() string { return b.token }

// NATSClient is how an application logs in to region's NATS server from
// the Docker host: the server's address on its region's network as a
// tls:// URL, the bed's client login and the bed's CA, checking the
// server's name (nats-<region>, which its certificate carries). A client
// login replies under natsserver.ClientInboxPrefix of its user.
func (b *Bed) NATSClient(ctx context.Context, region string) (url string, login *shardmap.NATSLogin, natsTLS *shardmap.NATSTLS, err error) {
	url, natsTLS, err = b.natsServer(ctx, region)
	return url, &shardmap.NATSLogin{User: natsClientUser, PasswordFile: filepath.Join(b.dir, bedNATSClient)}, natsTLS, err
}

// NATSTriage is NATSClient with Triage's own login, the one the roles use.
func (b *Bed) NATSTriage(ctx context.Context, region string) (url string, login *shardmap.NATSLogin, natsTLS *shardmap.NATSTLS, err error) {
	url, natsTLS, err = b.natsServer(ctx, region)
	return url, &shardmap.NATSLogin{User: natsUser, PasswordFile: filepath.Join(b.dir, bedNATSTriage)}, natsTLS, err
}

// natsServer is region's NATS server's URL from the Docker host and the
// TLS settings that verify it.
func (b *Bed) natsServer(ctx context.Context, region string) (string, *shardmap.NATSTLS, error) {
	c, err := b.service(ctx, "nats-"+region)
	if err != nil {
		return "", nil, err
	}
	ip, err := docker(ctx, "inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}", c.ID)
	if err != nil {
		return "", nil, err
	}
	if len(strings.Fields(ip)) == 0 {
		return "", nil, fmt.Errorf("%s has no address", c.Service)
	}
	return "tls://" + net.JoinHostPort(strings.Fields(ip)[0], "4222"),
		&shardmap.NATSTLS{CAFile: filepath.Join(b.dir, bedCA), ServerName: c.Service}, nil
}

// bearer sends the bed's API key with every RPC, over the routers' plain
// gRPC (the bed's clients reach them on the host's loopback).
type bearer string

func (t bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(t)}, nil
}

func (bearer) RequireTransportSecurity() bool { return false }
