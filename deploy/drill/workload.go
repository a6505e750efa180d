package drill

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
	"github.com/triage-queue/triage/schema/itemid"
)

// nackKey is the metadata key every drill nack sets to its sequence
// number. A nack merges metadata into the item, so every later delivery
// must carry the sequence of the last nack answered ok before that
// delivery was asked for, or a higher one; an older value means the nack
// was undone (it was written where a failover threw it away).
const nackKey = "drill_nack"

// sent is an item the workload enqueued and Triage acknowledged.
type sent struct {
	id       string
	key      string // its dedup key
	priority int32
	router   string    // region of the router that acknowledged it
	readyAt  time.Time // deliver_after as asked
	ackedAt  time.Time // when the enqueue was acknowledged
}

// call is one Enqueue the workload made, answered ok or not.
type call struct {
	router     string
	start, end time.Time
	ok         bool
	id         string // the item's ID when ok
	key        string // the dedup key it carried
	dup        bool   // answered as a duplicate of the item id
	code       codes.Code
}

// delivery is one dequeue of an item.
type delivery struct {
	id       string
	key      string    // its dedup key (the workload's payload)
	router   string    // region of the router that delivered it
	reqStart time.Time // when the Dequeue that returned it was sent
	at       time.Time // when that Dequeue was answered
	priority int32
	attempts int32
	nackSeq  int64  // metadata drill_nack as delivered; 0 when absent
	action   string // "ack", "nack", "crash" (kept the lease, never answered)
	ackErr   bool   // the ack or nack was not answered ok
}

// settle is an ack or a nack answered ok.
type settle struct {
	id         string
	key        string // the item's dedup key
	router     string
	start, end time.Time
	nackSeq    int64         // nacks: the drill_nack value it set
	delay      time.Duration // nacks: the redelivery delay asked for
}

// history is everything the workload saw: the input of analyze.
type history struct {
	sent       map[string]*sent // acknowledged enqueues by item ID
	enqueues   []call
	deliveries []delivery
	acks       []settle
	nacks      []settle
	enqErrs    map[codes.Code]int
	deqErrs    map[codes.Code]int
}

func newHistory() history {
	return history{sent: map[string]*sent{}, enqErrs: map[codes.Code]int{}, deqErrs: map[codes.Code]int{}}
}

// client is one router the workload talks to.
type client struct {
	region string
	q      triagev1.QueueClient
}

// workload produces and consumes through several routers while a fault
// runs, and records every call and its answer.
type workload struct {
	ns     string
	topic  string
	region string // region preference of every request: the faulted region
	lease  time.Duration
	run    string

	mu   sync.Mutex
	h    history
	seq  atomic.Int64
	nack atomic.Int64
}

func newWorkload(ns, topic, region string, lease time.Duration) *workload {
	return &workload{ns: ns, topic: topic, region: region, lease: lease,
		run: fmt.Sprintf("%x", time.Now().UnixNano()), h: newHistory()}
}

// start runs producers and consumers (crashing now and then) on every
// client until prodCtx and consCtx end; seed varies their random choices.
// The wait groups say when each side has stopped.
func (w *workload) start(prodCtx, consCtx context.Context, clients []client, producers, consumers int, seed uint64) (prodWG, consWG *sync.WaitGroup) {
	prodWG, consWG = &sync.WaitGroup{}, &sync.WaitGroup{}
	for ci, c := range clients {
		for i := range producers {
			prodWG.Go(func() { w.produce(prodCtx, c, rand.New(rand.NewPCG(seed+uint64(ci), uint64(i)))) })
		}
		for i := range consumers {
			consWG.Go(func() { w.consume(consCtx, c, rand.New(rand.NewPCG(seed+uint64(ci), 1000+uint64(i))), true) })
		}
	}
	return prodWG, consWG
}

// running is a workload that launch started: its producers and
// consumers, each side under a context of its own, so that the producers
// stop first and the consumers drain what is left.
type running struct {
	w                  *workload
	stopProd, stopCons context.CancelFunc
	prodWG, consWG     *sync.WaitGroup
}

// launch starts w's producers and consumers on clients (see start), each
// side under its own context derived from ctx.
func (w *workload) launch(ctx context.Context, clients []client, producers, consumers int, seed uint64) *running {
	prodCtx, stopProd := context.WithCancel(ctx)
	consCtx, stopCons := context.WithCancel(ctx)
	prodWG, consWG := w.start(prodCtx, consCtx, clients, producers, consumers, seed)
	return &running{w: w, stopProd: stopProd, stopCons: stopCons, prodWG: prodWG, consWG: consWG}
}

