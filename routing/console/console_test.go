package console

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func get(t *testing.T, h http.Handler, method, path string) *http.Response {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(method, path, nil))
	return rec.Result()
}

// TestServesAssets checks each page and asset's status, content type and
// headers, and what is refused.
func TestServesAssets(t *testing.T) {
	mux := http.NewServeMux()
	for p, h := range Register(nil) {
		mux.Handle(p, h)
	}
	resp := get(t, mux, http.MethodGet, "/console")
	require.Equal(t, http.StatusMovedPermanently, resp.StatusCode)
	require.Equal(t, "/console/", resp.Header.Get("Location"))

	for path, ctype := range map[string]string{
		"/console/":            "text/html; charset=utf-8",
		"/console/index.html":  "text/html; charset=utf-8",
		"/console/console.js":  "text/javascript; charset=utf-8",
		"/console/console.css": "text/css; charset=utf-8",
	} {
		resp := get(t, mux, http.MethodGet, path)
		require.Equal(t, http.StatusOK, resp.StatusCode, path)
		require.Equal(t, ctype, resp.Header.Get("Content-Type"), path)
		require.Equal(t, "nosniff", resp.Header.Get("X-Content-Type-Options"), path)
		require.Contains(t, resp.Header.Get("Content-Security-Policy"), "script-src 'self'", path)
		body, _ := io.ReadAll(resp.Body)
		require.NotEmpty(t, body, path)
	}
	for _, path := range []string{"/console/nope.js", "/console/../go.mod", "/console/assets/console.js", "/console/a/console.js", "/console/.."} {
		require.Equal(t, http.StatusNotFound, get(t, Handler(), http.MethodGet, path).StatusCode, path)
	}
	require.Equal(t, http.StatusMethodNotAllowed, get(t, mux, http.MethodPost, "/console/").StatusCode)
	head := get(t, mux, http.MethodHead, "/console/console.js")
	require.Equal(t, http.StatusOK, head.StatusCode)
	require.Equal(t, "text/javascript; charset=utf-8", head.Header.Get("Content-Type"))
}

// TestPageLoadsOnlyItsAssets: the page loads the console's own script
// and stylesheet, by relative name, and no inline script (the CSP would
// refuse it).
func TestPageLoadsOnlyItsAssets(t *testing.T) {
	page, err := assets.ReadFile("assets/index.html")
	require.NoError(t, err)
	srcs := regexp.MustCompile(`(?:src|href)="([^"#]+)"`).FindAllStringSubmatch(string(page), -1)
	var got []string
	for _, m := range srcs {
		got = append(got, m[1])
	}
	require.ElementsMatch(t, []string{"console.css", "console.js"}, got)
	require.Equal(t, 1, strings.Count(string(page), "<script"), "one script element, no inline scripts")
	require.NotContains(t, string(page), "style=", "no inline styles (the CSP refuses them)")
}

// Routes returns the console's API routes ("GET /v1/...") as written in
// ROUTES of console.js.
func routes(t *testing.T) map[string]string {
	js, err := assets.ReadFile("assets/console.js")
	require.NoError(t, err)
	out := map[string]string{}
	for _, m := range regexp.MustCompile(`(\w+): "(GET|POST|PUT|DELETE|PATCH) (/v1/[^"]*)"`).FindAllStringSubmatch(string(js), -1) {
		out[m[1]] = m[2] + " " + m[3]
	}
	require.NotEmpty(t, out)
	// Every /v1/ in the script is in ROUTES: no route is built elsewhere.
	require.Equal(t, len(out), strings.Count(string(js), "/v1/"), "a /v1/ path outside ROUTES")
	return out
}

// TestRoutesAreInTheAPI checks each route the console calls against the
// OpenAPI document generated from the proto (the gateway's routes).
func TestRoutesAreInTheAPI(t *testing.T) {
	data, err := os.ReadFile("../../proto/triage/v1/triage.swagger.json")
	require.NoError(t, err)
	var doc struct {
		Paths map[string]map[string]json.RawMessage `json:"paths"`
	}
	require.NoError(t, json.Unmarshal(data, &doc))
	rs := routes(t)
	for _, want := range []string{"listTopics", "topicStats", "getItem", "listItems", "updateItem", "deleteItem", "throughput",
		"listDeadLetters", "redrive", "deleteDeadLetters", "pauseTopic", "resumeTopic", "shardMap", "failovers"} {
		require.Contains(t, rs, want)
	}
	for name, r := range rs {
		method, path, _ := strings.Cut(r, " ")
		ops, ok := doc.Paths[path]
		require.True(t, ok, "%s: %s is not a route of the API", name, path)
		_, ok = ops[strings.ToLower(method)]
		require.True(t, ok, "%s: %s has no %s", name, path, method)
	}
}
