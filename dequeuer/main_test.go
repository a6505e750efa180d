package dequeuer

import (
	"os"
	"testing"

	"github.com/triage-queue/triage/deploy/mariadb/mariadbtest"
)

// The package's MariaDB tests share one server; every goroutine a test
// starts (claim loops, watchers, embedded NATS) must have ended when the
// package's tests pass.
func TestMain(m *testing.M) { os.Exit(mariadbtest.MainCheckingLeaks(m)) }
