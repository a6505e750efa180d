package natsserver_test

import (
	"bufio"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/triage-queue/triage/cmd/triage/natsserver"
	"github.com/triage-queue/triage/deploy/freeport"
	"github.com/triage-queue/triage/routing/auth/authtest"
)

// tlsFiles writes a peer certificate of a new CA into a temp dir and
// returns the server's TLS settings naming them.
func tlsFiles(t *testing.T, ca *authtest.CA) natsserver.TLS {
	t.Helper()
	cert, key, caFile := ca.PeerFiles(t, t.TempDir(), "nats")
	return natsserver.TLS{CertFile: cert, KeyFile: key, CAFile: caFile}
}

// TestTLS: with TLS the client port refuses a plaintext client and a
// client that does not trust the server's CA; a client with the CA
// connects, logs in and round-trips a message.
func TestTLS(t *testing.T) {
	t.Parallel()
	ca := authtest.NewCA(t, "nats-test-ca")
	tf := tlsFiles(t, ca)
	auth := &natsserver.Auth{Triage: natsserver.Login{User: "triage", Password: "t-secret"}}
	s, err := natsserver.Start(natsserver.Config{StoreDir: t.TempDir(), Auth: auth, TLS: &tf})
	require.NoError(t, err)
	t.Cleanup(s.Shutdown)
	require.True(t, strings.HasPrefix(s.ClientURL(), "tls://"), s.ClientURL())
	plainURL := "nats://" + strings.TrimPrefix(s.ClientURL(), "tls://")

	// Plaintext: the server announces TLS as required and never answers
	// a CONNECT sent in the clear.
	conn, err := net.DialTimeout("tcp", strings.TrimPrefix(s.ClientURL(), "tls://"), 5*time.Second)
	require.NoError(t, err)
	defer conn.Close()
	r := bufio.NewReader(conn)
	require.NoError(t, conn.SetDeadline(time.Now().Add(5*time.Second)))
	info, err := r.ReadString('\n')
	require.NoError(t, err)
	require.Contains(t, info, `"tls_required":true`)
	_, err = conn.Write([]byte("CONNECT {\"user\":\"triage\",\"pass\":\"t-secret\",\"verbose\":false}\r\nPING\r\n"))
	require.NoError(t, err)
	rest, err := r.ReadString('\n')
	require.Error(t, err, "the server answered a plaintext client: %q", rest)
	require.NotContains(t, rest, "PONG")

	// A client that does not trust the CA fails the handshake.
	_, err = nats.Connect(s.ClientURL(), nats.UserInfo("triage", "t-secret"), nats.MaxReconnects(0))
	require.Error(t, err)
	require.Contains(t, err.Error(), "certificate signed by unknown authority")
	other := authtest.NewCA(t, "another-ca")
	otherCA := filepath.Join(t.TempDir(), "other.crt")
	authtest.Write(t, otherCA, other.PEM)
	_, err = nats.Connect(s.ClientURL(), nats.UserInfo("triage", "t-secret"), nats.RootCAs(otherCA), nats.MaxReconnects(0))
	require.Error(t, err)
	require.Contains(t, err.Error(), "certificate signed by unknown authority")
	// Insisting on TLS does not get around the login.
	_, err = nats.Connect(s.ClientURL(), nats.RootCAs(tf.CAFile), nats.MaxReconnects(0))
	require.ErrorIs(t, err, nats.ErrAuthorization)

	// The CA and the login: connected, encrypted, working; the nats://
	// URL gets TLS too, because the server requires it.
	for _, url := range []string{s.ClientURL(), plainURL} {
		nc, err := nats.Connect(url, nats.UserInfo("triage", "t-secret"), nats.RootCAs(tf.CAFile), nats.MaxReconnects(0))
		require.NoError(t, err, url)
		state, err := nc.TLSConnectionState()
		require.NoError(t, err)
		require.True(t, state.HandshakeComplete)
		msgs := make(chan *nats.Msg, 1)
		_, err = nc.ChanSubscribe("triage.ready.default", msgs)
		require.NoError(t, err)
		require.NoError(t, nc.Publish("triage.ready.default", []byte("over tls")))
		select {
		case m := <-msgs:
			require.Equal(t, "over tls", string(m.Data))
		case <-time.After(5 * time.Second):
			t.Fatal("no message over TLS")
		}
		nc.Close()
	}
}

