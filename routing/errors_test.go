package routing

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"testing"

	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/triage-queue/triage/schema"
	"github.com/triage-queue/triage/shardmap"
)

// TestToStatusWithholdsAddresses: an error that reaches a client names no
// server address (a driver's "dial tcp host:port", MariaDB's "user@host",
// a primary in our own text); the node's log gets the whole text. Errors
// about the request itself are answered as they are.
func TestToStatusWithholdsAddresses(t *testing.T) {
	t.Parallel()
	dial := &net.OpError{Op: "dial", Net: "tcp", Addr: &net.TCPAddr{IP: net.IPv4(10, 0, 0, 5), Port: 3306}, Err: errors.New("connect: connection refused")}
	for _, c := range []struct {
		name   string
		err    error
		code   codes.Code
		hidden []string // not in the client's message
		kept   []string // in it
	}{
		{"dial", errorf(ErrUnavailable, "shard 3: counting what it holds: %v", dial), codes.Unavailable,
			[]string{"10.0.0.5", "3306"}, []string{"shard 3: counting what it holds", "dial tcp " + addrWithheld}},
		{"wrapped dial", fmt.Errorf("ack: %w", dial), codes.Unavailable, []string{"10.0.0.5"}, []string{"ack:"}},
		{"access denied", fmt.Errorf("%w: shard 1: %v", ErrUnavailable, &mysql.MySQLError{Number: 1045, Message: "Access denied for user 'app'@'172.18.0.4' (using password: YES)"}),
			codes.Unavailable, []string{"172.18.0.4"}, []string{"Access denied for user 'app'@'" + addrWithheld}},
		{"not writable", fmt.Errorf("%w: shard 2: read the failover epoch of db-2.shards.internal:3306: %v", shardmap.ErrNotWritable, "invalid connection"),
			codes.Unavailable, []string{"db-2", "internal", "3306"}, []string{"read the failover epoch of " + addrWithheld}},
		{"ipv6", errorf(ErrUnavailable, "dial tcp [fd00::12]:3306: i/o timeout"), codes.Unavailable, []string{"fd00", "3306"}, []string{"i/o timeout"}},
		{"internal", fmt.Errorf("scan: connection to localhost:3307 lost"), codes.Internal, []string{"localhost", "3307"}, nil},
		{"invalid argument echoes the request", invalid("shard.primary %q: allowed host:port", "db-9.internal:3306"), codes.InvalidArgument,
			nil, []string{"db-9.internal:3306"}},
		{"nothing to withhold", errorf(ErrUnavailable, "no dequeuer owns shard 3 yet; retry"), codes.Unavailable, nil, []string{"no dequeuer owns shard 3 yet; retry"}},
		{"map too large", fmt.Errorf("put namespace: %w: it would be 9000000 bytes", shardmap.ErrTooLarge), codes.ResourceExhausted,
			nil, []string{"shard map too large: it would be 9000000 bytes"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := toStatus(c.err)
			st, ok := status.FromError(err)
			require.True(t, ok)
			require.Equal(t, c.code, st.Code())
			for _, h := range c.hidden {
				require.NotContains(t, st.Message(), h)
			}
			for _, k := range c.kept {
				require.Contains(t, st.Message(), k)
			}
			var buf bytes.Buffer
			logWithheld(slog.New(slog.NewTextHandler(&buf, nil)), "/triage.v1.Queue/Ack", err)
			if len(c.hidden) == 0 {
				require.Empty(t, buf.String(), "nothing was withheld")
				return
			}
			require.Contains(t, buf.String(), "rpc=/triage.v1.Queue/Ack")
			for _, h := range c.hidden {
				require.Contains(t, buf.String(), h, "the log has what the client does not")
			}
		})
	}
}

