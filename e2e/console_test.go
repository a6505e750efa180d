package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/triage-queue/triage/cmd/triage/node"
	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
)

// consoleRoutes parses ROUTES out of the console's script as served:
// name → "METHOD /v1/path/{param}".
func consoleRoutes(t *testing.T, js string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, m := range regexp.MustCompile(`(\w+): "(GET|POST|PUT|DELETE|PATCH) (/v1/[^"]*)"`).FindAllStringSubmatch(js, -1) {
		out[m[1]] = m[2] + " " + m[3]
	}
	require.Equal(t, len(out), strings.Count(js, "/v1/"), "the script names a /v1/ path outside ROUTES")
	return out
}

// TestConsole serves the web console from a running node and calls every
// API route its script calls, as the script calls them (same paths,
// query parameters and bodies), after a workload whose answers are known.
func TestConsole(t *testing.T) {
	t.Parallel()
	b := setup(t, bedOpts{maxAttempts: 1})
	hc := &http.Client{Timeout: 30 * time.Second}

	get := func(path string) (*http.Response, string) {
		t.Helper()
		resp, err := hc.Get(b.http + path)
		require.NoError(t, err)
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp, string(body)
	}
	// The page (after /console's redirect) and its assets.
	resp, page := get("/console")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "/console/", resp.Request.URL.Path, "redirected to the directory")
	require.Equal(t, "text/html; charset=utf-8", resp.Header.Get("Content-Type"))
	require.Contains(t, page, `<script src="console.js"`)
	require.Contains(t, page, `href="console.css"`)
	resp, css := get("/console/console.css")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "text/css; charset=utf-8", resp.Header.Get("Content-Type"))
	require.Contains(t, css, ".ready")
	resp, js := get("/console/console.js")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "text/javascript; charset=utf-8", resp.Header.Get("Content-Type"))
	resp, _ = get("/console/missing.js")
	require.Equal(t, http.StatusNotFound, resp.StatusCode)

	// Every route the script calls is a route of the API.
	routes := consoleRoutes(t, js)
	require.Len(t, routes, 15)
	data, err := os.ReadFile("../proto/triage/v1/triage.swagger.json")
	require.NoError(t, err)
	var doc struct {
		Paths map[string]map[string]json.RawMessage `json:"paths"`
	}
	require.NoError(t, json.Unmarshal(data, &doc))
	for name, r := range routes {
		method, path, _ := strings.Cut(r, " ")
		require.Contains(t, doc.Paths[path], strings.ToLower(method), "%s: %s %s is not in the API", name, method, path)
	}

	// call is the script's call(): the route of name with path params,
	// query and JSON body; it returns the status and decoded answer.
	call := func(name string, params map[string]string, query url.Values, body any) (int, map[string]any) {
		t.Helper()
		method, path, _ := strings.Cut(routes[name], " ")
		for k, v := range params {
			path = strings.ReplaceAll(path, "{"+k+"}", url.PathEscape(v))
		}
		require.NotContains(t, path, "{", "%s: a path parameter is missing", name)
		if len(query) > 0 {
			path += "?" + query.Encode()
		}
		var rd io.Reader
		if body != nil {
			data, err := json.Marshal(body)
			require.NoError(t, err)
			rd = bytes.NewReader(data)
		}
		req, err := http.NewRequest(method, b.http+path, rd)
		require.NoError(t, err)
		req.Header.Set("Accept", "application/json")
		if body != nil {
			req.Header.Set("Content-Type", "application/json")
		}
		resp, err := hc.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		out := map[string]any{}
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&out), "%s %s", method, path)
		return resp.StatusCode, out
	}
	ok := func(name string, params map[string]string, query url.Values, body any) map[string]any {
		t.Helper()
		code, out := call(name, params, query, body)
		require.Equal(t, http.StatusOK, code, "%s: %v", name, out)
		return out
	}
	ns := map[string]string{"namespace": "default"}
	with := func(kv ...string) map[string]string {
		m := map[string]string{"namespace": "default"}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}

	// Workload: alpha holds two items at priority 0 and one at 2, beta
	// one at 1; one item of "dead" is nacked once (max_attempts 1).
	alpha := enqueue(t, b, "alpha", &triagev1.NewItem{Payload: []byte("a1")}, &triagev1.NewItem{Payload: []byte("a2")},
		&triagev1.NewItem{Payload: []byte("a3"), Priority: 2, Metadata: map[string]string{"k": "v"}})
	enqueue(t, b, "beta", &triagev1.NewItem{Payload: []byte("b1"), Priority: 1})
	dead := enqueue(t, b, "dead", &triagev1.NewItem{Payload: []byte("d1")})[0].Id
	var got []*triagev1.LeasedItem
	require.Eventually(t, func() bool { got = dequeue(t, b, "dead", 1, 0); return len(got) == 1 }, 10*time.Second, 20*time.Millisecond)
	res, err := b.queue.Nack(b.ctx(), &triagev1.NackRequest{Namespace: "default", Nacks: []*triagev1.NackItem{
		{Id: dead, LeaseToken: got[0].LeaseToken, Delay: durationpb.New(0), Error: "console test"}}})
	require.NoError(t, err)
	require.True(t, res.Results[0].Ok)

	// Topics page: the list, then each topic's stats.
	q := url.Values{"region": {""}, "page_size": {"1000"}}
	q.Del("region") // the script leaves an empty region out
	list := ok("listTopics", ns, q, nil)
	var names []string
	for _, tp := range list["topics"].([]any) {
		names = append(names, tp.(map[string]any)["topic"].(string))
	}
	require.Subset(t, names, []string{"alpha", "beta"})
	st := ok("topicStats", with("topic", "alpha"), nil, nil)
	require.Equal(t, "3", st["ready"])
	require.Equal(t, "3", st["total"])
	require.Equal(t, "0", st["leased"])
	require.Equal(t, []any{
		map[string]any{"priority": float64(0), "ready": "2"},
		map[string]any{"priority": float64(2), "ready": "1"},
	}, st["ready_by_priority"])
	require.Regexp(t, `^\d+(\.\d+)?s$`, st["oldest_ready_age"], "a protojson duration, which the script parses")
	st = ok("topicStats", with("topic", "dead"), nil, nil)
	require.Equal(t, "1", st["dead_letters"])

	// Item page.
	item := ok("getItem", with("id", alpha[2].Id), nil, nil)
	require.Equal(t, "alpha", item["topic"])
	require.Equal(t, "READY", item["state"])
	require.Equal(t, float64(2), item["priority"])
	require.Equal(t, "YTM=", item["payload"], "bytes as base64, which the script decodes")
	require.Equal(t, map[string]any{"k": "v"}, item["metadata"])
	code, out := call("getItem", with("id", "nope"), nil, nil)
	require.Equal(t, http.StatusBadRequest, code, "%v", out)
	require.NotEmpty(t, out["message"], "errors carry the message the script shows")

	// Items page: alpha's ready items two a page, as the script pages
	// them, then of priority 1 and up; a priority change and a delete
	// from the list.
	ids := func(lp map[string]any) []string {
		var out []string
		for _, it := range lp["items"].([]any) {
			out = append(out, it.(map[string]any)["id"].(string))
		}
		return out
	}
	lp := ok("listItems", with("topic", "alpha"), url.Values{"state": {"ready"}, "page_size": {"2"}}, nil)
	require.ElementsMatch(t, []string{alpha[0].Id, alpha[1].Id}, ids(lp))
	require.NotEmpty(t, lp["next_page_token"])
	lp = ok("listItems", with("topic", "alpha"), url.Values{"state": {"ready"}, "page_size": {"2"}, "page_token": {lp["next_page_token"].(string)}}, nil)
	require.Equal(t, []string{alpha[2].Id}, ids(lp))
	require.Empty(t, lp["next_page_token"])
	lp = ok("listItems", with("topic", "alpha"), url.Values{"state": {"ready"}, "min_priority": {"1"}, "max_priority": {"9"}}, nil)
	require.Equal(t, []string{alpha[2].Id}, ids(lp))
	code, out = call("listItems", with("topic", "alpha"), url.Values{"state": {"gone"}}, nil)
	require.Equal(t, http.StatusBadRequest, code, "%v", out)
	require.Contains(t, out["message"], "allowed ready, leased or delayed")
	item = ok("updateItem", with("id", alpha[0].Id), nil, map[string]any{"priority": 5, "updated_by": "console"})
	require.Equal(t, []any{float64(5), "console"}, []any{item["priority"], item["priority_changed_by"]})
	require.Empty(t, ok("deleteItem", with("id", alpha[1].Id), nil, nil))
	code, out = call("getItem", with("id", alpha[1].Id), nil, nil)
	require.Equal(t, http.StatusNotFound, code, "%v", out)

	// The throughput chart: the hour in 10-second intervals, with the
	// workload's enqueues in it.
	tp := ok("throughput", ns, nil, nil)
	require.Equal(t, "10s", tp["interval"])
	enqueued := tp["enqueued"].([]any)
	require.Len(t, enqueued, 360)
	sum := 0.0
	for _, v := range enqueued {
		sum += v.(float64)
	}
	require.Greater(t, sum, 0.0)

	// Dead letters page, and redrive of the selected one.
	dl := ok("listDeadLetters", with("topic", "dead"), url.Values{"page_size": {"100"}}, nil)
	letters := dl["dead_letters"].([]any)
	require.Len(t, letters, 1)
	letter := letters[0].(map[string]any)
	require.Equal(t, dead, letter["id"])
	require.Equal(t, "console test", letter["last_error"])
	rd := ok("redrive", with("topic", "dead"), nil, map[string]any{"region": "", "ids": []string{dead}})
	require.Equal(t, "1", rd["redriven"])
	dl = ok("listDeadLetters", with("topic", "dead"), url.Values{"page_size": {"100"}}, nil)
	require.Empty(t, dl["dead_letters"])
	require.Eventually(t, func() bool { got = dequeue(t, b, "dead", 1, 0); return len(got) == 1 }, 10*time.Second, 20*time.Millisecond)
	require.Equal(t, dead, got[0].Id, "redriven through the console's route")

	// Shards page: the map, then the failover history, which needs a
	// controller.
	m := ok("shardMap", nil, nil, nil)
	shards := m["shards"].([]any)
	require.Len(t, shards, 2)
	for i, s := range shards {
		s := s.(map[string]any)
		require.Equal(t, float64(i+1), s["id"])
		require.NotEmpty(t, s["primary"])
		require.Equal(t, "us-east", s["home_region"])
		require.Contains(t, s, "epoch")
	}
	code, out = call("failovers", nil, url.Values{"limit": {"200"}}, nil)
	require.Equal(t, http.StatusServiceUnavailable, code, "%v", out)
	require.Contains(t, out["message"], "no failover controller answered")
	ctl := b.startNode(node.Config{Roles: []string{node.RoleController}})
	require.Eventually(t, func() bool {
		code, out = call("failovers", nil, url.Values{"limit": {"200"}}, nil)
		return code == http.StatusOK
	}, 20*time.Second, 100*time.Millisecond, "%v", out)
	require.True(t, strings.HasPrefix(fmt.Sprint(out["controller"]), "us-east-"), "%v", out)
	require.Empty(t, out["events"], "no failover yet")
	require.NotNil(t, ctl.Controller)

	// Drills page: none yet, then one reported (as triage-bed drill does,
	// through ReportDrill) with its events.
	drills := ok("listDrills", nil, nil, nil)
	require.Empty(t, drills["drills"])
	_, err = b.admin.ReportDrill(b.ctx(), &triagev1.ReportDrillRequest{Id: "primary-kill-1", Scenario: "primary-kill", Phase: "fault injected",
		Events: []*triagev1.DrillEvent{{Text: "fault injected in 40ms"}}})
	require.NoError(t, err)
	drills = ok("listDrills", nil, nil, nil)
	reported := drills["drills"].([]any)
	require.Len(t, reported, 1)
	d := reported[0].(map[string]any)
	require.Equal(t, "primary-kill-1", d["id"])
	require.Equal(t, "fault injected", d["phase"])
	require.Equal(t, "fault injected in 40ms", d["events"].([]any)[0].(map[string]any)["text"])
}

