package bench

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/timestamppb"

	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
)

// TestTrailsBreakdown: each leg runs from one stamp to the next; an item
// served before its Enqueue answered ends its commit leg at the serve,
// and the slowest 1% are told apart from the rest.
func TestTrailsBreakdown(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	tr := newTrails()
	item := func(id string, enq, served time.Duration) *triagev1.LeasedItem {
		return &triagev1.LeasedItem{Id: id, EnqueuedAt: timestamppb.New(t0.Add(enq)),
			LeaseExpiresAt: timestamppb.New(t0.Add(served + steadyLease))}
	}
	for i := range 198 {
		id := fmt.Sprint(i)
		tr.answer([]string{id}, t0.Add(ms(5)))
		tr.deliver(item(id, ms(1), ms(8)), t0, t0.Add(ms(10)))
	}
	// Two slow ones: one waited in the queue, one was served before its
	// Enqueue answered.
	tr.answer([]string{"q"}, t0.Add(ms(5)))
	tr.deliver(item("q", ms(1), ms(95)), t0, t0.Add(ms(100)))
	tr.answer([]string{"s"}, t0.Add(ms(90)))
	tr.deliver(item("s", ms(1), ms(60)), t0, t0.Add(ms(120)))

	b, ok := tr.breakdown(window{from: t0, to: t0.Add(time.Second)})
	require.True(t, ok)
	require.Equal(t, 200, b.allN)
	require.Equal(t, 2, b.slowN)
	require.Equal(t, ms(100), b.slowFrom)
	require.Equal(t, []time.Duration{ms(1), ms(4), ms(3), ms(2)}, b.all, "router, commit, queued, answer")
	// The median of two is the upper one: "s" (commit 59, queued 0,
	// answer 60) for commit and answer, "q" (queued 90) for queued.
	require.Equal(t, []time.Duration{ms(1), ms(59), ms(90), ms(60)}, b.slow)

	_, ok = tr.breakdown(window{from: t0.Add(time.Hour), to: t0.Add(2 * time.Hour)})
	require.False(t, ok, "too few items in the window")
}
