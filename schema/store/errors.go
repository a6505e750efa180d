package store

import "errors"

// The store's errors. Callers test them with errors.Is (package routing
// maps them to gRPC codes); the store returns them bare or wrapped with
// %w, never re-created, and their texts are what API clients read.
var (
	// ErrStaleLease means the lease token is not the item's current one: the
	// lease expired and the item was delivered again, or it was nacked.
	ErrStaleLease = errors.New("stale lease token: the item was leased again or returned since; the current holder keeps it")
	// ErrNotFound means no such item: never enqueued, or acked or deleted.
	ErrNotFound = errors.New("item not found: it was acked, deleted, expired or never existed")
	// ErrBadToken means a lease token that does not parse (ParseToken).
	ErrBadToken = errors.New("invalid lease token: want the 16 hex digits a dequeue returned")
	// ErrMetadataTooLarge means a metadata patch merged with the item's
	// stored metadata would exceed MaxMetadataBytes; nothing was changed.
	ErrMetadataTooLarge = errors.New("metadata too large")
	// ErrOutcomeUnknown means a write was sent to the shard (its COMMIT,
	// or a query that commits) and no answer came back: the connection
	// broke or timed out, so the write may or may not have taken effect.
	// The lease and item writes settle such an outcome themselves (see
	// settle.go) and return it only when that failed too.
	ErrOutcomeUnknown = errors.New("outcome unknown")
)
