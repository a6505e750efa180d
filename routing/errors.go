package routing

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"regexp"

	"github.com/go-sql-driver/mysql"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/grpc"
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
	// ErrPermissionDenied means the caller's roles do not cover what the
	// request would change (routing/auth decides which RPCs a role may
	// call; this is the finer check of a request's fields).
	ErrPermissionDenied = errors.New("permission denied")
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
		errors.Is(err, schema.ErrUnsupportedServer), errors.Is(err, ErrPrecondition):
		code = codes.FailedPrecondition
	case errors.Is(err, ErrBufferFull), errors.Is(err, shardmap.ErrTooLarge):
		code = codes.ResourceExhausted
	case errors.Is(err, ErrPermissionDenied):
		code = codes.PermissionDenied
	case errors.Is(err, store.ErrOutcomeUnknown):
		// Before the context's codes: an ack whose caller's deadline
		// ended while its batch ran is as unknown as one whose answer
		// was lost, and the client retries UNAVAILABLE with the same
		// token.
		code = codes.Unavailable
	case errors.Is(err, ErrNotCommitted), errors.Is(err, context.DeadlineExceeded):
		code = codes.DeadlineExceeded
	case errors.Is(err, context.Canceled):
		code = codes.Canceled
	case errors.Is(err, ErrUnavailable), errors.Is(err, shardmap.ErrNoShards), errors.Is(err, nats.ErrNoResponders),
		errors.Is(err, nats.ErrTimeout), errors.Is(err, nats.ErrConnectionClosed), errors.Is(err, jetstream.ErrNoStreamResponse),
		errors.Is(err, peer.ErrNotOwner), errors.Is(err, shardmap.ErrNotWritable), isMySQLDown(err):
		code = codes.Unavailable
	}
	msg := err.Error()
	if code == codes.InvalidArgument || code == codes.NotFound {
		// These say what was wrong with the request, in its own words.
		return status.Error(code, msg)
	}
	public := addrPattern.ReplaceAllString(msg, addrWithheld)
	if public == msg {
		return status.Error(code, msg)
	}
	return &withheld{st: status.New(code, public), cause: err}
}

// addrPattern matches the network addresses a driver's or our own error
// text may hold (a shard's host:port in "dial tcp 10.0.0.5:3306", the
// node's address in MariaDB's "Access denied for user 'app'@'10.0.0.3'"):
// an IPv4 address with or without a port, a bracketed IPv6 address, and
// a host name followed by a port. Clients are told that the shard was
// unreachable, never where it lives.
var addrPattern = regexp.MustCompile(`\[[0-9A-Fa-f.]*:[0-9A-Fa-f:.]*\](?::\d{1,5})?|\b\d{1,3}(?:\.\d{1,3}){3}(?::\d{1,5})?\b|\b[A-Za-z][A-Za-z0-9-]*(?:\.[A-Za-z0-9-]+)*:\d{1,5}\b`)

const addrWithheld = "[address withheld]"

// withheld is an RPC's status whose message had addresses taken out;
// cause, with them, is for the node's log (logWithheld), where an
// operator needs to know which server failed.
type withheld struct {
	st    *status.Status
	cause error
}

func (e *withheld) Error() string              { return e.st.Err().Error() }
func (e *withheld) GRPCStatus() *status.Status { return e.st }
func (e *withheld) Unwrap() error              { return e.cause }

// logWithheld logs the whole text of an error toStatus answered with
// addresses withheld; rpc names the call.
func logWithheld(log *slog.Logger, rpc string, err error) {
	var w *withheld
	if log == nil || !errors.As(err, &w) {
		return
	}
	log.Warn("error answered without its addresses", "rpc", rpc, "code", w.st.Code().String(), "err", w.cause)
}

// logWithheldUnary is logWithheld as a gRPC interceptor.
func logWithheldUnary(log *slog.Logger) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		resp, err := handler(ctx, req)
		logWithheld(log, info.FullMethod, err)
		return resp, err
	}
}

// statusUnary turns a handler's error into the status its client gets
// (toStatus). Handlers return their errors as they are; this interceptor,
// and the gateway's error handler for HTTP, are where they become codes.
func statusUnary(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	resp, err := handler(ctx, req)
	return resp, toStatus(err)
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

// Advice for a lease or item write whose outcome stays unknown
// (store.ErrOutcomeUnknown): what a retry does, so a client knows it may
// send it again.
const (
	retryAck    = `retrying with the same lease token is safe: if this ack took effect the item is gone, and the retry answers it "item not found"`
	retryNack   = `retrying with the same lease token is safe: if this nack took effect its token is cleared, and the retry answers it "stale lease token"`
	retryExtend = "retrying with the same lease token is safe: an extension sets the expiry from the time of the call"
	retryUpdate = "retrying the update is safe: it sets the same values again"
	retryDelete = "retrying is safe: once the item is gone a delete answers NOT_FOUND"
)

// writeOutcome says in the error of a lease or item write on shard
// whether it changed anything there: ErrOutcomeUnknown (the store could
// not settle a write whose answer was lost) gets retry, the advice for
// its call; a shard that could not be reached or refused the write
// (isMySQLDown) changed nothing, since the store reports every write
// that was sent and not answered as ErrOutcomeUnknown, and an error
// before the COMMIT leaves an open transaction the server rolls back.
// Other errors are left as they are.
func writeOutcome(err error, shard uint32, retry string) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, store.ErrOutcomeUnknown):
		return fmt.Errorf("shard %d: %w; %s", shard, err, retry)
	case isMySQLDown(err):
		return fmt.Errorf("shard %d: %w; nothing was changed there", shard, err)
	}
	return err
}

// isAccessDenied reports MariaDB refusing a login (1045) or a statement
// for want of a privilege (1044, 1142, 1227).
func isAccessDenied(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && (me.Number == 1044 || me.Number == 1045 || me.Number == 1142 || me.Number == 1227)
}
