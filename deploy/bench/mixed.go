package bench

import (
	"cmp"
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
)

// inversionReady is how long a more urgent item must have been ready for
// the delivery of a less urgent one to count as a priority inversion.
const inversionReady = 5 * time.Millisecond

// sustainableRate measures what the mixed load can sustain: producers
// sending single items back to back (as many as triage-enqueue-batch1 has
// clients) and the mixed scenario's consumers, at once, on a topic of
// their own. Enqueue and dequeue share the box's cores, so this is lower
// than either path alone. The sustainable rate is the lower of the
// enqueue and delivery rates.
func (r *runner) sustainableRate(ctx context.Context) (rate float64, note string, err error) {
	const topic = "bench-mixed-probe"
	var enq, deq *sampler
	var wg sync.WaitGroup
	prog := r.progress(Mixed + " (closed-loop probe)")
	wg.Add(2)
	go func() {
		defer wg.Done()
		producers := r.p.enqueue1Clients[0]
		reqs := make([]*triagev1.EnqueueRequest, producers)
		for i := range reqs {
			reqs[i] = &triagev1.EnqueueRequest{Namespace: namespace, Topic: topic, Durability: triagev1.Durability_COMMITTED,
				Items: []*triagev1.NewItem{{Payload: r.payload, Priority: int32(i % 10)}}}
		}
		enq = runLoad(ctx, loadSpec{workers: producers, warmup: r.p.probeWarmup, measure: r.p.probeMeasure,
			op: func(ctx context.Context, w int, _ *sampler) (int, error) {
				cctx, cancel := context.WithTimeout(ctx, rpcTimeout)
				defer cancel()
				if _, err := r.client(w).Enqueue(cctx, reqs[w]); err != nil {
					return 0, err
				}
				return 1, nil
			}}, nil)
	}()
	go func() {
		defer wg.Done()
		deq = runLoad(ctx, loadSpec{workers: r.p.mixedConsumers, warmup: r.p.probeWarmup, measure: r.p.probeMeasure,
			op: func(ctx context.Context, w int, s *sampler) (int, error) {
				return r.dequeueAck(ctx, r.client(w), topic, r.p.mixedCount, 250*time.Millisecond, s)
			}}, prog)
	}()
	wg.Wait()
	prog.close()
	if ctx.Err() != nil {
		return 0, "", ctx.Err()
	}
	if enq.items == 0 || deq.items == 0 {
		return 0, "", fmt.Errorf("closed-loop probe: enqueued %d, delivered %d items (%s %s)", enq.items, deq.items, enq.errNote(), deq.errNote())
	}
	rate = min(enq.rate(), deq.rate())
	note = fmt.Sprintf("closed-loop probe of %s with %d single-item producers and %d consumers at once: enqueued %s/s, delivered %s/s",
		r.p.probeMeasure, r.p.enqueue1Clients[0], r.p.mixedConsumers, human(enq.rate()), human(deq.rate()))
	return rate, note, nil
}

// delivery is one item handed to a consumer, with the consumer's clock
// (nanoseconds since the run's start) when it sent the Dequeue and when the
// answer arrived.
type delivery struct {
	seq        int
	prio       int32
	sent, recv int64
}