// cancel cancels both sides without waiting for them, for a run that
// returns early.
func (r *running) cancel() {
	r.stopCons()
	r.stopProd()
}

// stopProducers stops the producers and waits until they have.
func (r *running) stopProducers() {
	r.stopProd()
	r.prodWG.Wait()
}

// drain waits, up to limit, until every acknowledged item was delivered,
// then a lease and a second more, so that items a crashed consumer held
// come back once more (their redelivery is counted) and stale copies show
// up, and stops the consumers and waits until they have.
func (r *running) drain(ctx context.Context, limit, lease time.Duration, progress io.Writer) {
	fmt.Fprintf(progress, "producers stopped; draining %d undelivered items\n", r.w.undelivered())
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) && ctx.Err() == nil && r.w.undelivered() > 0 {
		sleep(ctx, 200*time.Millisecond)
	}
	sleep(ctx, lease+time.Second)
	r.stopCons()
	r.consWG.Wait()
}

// produce enqueues one item at a time with a dedup key and retries the
// same key until it is acknowledged, as an idempotent producer does.
func (w *workload) produce(ctx context.Context, c client, rng *rand.Rand) {
	for ctx.Err() == nil {
		n := w.seq.Add(1)
		key := fmt.Sprintf("drill-%s-%s-%d", w.run, c.region, n)
		prio := int32(rng.IntN(4))
		var delay time.Duration
		if rng.IntN(5) == 0 {
			delay = time.Duration(rng.IntN(1500)) * time.Millisecond
		}
		// One deliver_after for every attempt: an attempt that timed out may
		// have stored the item, and a retry is answered with that item.
		ready := time.Now().Add(delay)
		for ctx.Err() == nil {
			start := time.Now()
			item := &triagev1.NewItem{Priority: prio, DedupKey: key, Payload: []byte(key)}
			if delay > 0 {
				item.DeliverAfter = timestamppb.New(ready)
			}
			rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			resp, err := c.q.Enqueue(rctx, &triagev1.EnqueueRequest{Namespace: w.ns, Topic: w.topic, Region: w.region, Items: []*triagev1.NewItem{item}})
			cancel()
			end := time.Now()
			if err != nil {
				if ctx.Err() != nil {
					return // cancelled by the drill, not answered by Triage
				}
				w.mu.Lock()
				w.h.enqueues = append(w.h.enqueues, call{router: c.region, start: start, end: end, key: key, code: status.Code(err)})
				w.h.enqErrs[status.Code(err)]++
				w.mu.Unlock()
				sleep(ctx, 100*time.Millisecond)
				continue
			}
			r := resp.Results[0]
			w.mu.Lock()
			w.h.enqueues = append(w.h.enqueues, call{router: c.region, start: start, end: end, ok: true, id: r.Id, key: key, dup: r.Duplicate})
			if _, dup := w.h.sent[r.Id]; !dup {
				w.h.sent[r.Id] = &sent{id: r.Id, key: key, priority: prio, router: c.region, readyAt: ready, ackedAt: end}
			}
			w.mu.Unlock()
			break
		}
		sleep(ctx, time.Duration(5+rng.IntN(10))*time.Millisecond)
	}
}

// consume dequeues and acks most items as they arrive, nacks some (with
// a short delay and a drill_nack sequence in metadata), and "crashes" on
// a few: keeps the lease and never answers, so they come back when it
// lapses.
func (w *workload) consume(ctx context.Context, c client, rng *rand.Rand, crashes bool) {
	for ctx.Err() == nil {
		start := time.Now()
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		resp, err := c.q.Dequeue(rctx, &triagev1.DequeueRequest{Namespace: w.ns, Region: w.region,
			Topics: []*triagev1.TopicCount{{Topic: w.topic, Count: 10}}, LeaseDuration: durationpb.New(w.lease),
			Wait: durationpb.New(500 * time.Millisecond)})
		cancel()
		now := time.Now()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			w.mu.Lock()
			w.h.deqErrs[status.Code(err)]++
			w.mu.Unlock()
			sleep(ctx, 100*time.Millisecond)
			continue
		}
		b := w.decide(resp.Items, c.region, start, now, rng, crashes)
		failed := map[string]bool{}
		settled := w.sendAcks(ctx, c, b, failed)
		nacked := w.sendNacks(ctx, c, b, failed)
		w.mu.Lock()
		for _, d := range b.deliveries {
			d.ackErr = failed[d.id]
			w.h.deliveries = append(w.h.deliveries, d)
		}
		w.h.acks = append(w.h.acks, settled...)
		w.h.nacks = append(w.h.nacks, nacked...)
		w.mu.Unlock()
	}
}