// TestTLSVerifyClients: with VerifyClients a client needs a certificate
// of the CA as well as the server's trust.
func TestTLSVerifyClients(t *testing.T) {
	t.Parallel()
	ca := authtest.NewCA(t, "nats-test-ca")
	tf := tlsFiles(t, ca)
	tf.VerifyClients = true
	s, err := natsserver.Start(natsserver.Config{StoreDir: t.TempDir(), TLS: &tf})
	require.NoError(t, err)
	t.Cleanup(s.Shutdown)

	_, err = nats.Connect(s.ClientURL(), nats.RootCAs(tf.CAFile), nats.MaxReconnects(0))
	require.Error(t, err, "no client certificate")
	dir := t.TempDir()
	strangerCert, strangerKey := authtest.NewCA(t, "stranger").Issue(t, "stranger", false)
	authtest.Write(t, filepath.Join(dir, "stranger.crt"), strangerCert)
	authtest.Write(t, filepath.Join(dir, "stranger.key"), strangerKey)
	_, err = nats.Connect(s.ClientURL(), nats.RootCAs(tf.CAFile), nats.ClientCert(filepath.Join(dir, "stranger.crt"), filepath.Join(dir, "stranger.key")), nats.MaxReconnects(0))
	require.Error(t, err, "a client certificate of another CA")

	c, k := ca.Issue(t, "triage-node", false)
	authtest.Write(t, filepath.Join(dir, "node.crt"), c)
	authtest.Write(t, filepath.Join(dir, "node.key"), k)
	nc, err := nats.Connect(s.ClientURL(), nats.RootCAs(tf.CAFile), nats.ClientCert(filepath.Join(dir, "node.crt"), filepath.Join(dir, "node.key")), nats.MaxReconnects(0))
	require.NoError(t, err)
	defer nc.Close()
	require.NoError(t, nc.Flush())
}

// TestTLSRejectsIncompleteSettings: a missing file or CA stops the server
// from starting rather than serving in the clear.
func TestTLSRejectsIncompleteSettings(t *testing.T) {
	t.Parallel()
	tf := tlsFiles(t, authtest.NewCA(t, "ca"))
	for name, c := range map[string]natsserver.Config{
		"no key":                 {TLS: &natsserver.TLS{CertFile: tf.CertFile}},
		"missing cert file":      {TLS: &natsserver.TLS{CertFile: tf.CertFile + ".gone", KeyFile: tf.KeyFile}},
		"verify without a CA":    {TLS: &natsserver.TLS{CertFile: tf.CertFile, KeyFile: tf.KeyFile, VerifyClients: true}},
		"routes without a CA":    {TLS: &natsserver.TLS{CertFile: tf.CertFile, KeyFile: tf.KeyFile, Routes: true}, ClusterName: "c"},
		"route auth, no pw":      {RouteAuth: &natsserver.Login{User: "route"}, ClusterName: "c"},
		"route auth, no cluster": {RouteAuth: &natsserver.Login{User: "route", Password: "x"}},
	} {
		c.StoreDir = t.TempDir()
		s, err := natsserver.Start(c)
		if err == nil {
			s.Shutdown()
		}
		require.Error(t, err, name)
	}
}

// cluster is a seed server of a cluster and how to start members.
type cluster struct {
	t    *testing.T
	seed *server.Server
	port int // the seed's route port
}