// mixed: producers enqueue single items at a fixed rate (open loop: each
// item has an intended send time, and latency counts from it, so a slow
// server cannot slow the load down and hide its own latency); consumers
// dequeue and ack as items come. Each payload carries the item's sequence
// number.
func (r *runner) mixed(ctx context.Context) (Scenario, error) {
	// A steady state on a small table, like the enqueue scenarios'.
	if err := truncate(ctx, r.shardDBs()); err != nil {
		return Scenario{}, err
	}
	sustainable, basis, err := r.sustainableRate(ctx)
	if err != nil {
		return Scenario{}, err
	}
	rate := sustainable / 2
	total := r.p.mixedWarmup + r.p.mixedMeasure
	n := int(rate * total.Seconds())
	if n < 1 {
		return Scenario{}, fmt.Errorf("offered rate %.1f items/s is too low to run", rate)
	}
	interval := float64(time.Second) / rate
	rnd := rand.New(rand.NewPCG(42, 7))
	prios := make([]int32, n)
	for i := range prios {
		prios[i] = int32(rnd.IntN(10))
	}
	ackAt := make([]int64, n) // since start; 0 = not answered, -1 = failed
	fmt.Fprintf(r.out, "%s: sustainable %s items/s (%s); offering half, %s items/s, for %s\n", r.label(Mixed), human(sustainable), basis,
		human(rate), total)

	prog := r.progress(Mixed)
	defer prog.close()
	start := time.Now().Add(50 * time.Millisecond)
	warmEnd := int64(r.p.mixedWarmup)
	measureEnd := int64(total)
	intended := func(i int) int64 { return int64(float64(i) * interval) }

	// Consumers start first and long-poll.
	var stop atomic.Bool
	var delivered atomic.Int64
	seen := make([]atomic.Bool, n)
	var unique atomic.Int64
	consumers := make([]*sampler, r.p.mixedConsumers)
	deliveries := make([][]delivery, r.p.mixedConsumers)
	var longPolls, polls atomic.Int64
	var cwg sync.WaitGroup
	for c := range consumers {
		consumers[c] = newSampler(window{from: start.Add(r.p.mixedWarmup), to: start.Add(total)})
		cwg.Add(1)
		go func() {
			defer cwg.Done()
			s := consumers[c]
			client := r.client(c)
			for !stop.Load() && ctx.Err() == nil {
				req := &triagev1.DequeueRequest{Namespace: namespace, Topics: []*triagev1.TopicCount{{Topic: mixedTopic, Count: int32(r.p.mixedCount)}}}
				cctx, cancel := context.WithTimeout(ctx, rpcTimeout)
				t0 := time.Now()
				resp, err := client.Dequeue(cctx, req)
				t1 := time.Now()
				polls.Add(1)
				if err == nil {
					s.observe("dequeue", t1, t1.Sub(t0))
					if len(resp.Items) > 0 {
						s.observe("dequeue_items", t1, t1.Sub(t0))
					}
					if len(resp.Items) == 0 {
						// Nothing ready: park in a long poll. Its duration is
						// waiting, not service time, so it is not a dequeue
						// latency; the items it returns count end to end.
						req.Wait = durationpb.New(250 * time.Millisecond)
						t0 = time.Now()
						resp, err = client.Dequeue(cctx, req)
						t1 = time.Now()
						longPolls.Add(1)
					}
				}
				cancel()
				if err != nil {
					if ctx.Err() == nil {
						s.fail(fmt.Errorf("dequeue: %w", err))
						sleepCtx(ctx, 10*time.Millisecond)
					}
					continue
				}
				for _, it := range resp.Items {
					if len(it.Payload) < 8 {
						s.fail(fmt.Errorf("item %s: payload of %d bytes is not the bench's", it.Id, len(it.Payload)))
						continue
					}
					seq := int(binary.BigEndian.Uint64(it.Payload))
					if seq < 0 || seq >= n {
						s.fail(fmt.Errorf("item %s: sequence %d out of range", it.Id, seq))
						continue
					}
					deliveries[c] = append(deliveries[c], delivery{seq: seq, prio: it.Priority,
						sent: t0.Sub(start).Nanoseconds(), recv: t1.Sub(start).Nanoseconds()})
					if !seen[seq].Swap(true) {
						unique.Add(1)
					}
				}
				delivered.Add(int64(len(resp.Items)))
				prog.items.Add(int64(len(resp.Items)))
				if len(resp.Items) == 0 {
					continue
				}
				actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rpcTimeout)
				ta := time.Now()
				ar, err := client.Ack(actx, &triagev1.AckRequest{Namespace: namespace, Acks: refs(resp.Items)})
				cancel()
				te := time.Now()
				if err != nil {
					s.fail(fmt.Errorf("ack: %w", err))
					continue
				}
				s.observe("ack", te, te.Sub(ta))
				for _, res := range ar.Results {
					if !res.Ok {
						s.fail(fmt.Errorf("ack %s refused: %s", res.Id, res.Error))
						break
					}
				}
			}
		}()
	}

	// Producers: a scheduler releases each item at its intended time to a
	// pool of senders.
	jobs := make(chan int, n)
	var enqErrs atomic.Int64
	var firstEnqErr atomic.Value
	var swg sync.WaitGroup
	for w := range r.p.mixedSenders {
		swg.Add(1)
		go func() {
			defer swg.Done()
			client := r.client(w)
			for i := range jobs {
				payload := make([]byte, payloadBytes)
				copy(payload, r.payload)
				binary.BigEndian.PutUint64(payload, uint64(i))
				binary.BigEndian.PutUint64(payload[8:], uint64(intended(i)))
				cctx, cancel := context.WithTimeout(ctx, rpcTimeout)
				_, err := client.Enqueue(cctx, &triagev1.EnqueueRequest{Namespace: namespace, Topic: mixedTopic,
					Items: []*triagev1.NewItem{{Payload: payload, Priority: prios[i]}}, Durability: triagev1.Durability_COMMITTED})
				cancel()
				if err != nil {
					ackAt[i] = -1
					enqErrs.Add(1)
					firstEnqErr.CompareAndSwap(nil, err)
					continue
				}
				ackAt[i] = max(time.Since(start).Nanoseconds(), 1)
			}
		}()
	}
	sleepCtx(ctx, time.Until(start))
	for next := 0; next < n && ctx.Err() == nil; {
		due := min(n, int(float64(time.Since(start))/interval)+1)
		for ; next < due; next++ {
			jobs <- next
		}
		time.Sleep(200 * time.Microsecond)
	}
	close(jobs)
	swg.Wait()
	// Drain: every committed item should reach a consumer.
	committed := int64(n) - enqErrs.Load()
	drainBy := time.Now().Add(10 * time.Second)
	for unique.Load() < committed && time.Now().Before(drainBy) && ctx.Err() == nil {
		sleepCtx(ctx, 10*time.Millisecond)
	}
	stop.Store(true)
	cwg.Wait()
	if ctx.Err() != nil {
		return Scenario{}, ctx.Err()
	}

	cs := merge(window{from: start.Add(r.p.mixedWarmup), to: start.Add(total)}, consumers)
	var all []delivery
	for _, d := range deliveries {
		all = append(all, d...)
	}
	first := firstDeliveries(all, n)
	var e2e, enq []time.Duration
	inWindow := 0
	for i := range n {
		t := intended(i)
		if t < warmEnd || t >= measureEnd {
			continue
		}
		if ackAt[i] > 0 {
			enq = append(enq, time.Duration(ackAt[i]-t))
		}
		if d, ok := first[i]; ok {
			e2e = append(e2e, time.Duration(d.recv-t))
		}
	}
	for _, d := range first {
		if d.recv >= warmEnd && d.recv < measureEnd {
			inWindow++
		}
	}
	slices.Sort(e2e)
	slices.Sort(enq)
	inv := countInversions(prios, ackAt, all, int64(inversionReady))
	undelivered := committed - int64(len(first))
	dups := int64(len(all)) - int64(len(first))
	if len(e2e) == 0 {
		return Scenario{}, fmt.Errorf("no item went end to end (enqueue errors: %d, first: %v; consumers: %s)",
			enqErrs.Load(), firstEnqErr.Load(), cs.errNote())
	}
	deqP99, enqP99 := cs.pct("dequeue", 99), percentile(enq, 99)
	notes := fmt.Sprintf("offered %s items/s open loop, half the sustainable %s/s (%s), as single-item COMMITTED Enqueue RPCs from up to %d senders; "+
		"%d consumers x Dequeue(count %d) (a long poll of 250 ms when nothing is ready) + Ack; "+
		"enqueue p99 %.2f ms; dequeue p99 %.2f ms (non-waiting calls; %.2f ms for those that returned items; %d of %d calls found nothing and fell back to a long poll); "+
		"priority inversions: %d of %d deliveries (an item delivered after a more urgent one had been committed >= %s); "+
		"end to end p50/p99/p99.9 %.2f/%.2f/%.2f ms",
		human(rate), human(sustainable), basis, r.p.mixedSenders, r.p.mixedConsumers, r.p.mixedCount,
		enqP99, deqP99, cs.pct("dequeue_items", 99), longPolls.Load(), polls.Load(), inv.count, len(first), inversionReady,
		percentile(e2e, 50), percentile(e2e, 99), percentile(e2e, 99.9))
	if inv.count > 0 {
		notes += fmt.Sprintf(" (worst: a priority-%d item delivered while a priority-%d item had waited %.1f ms)",
			inv.worstPrio, inv.worstUrgent, ms(time.Duration(inv.worstWait)))
	}
	if e := enqErrs.Load(); e > 0 {
		notes += fmt.Sprintf("; %d enqueues failed (first: %v)", e, firstEnqErr.Load())
	}
	if undelivered > 0 {
		notes += fmt.Sprintf("; %d committed items not delivered within 10 s of the last send", undelivered)
	}
	if dups > 0 {
		notes += fmt.Sprintf("; %d redeliveries", dups)
	}
	notes += errSuffix(cs)
	return Scenario{
		ItemsPerSec: float64(inWindow) / r.p.mixedMeasure.Seconds(),
		P50MS:       percentile(e2e, 50), P99MS: percentile(e2e, 99), P999MS: percentile(e2e, 99.9),
		Latency: "end to end: intended send time to the Dequeue answer that delivered the item",
		Notes:   notes,
		Metrics: map[string]float64{
			"e2e_p50_ms": percentile(e2e, 50), "e2e_p99_ms": percentile(e2e, 99),
			"offered_items_per_sec": rate, "sustainable_items_per_sec": sustainable, "enqueue_p50_ms": percentile(enq, 50), "enqueue_p99_ms": enqP99, "enqueue_p999_ms": percentile(enq, 99.9),
			"dequeue_p50_ms": cs.pct("dequeue", 50), "dequeue_p99_ms": deqP99, "dequeue_p999_ms": cs.pct("dequeue", 99.9),
			"dequeue_with_items_p99_ms": cs.pct("dequeue_items", 99),
			"ack_p99_ms":                cs.pct("ack", 99), "priority_inversions": float64(inv.count), "deliveries": float64(len(first)),
			"undelivered": float64(max(undelivered, 0)), "enqueue_errors": float64(enqErrs.Load()),
		},
	}, nil
}