// batch is what a consumer decided for the items of one dequeue: their
// deliveries, and the acks and nacks to send.
type batch struct {
	deliveries []delivery
	acks       []*triagev1.LeaseRef
	nacks      []*triagev1.NackItem
	// nackSeq is the drill_nack each nack sets, keyOf each item's dedup
	// key, by item ID.
	nackSeq map[string]int64
	keyOf   map[string]string
}

// decide records the delivery of each of items, dequeued through router
// by a request sent at start and answered at now, and picks what to do
// with it: crash on one in 20 (when crashes), nack two in 20 with a
// random delay under a new drill_nack sequence, ack the rest.
func (w *workload) decide(items []*triagev1.LeasedItem, router string, start, now time.Time, rng *rand.Rand, crashes bool) batch {
	b := batch{nackSeq: map[string]int64{}, keyOf: map[string]string{}}
	for _, it := range items {
		seq, _ := strconv.ParseInt(it.Metadata[nackKey], 10, 64)
		d := delivery{id: it.Id, key: string(it.Payload), router: router, reqStart: start, at: now, priority: it.Priority,
			attempts: it.Attempts, nackSeq: seq, action: "ack"}
		switch r := rng.IntN(20); {
		case crashes && r == 0:
			d.action = "crash"
		case r <= 2:
			d.action = "nack"
			s := w.nack.Add(1)
			b.nackSeq[it.Id] = s
			delay := time.Duration(rng.IntN(1000)) * time.Millisecond
			b.nacks = append(b.nacks, &triagev1.NackItem{Id: it.Id, LeaseToken: it.LeaseToken, Delay: durationpb.New(delay),
				Error: "drill nack", Metadata: map[string]string{nackKey: strconv.FormatInt(s, 10)}})
		default:
			b.acks = append(b.acks, &triagev1.LeaseRef{Id: it.Id, LeaseToken: it.LeaseToken})
		}
		b.deliveries = append(b.deliveries, d)
		b.keyOf[it.Id] = d.key
	}
	return b
}

// sendAcks sends b's acks in one call and returns those answered ok;
// it marks the others in failed.
func (w *workload) sendAcks(ctx context.Context, c client, b batch, failed map[string]bool) []settle {
	if len(b.acks) == 0 {
		return nil
	}
	var settled []settle
	s := time.Now()
	actx, cancel := context.WithTimeout(ctx, 5*time.Second)
	res, err := c.q.Ack(actx, &triagev1.AckRequest{Namespace: w.ns, Acks: b.acks})
	cancel()
	e := time.Now()
	for i, a := range b.acks {
		if err != nil || i >= len(res.Results) || !res.Results[i].Ok {
			failed[a.Id] = true
			continue
		}
		settled = append(settled, settle{id: a.Id, key: b.keyOf[a.Id], router: c.region, start: s, end: e})
	}
	return settled
}

// sendNacks sends b's nacks in one call and returns those answered ok; it
// marks the others in failed.
func (w *workload) sendNacks(ctx context.Context, c client, b batch, failed map[string]bool) []settle {
	if len(b.nacks) == 0 {
		return nil
	}
	var nacked []settle
	s := time.Now()
	nctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	res, err := c.q.Nack(nctx, &triagev1.NackRequest{Namespace: w.ns, Nacks: b.nacks})
	cancel()
	e := time.Now()
	for i, n := range b.nacks {
		if err != nil || i >= len(res.Results) || !res.Results[i].Ok {
			failed[n.Id] = true
			continue
		}
		nacked = append(nacked, settle{id: n.Id, key: b.keyOf[n.Id], router: c.region, start: s, end: e,
			nackSeq: b.nackSeq[n.Id], delay: n.Delay.AsDuration()})
	}
	return nacked
}

// undelivered counts acknowledged items not delivered yet.
func (w *workload) undelivered() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	seen := make(map[string]bool, len(w.h.deliveries))
	for _, d := range w.h.deliveries {
		seen[d.id] = true
	}
	n := 0
	for id := range w.h.sent {
		if !seen[id] {
			n++
		}
	}
	return n
}

// shardOf is the shard an item ID names; 0 if it names none.
func shardOf(id string) uint32 {
	p, err := itemid.Parse(id)
	if err != nil {
		return 0
	}
	return p.Shard
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
