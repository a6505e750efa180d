package postgres

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"

	"github.com/triage-queue/triage/deploy/aptget"
)

// Package is the Debian package EnsureInstalled installs.
const Package = "postgresql-15"

const installHint = "install PostgreSQL (Debian 12: `apt-get install -y " + Package + "`) so that initdb and postgres are on PATH or in /usr/lib/postgresql/<version>/bin"

// ErrNotInstalled is returned, wrapped, when the server's binaries are
// missing and cannot be installed: callers that can do without a Postgres
// tell it from a server that failed to start.
var ErrNotInstalled = errors.New("postgres: not installed")

// binaries are the resolved paths of the programs the package runs.
type binaries struct{ initdb, server string }

// findBinaries looks initdb and postgres up on PATH, then in Debian's
// versioned directories, newest first: Debian keeps them out of PATH.
func findBinaries() (binaries, error) {
	var dirs []string
	if p, err := exec.LookPath("initdb"); err == nil {
		dirs = append(dirs, filepath.Dir(p))
	}
	versions, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	slices.SortFunc(versions, func(a, b string) int { return versionOf(b) - versionOf(a) })
	for _, dir := range append(dirs, versions...) {
		b := binaries{initdb: filepath.Join(dir, "initdb"), server: filepath.Join(dir, "postgres")}
		if executable(b.initdb) && executable(b.server) {
			return b, nil
		}
	}
	return binaries{}, fmt.Errorf("%w: initdb and postgres not found; %s", ErrNotInstalled, installHint)
}

// versionOf is the major version in a /usr/lib/postgresql/<v>/bin path, 0
// when it has none.
func versionOf(dir string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(dir)))
	return v
}

func executable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}

// EnsureInstalled makes sure initdb and postgres are available, installing
// Debian's postgresql-15 with apt-get when they are missing and the caller
// is root, the way the bed installs MariaDB: a fresh box or CI runner then
// runs the bench without a manual step. apt-get update runs only if the
// first install fails. Debian's package starts a cluster of its own; it is
// stopped, since only private servers are used. Progress lines go to
// logger (nil discards them).
func EnsureInstalled(ctx context.Context, logger *slog.Logger) error {
	if _, err := findBinaries(); err == nil {
		return nil
	}
	if err := aptget.Install(ctx, logger, Package); err != nil {
		return fmt.Errorf("%w, %w; %s", ErrNotInstalled, err, installHint)
	}
	if service, err := exec.LookPath("service"); err == nil {
		_ = exec.CommandContext(ctx, service, "postgresql", "stop").Run()
	}
	if _, err := findBinaries(); err != nil {
		return fmt.Errorf("postgres: installed %s but still: %w", Package, err)
	}
	return nil
}