// firstDeliveries keeps each item's first delivery.
func firstDeliveries(all []delivery, n int) map[int]delivery {
	first := make(map[int]delivery, n)
	for _, d := range all {
		if f, ok := first[d.seq]; !ok || d.recv < f.recv {
			first[d.seq] = d
		}
	}
	return first
}

type inversions struct {
	count                  int
	worstWait              int64
	worstPrio, worstUrgent int32
}

// countInversions counts deliveries of an item while a more urgent one had
// been ready for at least minReady and was still waiting. An item counts
// as ready from its enqueue answer (ackAt; it was committed before that)
// and as still waiting until the Dequeue that delivered it was sent, and
// only if that was after the answer carrying the less urgent item: both
// bounds err towards not counting, so every inversion counted is real.
// Times are nanoseconds on one clock; ackAt <= 0 means never committed.
func countInversions(prios []int32, ackAt []int64, all []delivery, minReady int64) inversions {
	firstSent := make([]int64, len(prios))
	for i := range firstSent {
		firstSent[i] = math.MaxInt64 // never delivered: waiting to the end
	}
	for _, d := range all {
		firstSent[d.seq] = min(firstSent[d.seq], d.sent)
	}
	// Per priority: committed items by ready time, with the running maximum
	// of when they left the queue.
	type level struct {
		ready, leftMax []int64
	}
	levels := map[int32]*level{}
	var order []int32
	idx := make([]int, 0, len(prios))
	for i := range prios {
		if ackAt[i] > 0 {
			idx = append(idx, i)
		}
	}
	sort.Slice(idx, func(a, b int) bool { return ackAt[idx[a]] < ackAt[idx[b]] })
	for _, i := range idx {
		l := levels[prios[i]]
		if l == nil {
			l = &level{}
			levels[prios[i]] = l
			order = append(order, prios[i])
		}
		m := firstSent[i]
		if k := len(l.leftMax); k > 0 {
			m = max(m, l.leftMax[k-1])
		}
		l.ready = append(l.ready, ackAt[i])
		l.leftMax = append(l.leftMax, m)
	}
	slices.SortFunc(order, cmp.Compare)
	var out inversions
	firstOnly := map[int]bool{}
	for _, d := range all {
		if firstOnly[d.seq] || d.sent != firstSent[d.seq] {
			continue // count an item once, at its first delivery
		}
		firstOnly[d.seq] = true
		for _, p := range order {
			if p >= d.prio {
				break
			}
			l := levels[p]
			// Items of priority p ready at least minReady before d's request.
			k := sort.Search(len(l.ready), func(j int) bool { return l.ready[j] > d.sent-minReady })
			if k > 0 && l.leftMax[k-1] > d.recv {
				out.count++
				// leftMax rises exactly at the earliest-ready item still
				// waiting: the one that had waited longest.
				j := sort.Search(k, func(j int) bool { return l.leftMax[j] > d.recv })
				if w := d.sent - l.ready[j]; w > out.worstWait {
					out.worstWait, out.worstPrio, out.worstUrgent = w, d.prio, p
				}
				break
			}
		}
	}
	return out
}
