package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime/debug"
	"time"

	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
)

// Item is a leased item handed to a Handler. The worker owns its lease:
// it extends it while the handler runs and acks or nacks the item from
// the handler's result.
type Item struct {
	// ID names the item (and its shard).
	ID string
	// Namespace and Topic the item was dequeued from.
	Namespace, Topic string
	// Priority: lower is more urgent.
	Priority int32
	// Payload is the item's bytes, as enqueued.
	Payload []byte
	// Metadata is the item's small mutable map.
	Metadata map[string]string
	// Attempts counts deliveries so far, this one included; released and
	// snoozed deliveries are not counted.
	Attempts int
	// MaxAttempts is the deliveries the item gets before it is
	// dead-lettered: its topic's retry policy, or its namespace's. 0: no
	// limit. Attempts == MaxAttempts is the last try.
	MaxAttempts int
	// LastError is the error the item's last nack recorded, "" if none.
	LastError string
	// Traceparent is the W3C trace context of the enqueue that stored the
	// item ("" when it was not traced); the worker links each handler's
	// span to it.
	Traceparent string
	// EnqueuedAt is when the router accepted the item.
	EnqueuedAt time.Time

	token string
}

func newItem(ns string, li *triagev1.LeasedItem) *Item {
	return &Item{
		ID: li.GetId(), Namespace: ns, Topic: li.GetTopic(), Priority: li.GetPriority(),
		Payload: li.GetPayload(), Metadata: li.GetMetadata(), Attempts: int(li.GetAttempts()),
		MaxAttempts: int(li.GetMaxAttempts()), LastError: li.GetLastError(), Traceparent: li.GetTraceparent(),
		EnqueuedAt: li.GetEnqueuedAt().AsTime(), token: li.GetLeaseToken(),
	}
}

// LeaseToken is the token of the delivery, for calls made outside the
// worker (UpdateItem needs none; Ack and Nack are the worker's).
func (it *Item) LeaseToken() string { return it.token }

// Handler processes one item. Returning nil acks it; an error nacks it,
// and the server redelivers it after the namespace's backoff, until the
// namespace's max attempts send it to the dead letters. Return
// Permanent(err) to dead-letter it at once, Snooze(d) to see it again
// after d without counting a failure. ctx is cancelled when the lease is
// lost (context.Cause is ErrLeaseLost), the topic's timeout passes
// (ErrHandlerTimeout; see TopicOptions.Timeout) or the worker is stopped
// hard (ErrWorkerStopped).
type Handler func(ctx context.Context, it *Item) error

// Middleware wraps a Handler: logging, metrics and tracing hooks see
// every item and every result, panics included (as *PanicError). The
// first Middleware given to Use is the outermost.
type Middleware func(next Handler) Handler

// Permanent marks err as one a retry cannot fix (a payload that does not
// parse, a deleted account): the item goes straight to the topic's dead
// letters with err as its last error. The mark survives wrapping with %w.
func Permanent(err error) error {
	if err == nil {
		err = errors.New("permanent failure")
	}
	return &permanentError{err}
}

type permanentError struct{ err error }

