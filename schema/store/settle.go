package store

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// A write whose COMMIT was sent and not answered (ErrOutcomeUnknown: the
// connection broke, or the driver's read timeout fired while the commit
// waited for a replica) may or may not have taken effect. Left as it is,
// the caller hears a failure for an ack that may have deleted the item,
// or for a nack whose delay and error may be stored; the lease and item
// writes therefore settle it before they answer, on a fresh connection of
// the pool (database/sql discards the broken one):
//
//   - An ack or nack is sent again under row locks. A row the lost
//     transaction would have changed that still carries its token shows
//     it did not commit (it changed all of its rows or none), and the
//     repeat's answer is the call's. When none carries its token any more,
//     the lost transaction took effect, and each ref answers as done. The
//     locks make the repeat wait for a lost transaction that is still
//     committing (a semi-sync wait), so it never reads the row from before
//     a commit about to land.
//   - An extension, an update and a delete are run again: each writes the
//     same values the lost one would have, so the repeat's answer is the
//     call's (a delete that finds the item gone answers done).
//
// Only when the repeat fails too (the primary is down, or the lost
// transaction still holds its rows past the settle's time) does the call
// return ErrOutcomeUnknown; repeating it with the same lease token is then
// safe, for the same reasons.
//
// When the lost transaction did not commit, and meanwhile the lease
// lapsed and the next holder acked or nacked the item, the ack or nack
// answers done although another call did it: the item is gone, or back
// in the ready set, either way.

// settleTimeout bounds settling one write: more than a lock wait
// (innodb_lock_wait_timeout, 10 s for the application account), so a
// repeat that waited out a lost transaction's locks once can still answer.
const settleTimeout = 15 * time.Second

// settleCtx is the context a settle runs on: ctx's values without its
// end (a call whose deadline ended it mid-commit still leaves the write
// settled), bounded by settleTimeout.
func settleCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
}

// settleFailed is the error of a write whose outcome stays unknown: cause
// (ErrOutcomeUnknown) and why the settle could not tell.
func settleFailed(cause, settle error) error {
	return fmt.Errorf("%w; doing it again to settle it failed: %v", cause, settle)
}

// settleAck settles an ack whose outcome is unknown (cause): lost holds
// the positions of p.Refs the lost transaction would have acked, all or
// none of them, and known the results of the others. It acks the lost
// refs again; when none of their rows is left (the repeat answers
// ErrNotFound for each), the lost transaction deleted them and each
// answers as acked, as it would have (a second ref to the same item
// finds it gone). Otherwise the repeat did the ack and its results are
// the answer.
func (s Store) settleAck(ctx context.Context, p ItemAckParams, lost []int, known []error, cause error) ([]error, error) {
	out := make([]error, len(p.Refs))
	copy(out, known)
	if len(lost) == 0 {
		return out, nil
	}
	sub := p
	sub.Refs = make([]LeaseRef, len(lost))
	for j, i := range lost {
		sub.Refs[j] = p.Refs[i]
	}
	sctx, cancel := settleCtx(ctx)
	defer cancel()
	res, err := s.itemAck(sctx, sub)
	if err != nil {
		return nil, settleFailed(cause, err)
	}
	gone := true
	for _, r := range res {
		gone = gone && errors.Is(r, ErrNotFound)
	}
	seen := map[uint64]bool{}
	for j, i := range lost {
		switch {
		case !gone:
			out[i] = res[j]
		case seen[p.Refs[i].Key]:
			out[i] = ErrNotFound
		default:
			out[i] = nil
		}
		seen[p.Refs[i].Key] = true
	}
	return out, nil
}

// settleNack settles a nack whose outcome is unknown (cause), given what
// the lost transaction would have committed: results (nil for the nacks
// it applied, the lost ones), readyNow and deadTopics. It nacks the lost
// ones again; when each is refused (its token is gone: cleared by the lost
// nack, or the row moved to dead_letters), the lost transaction took
// effect and its own results stand. Otherwise the repeat did the nacks and
// its results are the answer.
func (s Store) settleNack(ctx context.Context, p ItemNackParams, results []error, readyNow, deadTopics []string, cause error) ([]error, []string, []string, error) {
	var lost []int
	for i, r := range results {
		if r == nil {
			lost = append(lost, i)
		}
	}
	if len(lost) == 0 {
		return results, readyNow, deadTopics, nil
	}
	sub := p
	sub.Nacks = make([]Nack, len(lost))
	for j, i := range lost {
		sub.Nacks[j] = p.Nacks[i]
	}
	sctx, cancel := settleCtx(ctx)
	defer cancel()
	res, ready, dead, err := s.itemNack(sctx, sub)
	if err != nil {
		return nil, nil, nil, settleFailed(cause, err)
	}
	applied := true
	for _, r := range res {
		applied = applied && (errors.Is(r, ErrStaleLease) || errors.Is(r, ErrNotFound))
	}
	if applied {
		return results, readyNow, deadTopics, nil
	}
	for j, i := range lost {
		results[i], readyNow[i] = res[j], ready[j]
	}
	return results, readyNow, dead, nil
}
