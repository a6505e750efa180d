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
	"github.com/triage-queue/triage/schema"
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
	m, err := r.planMixed(sustainable, basis)
	if err != nil {
		return Scenario{}, err
	}
	fmt.Fprintf(r.out, "%s: sustainable %s items/s (%s); offering half, %s items/s, for %s\n", r.label(Mixed), human(sustainable), basis,
		human(m.rate), m.total)

	m.prog = r.progress(Mixed)
	defer m.prog.close()
	m.start = time.Now().Add(50 * time.Millisecond)
	// Consumers start first and long-poll.
	var cwg sync.WaitGroup
	for c := range m.consumers {
		m.consumers[c] = newSampler(m.window())
		cwg.Add(1)
		go func() {
			defer cwg.Done()
			m.consume(ctx, c)
		}()
	}
	m.produce(ctx)
	// Drain: every committed item should reach a consumer.
	drainBy := time.Now().Add(10 * time.Second)
	for m.unique.Load() < m.committed() && time.Now().Before(drainBy) && ctx.Err() == nil {
		schema.Sleep(ctx, 10*time.Millisecond)
	}
	m.stop.Store(true)
	cwg.Wait()
	if ctx.Err() != nil {
		return Scenario{}, ctx.Err()
	}
	return m.report()
}

// mixedRun is one run of the mixed scenario: its plan (n single-item
// enqueues at rate, their priorities, each one's intended send time),
// and what its producers and consumers record.
type mixedRun struct {
	r                 *runner
	n                 int
	rate, sustainable float64
	basis             string
	interval          float64 // ns between intended sends
	total             time.Duration
	prios             []int32
	start             time.Time
	prog              *progress

	// Producers: ackAt[i] is when item i's Enqueue answered, since
	// start; 0 = not answered, -1 = failed.
	ackAt       []int64
	enqErrs     atomic.Int64
	firstEnqErr atomic.Value

	// Consumers: consumers[c] samples consumer c's calls, deliveries[c]
	// holds what it was delivered.
	stop             atomic.Bool
	delivered        atomic.Int64
	seen             []atomic.Bool
	unique           atomic.Int64
	consumers        []*sampler
	deliveries       [][]delivery
	longPolls, polls atomic.Int64
	// trails follows each item from its intended send to the Dequeue
	// answer that delivered it (trail.go): its router leg includes the
	// wait for a free sender.
	trails *trails
}

// planMixed plans a run offering half the sustainable rate.
func (r *runner) planMixed(sustainable float64, basis string) (*mixedRun, error) {
	rate := sustainable / 2
	total := r.p.mixedWarmup + r.p.mixedMeasure
	n := int(rate * total.Seconds())
	if n < 1 {
		return nil, fmt.Errorf("offered rate %.1f items/s is too low to run", rate)
	}
	rnd := rand.New(rand.NewPCG(42, 7))
	prios := make([]int32, n)
	for i := range prios {
		prios[i] = int32(rnd.IntN(10))
	}
	return &mixedRun{r: r, n: n, rate: rate, sustainable: sustainable, basis: basis, interval: float64(time.Second) / rate, total: total,
		prios: prios, ackAt: make([]int64, n), seen: make([]atomic.Bool, n),
		consumers: make([]*sampler, r.p.mixedConsumers), deliveries: make([][]delivery, r.p.mixedConsumers), trails: newTrails()}, nil
}

// intended is item i's intended send time, since start.
func (m *mixedRun) intended(i int) int64 { return int64(float64(i) * m.interval) }

// window is the measured part of the run, after the warm-up.
func (m *mixedRun) window() window {
	return window{from: m.start.Add(m.r.p.mixedWarmup), to: m.start.Add(m.total)}
}

// committed is how many items were enqueued without an error.
func (m *mixedRun) committed() int64 { return int64(m.n) - m.enqErrs.Load() }

// consume is consumer c: Dequeue (a long poll when nothing is ready) and
// Ack, until the run stops.
func (m *mixedRun) consume(ctx context.Context, c int) {
	s := m.consumers[c]
	client := m.r.client(c)
	for !m.stop.Load() && ctx.Err() == nil {
		req := &triagev1.DequeueRequest{Namespace: namespace, Topics: []*triagev1.TopicCount{{Topic: mixedTopic, Count: int32(m.r.p.mixedCount)}}}
		cctx, cancel := context.WithTimeout(ctx, rpcTimeout)
		t0 := time.Now()
		resp, err := client.Dequeue(cctx, req)
		t1 := time.Now()
		m.polls.Add(1)
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
				m.longPolls.Add(1)
			}
		}
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				s.fail(fmt.Errorf("dequeue: %w", err))
				schema.Sleep(ctx, 10*time.Millisecond)
			}
			continue
		}
		m.record(c, resp.Items, t0, t1)
		if len(resp.Items) == 0 {
			continue
		}
		m.ack(ctx, client, s, resp.Items)
	}
}

