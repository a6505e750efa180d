package console

import (
	"embed"
	"io/fs"
	"net/http"
	"path"
	"strings"
)

//go:embed assets
var assets embed.FS

// Path is where the console is served.
const Path = "/console"

// files are the console's assets by name under Path, with their content
// types.
var files = map[string]string{
	"index.html":  "text/html; charset=utf-8",
	"console.js":  "text/javascript; charset=utf-8",
	"console.css": "text/css; charset=utf-8",
}

// csp admits the console's own script and stylesheet only; the charts are
// SVG built in the DOM, and the API is on the same origin.
const csp = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// Handler serves the console: Path redirects to Path+"/", which is
// index.html, and Path+"/<asset>" the assets. Register it for both Path
// and Path+"/".
func Handler() http.Handler {
	sub, err := fs.Sub(assets, "assets")
	if err != nil {
		panic(err) // the embedded tree is fixed at build time
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		if r.URL.Path == Path {
			http.Redirect(w, r, Path+"/", http.StatusMovedPermanently)
			return
		}
		name := strings.TrimPrefix(r.URL.Path, Path+"/")
		if name == "" {
			name = "index.html"
		}
		ctype, ok := files[path.Clean(name)]
		if !ok || strings.Contains(name, "/") {
			http.NotFound(w, r)
			return
		}
		data, err := fs.ReadFile(sub, name)
		if err != nil {
			http.NotFound(w, r)
			return
		}
		h := w.Header()
		h.Set("Content-Type", ctype)
		h.Set("Content-Security-Policy", csp)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cache-Control", "no-cache")
		if r.Method == http.MethodHead {
			return
		}
		_, _ = w.Write(data)
	})
}

// Register adds the console's handler to mux-style extra handlers (the
// map routing.NewGatewayFor takes).
func Register(extra map[string]http.Handler) map[string]http.Handler {
	if extra == nil {
		extra = map[string]http.Handler{}
	}
	h := Handler()
	extra[Path] = h
	extra[Path+"/"] = h
	return extra
}
