package node

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/triage-queue/triage/routing"
)

// TestOpenAPIIsPublic: behind a gateway that refuses every caller, as a
// router with keys_file does to one without a key, GET /openapi.json
// still answers the embedded OpenAPI document, which parses as JSON and
// describes the /v1/ routes; HEAD answers its headers only, and other
// methods 405.
func TestOpenAPIIsPublic(t *testing.T) {
	t.Parallel()
	refuse := routing.WithAuthenticate(func(*http.Request) error { return errors.New("no credentials") })
	gw, err := routing.NewGatewayFor(t.Context(), nil, nil, map[string]http.Handler{OpenAPIPath: openAPIHandler()}, refuse)
	require.NoError(t, err)
	srv := httptest.NewServer(gw)
	t.Cleanup(srv.Close)

	resp, err := http.Get(srv.URL + "/openapi.json")
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
	require.Equal(t, "application/json", resp.Header.Get("Content-Type"))
	var doc struct {
		Swagger string                     `json:"swagger"`
		Paths   map[string]json.RawMessage `json:"paths"`
	}
	require.NoError(t, json.Unmarshal(body, &doc))
	require.Equal(t, "2.0", doc.Swagger)
	require.NotEmpty(t, doc.Paths)
	for p := range doc.Paths {
		require.True(t, strings.HasPrefix(p, "/v1/"), "path %q of the document is not under /v1/", p)
	}

	resp, err = http.Head(srv.URL + "/openapi.json")
	require.NoError(t, err)
	body, err = io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Empty(t, body)

	resp, err = http.Post(srv.URL+"/openapi.json", "application/json", strings.NewReader("{}"))
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode)
	require.Equal(t, "GET, HEAD", resp.Header.Get("Allow"))
}
