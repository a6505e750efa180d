package drill

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
)

// sent is an item the workload enqueued and Triage acknowledged.
type sent struct {
	id       string
	priority int32
	readyAt  time.Time // deliver_after as asked
	ackedAt  time.Time // when the enqueue was acknowledged
}

// delivery is one dequeue of an item.
type delivery struct {
	id       string
	priority int32
	at       time.Time
	attempts int32
	action   string // "ack", "nack", "crash" (kept the lease, never answered)
	ackErr   bool
}

// workload produces and consumes through one router while a fault runs.
type workload struct {
	q      triagev1.QueueClient
	ns     string
	topic  string
	region string
	lease  time.Duration
	run    string

	mu         sync.Mutex
	sent       map[string]*sent // by item ID
	deliveries []delivery
	enqErrs    map[codes.Code]int
	deqErrs    map[codes.Code]int
	lastEnqOK  atomic.Int64 // unix nanos
	lastDeqOK  atomic.Int64
	seq        atomic.Int64
}

func newWorkload(q triagev1.QueueClient, ns, topic, region string, lease time.Duration) *workload {
	return &workload{q: q, ns: ns, topic: topic, region: region, lease: lease,
		run: fmt.Sprintf("%x", time.Now().UnixNano()), sent: map[string]*sent{},
		enqErrs: map[codes.Code]int{}, deqErrs: map[codes.Code]int{}}
}

// produce enqueues one item at a time with a dedup key and retries the
// same key until it is acknowledged, as an idempotent producer does.
func (w *workload) produce(ctx context.Context, rng *rand.Rand) {
	for ctx.Err() == nil {
		n := w.seq.Add(1)
		key := fmt.Sprintf("drill-%s-%d", w.run, n)
		prio := int32(rng.IntN(4))
		var delay time.Duration
		if rng.IntN(5) == 0 {
			delay = time.Duration(rng.IntN(1500)) * time.Millisecond
		}
		for ctx.Err() == nil {
			ready := time.Now().Add(delay)
			item := &triagev1.NewItem{Priority: prio, DedupKey: key, Payload: []byte(key)}
			if delay > 0 {
				item.DeliverAfter = timestamppb.New(ready)
			}
			rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			resp, err := w.q.Enqueue(rctx, &triagev1.EnqueueRequest{Namespace: w.ns, Topic: w.topic, Region: w.region, Items: []*triagev1.NewItem{item}})
			cancel()
			if err != nil {
				w.mu.Lock()
				w.enqErrs[status.Code(err)]++
				w.mu.Unlock()
				sleep(ctx, 100*time.Millisecond)
				continue
			}
			now := time.Now()
			w.lastEnqOK.Store(now.UnixNano())
			r := resp.Results[0]
			w.mu.Lock()
			if _, dup := w.sent[r.Id]; !dup {
				w.sent[r.Id] = &sent{id: r.Id, priority: prio, readyAt: ready, ackedAt: now}
			}
			w.mu.Unlock()
			break
		}
		sleep(ctx, time.Duration(5+rng.IntN(10))*time.Millisecond)
	}
}

// consume dequeues and acks most items, nacks some, and "crashes" on a
// few: keeps the lease and never answers, so they come back when it lapses.
func (w *workload) consume(ctx context.Context, rng *rand.Rand, crashes bool) {
	for ctx.Err() == nil {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		resp, err := w.q.Dequeue(rctx, &triagev1.DequeueRequest{Namespace: w.ns, Region: w.region,
			Topics: []*triagev1.TopicCount{{Topic: w.topic, Count: 10}}, LeaseDuration: durationpb.New(w.lease),
			Wait: durationpb.New(500 * time.Millisecond)})
		cancel()
		if err != nil {
			w.mu.Lock()
			w.deqErrs[status.Code(err)]++
			w.mu.Unlock()
			sleep(ctx, 100*time.Millisecond)
			continue
		}
		if len(resp.Items) > 0 {
			w.lastDeqOK.Store(time.Now().UnixNano())
		}
		now := time.Now()
		var acks []*triagev1.LeaseRef
		var nacks []*triagev1.NackItem
		var ds []delivery
		for _, it := range resp.Items {
			d := delivery{id: it.Id, priority: it.Priority, at: now, attempts: it.Attempts, action: "ack"}
			switch r := rng.IntN(20); {
			case crashes && r == 0:
				d.action = "crash"
			case r <= 2:
				d.action = "nack"
				nacks = append(nacks, &triagev1.NackItem{Id: it.Id, LeaseToken: it.LeaseToken, Delay: durationpb.New(0), Error: "drill nack"})
			default:
				acks = append(acks, &triagev1.LeaseRef{Id: it.Id, LeaseToken: it.LeaseToken})
			}
			ds = append(ds, d)
		}
		failed := map[string]bool{}
		if len(acks) > 0 {
			actx, cancel := context.WithTimeout(ctx, 5*time.Second)
			res, err := w.q.Ack(actx, &triagev1.AckRequest{Namespace: w.ns, Acks: acks})
			cancel()
			for i, a := range acks {
				if err != nil || !res.Results[i].Ok {
					failed[a.Id] = true
				}
			}
		}
		if len(nacks) > 0 {
			nctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			_, _ = w.q.Nack(nctx, &triagev1.NackRequest{Namespace: w.ns, Nacks: nacks})
			cancel()
		}
		w.mu.Lock()
		for _, d := range ds {
			d.ackErr = failed[d.id]
			w.deliveries = append(w.deliveries, d)
		}
		w.mu.Unlock()
	}
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
