package dequeuer

import (
	"testing"

	"go.uber.org/goleak"
)

// Every goroutine a test starts (claim loops, watchers, embedded NATS)
// must have ended when the package's tests pass.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
