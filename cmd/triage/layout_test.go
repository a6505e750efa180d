package main

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

const module = "github.com/triage-queue/triage"

// goList runs go list with args and returns its output's fields.
func goList(t *testing.T, args ...string) []string {
	t.Helper()
	out, err := exec.Command("go", append([]string{"list"}, args...)...).Output()
	if ee, ok := err.(*exec.ExitError); ok {
		t.Fatalf("go list %v: %v\n%s", args, err, ee.Stderr)
	}
	require.NoError(t, err)
	return strings.Fields(string(out))
}

// notInServe are what the production binary must not link: everything
// under deploy/ (the beds, the bench, the drills, the WAN proxies, the
// MariaDB launcher and the queue model), toxiproxy, and the test
// libraries (the browser driver too). They live in cmd/triage-bed's
// binary, or only in tests.
var notInServe = []string{
	module + "/deploy",
	"github.com/Shopify/toxiproxy",
	"github.com/stretchr/testify",
	"go.uber.org/goleak",
	module + "/routing/console/consoletest",
	"github.com/chromedp",
}

// TestServeDoesNotLinkTheBed holds the split between the two binaries:
// triage, which serves, links nothing of the bed, the bench or toxiproxy;
// triage-bed does (which also shows the check can fail).
func TestServeDoesNotLinkTheBed(t *testing.T) {
	t.Parallel()
	linked := func(deps []string, prefix string) bool {
		for _, d := range deps {
			if d == prefix || strings.HasPrefix(d, prefix+"/") {
				return true
			}
		}
		return false
	}
	serve := goList(t, "-deps", module+"/cmd/triage")
	require.Contains(t, serve, module+"/cmd/triage/node")
	for _, p := range notInServe {
		if linked(serve, p) {
			t.Errorf("cmd/triage links %s: move what needs it to cmd/triage-bed, or what cmd/triage needs of it out of it (go list -deps ./cmd/triage)", p)
		}
	}
	bed := goList(t, "-deps", module+"/cmd/triage-bed")
	for _, p := range []string{module + "/deploy/bed", module + "/deploy/bench", module + "/deploy/wan", "github.com/Shopify/toxiproxy"} {
		require.True(t, linked(bed, p), "cmd/triage-bed should link %s", p)
	}
}

// TestEveryPackageHasADocComment: every package of the module has a
// doc.go whose comment says what the package is for ("Package x ...", or
// "Command x ..." for a binary), and no other hand-written file of it
// carries a package comment. The generated proto/.../v1 packages are no
// exception: their doc.go is written by hand and make generate leaves it
// alone; only their generated files may carry the comment protoc gives
// them.
func TestEveryPackageHasADocComment(t *testing.T) {
	t.Parallel()
	root := goList(t, "-m", "-f", "{{.Dir}}")[0]
	lines := goList(t, "-f", "{{.Dir}}|{{.Name}}|{{join .GoFiles \"|\"}}", module+"/...")
	require.NotEmpty(t, lines)
	for _, line := range lines {
		fields := strings.Split(line, "|")
		dir, name, files := fields[0], fields[1], fields[2:]
		rel, err := filepath.Rel(root, dir)
		require.NoError(t, err)
		fset := token.NewFileSet()
		hasDoc := false
		for _, file := range files {
			f, err := parser.ParseFile(fset, filepath.Join(dir, file), nil, parser.PackageClauseOnly|parser.ParseComments)
			require.NoError(t, err)
			if file == "doc.go" {
				hasDoc = true
				want := "Package " + name + " "
				if name == "main" {
					want = "Command " + filepath.Base(dir) + " "
				}
				if f.Doc == nil || !strings.HasPrefix(f.Doc.Text(), want) {
					t.Errorf("%s/doc.go: the package comment should start %q and say why the package exists", rel, want)
				}
				continue
			}
			if f.Doc != nil && !ast.IsGenerated(f) {
				t.Errorf("%s/%s has a package comment: it belongs in doc.go", rel, file)
			}
		}
		if !hasDoc {
			t.Errorf("%s has no doc.go: add one whose comment says why the package exists", rel)
		}
	}
}