// TestConsoleWithKeys: with a keys file, the console's pages need no key
// (they hold no data), while the API routes its script calls answer 401
// without the Bearer key it sends and 200 with a key of the right role.
func TestConsoleWithKeys(t *testing.T) {
	t.Parallel()
	s := setupSecure(t)
	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: s.client}}
	do := func(path, key string) int {
		t.Helper()
		req, err := http.NewRequest(http.MethodGet, "https://"+s.node.HTTPAddr+path, nil)
		require.NoError(t, err)
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		resp, err := hc.Do(req)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	require.Equal(t, http.StatusOK, do("/console/", ""))
	require.Equal(t, http.StatusOK, do("/console/console.js", ""))
	require.Equal(t, http.StatusUnauthorized, do("/v1/namespaces/default/topics?page_size=1000", ""))
	require.Equal(t, http.StatusOK, do("/v1/namespaces/default/topics?page_size=1000", s.tokens["reader"]))
	require.Equal(t, http.StatusForbidden, do("/v1/namespaces/default/topics?page_size=1000", s.tokens["producer"]))
	// With admin listeners, cluster-admin routes are refused on the
	// public one, which is what the console's shard page shows.
	require.Equal(t, http.StatusForbidden, do("/v1/shardmap", s.tokens["ops"]))
	require.Equal(t, http.StatusForbidden, do("/v1/failovers", s.tokens["ops"]))
	require.Equal(t, http.StatusForbidden, do("/v1/drills", s.tokens["ops"]))
}
