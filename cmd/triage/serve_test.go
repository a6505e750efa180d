package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"

	"github.com/go-sql-driver/mysql"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
)

// TestTransientStartErrors: serve retries a start that failed on NATS,
// JetStream, the network or a timeout, and ends at once on anything else
// (a config error, an address it cannot listen on).
func TestTransientStartErrors(t *testing.T) {
	t.Parallel()
	_, listenErr := net.Listen("tcp", "256.0.0.1:0")
	require.Error(t, listenErr)
	for _, c := range []struct {
		err  error
		want bool
	}{
		{fmt.Errorf("connect nats: %w", nats.ErrNoServers), true},
		{fmt.Errorf("open kv bucket triage_shardmap: %w", context.DeadlineExceeded), true},
		{fmt.Errorf("load: %w", jetstream.ErrNoStreamResponse), true},
		{fmt.Errorf("bootstrap: %w", &jetstream.APIError{Code: 503, ErrorCode: 10008, Description: "JetStream system temporarily unavailable"}), true},
		{fmt.Errorf("migrate: %w", &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}), true},
		{fmt.Errorf("migrate: %w", mysql.ErrInvalidConn), true},
		{errors.New(`region "eu-west" is not in the shard map (regions: [us-east])`), false},
		{fmt.Errorf("bootstrap: %w", &jetstream.APIError{Code: 400, ErrorCode: 10058, Description: "stream name already in use"}), false},
		{fmt.Errorf("grpc listener: %w", listenErr), false},
	} {
		require.Equal(t, c.want, transient(c.err), "%v", c.err)
	}
}
