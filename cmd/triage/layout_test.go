package main

import (
	"go/ast"
	"go/parser"
	"go/token"
	"maps"
	"os/exec"
	"path/filepath"
	"slices"
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
// MariaDB and Postgres launchers and the queue model), toxiproxy, River
// and pgx (the bench's peer), and the test libraries (the browser driver
// too). They live in cmd/triage-bed's binary, or only in tests.
var notInServe = []string{
	module + "/deploy",
	"github.com/Shopify/toxiproxy",
	"github.com/riverqueue",
	"github.com/jackc/pgx",
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
	for _, p := range []string{module + "/deploy/bed", module + "/deploy/bench", module + "/deploy/wan", "github.com/Shopify/toxiproxy",
		"github.com/riverqueue/river"} {
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

// maxFunctionLines is the longest a function may be, counted from its
// func line to its closing brace: about what a reader holds in their
// head at once. Tests and generated code are exempt.
const maxFunctionLines = 80

// longFunctionsLeft are the functions still over maxFunctionLines, as
// "path/file.go:Func" (or "path/file.go:Type.Method") from the module
// root. They are being split into named steps; the list only shrinks:
// a function split below the limit comes off it (TestNoLongFunctions
// fails until it does), and nothing is added to it.
var longFunctionsLeft = map[string]bool{}

// TestNoLongFunctions keeps every hand-written function of the module
// (not tests, not generated code) within maxFunctionLines, apart from
// those longFunctionsLeft still lists, and keeps that list current.
func TestNoLongFunctions(t *testing.T) {
	t.Parallel()
	root := goList(t, "-m", "-f", "{{.Dir}}")[0]
	long := map[string]int{}
	for _, file := range moduleSourceFiles(t, root) {
		for name, n := range longFunctions(t, root, file) {
			long[name] = n
		}
	}
	for _, name := range slices.Sorted(maps.Keys(long)) {
		if !longFunctionsLeft[name] {
			t.Errorf("%s is %d lines, over %d: split it into named steps", name, long[name], maxFunctionLines)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(longFunctionsLeft)) {
		if _, ok := long[name]; !ok {
			t.Errorf("%s is no longer over %d lines (or is gone): take it off longFunctionsLeft", name, maxFunctionLines)
		}
	}
}

// moduleSourceFiles returns the hand-written, non-test .go files of the
// module's packages, whatever their build constraints, as absolute paths.
func moduleSourceFiles(t *testing.T, root string) []string {
	t.Helper()
	lines := goList(t, "-e", "-f", "{{.Dir}}|{{join .GoFiles \"|\"}}|{{join .CgoFiles \"|\"}}|{{join .IgnoredGoFiles \"|\"}}", module+"/...")
	require.NotEmpty(t, lines)
	var files []string
	for _, line := range lines {
		fields := strings.Split(line, "|")
		dir := fields[0]
		for _, name := range fields[1:] {
			if name == "" || strings.HasSuffix(name, "_test.go") || strings.HasSuffix(name, ".pb.go") || strings.HasSuffix(name, ".pb.gw.go") {
				continue
			}
			files = append(files, filepath.Join(dir, name))
		}
	}
	return files
}

// longFunctions parses file and returns its functions over
// maxFunctionLines by "path/file.go:Func" name, with their line counts.
// A file marked generated ("Code generated ... DO NOT EDIT.") has none.
func longFunctions(t *testing.T, root, file string) map[string]int {
	t.Helper()
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, file, nil, parser.ParseComments|parser.SkipObjectResolution)
	require.NoError(t, err)
	if ast.IsGenerated(f) {
		return nil
	}
	rel, err := filepath.Rel(root, file)
	require.NoError(t, err)
	long := map[string]int{}
	for _, decl := range f.Decls {
		fd, ok := decl.(*ast.FuncDecl)
		if !ok || fd.Body == nil {
			continue
		}
		n := fset.Position(fd.End()).Line - fset.Position(fd.Pos()).Line + 1
		if n > maxFunctionLines {
			long[filepath.ToSlash(rel)+":"+funcName(fd)] = n
		}
	}
	return long
}

// funcName names a function as its file declares it: "Func", or
// "Type.Method" for a method, so methods of the same name on different
// types stay apart.
func funcName(fd *ast.FuncDecl) string {
	if fd.Recv == nil || len(fd.Recv.List) == 0 {
		return fd.Name.Name
	}
	typ := fd.Recv.List[0].Type
	for {
		switch x := typ.(type) {
		case *ast.StarExpr:
			typ = x.X
			continue
		case *ast.IndexExpr:
			typ = x.X
			continue
		case *ast.IndexListExpr:
			typ = x.X
			continue
		case *ast.Ident:
			return x.Name + "." + fd.Name.Name
		}
		return fd.Name.Name
	}
}
