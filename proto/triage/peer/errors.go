package peer

import "errors"

var (
	// ErrNotOwner means a dequeuer does not own a shard asked of it; the
	// router asks the new owner (ShardDequeueResponse code
	// FAILED_PRECONDITION).
	ErrNotOwner = errors.New("this dequeuer does not own the shard")
	// ErrBusy means a dequeuer already serves as many requests as it
	// may; the caller retries (UNAVAILABLE) rather than queue without
	// bound.
	ErrBusy = errors.New("dequeuer busy: too many dequeue requests in flight, retry shortly")
)

// ReplySlack is what a ShardDequeue reply needs besides its items (the
// error fields, NATS framing), with room to spare.
const ReplySlack = 4096

// MaxReplyBytes bounds the items of one dequeue reply: gRPC clients refuse
// messages over 4 MiB unless configured otherwise, and a reply that cannot
// be received burns the attempts of every item in it.
const MaxReplyBytes = 4<<20 - ReplySlack