// record notes the items consumer c was delivered by a Dequeue sent at
// t0 and answered at t1.
func (m *mixedRun) record(c int, items []*triagev1.LeasedItem, t0, t1 time.Time) {
	s := m.consumers[c]
	for _, it := range items {
		if len(it.Payload) < 8 {
			s.fail(fmt.Errorf("item %s: payload of %d bytes is not the bench's", it.Id, len(it.Payload)))
			continue
		}
		seq := int(binary.BigEndian.Uint64(it.Payload))
		if seq < 0 || seq >= m.n {
			s.fail(fmt.Errorf("item %s: sequence %d out of range", it.Id, seq))
			continue
		}
		m.deliveries[c] = append(m.deliveries[c], delivery{seq: seq, prio: it.Priority,
			sent: t0.Sub(m.start).Nanoseconds(), recv: t1.Sub(m.start).Nanoseconds()})
		m.trails.deliver(it, m.start.Add(time.Duration(m.intended(seq))), t1)
		if !m.seen[seq].Swap(true) {
			m.unique.Add(1)
		}
	}
	m.delivered.Add(int64(len(items)))
	m.prog.items.Add(int64(len(items)))
}

// ack acks delivered items, timing the call.
func (m *mixedRun) ack(ctx context.Context, client triagev1.QueueClient, s *sampler, items []*triagev1.LeasedItem) {
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rpcTimeout)
	ta := time.Now()
	ar, err := client.Ack(actx, &triagev1.AckRequest{Namespace: namespace, Acks: refs(items)})
	cancel()
	te := time.Now()
	if err != nil {
		s.fail(fmt.Errorf("ack: %w", err))
		return
	}
	s.observe("ack", te, te.Sub(ta))
	for _, res := range ar.Results {
		if !res.Ok {
			s.fail(fmt.Errorf("ack %s refused: %s", res.Id, res.Error))
			break
		}
	}
}

// produce enqueues the run's items open loop: a scheduler releases each
// at its intended time to a pool of senders. It returns when every item
// was sent.
func (m *mixedRun) produce(ctx context.Context) {
	jobs := make(chan int, m.n)
	var swg sync.WaitGroup
	for w := range m.r.p.mixedSenders {
		swg.Add(1)
		go func() {
			defer swg.Done()
			client := m.r.client(w)
			for i := range jobs {
				m.send(ctx, client, i)
			}
		}()
	}
	schema.Sleep(ctx, time.Until(m.start))
	for next := 0; next < m.n && ctx.Err() == nil; {
		due := min(m.n, int(float64(time.Since(m.start))/m.interval)+1)
		for ; next < due; next++ {
			jobs <- next
		}
		time.Sleep(200 * time.Microsecond)
	}
	close(jobs)
	swg.Wait()
}

// send enqueues item i, its sequence number and intended send time in
// its payload, and records when it was answered.
func (m *mixedRun) send(ctx context.Context, client triagev1.QueueClient, i int) {
	payload := make([]byte, payloadBytes)
	copy(payload, m.r.payload)
	binary.BigEndian.PutUint64(payload, uint64(i))
	binary.BigEndian.PutUint64(payload[8:], uint64(m.intended(i)))
	cctx, cancel := context.WithTimeout(ctx, rpcTimeout)
	resp, err := client.Enqueue(cctx, &triagev1.EnqueueRequest{Namespace: namespace, Topic: mixedTopic,
		Items: []*triagev1.NewItem{{Payload: payload, Priority: m.prios[i]}}, Durability: triagev1.Durability_COMMITTED})
	cancel()
	if err != nil {
		m.ackAt[i] = -1
		m.enqErrs.Add(1)
		m.firstEnqErr.CompareAndSwap(nil, err)
		return
	}
	now := time.Now()
	m.ackAt[i] = max(now.Sub(m.start).Nanoseconds(), 1)
	for _, r := range resp.Results {
		m.trails.answer([]string{r.Id}, now)
	}
}

// mixedResult is what a mixed run measured, over its window.
type mixedResult struct {
	cs          *sampler
	all         []delivery
	first       map[int]delivery
	e2e, enq    []time.Duration // sorted
	inWindow    int             // first deliveries received in the window
	inv         inversions
	undelivered int64
	dups        int64
}

