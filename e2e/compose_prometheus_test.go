package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// composeRoles are the role containers of each compose region, which the
// bed's Prometheus scrapes (deploy/compose/config/prometheus.yml).
var composeRoles = []string{"router", "enqueuer", "dequeuer", "controller"}

// checkPrometheus: the bed's Prometheus (published on a free loopback
// port) scrapes every role container of every region and finds it up, and
// it loaded deploy/prometheus/alerts.yml and evaluates every rule without
// an error, which promtool's checks cannot see (a query that fails only
// on real series, such as a many-to-many match). The bed has been up for
// the tour by then, so the first answer usually does; it asks again for
// up to a minute, as a role that started last is scraped within one
// interval (15 s).
func (b *composeBed) checkPrometheus(rec *recap) {
	t := b.t
	rec.at("Prometheus scrapes every node")
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	out, err := exec.Command("docker", "port", b.container("prometheus"), "9090/tcp").CombinedOutput()
	require.NoError(t, err, "%s", out)
	api := "http://" + strings.Fields(string(out))[0] + "/api/v1/"
	var want []string
	for _, r := range composeRegions {
		for _, role := range composeRoles {
			want = append(want, role+"/"+r)
		}
	}
	start := time.Now()
	var up, rules, lags, stopped []string
	for {
		up, rules = promUp(ctx, t, api), promRules(ctx, t, api)
		lags = promSeries(ctx, t, api, `triage_shard_replication_lag_seconds >= 0`)
		stopped = promSeries(ctx, t, api, `triage_shard_replication_lag_seconds < 0`)
		healthy := !slices.ContainsFunc(rules, func(r string) bool { return !strings.HasSuffix(r, "=ok") })
		if slices.Equal(up, want) && len(rules) > 0 && healthy && len(lags) > 0 && len(stopped) == 0 || time.Since(start) > time.Minute {
			break
		}
		time.Sleep(2 * time.Second)
	}
	require.Equal(t, want, up, "the targets Prometheus finds up (role/region)")
	// The replicas replicate after the tour: only the controller, whose
	// account may read replica status, reports their lag, and no node
	// reports a replica as stopped (-1) for want of that privilege.
	require.NotEmpty(t, lags, "the controllers report every replica's lag")
	require.Empty(t, stopped, "replicas reported stopped (role/replica)")
	require.NotEmpty(t, rules, "the alert rules Prometheus loaded")
	for _, r := range rules {
		require.True(t, strings.HasSuffix(r, "=ok"), "alert rule %s", r)
	}
	t.Logf("Prometheus: %d targets up (%s), %d alert rules evaluated without error, %.1fs after the tour",
		len(up), strings.Join(up, " "), len(rules), time.Since(start).Seconds())
}

// promUp is role/region of every target of job triage whose up is 1,
// sorted as composeRegions and composeRoles are.
func promUp(ctx context.Context, t *testing.T, api string) []string {
	var data struct {
		Result []struct {
			Metric map[string]string `json:"metric"`
			Value  [2]any            `json:"value"`
		} `json:"result"`
	}
	promGet(ctx, t, api+"query?query="+url.QueryEscape(`up{job="triage"} == 1`), &data)
	var out []string
	for _, r := range data.Result {
		out = append(out, r.Metric["role"]+"/"+r.Metric["region"])
	}
	order := func(s string) int {
		role, region, _ := strings.Cut(s, "/")
		return slices.Index(composeRegions, region)*len(composeRoles) + slices.Index(composeRoles, role)
	}
	slices.SortFunc(out, func(a, b string) int { return order(a) - order(b) })
	return out
}

// promSeries is role/replica of every series the instant query q answers.
func promSeries(ctx context.Context, t *testing.T, api, q string) []string {
	var data struct {
		Result []struct {
			Metric map[string]string `json:"metric"`
		} `json:"result"`
	}
	promGet(ctx, t, api+"query?query="+url.QueryEscape(q), &data)
	var out []string
	for _, r := range data.Result {
		out = append(out, r.Metric["role"]+"/"+r.Metric["replica"])
	}
	return out
}

// promRules is name=health (ok, unknown before its first evaluation, err)
// of every alert rule Prometheus loaded, with the error when there is one.
func promRules(ctx context.Context, t *testing.T, api string) []string {
	var data struct {
		Groups []struct {
			Rules []struct {
				Name      string `json:"name"`
				Health    string `json:"health"`
				LastError string `json:"lastError"`
			} `json:"rules"`
		} `json:"groups"`
	}
	promGet(ctx, t, api+"rules?type=alert", &data)
	var out []string
	for _, g := range data.Groups {
		for _, r := range g.Rules {
			out = append(out, fmt.Sprintf("%s=%s%s", r.Name, r.Health, r.LastError))
		}
	}
	return out
}

// promGet decodes the data of a successful answer of Prometheus' HTTP API
// at u into v.
func promGet(ctx context.Context, t *testing.T, u string, v any) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err, "GET %s", u)
	defer resp.Body.Close()
	var env struct {
		Status string          `json:"status"`
		Data   json.RawMessage `json:"data"`
		Error  string          `json:"error"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&env), "GET %s", u)
	require.Equal(t, "success", env.Status, "GET %s: %s", u, env.Error)
	require.NoError(t, json.Unmarshal(env.Data, v), "GET %s", u)
}