// TestAddrPatternLeavesPlainTextAlone: the words, numbers, durations and
// timestamps of our messages are not taken for addresses.
func TestAddrPatternLeavesPlainTextAlone(t *testing.T) {
	t.Parallel()
	for _, s := range []string{
		"shard 3: 12 item(s), 4 dead letter(s); retry in 1.5s",
		"lease of 1-00000000000000ff expired at 2025-01-02T12:30:45Z",
		"the server is MariaDB 10.11.6; Triage needs MariaDB 10.11 or later",
		"Error 1290 (HY000): The MariaDB server is running with the --read-only option",
		"nats: no responders available for request",
		"namespace orders: shards [3] of us-east are draining",
	} {
		require.Equal(t, s, addrPattern.ReplaceAllString(s, addrWithheld))
	}
	require.Equal(t, strings.Repeat(addrWithheld+" ", 3), addrPattern.ReplaceAllString("10.1.2.3 db.internal:3306 [::1]:3306 ", addrWithheld))
}

// TestUnusableShardAnswers: AddShard's refusal of a primary it cannot use
// names the step and the account, not the server's answer (which the
// log gets); a server that is not MariaDB 10.11 or later is named by its
// version.
func TestUnusableShardAnswers(t *testing.T) {
	t.Parallel()
	var log bytes.Buffer
	r := &Router{log: slog.New(slog.NewTextHandler(&log, nil))}
	s := shardmap.Shard{ID: 7, Primary: "db-7.internal:3306"}
	denied := &mysql.MySQLError{Number: 1045, Message: "Access denied for user 'root'@'10.9.8.7' (using password: YES)"}
	dial := &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connect: connection refused")}
	for _, c := range []struct {
		name string
		err  error
		code codes.Code
		msg  string
	}{
		{"unsupported", fmt.Errorf("%w: the server is MySQL 8.0.36 (or another server that is not MariaDB); Triage needs MariaDB 10.11 or later", schema.ErrUnsupportedServer),
			codes.FailedPrecondition, "shard 7: unsupported database server: the server is MySQL 8.0.36 (or another server that is not MariaDB); Triage needs MariaDB 10.11 or later (nothing was added)"},
		{"privileged", &accountError{"application", "connect to", fmt.Errorf("shard primary db-7.internal:3306: application account: %w",
			fmt.Errorf("%w: the account holds SUPER on *.*", schema.ErrPrivilegedAccount))},
			codes.FailedPrecondition, "shard 7: account can write through read_only: the account holds SUPER on *.* (nothing was added)"},
		{"unreachable", &accountError{"application", "connect to", dial}, codes.Unavailable,
			"shard 7: could not connect to the shard's primary as this node's application account; nothing was added; see the node's log"},
		{"app refused", &accountError{"application", "connect to", denied}, codes.FailedPrecondition,
			"shard 7: could not connect to the shard's primary as this node's application account; nothing was added; see the node's log"},
		{"admin refused", &accountError{"admin", "migrate the schema on", fmt.Errorf("1 schema migration(s) pending: %w", denied)}, codes.FailedPrecondition,
			"shard 7: its schema needs migrating and the primary refused this node's admin account"},
		{"admin failed", &accountError{"admin", "migrate the schema on", errors.New("Error 1064: syntax")}, codes.Unavailable,
			"shard 7: could not migrate the schema on the shard's primary as this node's admin account; nothing was added; see the node's log"},
		{"deadline", &accountError{"application", "connect to", context.DeadlineExceeded}, codes.DeadlineExceeded, "shard 7: could not connect to"},
	} {
		t.Run(c.name, func(t *testing.T) {
			log.Reset()
			st := status.Convert(r.unusableShard(s, c.err))
			require.Equal(t, c.code, st.Code(), st.Message())
			require.Contains(t, st.Message(), c.msg)
			for _, leak := range []string{"db-7", "3306", "10.9.8.7", "Access denied", "connection refused", "1064"} {
				require.NotContains(t, st.Message(), leak)
			}
			require.Contains(t, log.String(), "primary=db-7.internal:3306")
			require.Contains(t, log.String(), c.err.Error(), "the log has the server's answer")
		})
	}
}
