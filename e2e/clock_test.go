package e2e

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/triage-queue/triage/cmd/triage/node"
	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
)

// TestNackAndExtendUnderClockSkew: the router's host clock is 30 s ahead
// of (or behind) the dequeuer's. Nack and ExtendLease, written by the
// router, and prefetch and serve, written by the dequeuer, still agree on
// when a row is ready or its lease lapses, because both take the time of
// the shard's primary (shardmap.Clock), not their own: a nack of 0 s makes
// the item dequeuable at once, and a 5 s extension keeps it leased for
// about 5 s, not 5 s plus or minus the skew.
func TestNackAndExtendUnderClockSkew(t *testing.T) {
	for _, skew := range []time.Duration{30 * time.Second, -30 * time.Second} {
		t.Run(fmt.Sprint(skew), func(t *testing.T) {
			t.Parallel()
			b := setup(t, bedOpts{shards: 1, noNode: true})
			b.startNode(node.Config{Seams: node.Seams{RouterNow: func() time.Time { return time.Now().Add(skew) }, DequeuerNow: time.Now}})
			// An explicit deliver_after in the past: the default (the
			// router's "now") is not what this test is about.
			enqueue(t, b, "jobs", &triagev1.NewItem{Payload: []byte("x"), DeliverAfter: timestamppb.New(time.Now().Add(-time.Minute))})
			got := dequeue(t, b, "jobs", 1, 30*time.Second)
			require.Len(t, got, 1)

			// (a) A nack with a delay of 0 (none would mean the backoff):
			// ready again at once.
			nres, err := b.queue.Nack(b.ctx(), &triagev1.NackRequest{Namespace: "default",
				Nacks: []*triagev1.NackItem{{Id: got[0].Id, LeaseToken: got[0].LeaseToken, Delay: durationpb.New(0)}}})
			require.NoError(t, err)
			require.True(t, nres.Results[0].Ok, nres.Results[0].Error)
			var again []*triagev1.LeasedItem
			require.Eventually(t, func() bool {
				again = dequeue(t, b, "jobs", 1, 30*time.Second)
				return len(again) == 1
			}, time.Second, 20*time.Millisecond, "a nack of 0 s left the item invisible")

			// (b) Extend by 5 s: invisible for about 5 s, visible again
			// within about 6 s.
			start := time.Now()
			resp, err := b.queue.ExtendLease(b.ctx(), &triagev1.ExtendLeaseRequest{Namespace: "default", Id: again[0].Id,
				LeaseToken: again[0].LeaseToken, LeaseDuration: durationpb.New(5 * time.Second)})
			require.NoError(t, err)
			require.WithinDuration(t, time.Now().Add(5*time.Second), resp.LeaseExpiresAt.AsTime(), time.Second,
				"the new expiry is not 5 s from now")
			var third []*triagev1.LeasedItem
			require.Eventually(t, func() bool {
				third = dequeue(t, b, "jobs", 1, 30*time.Second)
				return len(third) == 1
			}, 8*time.Second, 50*time.Millisecond, "the extended lease never lapsed")
			took := time.Since(start)
			require.GreaterOrEqual(t, took, 4500*time.Millisecond, "the 5 s extension lapsed early")
			require.LessOrEqual(t, took, 6500*time.Millisecond, "the 5 s extension held too long")
			require.Equal(t, again[0].Id, third[0].Id)
		})
	}
}
