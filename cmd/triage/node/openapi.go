package node

import (
	"net/http"

	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
)

// OpenAPIPath is where the router's public HTTP listener serves the
// OpenAPI document of its JSON API (triagev1.OpenAPI). It sits at the
// root beside /healthz, /readyz and /console rather than under /v1/:
// every path under /v1/ is an RPC of the gateway, authenticated, traced
// and answered in the API's error format, and the document is none of
// those. It is public: it describes the routes every client may read in
// the repository, and holds no namespace, address or key, so as with
// gRPC reflection there is nothing to keep from an unauthenticated
// caller.
const OpenAPIPath = "/openapi.json"

// openAPIHandler serves triagev1.OpenAPI to GET and HEAD.
func openAPIHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		h := w.Header()
		h.Set("Content-Type", "application/json")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Cache-Control", "no-cache")
		if r.Method == http.MethodHead {
			return
		}
		_, _ = w.Write(triagev1.OpenAPI)
	})
}
