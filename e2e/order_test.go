package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/durationpb"

	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
	"github.com/triage-queue/triage/schema/itemid"
)

// sentItem is an enqueued item and where it must sort: by priority, then by
// enqueue order (deliver_after is the enqueue time, then the ID breaks ties
// inside one request).
type sentItem struct {
	id       string
	priority int32
	seq      int
}

// enqueueMixed enqueues items with random priorities over many sequential
// requests of random size and returns them in the order they must be
// delivered.
func enqueueMixed(t *testing.T, b *bed, topic string, requests int, rng *rand.Rand) []sentItem {
	t.Helper()
	var sent []sentItem
	for r := 0; r < requests; r++ {
		var items []*triagev1.NewItem
		for range 1 + rng.IntN(12) {
			items = append(items, &triagev1.NewItem{Priority: int32(rng.IntN(5)), Payload: []byte(fmt.Sprint(len(sent) + len(items)))})
		}
		for i, res := range enqueue(t, b, topic, items...) {
			sent = append(sent, sentItem{id: res.Id, priority: items[i].Priority, seq: len(sent)})
		}
	}
	slices.SortStableFunc(sent, func(a, b sentItem) int {
		if a.priority != b.priority {
			return int(a.priority - b.priority)
		}
		return a.seq - b.seq
	})
	return sent
}

// shardsOf returns how many of topic's rows each shard holds.
func shardsOf(t *testing.T, b *bed, topic string) []int {
	t.Helper()
	out := make([]int, len(b.shards))
	for i, db := range b.shards {
		require.NoError(t, db.Get(&out[i], "SELECT COUNT(*) FROM items WHERE topic = ?", topic))
	}
	return out
}

// TestOrderAcrossShards enqueues mixed priorities over many requests, which
// round-robin spreads over three shards, and checks that dequeues of one
// and of seven items deliver exactly (priority, enqueue order).
func TestOrderAcrossShards(t *testing.T) {
	t.Parallel()
	for _, count := range []int32{1, 7} {
		t.Run(fmt.Sprintf("count=%d", count), func(t *testing.T) {
			t.Parallel()
			b := setup(t, bedOpts{shards: 3})
			const topic = "ordered"
			want := enqueueMixed(t, b, topic, 40, rand.New(rand.NewPCG(uint64(count), 42)))

			perShard := shardsOf(t, b, topic)
			for i, n := range perShard {
				require.Positive(t, n, "shard %d holds none of the items (per shard: %v); round-robin should spread requests", i+1, perShard)
			}
			idShards := map[uint32]int{}
			for _, s := range want {
				id, err := itemid.Parse(s.id)
				require.NoError(t, err)
				idShards[id.Shard]++
			}
			require.Len(t, idShards, 3, "item IDs name every shard")
			for shard, n := range idShards {
				require.Equal(t, perShard[shard-1], n, "IDs naming shard %d match the rows on it", shard)
			}

			var got []*triagev1.LeasedItem
			for len(got) < len(want) {
				batch := dequeue(t, b, topic, count, 0)
				require.Len(t, batch, min(int(count), len(want)-len(got)), "a dequeue returns as many items as asked while enough are ready")
				got = append(got, batch...)
			}
			require.Empty(t, dequeue(t, b, topic, count, 0), "nothing is left to deliver")
			for i, it := range got {
				require.Equal(t, want[i].id, it.Id, "delivery %d: want priority %d, got priority %d", i, want[i].priority, it.Priority)
				require.Equal(t, want[i].priority, it.Priority)
				if i > 0 {
					require.LessOrEqual(t, compareLeased(got[i-1], it), 0, "delivery %d sorts before %d", i-1, i)
				}
			}
			for _, r := range ack(t, b, got...) {
				require.True(t, r.Ok, r.Error)
			}
			require.Equal(t, 0, b.rowCount("items"))
		})
	}
}

// compareLeased orders leased items by (priority, deliver_after, id); IDs
// of one shard compare by their key, which is allocated in time order.
func compareLeased(a, b *triagev1.LeasedItem) int {
	if a.Priority != b.Priority {
		return int(a.Priority - b.Priority)
	}
	if c := a.DeliverAfter.AsTime().Compare(b.DeliverAfter.AsTime()); c != 0 {
		return c
	}
	ia, _ := itemid.Parse(a.Id)
	ib, _ := itemid.Parse(b.Id)
	switch {
	case ia.Key < ib.Key:
		return -1
	case ia.Key > ib.Key:
		return 1
	}
	return 0
}

// TestOrderUrgentArrivalJumpsBufferedItems checks that an item enqueued
// after a consumer started on a topic is delivered before less urgent items
// already prefetched for it: an enqueue that returned is visible to the next
// dequeue in priority order.
func TestOrderUrgentArrivalJumpsBufferedItems(t *testing.T) {
	t.Parallel()
	b := setup(t, bedOpts{shards: 3})
	const topic = "busy"
	for range 6 {
		var items []*triagev1.NewItem
		for range 20 {
			items = append(items, &triagev1.NewItem{Priority: 50, Payload: []byte("routine")})
		}
		enqueue(t, b, topic, items...)
	}
	first := dequeue(t, b, topic, 1, 0)
	require.Len(t, first, 1)
	require.Equal(t, int32(50), first[0].Priority)
	for round := range 20 {
		urgent := enqueue(t, b, topic, &triagev1.NewItem{Priority: int32(round % 3), Payload: []byte("urgent")})
		got := dequeue(t, b, topic, 1, 0)
		require.Len(t, got, 1)
		require.Equal(t, urgent[0].Id, got[0].Id, "round %d: the urgent item enqueued just before is delivered first, not priority %d", round, got[0].Priority)
		// A routine item in between keeps the prefetch buffer in use.
		routine := dequeue(t, b, topic, 1, 0)
		require.Len(t, routine, 1)
		require.Equal(t, int32(50), routine[0].Priority)
	}
}

