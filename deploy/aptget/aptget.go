package aptget

import (
	"bufio"
	"bytes"
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

// ErrCannotInstall means the caller is not root or the machine has no
// apt-get: the package must be installed by hand.
var ErrCannotInstall = errors.New("cannot install it here (needs root and apt-get)")

// Install installs pkg with apt-get. It runs apt-get update, which is slow
// and mostly not needed, only when the first install fails, and then
// installs again. Each output line goes to logger (nil discards them).
func Install(ctx context.Context, logger *slog.Logger, pkg string) error {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	aptGet, err := exec.LookPath("apt-get")
	if os.Geteuid() != 0 || err != nil {
		return ErrCannotInstall
	}
	logger.Info("installing " + pkg + " with apt-get")
	install := []string{"-o", "DPkg::Lock::Timeout=600", "install", "-y", pkg}
	if err := run(ctx, logger, aptGet, install...); err != nil {
		logger.Info("apt-get install failed, running apt-get update and retrying", "err", err)
		if err := run(ctx, logger, aptGet, "-o", "DPkg::Lock::Timeout=600", "update"); err != nil {
			return fmt.Errorf("apt-get update: %w", err)
		}
		if err := run(ctx, logger, aptGet, install...); err != nil {
			return fmt.Errorf("apt-get install %s: %w", pkg, err)
		}
	}
	return nil
}

// run runs a command non-interactively, logging each output line and
// keeping the last lines for the error.
func run(ctx context.Context, logger *slog.Logger, name string, args ...string) error {
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
	var last []string
	sc := bufio.NewScanner(pr)
	for sc.Scan() {
		logger.Info(filepath.Base(name), "line", sc.Text())
		if last = append(last, sc.Text()); len(last) > 10 {
			last = last[1:]
		}
	}
	_, _ = io.Copy(io.Discard, pr) // drain after an over-long line so Wait can finish
	if err := <-waitErr; err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.Join(last, "\n"))
	}
	return nil
}

// Tail returns the last 2 KiB of b, starting at a line boundary: what an
// error quotes of a program's output or log.
func Tail(b []byte) string {
	const n = 2048
	if len(b) > n {
		b = b[len(b)-n:]
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			b = b[i+1:]
		}
	}
	return strings.TrimSpace(string(b))
}
