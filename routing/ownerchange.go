package routing

import (
	"context"
	"errors"

	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
)

// errOwnerChanged: while a Dequeue waited for an owner's answer, another
// dequeuer claimed one of the shards it asked for.
var errOwnerChanged = errors.New("the shards' owner changed while it was asked")

// askWhileOwner calls ask with a context that ends, with errOwnerChanged,
// once owners names another dequeuer than owner for one of shards. An
// owner cut off by a partition or gone with its region answers nothing,
// so without this a Dequeue sent to it waits out its caller's deadline
// (the drills: 5 s of every client's dequeue RTO after the new owner had
// taken the shard), where the new owner serves it at once (followOwners
// asks again). An owner that answers after all loses nothing: an answer
// nobody waits for goes back to the ready set (NATSDequeuers.Late). A
// claim that only vanished (a hand-over's delete, an expiry) names no
// other owner and ends nothing: the owner handing over answers itself.
func askWhileOwner(ctx context.Context, owners OwnerView, owner string, shards []uint32,
	ask func(context.Context) ([]*triagev1.LeasedItem, error)) ([]*triagev1.LeasedItem, error) {
	actx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go func() {
		for {
			changed := owners.Changed()
			for _, id := range shards {
				if o, ok := owners.Owner(id); ok && o != owner {
					cancel(errOwnerChanged)
					return
				}
			}
			select {
			case <-changed:
			case <-actx.Done():
				return
			}
		}
	}()
	items, err := ask(actx)
	if err != nil && ctx.Err() == nil && errors.Is(context.Cause(actx), errOwnerChanged) {
		err = errOwnerChanged
	}
	return items, err
}
