package bed

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// requireMetrics checks that r's metrics listener, as bed.json names it,
// serves /metrics, and that the router's HTTP listener answers 404 there.
func requireMetrics(t *testing.T, r Region) {
	t.Helper()
	require.NotEmpty(t, r.Metrics, "bed.json names the metrics listener")
	get := func(url string) (int, string) {
		resp, err := http.Get(url)
		require.NoError(t, err)
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(body)
	}
	code, body := get("http://" + r.Metrics + "/metrics")
	require.Equal(t, http.StatusOK, code)
	require.True(t, strings.Contains(body, "triage_shard_primary_info"), "the metrics listener serves the node's metrics")
	code, body = get("http://" + r.HTTP + "/metrics")
	require.Equal(t, http.StatusNotFound, code)
	require.NotContains(t, body, "triage_")
}
