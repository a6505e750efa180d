package compose

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"

	"github.com/triage-queue/triage/deploy/certs"
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

// WriteBedDir makes dir a bed directory for t, unless it is one already
// (it holds every file of one): a new cluster-admin API key and the keys
// file with its hash, random NATS passwords, and a throwaway CA with the
// NATS servers' certificate for every NATS server's and every gateway's
// name (the routes dial the gateways) and the MariaDB servers' for every
// MariaDB server's and every gateway's name (another region's server is
// dialed as its gateway, by nodes and replicas alike, and is verified
// against the name dialed). The directory is made 0700, which keeps its
// files from the host's other users (up.sh's mkdir -p leaves it 0755);
// in it, every file a container mounts is 0644, because the containers
// run as the production image's user (uid 65532), not as the host user
// who writes them, and a bind mount keeps the host's owner and mode. The
// API key, which no container mounts, stays 0600. It reports whether it
// wrote anything.
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
	if err := os.Chmod(dir, 0o700); err != nil {
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
	c, err := issueBedCerts(t)
	if err != nil {
		return false, err
	}
	files := []struct {
		name string
		data []byte
		perm os.FileMode
	}{
		{bedKeys, append(keys, '\n'), 0o644},
		{bedCA, c.ca, 0o644},
		{bedNATSCert, c.natsCert, 0o644},
		{bedNATSKey, c.natsKey, 0o644},
		{bedMySQLCert, c.mysqlCert, 0o644},
		{bedMySQLKey, c.mysqlKey, 0o644},
		{bedNATSTriage, []byte(rand.Text() + "\n"), 0o644},
		{bedNATSClient, []byte(rand.Text() + "\n"), 0o644},
		{bedNATSRoute, []byte(rand.Text() + "\n"), 0o644},
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

// bedCerts are the compose bed's certificates, PEM-encoded: the CA's and
// the NATS and MariaDB servers' certificates and keys.
type bedCerts struct {
	ca, natsCert, natsKey, mysqlCert, mysqlKey []byte
}

// issueBedCerts makes a throwaway CA and issues with it the NATS servers'
// certificate for every NATS server's and every gateway's name and the
// MariaDB servers' for every MariaDB server's and every gateway's name,
// both for localhost and 127.0.0.1 too, as the process bed's are. The
// CA's key is dropped when it returns: nothing but these two certificates
// is ever signed with it.
func issueBedCerts(t Topology) (*bedCerts, error) {
	natsNames := []string{"localhost", "127.0.0.1"}
	mysqlNames := []string{"localhost", "127.0.0.1"}
	for _, r := range t.Regions {
		natsNames = append(natsNames, "nats-"+r, gateway(r))
		mysqlNames = append(mysqlNames, gateway(r))
	}
	for _, s := range t.servers() {
		mysqlNames = append(mysqlNames, s.service)
	}
	ca, err := certs.NewCA("triage compose bed CA")
	if err != nil {
		return nil, err
	}
	c := &bedCerts{ca: ca.PEM()}
	if c.natsCert, c.natsKey, err = ca.Issue("triage compose bed NATS", natsNames...); err != nil {
		return nil, err
	}
	if c.mysqlCert, c.mysqlKey, err = ca.Issue("triage compose bed MariaDB", mysqlNames...); err != nil {
		return nil, err
	}
	return c, nil
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
