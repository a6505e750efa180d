package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/triage-queue/triage/cmd/triage/node"
)

// TestServeWaitsForNATS: `triage serve` started while its NATS server is
// down (a process restarted during a NATS fault, or started before it)
// keeps trying instead of exiting, and starts once NATS is back. A
// supervisor that does not restart an exited process would otherwise
// leave the role down for good.
func TestServeWaitsForNATS(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 1)
	c.stopNATS()
	p := c.start("us-east-deq", node.Config{Roles: []string{node.RoleDequeuer}, DequeuerID: "us-east-deq"})
	logFile := filepath.Join(c.dir, "us-east-deq.log")
	logged := func(s string) bool {
		out, _ := os.ReadFile(logFile)
		return strings.Contains(string(out), s)
	}
	require.Eventually(t, func() bool { return logged("node did not start; retrying") }, 30*time.Second, 50*time.Millisecond,
		"the node never said it retries its start")
	select {
	case <-p.done:
		out, _ := os.ReadFile(logFile)
		t.Fatalf("triage serve exited while NATS was down:\n%s", out)
	default:
	}
	c.startNATS()
	require.Eventually(t, func() bool { return logged("node started") }, time.Minute, 100*time.Millisecond,
		"the node did not start once NATS was back")
}
