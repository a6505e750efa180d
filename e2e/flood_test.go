package e2e

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/durationpb"

	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
)

// TestConsumersKeepUpDuringEnqueueFlood: with producers enqueuing single
// items as fast as they can, every enqueue announces new items, so a
// prefetch queue is always "dirty". Consumers must still be served (a
// dequeue once re-read the shard forever and delivered nothing).
func TestConsumersKeepUpDuringEnqueueFlood(t *testing.T) {
	t.Parallel()
	b := setup(t, bedOpts{})
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
	defer cancel()
	var enq, deq atomic.Int64
	var wg sync.WaitGroup
	for i := range 32 {
		wg.Go(func() {
			for ctx.Err() == nil {
				if _, err := b.queue.Enqueue(ctx, &triagev1.EnqueueRequest{Namespace: "default", Topic: "flood",
					Items: []*triagev1.NewItem{{Priority: int32(i % 10)}}}); err == nil {
					enq.Add(1)
				}
			}
		})
	}
	for range 8 {
		wg.Go(func() {
			for ctx.Err() == nil {
				resp, err := b.queue.Dequeue(ctx, &triagev1.DequeueRequest{Namespace: "default",
					Topics: []*triagev1.TopicCount{{Topic: "flood", Count: 10}}, Wait: durationpb.New(250 * time.Millisecond)})
				if err == nil {
					deq.Add(int64(len(resp.Items)))
				}
			}
		})
	}
	wg.Wait()
	t.Logf("enqueued %d, delivered %d", enq.Load(), deq.Load())
	require.Positive(t, enq.Load())
	require.Greater(t, deq.Load(), enq.Load()/10, "consumers are starved while producers flood the topic")
}