// measure collects what the run's producers and consumers recorded for
// the items intended to be sent within the window.
func (m *mixedRun) measure() mixedResult {
	warmEnd, measureEnd := int64(m.r.p.mixedWarmup), int64(m.total)
	res := mixedResult{cs: merge(m.window(), m.consumers)}
	for _, d := range m.deliveries {
		res.all = append(res.all, d...)
	}
	res.first = firstDeliveries(res.all, m.n)
	for i := range m.n {
		t := m.intended(i)
		if t < warmEnd || t >= measureEnd {
			continue
		}
		if m.ackAt[i] > 0 {
			res.enq = append(res.enq, time.Duration(m.ackAt[i]-t))
		}
		if d, ok := res.first[i]; ok {
			res.e2e = append(res.e2e, time.Duration(d.recv-t))
		}
	}
	for _, d := range res.first {
		if d.recv >= warmEnd && d.recv < measureEnd {
			res.inWindow++
		}
	}
	slices.Sort(res.e2e)
	slices.Sort(res.enq)
	res.inv = countInversions(m.prios, m.ackAt, res.all, int64(inversionReady))
	res.undelivered = m.committed() - int64(len(res.first))
	res.dups = int64(len(res.all)) - int64(len(res.first))
	return res
}

// report is the run's Scenario.
func (m *mixedRun) report() (Scenario, error) {
	res := m.measure()
	cs, e2e, enq := res.cs, res.e2e, res.enq
	if len(e2e) == 0 {
		return Scenario{}, fmt.Errorf("no item went end to end (enqueue errors: %d, first: %v; consumers: %s)",
			m.enqErrs.Load(), m.firstEnqErr.Load(), cs.errNote())
	}
	deqP99, enqP99 := cs.pct("dequeue", 99), percentile(enq, 99)
	metrics := map[string]float64{
		"e2e_p50_ms": percentile(e2e, 50), "e2e_p99_ms": percentile(e2e, 99),
		"offered_items_per_sec": m.rate, "sustainable_items_per_sec": m.sustainable, "enqueue_p50_ms": percentile(enq, 50), "enqueue_p99_ms": enqP99, "enqueue_p999_ms": percentile(enq, 99.9),
		"dequeue_p50_ms": cs.pct("dequeue", 50), "dequeue_p99_ms": deqP99, "dequeue_p999_ms": cs.pct("dequeue", 99.9),
		"dequeue_with_items_p99_ms": cs.pct("dequeue_items", 99),
		"ack_p99_ms":                cs.pct("ack", 99), "priority_inversions": float64(res.inv.count), "deliveries": float64(len(res.first)),
		"undelivered": float64(max(res.undelivered, 0)), "enqueue_errors": float64(m.enqErrs.Load()),
	}
	notes := m.notes(res)
	if b, ok := m.trails.breakdown(m.window()); ok {
		b.metrics(metrics, "")
		notes += "; " + b.note() + " (router includes the wait for a free sender)"
	}
	return Scenario{
		ItemsPerSec: float64(res.inWindow) / m.r.p.mixedMeasure.Seconds(),
		P50MS:       percentile(e2e, 50), P99MS: percentile(e2e, 99), P999MS: percentile(e2e, 99.9),
		Latency: "end to end: intended send time to the Dequeue answer that delivered the item",
		Notes:   notes,
		Metrics: metrics,
	}, nil
}

// notes describes the run and what it measured, for the report.
func (m *mixedRun) notes(res mixedResult) string {
	p := m.r.p
	cs, e2e, inv := res.cs, res.e2e, res.inv
	notes := fmt.Sprintf("offered %s items/s open loop, half the sustainable %s/s (%s), as single-item COMMITTED Enqueue RPCs from up to %d senders; "+
		"%d consumers x Dequeue(count %d) (a long poll of 250 ms when nothing is ready) + Ack; "+
		"enqueue p99 %.2f ms; dequeue p99 %.2f ms (non-waiting calls; %.2f ms for those that returned items; %d of %d calls found nothing and fell back to a long poll); "+
		"priority inversions: %d of %d deliveries (an item delivered after a more urgent one had been committed >= %s); "+
		"end to end p50/p99/p99.9 %.2f/%.2f/%.2f ms",
		human(m.rate), human(m.sustainable), m.basis, p.mixedSenders, p.mixedConsumers, p.mixedCount,
		percentile(res.enq, 99), cs.pct("dequeue", 99), cs.pct("dequeue_items", 99), m.longPolls.Load(), m.polls.Load(), inv.count, len(res.first), inversionReady,
		percentile(e2e, 50), percentile(e2e, 99), percentile(e2e, 99.9))
	if inv.count > 0 {
		notes += fmt.Sprintf(" (worst: a priority-%d item delivered while a priority-%d item had waited %.1f ms)",
			inv.worstPrio, inv.worstUrgent, ms(time.Duration(inv.worstWait)))
	}
	if e := m.enqErrs.Load(); e > 0 {
		notes += fmt.Sprintf("; %d enqueues failed (first: %v)", e, m.firstEnqErr.Load())
	}
	if res.undelivered > 0 {
		notes += fmt.Sprintf("; %d committed items not delivered within 10 s of the last send", res.undelivered)
	}
	if res.dups > 0 {
		notes += fmt.Sprintf("; %d redeliveries", res.dups)
	}
	return notes + errSuffix(cs)
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
