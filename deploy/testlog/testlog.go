package testlog

import (
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
)

// New returns a logger of level and above that writes to t.Log. Call it
// before registering the Stop of what it logs for: cleanups run
// last-registered first, so that has stopped when the writer closes. A
// line written after that (a goroutine that outlived its Stop) goes to
// stderr, since t.Log would panic.
func New(t testing.TB, level slog.Level) *slog.Logger {
	w := &writer{t: t}
	t.Cleanup(func() {
		w.mu.Lock()
		w.done = true
		w.mu.Unlock()
	})
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: level}))
}

type writer struct {
	t    testing.TB
	mu   sync.Mutex
	done bool
}

func (w *writer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.done {
		return os.Stderr.Write(p)
	}
	w.t.Helper()
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}
