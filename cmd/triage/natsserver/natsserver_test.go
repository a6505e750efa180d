package natsserver_test

import (
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/triage-queue/triage/cmd/triage/natsserver"
)

// TestStartReportsAPortInUseAtOnce: a route port someone else holds is a
// fatal error to the server, which then never becomes ready. Start says
// so at once, naming the port's trouble, rather than after its readiness
// wait as a server "not ready" (how a CI run once reported it, with no
// cause).
func TestStartReportsAPortInUseAtOnce(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	start := time.Now()
	port := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
	// Clustered JetStream needs a configured route; this one is to itself.
	s, err := natsserver.Start(natsserver.Config{StoreDir: t.TempDir(), ClusterName: "c", ClusterPort: l.Addr().(*net.TCPAddr).Port,
		Routes: []string{"nats-route://127.0.0.1:" + port}})
	if err == nil {
		s.Shutdown()
	}
	require.ErrorContains(t, err, "address already in use")
	require.ErrorContains(t, err, "router port")
	require.Less(t, time.Since(start), 5*time.Second, "Start waited out its readiness bound")
}