func freePort(t *testing.T) int {
	t.Helper()
	p, err := freeport.Pick()
	require.NoError(t, err)
	return p
}

// join starts a server named name that routes to the seed with cfg's
// RouteAuth and TLS.
func (c *cluster) join(name string, cfg natsserver.Config) *server.Server {
	c.t.Helper()
	cfg.Name, cfg.StoreDir, cfg.ClusterName, cfg.ClusterPort = name, c.t.TempDir(), "triage", freePort(c.t)
	cfg.Routes = []string{"nats-route://127.0.0.1:" + strconv.Itoa(c.port)}
	s, err := natsserver.Start(cfg)
	require.NoError(c.t, err)
	c.t.Cleanup(s.Shutdown)
	return s
}

// TestRouteAuth: a server that dials the seed's route port without the
// route login, or with a wrong one, is refused and never joins; one with
// the login joins. With route TLS, a server that speaks plain TCP on the
// route, or holds a certificate of another CA, stays out even with the
// right login.
func TestRouteAuth(t *testing.T) {
	t.Parallel()
	login := &natsserver.Login{User: "route", Password: "r-secret"}
	for _, withTLS := range []bool{false, true} {
		t.Run(map[bool]string{false: "plain", true: "tls"}[withTLS], func(t *testing.T) {
			t.Parallel()
			var tf *natsserver.TLS
			if withTLS {
				f := tlsFiles(t, authtest.NewCA(t, "cluster-ca"))
				f.Routes = true
				tf = &f
			}
			c := &cluster{t: t, port: freePort(t)}
			// A clustered JetStream needs a configured route: the seed's is to
			// itself, which the server recognizes and drops.
			seed, err := natsserver.Start(natsserver.Config{Name: "seed", StoreDir: t.TempDir(), ClusterName: "triage", ClusterPort: c.port,
				Routes: []string{"nats-route://127.0.0.1:" + strconv.Itoa(c.port)}, RouteAuth: login, TLS: tf})
			require.NoError(t, err)
			t.Cleanup(seed.Shutdown)
			c.seed = seed

			strangers := map[string]*server.Server{
				"no login":    c.join("no-login", natsserver.Config{TLS: tf}),
				"wrong login": c.join("wrong-login", natsserver.Config{TLS: tf, RouteAuth: &natsserver.Login{User: "route", Password: "guess"}}),
			}
			if withTLS {
				strangers["no tls"] = c.join("no-tls", natsserver.Config{RouteAuth: login})
				f := tlsFiles(t, authtest.NewCA(t, "other-ca"))
				f.Routes = true
				strangers["other ca"] = c.join("other-ca", natsserver.Config{TLS: &f, RouteAuth: login})
			}
			member := c.join("member", natsserver.Config{TLS: tf, RouteAuth: login})
			require.Eventually(t, func() bool { return member.NumRoutes() > 0 && seed.NumRoutes() > 0 }, 15*time.Second, 20*time.Millisecond,
				"the server with the route login does not join")
			// The strangers have been dialing since before the member
			// joined; give them a few more of their retries (one a second).
			time.Sleep(3 * time.Second)
			// A refused stranger can show a route for a moment on its own
			// side: it registers the route on the seed's INFO, which comes
			// before the seed refuses its CONNECT, and it retries every
			// second (a CI run caught one in that moment). One that joined
			// holds its route: sample across more than a retry interval.
			for name, s := range strangers {
				held := 0
				const samples = 60
				for range samples {
					if s.NumRoutes() > 0 {
						held++
					}
					time.Sleep(25 * time.Millisecond)
				}
				require.Less(t, held, samples/2, "%s: joined the cluster (a route in most samples over 1.5 s)", name)
			}
			routes, err := seed.Routez(nil)
			require.NoError(t, err)
			for _, r := range routes.Routes {
				require.Equal(t, "member", r.RemoteName, "a stranger has a route to the seed")
			}
		})
	}
}
