package postgres

import (
	"context"
	"log/slog"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// TestStartStop starts a server in a temp dir, as root or not: it answers
// over TCP with durable commits, its backends count among its PIDs, and
// Stop leaves no process behind.
func TestStartStop(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	require.NoError(t, EnsureInstalled(ctx, slog.New(slog.NewTextHandler(os.Stderr, nil))))
	// Not t.TempDir: its parent is private to the caller, and a root
	// caller's server runs as another account.
	dir, err := os.MkdirTemp("", "postgres-test-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	s, err := Start(ctx, Config{Dir: dir})
	require.NoError(t, err)
	defer s.Stop()

	conn, err := pgx.Connect(ctx, s.DSN("postgres"))
	require.NoError(t, err)
	for name, want := range map[string]string{"fsync": "on", "synchronous_commit": "on", "full_page_writes": "on"} {
		var got string
		require.NoError(t, conn.QueryRow(ctx, "SELECT current_setting($1)", name).Scan(&got))
		require.Equal(t, want, got, name)
	}
	var backend int
	require.NoError(t, conn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&backend))
	require.Contains(t, s.PIDs(), backend)
	require.NoError(t, conn.Close(ctx))

	pid := s.PID()
	require.NoError(t, s.Stop())
	select {
	case <-s.Wait():
	default:
		t.Fatal("Stop returned before the server exited")
	}
	if cmd, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline"); err == nil {
		require.NotContains(t, string(cmd), "postgres", "postgres pid %d outlived Stop", pid)
	}
	require.NoError(t, s.Stop(), "a second Stop is a no-op")
}