// TestExactlyOnceWithConcurrentProducersAndConsumers runs producers and
// consumers at once and checks that every acknowledged enqueue is delivered
// exactly once with its own payload, and that the queue ends empty.
func TestExactlyOnceWithConcurrentProducersAndConsumers(t *testing.T) {
	t.Parallel()
	b := setup(t, bedOpts{shards: 3})
	const (
		topic     = "work"
		producers = 4
		consumers = 4
		perProd   = 500
		total     = producers * perProd
	)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	var mu sync.Mutex
	enqueued := map[string]string{} // id -> payload
	delivered := map[string]int{}
	payloads := map[string]string{} // id -> payload as delivered
	var acked atomic.Int64
	var wg sync.WaitGroup
	for p := range producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(p), 7))
			for sent := 0; sent < perProd && ctx.Err() == nil; {
				n := min(1+rng.IntN(50), perProd-sent)
				items := make([]*triagev1.NewItem, n)
				for i := range items {
					items[i] = &triagev1.NewItem{Priority: int32(rng.IntN(3)), Payload: []byte(fmt.Sprintf("p%d-%d", p, sent+i))}
				}
				resp, err := b.queue.Enqueue(ctx, &triagev1.EnqueueRequest{Namespace: "default", Topic: topic, Items: items})
				if !assert.NoError(t, err) || !assert.Len(t, resp.Results, n) {
					return
				}
				mu.Lock()
				for i, r := range resp.Results {
					_, dup := enqueued[r.Id]
					assert.False(t, dup, "id %s handed out twice", r.Id)
					assert.False(t, r.Duplicate)
					enqueued[r.Id] = string(items[i].Payload)
				}
				mu.Unlock()
				sent += n
			}
		}()
	}
	var cwg sync.WaitGroup
	for range consumers {
		cwg.Add(1)
		go func() {
			defer cwg.Done()
			for acked.Load() < total && ctx.Err() == nil {
				t0 := time.Now()
				resp, err := b.queue.Dequeue(ctx, &triagev1.DequeueRequest{Namespace: "default",
					Topics: []*triagev1.TopicCount{{Topic: topic, Count: 10}}, Wait: durationpb.New(time.Second)})
				// A dequeue must not outlive its wait by much. The bound catches
				// a poll that ignores its wait (it would run to ctx's end); it
				// is loose because the package's tests share one mariadbd.
				if !assert.Less(t, time.Since(t0), 15*time.Second, "a dequeue that waits 1s returns soon after") {
					return
				}
				if !assert.NoError(t, err) {
					return
				}
				if len(resp.Items) == 0 {
					continue
				}
				req := &triagev1.AckRequest{Namespace: "default"}
				mu.Lock()
				for _, it := range resp.Items {
					delivered[it.Id]++
					// A producer may not have recorded the ID yet when the
					// item is already delivered; payloads are compared below.
					payloads[it.Id] = string(it.Payload)
					req.Acks = append(req.Acks, &triagev1.LeaseRef{Id: it.Id, LeaseToken: it.LeaseToken})
				}
				mu.Unlock()
				ares, err := b.queue.Ack(ctx, req)
				if !assert.NoError(t, err) {
					return
				}
				for _, r := range ares.Results {
					assert.True(t, r.Ok, "ack %s: %s", r.Id, r.Error)
				}
				acked.Add(int64(len(resp.Items)))
			}
		}()
	}
	wg.Wait()
	cwg.Wait()
	if ctx.Err() != nil {
		dumpItems(t, b)
	}
	require.NoError(t, ctx.Err(), "the run finished in time: %d enqueued, %d delivered, %d acked, %d rows left",
		len(enqueued), len(delivered), acked.Load(), b.rowCount("items"))
	require.False(t, t.Failed())

	require.Len(t, enqueued, total)
	require.Equal(t, int64(total), acked.Load())
	shards := map[uint32]bool{}
	for id, payload := range enqueued {
		require.Equal(t, 1, delivered[id], "item %s delivered %d times", id, delivered[id])
		require.Equal(t, payload, payloads[id], "item %s delivered with its own payload", id)
		parsed, err := itemid.Parse(id)
		require.NoError(t, err)
		shards[parsed.Shard] = true
	}
	require.Len(t, shards, 3, "the items were spread over every shard")
	for id := range delivered {
		_, ok := enqueued[id]
		require.True(t, ok, "delivered %s was never enqueued", id)
	}
	require.Equal(t, 0, b.rowCount("items"))
}

// dumpItems logs every item row, to explain a test that timed out.
func dumpItems(t *testing.T, b *bed) {
	t.Helper()
	now := time.Now().UnixMicro()
	for i, db := range b.shards {
		var rows []struct {
			ID           uint64 `db:"id"`
			Priority     int32  `db:"priority"`
			DeliverAfter int64  `db:"deliver_after"`
			Attempts     int32  `db:"attempts"`
			LeaseToken   uint64 `db:"lease_token"`
		}
		require.NoError(t, db.Select(&rows, "SELECT id, priority, deliver_after, attempts, lease_token FROM items ORDER BY id LIMIT 50"))
		for _, r := range rows {
			t.Logf("shard %d: item %s priority %d ready in %s attempts %d token %x", i+1, itemid.ID{Shard: uint32(i + 1), Key: r.ID},
				r.Priority, time.Duration(r.DeliverAfter-now)*time.Microsecond, r.Attempts, r.LeaseToken)
		}
	}
}
