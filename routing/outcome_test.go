package routing

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"

	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/triage-queue/triage/schema/store"
)

// TestWriteOutcome: a lease or item write whose outcome the store could
// not settle answers UNAVAILABLE saying the outcome is unknown and that a
// retry with the same token is safe; one that failed before anything was
// sent says it changed nothing; the store's refusals are left as they
// are.
func TestWriteOutcome(t *testing.T) {
	t.Parallel()
	unknown := fmt.Errorf("ack: %w: the write was sent to the shard and its answer was lost (%w); doing it again to settle it failed: %v", store.ErrOutcomeUnknown, mysql.ErrInvalidConn, "dial tcp 10.0.0.5:3306: connection refused")
	gone := fmt.Errorf("ack: %w: the call ended while its batch was queued or running (%w)", store.ErrOutcomeUnknown, context.DeadlineExceeded)
	dial := fmt.Errorf("ack: %w", &net.OpError{Op: "dial", Net: "tcp", Addr: &net.TCPAddr{IP: net.IPv4(10, 0, 0, 5), Port: 3306}, Err: errors.New("connect: connection refused")})
	for _, c := range []struct {
		name    string
		err     error
		retry   string
		code    codes.Code
		says    []string
		saysNot []string
	}{
		{"lost and unsettled", unknown, retryAck, codes.Unavailable,
			[]string{"shard 4: ack: outcome unknown", "retrying with the same lease token is safe", `answers it "item not found"`},
			[]string{"10.0.0.5", "nothing was changed"}},
		{"caller gone mid-batch", gone, retryAck, codes.Unavailable, []string{"outcome unknown", "retrying with the same lease token is safe"}, nil},
		{"nack", fmt.Errorf("nack: %w", store.ErrOutcomeUnknown), retryNack, codes.Unavailable, []string{`answers it "stale lease token"`}, nil},
		{"refused before sending", dial, retryAck, codes.Unavailable, []string{"shard 4: ack: dial tcp", "nothing was changed there"},
			[]string{"outcome unknown", "10.0.0.5"}},
		{"read-only shard", &mysql.MySQLError{Number: 1290, Message: "read-only"}, retryExtend, codes.Unavailable, []string{"nothing was changed there"}, nil},
		{"stale lease", store.ErrStaleLease, retryExtend, codes.FailedPrecondition, []string{"stale lease token"}, []string{"shard 4"}},
		{"not found", store.ErrNotFound, retryDelete, codes.NotFound, []string{"item not found"}, []string{"shard 4"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			st, ok := status.FromError(toStatus(writeOutcome(c.err, 4, c.retry)))
			require.True(t, ok)
			require.Equal(t, c.code, st.Code(), st.Message())
			for _, s := range c.says {
				require.Contains(t, st.Message(), s)
			}
			for _, s := range c.saysNot {
				require.NotContains(t, st.Message(), s)
			}
		})
	}
	require.NoError(t, writeOutcome(nil, 4, retryAck))
}
