package main

import (
	"context"
	"io"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/triage-queue/triage/cmd/internal/cli"

	"github.com/triage-queue/triage/cmd/triage/natsserver"
	"github.com/triage-queue/triage/deploy/freeport"
	"github.com/triage-queue/triage/routing/auth/authtest"
)

// TestNATSAuthFlags: `triage nats` reads the logins' passwords from files
// (dropping the newline); a missing file is an error, not an open server.
func TestNATSAuthFlags(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	tri, cli := filepath.Join(dir, "triage"), filepath.Join(dir, "client")
	authtest.Write(t, tri, []byte("t-secret\n"))
	authtest.Write(t, cli, []byte("c-secret\n"))
	a, err := natsAuth("triage", tri, "client", cli)
	require.NoError(t, err)
	require.Equal(t, &natsserver.Auth{Triage: natsserver.Login{User: "triage", Password: "t-secret"},
		Clients: []natsserver.Login{{User: "client", Password: "c-secret"}}}, a)
	a, err = natsAuth("triage", tri, "client", "")
	require.NoError(t, err)
	require.Empty(t, a.Clients)
	_, err = natsAuth("triage", filepath.Join(dir, "missing"), "client", cli)
	require.Error(t, err)
	_, err = natsAuth("triage", tri, "client", filepath.Join(dir, "missing"))
	require.Error(t, err)
}

// TestNATSTLSFlags: `triage nats --tls-cert --tls-key` serves TLS only (a
// client without the CA is refused, one with it logs in); TLS options
// without the pair and a route password without routes are usage errors,
// not a server in the clear.
func TestNATSTLSFlags(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cert, key, ca := authtest.NewCA(t, "nats-ca").PeerFiles(t, dir, "nats")
	tri := filepath.Join(dir, "triage")
	authtest.Write(t, tri, []byte("t-secret\n"))
	for _, args := range [][]string{
		{"nats", "--no-auth", "--tls-ca", ca, "--tls-verify-clients"},
		{"nats", "--no-auth", "--tls-routes", "--tls-ca", ca},
		{"nats", "--no-auth", "--route-password-file", tri},
	} {
		var stdout, stderr strings.Builder
		code := cli.Run(t.Context(), newRoot(), append(args, "--port", "-1", "--http-port", "0", "--store", t.TempDir()), strings.NewReader(""), &stdout, &stderr)
		require.Equal(t, 2, code, "%v: %s", args, stderr.String())
	}

	port := freePort(t)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan int)
	var stderr strings.Builder
	go func() {
		done <- cli.Run(ctx, newRoot(), []string{"nats", "--host", "127.0.0.1", "--port", strconv.Itoa(port), "--http-port", "0", "--store", t.TempDir(),
			"--triage-password-file", tri, "--tls-cert", cert, "--tls-key", key}, strings.NewReader(""), io.Discard, &stderr)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	url := "tls://127.0.0.1:" + strconv.Itoa(port)
	var nc *nats.Conn
	require.Eventually(t, func() bool {
		var err error
		nc, err = nats.Connect(url, nats.UserInfo("triage", "t-secret"), nats.RootCAs(ca), nats.MaxReconnects(0))
		return err == nil
	}, 20*time.Second, 50*time.Millisecond, "%s", &stderr)
	defer nc.Close()
	state, err := nc.TLSConnectionState()
	require.NoError(t, err)
	require.True(t, state.HandshakeComplete)
	_, err = nats.Connect(url, nats.UserInfo("triage", "t-secret"), nats.MaxReconnects(0))
	require.ErrorContains(t, err, "certificate signed by unknown authority")
}

