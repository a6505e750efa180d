package mariadb

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/triage-queue/triage/deploy/aptget"
)

// searchDirs are tried after PATH: Debian puts mariadbd in /usr/sbin, which
// is often missing from a non-login PATH.
var searchDirs = []string{"/usr/sbin", "/usr/bin", "/usr/local/sbin", "/usr/local/bin"}

const installHint = "install MariaDB 10.11+ (Debian/Ubuntu: `apt-get install -y mariadb-server`) so that mariadbd and mariadb-install-db are on PATH or in /usr/sbin, /usr/bin or /usr/local/bin"

// binaries are the resolved paths of the programs the package runs.
type binaries struct{ server, installDB string }

// findBinary looks name up on PATH, then in searchDirs.
func findBinary(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	for _, dir := range searchDirs {
		p := filepath.Join(dir, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("mariadb: %s not found", name)
}

func findBinaries() (binaries, error) {
	server, err1 := findBinary("mariadbd")
	installDB, err2 := findBinary("mariadb-install-db")
	if err := errors.Join(err1, err2); err != nil {
		return binaries{}, fmt.Errorf("%w; %s", err, installHint)
	}
	return binaries{server: server, installDB: installDB}, nil
}

// EnsureInstalled makes sure mariadbd and mariadb-install-db are available,
// installing the Debian mariadb-server package with apt-get when they are
// missing and we run as root. It exists so that a fresh container or CI
// runner can run the test bed without a manual setup step. apt-get update is
// run only if the first install attempt fails, because it is slow and usually
// unnecessary. Progress lines go to logger (nil means discard).
func EnsureInstalled(ctx context.Context, logger *slog.Logger) error {
	if _, err := findBinaries(); err == nil {
		return nil
	}
	if err := aptget.Install(ctx, logger, "mariadb-server"); err != nil {
		return fmt.Errorf("mariadb: mariadbd not found, %w; %s", err, installHint)
	}
	if _, err := findBinaries(); err != nil {
		return fmt.Errorf("mariadb: installed mariadb-server but still: %w", err)
	}
	return nil
}
