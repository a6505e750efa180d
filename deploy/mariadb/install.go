package mariadb

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
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
	if logger == nil {
		logger = discardLogger
	}
	if _, err := findBinaries(); err == nil {
		return nil
	}
	if os.Geteuid() != 0 {
		return fmt.Errorf("mariadb: mariadbd not found and not running as root, cannot install it: %s", installHint)
	}
	aptGet, err := exec.LookPath("apt-get")
	if err != nil {
		return fmt.Errorf("mariadb: mariadbd not found and apt-get unavailable: %s", installHint)
	}
	logger.Info("mariadb: mariadbd not found, installing mariadb-server with apt-get")
	install := []string{"install", "-y", "mariadb-server"}
	if err := runLogged(ctx, logger, aptGet, install...); err != nil {
		logger.Info("mariadb: apt-get install failed, running apt-get update and retrying", "err", err)
		if err := runLogged(ctx, logger, aptGet, "update"); err != nil {
			return fmt.Errorf("mariadb: apt-get update: %w; %s", err, installHint)
		}
		if err := runLogged(ctx, logger, aptGet, install...); err != nil {
			return fmt.Errorf("mariadb: apt-get install mariadb-server: %w; %s", err, installHint)
		}
	}
	if _, err := findBinaries(); err != nil {
		return fmt.Errorf("mariadb: installed mariadb-server but still: %w", err)
	}
	return nil
}

// runLogged runs a command non-interactively, logging each output line and
// keeping the last lines for the error.
func runLogged(ctx context.Context, logger *slog.Logger, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		return err
	}
	waitErr := make(chan error, 1)
	go func() {
		err := cmd.Wait()
		pw.Close()
		waitErr <- err
	}()
	var tail []string
	sc := bufio.NewScanner(pr)
	for sc.Scan() {
		logger.Info("mariadb: "+filepath.Base(name), "line", sc.Text())
		if tail = append(tail, sc.Text()); len(tail) > 10 {
			tail = tail[1:]
		}
	}
	_, _ = io.Copy(io.Discard, pr) // drain after an over-long line so Wait can finish
	if err := <-waitErr; err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.Join(tail, "\n"))
	}
	return nil
}

var discardLogger = slog.New(slog.DiscardHandler)