// TestNATSDefaults: `triage nats` without flags listens on loopback only,
// serves no monitoring port, and refuses to start without the Triage login
// unless --no-auth says so, saying which flag to give.
func TestNATSDefaults(t *testing.T) {
	t.Parallel()
	flags := natsCommand().Flags()
	require.Equal(t, "127.0.0.1", flags.Lookup("host").DefValue)
	require.Equal(t, "0", flags.Lookup("http-port").DefValue, "no monitoring port unless asked for")

	dir := t.TempDir()
	tri := filepath.Join(dir, "triage")
	authtest.Write(t, tri, []byte("t-secret\n"))
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"no login", nil, "give --triage-password-file"},
		{"no login and a client login", []string{"--client-password-file", tri}, "needs --triage-password-file"},
		{"both --no-auth and a login", []string{"--no-auth", "--triage-password-file", tri}, "choose one"},
	} {
		var stdout, stderr strings.Builder
		args := append([]string{"nats", "--port", "-1", "--store", t.TempDir()}, tc.args...)
		code := cli.Run(t.Context(), newRoot(), args, strings.NewReader(""), &stdout, &stderr)
		require.Equal(t, 2, code, "%s: %s", tc.name, stderr.String())
		require.Contains(t, stderr.String(), tc.want, tc.name)
	}

	port := freePort(t)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan int)
	var stderr syncBuilder
	go func() {
		done <- cli.Run(ctx, newRoot(), []string{"nats", "--no-auth", "--port", strconv.Itoa(port), "--store", t.TempDir()},
			strings.NewReader(""), io.Discard, &stderr)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	loop := "127.0.0.1:" + strconv.Itoa(port)
	require.Eventually(t, func() bool {
		nc, err := nats.Connect("nats://"+loop, nats.MaxReconnects(0))
		if err == nil {
			nc.Close()
		}
		return err == nil
	}, 20*time.Second, 50*time.Millisecond, "%s", &stderr)
	// The server accepts connections a moment before the command says
	// where it serves: wait for the line rather than read it at once.
	require.Eventually(t, func() bool { return strings.Contains(stderr.String(), "serving nats://"+loop+" ") },
		10*time.Second, 20*time.Millisecond, "%s", &stderr)
	require.Contains(t, stderr.String(), "monitoring off")
	// Loopback only: the host's other addresses refuse the port.
	addrs, err := net.InterfaceAddrs()
	require.NoError(t, err)
	for _, a := range addrs {
		ip, ok := a.(*net.IPNet)
		if !ok || ip.IP.IsLoopback() || ip.IP.To4() == nil {
			continue
		}
		c, err := net.DialTimeout("tcp", net.JoinHostPort(ip.IP.String(), strconv.Itoa(port)), time.Second)
		if err == nil {
			c.Close()
		}
		require.Error(t, err, "%s answers on %s", loop, ip.IP)
	}
}

// syncBuilder is a strings.Builder that a command may write while the
// test reads it.
type syncBuilder struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuilder) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuilder) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func freePort(t *testing.T) int {
	t.Helper()
	p, err := freeport.Pick()
	require.NoError(t, err)
	return p
}

// TestProbeNATSPeers: `triage probe --nats-peers N` (the compose bed's NATS
// health check) passes only when the server's /routez lists routes to N
// other servers, read from a real clustered nats-server.
func TestProbeNATSPeers(t *testing.T) {
	t.Parallel()
	httpPort, routeA, routeB := freePort(t), freePort(t), freePort(t)
	a, err := natsserver.Start(natsserver.Config{Name: "nats-a", StoreDir: t.TempDir(), HTTPPort: httpPort,
		ClusterName: "c", ClusterPort: routeA, Routes: []string{"nats://127.0.0.1:" + strconv.Itoa(routeB)}})
	require.NoError(t, err)
	t.Cleanup(a.Shutdown)
	base := "http://127.0.0.1:" + strconv.Itoa(httpPort)
	probe := func(peers string) (int, string) {
		var stdout, stderr strings.Builder
		code := cli.Run(t.Context(), newRoot(), []string{"probe", "--nats-peers", peers, base}, strings.NewReader(""), &stdout, &stderr)
		return code, stdout.String() + stderr.String()
	}
	code, out := probe("1")
	require.NotEqual(t, 0, code, "alone, without its route (nor a JetStream quorum): %s", out)

	b, err := natsserver.Start(natsserver.Config{Name: "nats-b", StoreDir: t.TempDir(),
		ClusterName: "c", ClusterPort: routeB, Routes: []string{"nats://127.0.0.1:" + strconv.Itoa(routeA)}})
	require.NoError(t, err)
	t.Cleanup(b.Shutdown)
	require.Eventually(t, func() bool { code, out = probe("1"); return code == 0 }, 20*time.Second, 100*time.Millisecond, "%s", &out)
	require.Contains(t, out, "routes to [nats-b]", "a route pool's connections count once")
	code, out = probe("2")
	require.NotEqual(t, 0, code)
	require.Contains(t, out, "routes to 1 other server(s) [nats-b], want 2")
}
