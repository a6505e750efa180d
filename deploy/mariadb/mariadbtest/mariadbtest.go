package mariadbtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/triage-queue/triage/deploy/mariadb"
	"go.uber.org/goleak"
)

var (
	ensureInstalled = sync.OnceValue(func() error {
		// Install progress goes to stderr: apt-get can take minutes.
		return mariadb.EnsureInstalled(context.Background(), slog.New(slog.NewTextHandler(os.Stderr, nil)))
	})

	mu        sync.Mutex
	inMain    bool   // Main is running, so the shared server will be stopped
	sharedDir string // created on first use, removed by Main
	shared    *mariadb.Server
	sharedErr error // sticky, so a broken server fails fast instead of timing out per test
)

// Main runs the package's tests (call it from TestMain) and then stops the
// shared server. It installs MariaDB first if needed, so that the install
// time is not charged to whichever test happens to run first.
func Main(m *testing.M) int {
	_ = ensureInstalled() // a failure is reported by each test that needs a server
	mu.Lock()
	inMain = true
	mu.Unlock()
	code := m.Run()
	mu.Lock()
	defer mu.Unlock()
	if shared != nil {
		if err := shared.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "mariadbtest: stopping shared server:", err)
			code = max(code, 1)
		}
	}
	if sharedDir != "" {
		_ = os.RemoveAll(sharedDir)
	}
	if code == 0 && checkLeaks {
		// After a passing run, every goroutine a test started must have
		// ended: a worker that outlives its Stop is a bug, and in a
		// server it is a slow leak.
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "mariadbtest: goroutines left running after the tests:", err)
			code = 1
		}
	}
	return code
}

var checkLeaks bool

// MainCheckingLeaks is Main, and then fails a passing run that left
// goroutines running (go.uber.org/goleak).
func MainCheckingLeaks(m *testing.M) int {
	checkLeaks = true
	return Main(m)
}

// Server returns the package's shared server, starting it on first call.
// If a test killed or stopped it, it is restarted on the same data and port,
// so DSNs handed out earlier stay valid.
func Server(t testing.TB) *mariadb.Server {
	t.Helper()
	s, err := Shared()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// Shared is Server for code that has no testing.TB, such as examples: it
// returns the failure instead of failing a test.
func Shared() (*mariadb.Server, error) {
	mu.Lock()
	defer mu.Unlock()
	if !inMain {
		return nil, errors.New("mariadbtest: the shared server needs func TestMain(m *testing.M) { os.Exit(mariadbtest.Main(m)) }")
	}
	if sharedErr == nil && (shared == nil || exited(shared)) {
		sharedErr = startShared()
	}
	if sharedErr != nil {
		return nil, fmt.Errorf("mariadbtest: shared server: %w", sharedErr)
	}
	return shared, nil
}

func startShared() error {
	if err := ensureInstalled(); err != nil {
		return err
	}
	cfg := mariadb.Config{Dir: sharedDir}
	if shared != nil {
		cfg.Port = shared.Port()
	} else {
		dir, err := os.MkdirTemp("", "mariadbtest-")
		if err != nil {
			return err
		}
		sharedDir, cfg.Dir = dir, dir
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := mariadb.Start(ctx, cfg)
	if err == nil {
		shared = s
	}
	return err
}

func exited(s *mariadb.Server) bool {
	select {
	case <-s.Wait():
		return true
	default:
		return false
	}
}

// Database creates a fresh, empty database on the shared server and returns
// its DSN. The database is dropped when the test ends.
func Database(t testing.TB) string {
	t.Helper()
	s := Server(t)
	name := dbName(t.Name())
	if err := s.CreateDatabase(t.Context(), name); err != nil {
		t.Fatalf("mariadbtest: %v", err)
	}
	t.Cleanup(func() {
		if exited(s) {
			return // killed by the test; the data dir goes with Main
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := s.DropDatabase(ctx, name); err != nil {
			t.Errorf("mariadbtest: %v", err)
		}
	})
	return s.DSN(name)
}

// dbName returns "t_" + the sanitised test name + "_" + a random suffix,
// within MariaDB's 64-character limit; the name prefix helps when debugging
// a left-over database.
func dbName(testName string) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	suffix := "_" + hex.EncodeToString(b[:])
	clean := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '_' {
			return r
		}
		if r >= 'A' && r <= 'Z' {
			return r + 'a' - 'A'
		}
		return '_'
	}, testName)
	return "t_" + clean[:min(len(clean), 64-2-len(suffix))] + suffix
}

// NewServer starts a server only this test uses, in t.TempDir(), stopped at
// t.Cleanup, with mariadbd's extra command-line args. Use it for tests that
// kill -9 or restart a server, so other tests are not disturbed, or that
// need a server set up differently.
func NewServer(t testing.TB, args ...string) *mariadb.Server {
	t.Helper()
	if err := ensureInstalled(); err != nil {
		t.Fatalf("mariadbtest: %v", err)
	}
	s, err := mariadb.Start(t.Context(), mariadb.Config{Dir: t.TempDir(), ExtraArgs: args})
	if err != nil {
		t.Fatalf("mariadbtest: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Stop(); err != nil {
			t.Errorf("mariadbtest: %v", err)
		}
	})
	return s
}
