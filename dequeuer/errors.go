package dequeuer

import (
	"errors"

	"github.com/triage-queue/triage/schema/store"
)

var (
	// ErrStaleLease is store.ErrStaleLease: the lease token is not the
	// item's current one. The same value, so errors.Is matches either.
	ErrStaleLease = store.ErrStaleLease
	// ErrNotFound is store.ErrNotFound: no such item.
	ErrNotFound = store.ErrNotFound
	// ErrBadToken means a lease token that does not parse.
	ErrBadToken = errors.New("invalid lease token: want the 16 hex digits a dequeue returned")
	// ErrNotOwner means this dequeuer does not own a shard asked of it.
	ErrNotOwner = errors.New("this dequeuer does not own the shard")
	// ErrMetadataTooLarge is store.ErrMetadataTooLarge: merged metadata
	// would exceed store.MaxMetadataBytes; nothing was changed.
	ErrMetadataTooLarge = store.ErrMetadataTooLarge
	// ErrBusy means the dequeuer already serves MaxInflight requests; the
	// caller retries (UNAVAILABLE) rather than queue without bound.
	ErrBusy = errors.New("dequeuer busy: too many dequeue requests in flight, retry shortly")
)
