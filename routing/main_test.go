package routing

import (
	"testing"

	"go.uber.org/goleak"
)

// Every goroutine a test starts (node claims, embedded NATS)
// must have ended when the package's tests pass.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
