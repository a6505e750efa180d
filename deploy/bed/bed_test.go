package bed

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestBedUpAndDown starts a one-region bed on free ports, checks the layout
// file and the gateway, then stops it with Down's PID logic and checks every
// listed mariadbd is gone.
func TestBedUpAndDown(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b, err := Start(ctx, Config{Dir: dir, NATSPort: -1, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	defer b.Stop()

	l, err := ReadLayout(dir)
	require.NoError(t, err)
	require.Len(t, l.Regions, 1)
	require.Equal(t, "us-east", l.Regions[0].Name)
	roles := map[string]int{}
	for _, p := range l.Processes {
		roles[p.Role]++
		require.Positive(t, p.PID)
	}
	require.Equal(t, map[string]int{"mysql-primary": 2, "nats": 1, "triage": 1}, roles)

	resp, err := http.Post("http://"+l.Regions[0].HTTP+"/v1/namespaces/default/topics/t/items", "application/json",
		strings.NewReader(`{"items":[{"payload":"aGk="}]}`))
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
	require.Contains(t, string(body), `"id"`)

	// A second bed in the same dir is refused while this one runs.
	_, err = Start(ctx, Config{Dir: dir, NATSPort: -1})
	require.ErrorContains(t, err, "already running")

	b.Stop()
	for _, p := range l.Processes {
		if p.Role == "mysql-primary" {
			require.ErrorIs(t, syscall.Kill(p.PID, 0), syscall.ESRCH, "mariadbd %d still running", p.PID)
		}
	}
	_, err = ReadLayout(dir)
	require.Error(t, err, "bed.json is removed on stop")
}
