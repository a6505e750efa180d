package peer

import (
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
)

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

// ReplyCode is the gRPC code a ShardDequeueResponse carries for err, so
// the router acts on the kind of failure rather than on its wording:
// FAILED_PRECONDITION for ErrNotOwner (ask the new owner), UNAVAILABLE for
// anything else (retry).
func ReplyCode(err error) codes.Code {
	if errors.Is(err, ErrNotOwner) {
		return codes.FailedPrecondition
	}
	return codes.Unavailable
}

// ReplyError rebuilds the error a reply reports: one that errors.Is
// matches to ErrNotOwner for FAILED_PRECONDITION, with the remote message.
func ReplyError(code codes.Code, msg string) error {
	if code == codes.FailedPrecondition {
		return fmt.Errorf("%w: %s", ErrNotOwner, msg)
	}
	return errors.New(msg)
}

// AnswerWithin bounds how long after a ShardDequeue's wait its owner may
// still answer: the owner gives up its work then and answers with what it
// has. A router waits for the answer a shorter time (the wait plus
// CallerSlack), but keeps listening until the wait plus AnswerWithin plus
// LateSlack, so that items answered after its caller gave up go back to
// the ready set instead of staying hidden under a counted attempt.
const (
	AnswerWithin = 10 * time.Second
	CallerSlack  = 5 * time.Second
	LateSlack    = 5 * time.Second
)
