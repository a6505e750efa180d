package e2e

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/triage-queue/triage/cmd/triage/node"
	"github.com/triage-queue/triage/routing/auth"
	"github.com/triage-queue/triage/routing/auth/authtest"
)

// TestOpenListenerNeedsKeysOrInsecure: a router without a keys file
// refuses to start on any listener address other than loopback, naming the
// listener and the ways out; with "insecure" it starts (and says so in its
// log), and with a keys file it starts and asks callers for a key.
func TestOpenListenerNeedsKeysOrInsecure(t *testing.T) {
	t.Parallel()
	b := setup(t, bedOpts{shards: 1, noNode: true})
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	for _, tc := range []struct {
		name string
		cfg  node.Config
		want string
	}{
		{"grpc on every interface", node.Config{GRPC: "0.0.0.0:0"}, "grpc 0.0.0.0:0"},
		{"http without a host", node.Config{HTTP: ":0"}, "http :0"},
		{"http on IPv6's any", node.Config{HTTP: "[::]:0"}, "http [::]:0"},
		{"admin grpc", node.Config{AdminGRPC: "0.0.0.0:0"}, "admin_grpc 0.0.0.0:0"},
		{"admin http by name", node.Config{AdminHTTP: "example.com:0"}, "admin_http example.com:0"},
	} {
		n, err := node.Start(ctx, b.config(tc.cfg), testLogger(t))
		if n != nil {
			n.Stop()
		}
		require.Error(t, err, tc.name)
		for _, s := range []string{tc.want, "not a loopback address", "without keys_file", "bind 127.0.0.1", `"insecure": true`, "--insecure"} {
			require.ErrorContains(t, err, s, tc.name)
		}
	}

	get := func(url, token string) int {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		require.NoError(t, err)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	local := func(addr string) string {
		_, port, err := net.SplitHostPort(addr)
		require.NoError(t, err)
		return "http://127.0.0.1:" + port
	}

	var logs lockedBuffer
	n, err := node.Start(ctx, b.config(node.Config{GRPC: "0.0.0.0:0", HTTP: "0.0.0.0:0", Insecure: true}), slog.New(slog.NewTextHandler(&logs, nil)))
	require.NoError(t, err, "insecure")
	t.Cleanup(n.Stop)
	require.Equal(t, http.StatusOK, get(local(n.HTTPAddr)+"/v1/shardmap", ""), "open to everyone, as asked")
	require.Contains(t, logs.String(), "serving without authentication")
	require.Contains(t, logs.String(), "grpc 0.0.0.0:0, http 0.0.0.0:0")

	keysFile := filepath.Join(t.TempDir(), "keys.json")
	tokens := authtest.Keys(t, keysFile, auth.Key{Name: "ops", ClusterAdmin: true})
	k, err := node.Start(ctx, b.config(node.Config{GRPC: "0.0.0.0:0", HTTP: "0.0.0.0:0", KeysFile: keysFile}), testLogger(t))
	require.NoError(t, err, "with a keys file")
	t.Cleanup(k.Stop)
	require.Equal(t, http.StatusUnauthorized, get(local(k.HTTPAddr)+"/v1/shardmap", ""))
	require.Equal(t, http.StatusOK, get(local(k.HTTPAddr)+"/v1/shardmap", tokens["ops"]))
}

// lockedBuffer is a log destination the node's goroutines write while the
// test reads it.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
