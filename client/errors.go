package client

import (
	"context"
	"errors"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Sentinel errors, matched with errors.Is against what the Client and the
// Worker return. RPC failures are *Error values that match the sentinel of
// their gRPC code, so callers need not import grpc/status to branch on
// the common cases; status.Code still works on them.
var (
	// ErrUnavailable: no router could serve the call, after the retries
	// and failovers the client is configured for (codes.Unavailable).
	ErrUnavailable = errors.New("triage: unavailable")
	// ErrNotFound: no such namespace or item (acked, deleted, expired).
	ErrNotFound = errors.New("triage: not found")
	// ErrStaleLease: the lease token is no longer the item's: its lease
	// lapsed and it was leased again, or it was returned.
	ErrStaleLease = errors.New("triage: stale lease")
	// ErrInvalid: the request was refused as malformed; the message says
	// what is allowed.
	ErrInvalid = errors.New("triage: invalid argument")
	// ErrResourceExhausted: a quota (rate, depth) or a full enqueue
	// buffer; retry later.
	ErrResourceExhausted = errors.New("triage: resource exhausted")
	// ErrLeaseLost is the cause of a handler context cancelled because
	// the item's lease could not be extended: another consumer may hold
	// the item now, so the handler should stop (context.Cause).
	ErrLeaseLost = errors.New("triage: lease lost")
	// ErrWorkerStopped is the cause of a handler context cancelled by a
	// hard stop: the shutdown deadline passed while it ran.
	ErrWorkerStopped = errors.New("triage: worker stopped")
	// ErrHandlerTimeout is the cause of a handler context cancelled
	// because the topic's TopicOptions.Timeout passed: the worker has
	// nacked the item and ignores the handler's result.
	ErrHandlerTimeout = errors.New("triage: handler timed out")
)

// Error is a failed RPC: the method, the router that answered last, and
// the gRPC status.
type Error struct {
	// Method is the full gRPC method name.
	Method string
	// Endpoint is the address of the router that answered last.
	Endpoint string
	// Code and Message are the status the router (or the transport)
	// returned.
	Code    codes.Code
	Message string
	// Attempts is how many times the call was sent.
	Attempts int
}

func (e *Error) Error() string {
	return "triage: " + e.Method + " via " + e.Endpoint + ": " + e.Code.String() + ": " + e.Message
}

// GRPCStatus lets status.Code and status.FromError see the code.
func (e *Error) GRPCStatus() *status.Status { return status.New(e.Code, e.Message) }

// Is matches the sentinel of the error's code, and context.Canceled or
// context.DeadlineExceeded for those codes.
func (e *Error) Is(target error) bool {
	switch e.Code {
	case codes.Canceled:
		return target == context.Canceled
	case codes.DeadlineExceeded:
		return target == context.DeadlineExceeded
	}
	return codeSentinel(e.Code) == target
}

func codeSentinel(c codes.Code) error {
	switch c {
	case codes.Unavailable:
		return ErrUnavailable
	case codes.NotFound:
		return ErrNotFound
	case codes.FailedPrecondition, codes.Aborted:
		return ErrStaleLease
	case codes.InvalidArgument:
		return ErrInvalid
	case codes.ResourceExhausted:
		return ErrResourceExhausted
	}
	return nil
}

// ItemError reports that the server refused one item of a call that
// otherwise succeeded, for example a nack with a stale lease token.
type ItemError struct {
	// ID is the item's ID.
	ID string
	// Reason is the server's explanation (ItemResult.error).
	Reason string
}

func (e *ItemError) Error() string {
	return "item " + e.ID + ": " + e.Reason
}

// Is matches ErrStaleLease and ErrNotFound by the server's reason, whose
// wording the router keeps stable (schema/store/errors.go).
func (e *ItemError) Is(target error) bool {
	switch {
	case strings.HasPrefix(e.Reason, "stale lease token"):
		return target == ErrStaleLease
	case strings.HasPrefix(e.Reason, "item not found"):
		return target == ErrNotFound
	}
	return false
}