func (e *permanentError) Error() string { return "permanent: " + e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// IsPermanent reports whether err carries the Permanent mark.
func IsPermanent(err error) bool {
	var p *permanentError
	return errors.As(err, &p)
}

// Snooze asks for the item again after d, without counting this delivery
// as a failure: its attempts go back by one and it never dead-letters
// because of it (a release nack). For "not yet": a resource still being
// prepared, a rate limit downstream.
func Snooze(d time.Duration) error {
	return &snoozeError{max(d, 0)}
}

type snoozeError struct{ d time.Duration }

func (e *snoozeError) Error() string { return fmt.Sprintf("snoozed for %s", e.d) }

// PanicError is what a handler that panicked returns to the middleware
// and the nack: the value and the stack, both kept in last_error.
type PanicError struct {
	Value any
	Stack []byte
}

func (e *PanicError) Error() string { return fmt.Sprintf("panic: %v\n\n%s", e.Value, e.Stack) }

// recoverHandler turns a panic into a *PanicError, innermost, so the
// middleware sees it as an error like any other.
func recoverHandler(h Handler) Handler {
	return func(ctx context.Context, it *Item) (err error) {
		defer func() {
			if r := recover(); r != nil {
				err = &PanicError{Value: r, Stack: debug.Stack()}
			}
		}()
		return h(ctx, it)
	}
}

// HandleJSON registers a handler for topic whose payloads are JSON
// values of T, with the topic's options as Handle takes them. A payload
// that does not decode is a permanent error: it will not decode on the
// next attempt either.
func HandleJSON[T any](w *Worker, topic string, h func(ctx context.Context, it *Item, v T) error, opts TopicOptions) {
	w.Handle(topic, func(ctx context.Context, it *Item) error {
		var v T
		if err := json.Unmarshal(it.Payload, &v); err != nil {
			return Permanent(fmt.Errorf("decode %T payload: %w", v, err))
		}
		return h(ctx, it, v)
	}, opts)
}

// DefaultHandlerTimeout is the handler timeout of a topic whose
// TopicOptions leave Timeout zero: one minute, as River's job timeout.
const DefaultHandlerTimeout = time.Minute

// NoTimeout, as TopicOptions.Timeout, lets a topic's handlers run without
// a limit: the worker extends their leases until they return, as long as
// the process lives.
const NoTimeout time.Duration = -1

// TopicOptions configure one topic's handler, given to Handle (and
// HandleJSON). Zero fields take the defaults given, so TopicOptions{} is
// a topic with the defaults.
//
// The options are one struct, as River's worker options are, rather than
// the functional options (Concurrency(n), Prefetch(n)) the package had
// before: the package is pre-1.0 and had only those two, and a struct
// shows every option and its default in one place, in the same style as
// WorkerConfig.
type TopicOptions struct {
	// Concurrency is how many items of the topic are handled at once.
	// Default 1.
	Concurrency int
	// Prefetch is how many items of the topic the worker leases ahead of
	// its handlers, so a handler that finishes finds the next item without
	// a round trip. Default (0): as many as Concurrency; a negative value
	// prefetches none. Prefetched items hold leases (the worker extends
	// them) that no other consumer can take; Stop hands them back at once.
	Prefetch int
	// Timeout bounds each handler call, counted from when the handler
	// starts (time spent prefetched does not count). Default (0):
	// DefaultHandlerTimeout; NoTimeout (any negative value) for none.
	//
	// When it passes, the handler's context is cancelled with cause
	// ErrHandlerTimeout (its Deadline reports the limit from the start),
	// the worker stops extending the item's lease and nacks the item
	// without a delay, so the server's backoff applies, the attempt
	// counts and last_error reads "handler timed out after <Timeout>". The
	// worker does not wait for the handler: a result it returns later is
	// ignored, and its slot goes to the next item at once, so a handler
	// that ignores its context keeps running on its own goroutine, outside
	// Concurrency, until it returns. A handler that returns an error once
	// its context has timed out counts as timed out too. Without a
	// timeout, a handler stuck on a dead socket holds its item leased
	// until the process dies.
	Timeout time.Duration
}

func (o TopicOptions) withDefaults() TopicOptions {
	o.Concurrency = max(o.Concurrency, 1)
	switch {
	case o.Prefetch == 0:
		o.Prefetch = o.Concurrency
	case o.Prefetch < 0:
		o.Prefetch = 0
	}
	switch {
	case o.Timeout == 0:
		o.Timeout = DefaultHandlerTimeout
	case o.Timeout < 0:
		o.Timeout = NoTimeout
	}
	return o
}

// maxErrorBytes is the router's limit on a nack's error
// (routing.MaxErrorBytes).
const maxErrorBytes = 4 << 10

// truncateError cuts msg to what a nack may carry, on a rune boundary.
func truncateError(msg string) string {
	if len(msg) <= maxErrorBytes {
		return msg
	}
	const mark = "\n... (truncated)"
	cut := maxErrorBytes - len(mark)
	for cut > 0 && msg[cut]&0xC0 == 0x80 {
		cut--
	}
	return msg[:cut] + mark
}
