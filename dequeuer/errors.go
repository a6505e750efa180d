package dequeuer

import "errors"

var (
	// ErrStaleLease means the lease token is not the item's current one: the
	// lease expired and the item was delivered again, or it was nacked.
	ErrStaleLease = errors.New("stale lease token: the item was leased again or returned since; the current holder keeps it")
	// ErrNotFound means no such item: never enqueued, or acked or deleted.
	ErrNotFound = errors.New("item not found: it was acked, deleted, expired or never existed")
	// ErrBadToken means a lease token that does not parse.
	ErrBadToken = errors.New("invalid lease token: want the 16 hex digits a dequeue returned")
	// ErrNotOwner means this dequeuer does not own a shard asked of it.
	ErrNotOwner = errors.New("this dequeuer does not own the shard")
	// ErrMetadataTooLarge means a metadata patch merged with the item's
	// stored metadata would exceed MaxMetadataBytes; nothing was changed.
	ErrMetadataTooLarge = errors.New("metadata too large")
	// ErrBusy means the dequeuer already serves MaxInflight requests; the
	// caller retries (UNAVAILABLE) rather than queue without bound.
	ErrBusy = errors.New("dequeuer busy: too many dequeue requests in flight, retry shortly")
)
