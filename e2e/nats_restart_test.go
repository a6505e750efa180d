package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/triage-queue/triage/cmd/triage/node"
	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
)

// TestNATSRestartKeepsTheQueueServing: a standalone NATS server restarts
// (an upgrade, a crash) under running router, enqueuer and dequeuer
// processes. Its file-backed streams come back; its memory-backed buckets
// (sessions, claims, health) do not. The processes make what they need
// again: enqueue and dequeue serve within a bound of NATS coming back,
// and every item acknowledged before the restart is delivered after it.
func TestNATSRestartKeepsTheQueueServing(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 2)
	const ttl = 2 * time.Second
	router := c.start("router", node.Config{Roles: []string{node.RoleRouter}, OwnerTTL: ms(ttl)})
	c.start("enq", node.Config{Roles: []string{node.RoleEnqueuer}, OwnerTTL: ms(ttl)})
	c.start("us-east-deq", node.Config{Roles: []string{node.RoleDequeuer}, DequeuerID: "us-east-deq", OwnerTTL: ms(ttl)})
	q := c.client(router)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()

	enqueue := func(tag string, n int) (map[string]bool, error) {
		req := &triagev1.EnqueueRequest{Namespace: "default", Topic: "work"}
		for i := range n {
			req.Items = append(req.Items, &triagev1.NewItem{Payload: fmt.Appendf(nil, "%s-%d", tag, i)})
		}
		rctx, rcancel := context.WithTimeout(ctx, 5*time.Second)
		defer rcancel()
		resp, err := q.Enqueue(rctx, req)
		if err != nil {
			return nil, err
		}
		ids := map[string]bool{}
		for _, r := range resp.Results {
			ids[r.Id] = true
		}
		return ids, nil
	}
	// drain dequeues and acks until want is delivered or the time is up.
	drain := func(want map[string]bool, within time.Duration) {
		t.Helper()
		deadline := time.Now().Add(within)
		for len(want) > 0 && time.Now().Before(deadline) {
			rctx, rcancel := context.WithTimeout(ctx, 5*time.Second)
			resp, err := q.Dequeue(rctx, &triagev1.DequeueRequest{Namespace: "default",
				Topics: []*triagev1.TopicCount{{Topic: "work", Count: 50}}, Wait: durationpb.New(time.Second)})
			rcancel()
			if err != nil {
				time.Sleep(100 * time.Millisecond)
				continue
			}
			ack := &triagev1.AckRequest{Namespace: "default"}
			for _, it := range resp.Items {
				delete(want, it.Id)
				ack.Acks = append(ack.Acks, &triagev1.LeaseRef{Id: it.Id, LeaseToken: it.LeaseToken})
			}
			if len(ack.Acks) > 0 {
				_, _ = q.Ack(ctx, ack)
			}
		}
		require.Empty(t, want, "acknowledged items not delivered within %s", within)
	}

	var first map[string]bool
	require.Eventually(t, func() bool {
		var err error
		first, err = enqueue("before", 20)
		return err == nil
	}, time.Minute, 100*time.Millisecond, "the first enqueue")
	drain(first, 30*time.Second)
	waiting, err := enqueue("waiting", 20)
	require.NoError(t, err)

	c.stopNATS()
	c.startNATS()
	back := time.Now()
	// Past what the dequeuer's session was sure for before the restart:
	// what serves now stands on what was made after it.
	time.Sleep(3 * ttl)
	var after map[string]bool
	require.Eventually(t, func() bool {
		after, err = enqueue("after", 20)
		return err == nil
	}, 30*time.Second, 100*time.Millisecond, "an enqueue after NATS came back")
	t.Logf("enqueue served %s after NATS came back", time.Since(back).Round(time.Millisecond))
	for id := range after {
		waiting[id] = true
	}
	drain(waiting, 30*time.Second)
	t.Logf("every item delivered %s after NATS came back", time.Since(back).Round(time.Millisecond))
}
