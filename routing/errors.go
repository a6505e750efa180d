package routing

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"net"

	"github.com/go-sql-driver/mysql"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/triage-queue/triage/proto/triage/peer"
	"github.com/triage-queue/triage/schema"
	"github.com/triage-queue/triage/schema/itemid"
	"github.com/triage-queue/triage/schema/store"
	"github.com/triage-queue/triage/shardmap"
)

var (
	// ErrInvalid marks bad input; the message says what is allowed.
	ErrInvalid = errors.New("invalid argument")
	// ErrBufferFull means the region's enqueue buffer refused the batch.
	ErrBufferFull = errors.New("enqueue buffer is full; retry with backoff")
	// ErrUnavailable means no primary or dequeuer can be reached now.
	ErrUnavailable = errors.New("unavailable")
	// ErrFailover means the controller refused or failed a failover.
	ErrFailover = errors.New("failover")
	// ErrNotCommitted means the batch is buffered but its commit was not
	// confirmed in time.
	ErrNotCommitted = errors.New("enqueue buffered but not confirmed committed in time; it will still be inserted, retry with the same dedup keys to be sure")
)

func errorf(kind error, format string, args ...any) error {
	return fmt.Errorf("%w: %s", kind, fmt.Sprintf(format, args...))
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
}

// toStatus is the one place domain errors become gRPC codes.
func toStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	code := codes.Internal
	switch {
	case errors.Is(err, ErrInvalid), errors.Is(err, itemid.ErrInvalid), errors.Is(err, store.ErrBadToken),
		errors.Is(err, store.ErrMetadataTooLarge):
		code = codes.InvalidArgument
	case errors.Is(err, shardmap.ErrUnknownNamespace), errors.Is(err, store.ErrNotFound), errors.Is(err, shardmap.ErrUnknownShard):
		code = codes.NotFound
	case errors.Is(err, store.ErrStaleLease), errors.Is(err, ErrFailover), errors.Is(err, shardmap.ErrShardState),
		errors.Is(err, schema.ErrUnsupportedServer):
		code = codes.FailedPrecondition
	case errors.Is(err, ErrBufferFull):
		code = codes.ResourceExhausted
	case errors.Is(err, ErrNotCommitted), errors.Is(err, context.DeadlineExceeded):
		code = codes.DeadlineExceeded
	case errors.Is(err, context.Canceled):
		code = codes.Canceled
	case errors.Is(err, ErrUnavailable), errors.Is(err, shardmap.ErrNoShards), errors.Is(err, nats.ErrNoResponders),
		errors.Is(err, nats.ErrTimeout), errors.Is(err, nats.ErrConnectionClosed), errors.Is(err, jetstream.ErrNoStreamResponse),
		errors.Is(err, peer.ErrNotOwner), errors.Is(err, shardmap.ErrNotWritable), isMySQLDown(err):
		code = codes.Unavailable
	}
	return status.Error(code, err.Error())
}

// isMySQLDown reports errors that mean the shard primary cannot take the
// request now (connection refused or lost, server read-only while fenced).
func isMySQLDown(err error) bool {
	var ne net.Error
	var me *mysql.MySQLError
	switch {
	case errors.Is(err, driver.ErrBadConn), errors.Is(err, mysql.ErrInvalidConn), errors.As(err, &ne):
		return true
	case errors.As(err, &me):
		return me.Number == 1290 || me.Number == 1836 // read-only
	}
	return false
}

// isAccessDenied reports MariaDB refusing a login (1045) or a statement
// for want of a privilege (1044, 1142, 1227).
func isAccessDenied(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && (me.Number == 1044 || me.Number == 1045 || me.Number == 1142 || me.Number == 1227)
}
