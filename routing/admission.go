package routing

import (
	"context"
	"math"
	"runtime"
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"time"
)

// Enqueue admission. On a node whose CPU is saturated every request
// mostly waits for a core: each time a goroutine is woken (a reply from
// MariaDB or NATS, a batch it joined committing, the next gRPC frame) it
// queues behind every other runnable goroutine, and a consumer's Dequeue
// and Ack each pass through several such wake-ups (see deploy/bench's
// --trace). Many single-item producers can fill that queue so that items
// go in faster than the consumers' calls get a core to take them out, and
// the backlog grows without bound.
//
// So while the process is saturated and consumers are being served, at
// most EnqueueConcurrency Enqueue calls run at once on this router; the
// others wait, oldest first, before anything is done for them (a call
// whose context ends while it waits changes nothing and answers
// DEADLINE_EXCEEDED). Waiting callers are blocked, not runnable, so they
// take no place in the queue for a core. Neither condition alone closes
// the gate:
//
//   - Saturation is the Go scheduler's own figure: the mean time a
//     goroutine waited to run over the last admissionTick (runtime/metrics
//     /sched/latencies:seconds) above saturatedAfter. Enqueues that are
//     slow for the WAN or a busy database are not held back: that wait is
//     not the scheduler's.
//   - Consumers being served: a Dequeue, Ack, Nack or ExtendLease reached
//     this router in the tick. Without them (a bulk load) enqueues run
//     unbounded: a cap costs a closed-loop load fewer rows per group
//     commit, and so throughput, while nobody is waiting to dequeue.
//
// How it opens again is in admission.tick. The limit is fixed rather than
// adaptive: a limit that shrinks while consumers' acks are slow holds
// enqueues back into smaller commit groups, each costing more, without
// raising delivery. deploy/bench/README.md reports the gate's effect
// (triage-steady at many producers).

// admissionTick is how often the gate looks at the scheduler and at the
// consumers.
const admissionTick = 250 * time.Millisecond

// saturatedAfter is the mean scheduling latency above which the process
// counts as saturated: an idle process schedules in microseconds, and one
// whose runnable goroutines wait for each other's time slices in
// milliseconds.
const saturatedAfter = time.Millisecond

// idleBelow is the mean scheduling latency under which a closed gate
// opens: the process is not short of CPU. It sits below what a saturated
// process reads while the gate holds it closed (a few hundred µs), so a
// gate that brings the latency down does not open itself.
const idleBelow = 150 * time.Microsecond

// DefaultEnqueueConcurrency is the cap for the process's GOMAXPROCS: 32
// per core.
func DefaultEnqueueConcurrency() int { return 32 * runtime.GOMAXPROCS(0) }

// gate is a counting semaphore whose limit can change, and whose waiters
// are admitted in arrival order. A limit of 0 admits everyone and counts
// nobody: an open gate costs an Enqueue one atomic load, not a lock that
// every concurrent enqueue would share. So the calls that started while
// it was open are not counted once it closes; they finish within one
// enqueue's time.
type gate struct {
	limited atomic.Bool // limit > 0, read without the lock

	mu       sync.Mutex
	limit    int
	inflight int // callers holding a slot
	waiters  []chan struct{}
	waited   atomic.Int64 // callers that had to wait, ever
}

// acquire waits for a slot or for ctx to end (its error). held says
// whether the caller took a slot, which it must release.
func (g *gate) acquire(ctx context.Context) (held bool, err error) {
	if !g.limited.Load() {
		return false, nil
	}
	g.mu.Lock()
	if g.limit == 0 { // opened meanwhile
		g.mu.Unlock()
		return false, nil
	}
	if len(g.waiters) == 0 && g.inflight < g.limit {
		g.inflight++
		g.mu.Unlock()
		return true, nil
	}
	ch := make(chan struct{})
	g.waiters = append(g.waiters, ch)
	g.mu.Unlock()
	g.waited.Add(1)
	select {
	case <-ch:
		return true, nil
	case <-ctx.Done():
		g.mu.Lock()
		for i, w := range g.waiters {
			if w == ch {
				g.waiters = append(g.waiters[:i], g.waiters[i+1:]...)
				g.mu.Unlock()
				return false, ctx.Err()
			}
		}
		g.mu.Unlock()
		// Admitted while ctx ended: hand the slot on.
		g.release()
		return false, ctx.Err()
	}
}

// holding reports whether the gate has a limit now.
func (g *gate) holding() bool { return g.limited.Load() }

// release gives a held slot back: to the oldest waiter when the limit
// allows.
func (g *gate) release() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.inflight--
	g.admit()
}

// setLimit changes the limit (0: none) and admits the waiters it allows.
func (g *gate) setLimit(n int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.limit = n
	g.limited.Store(n > 0)
	g.admit()
}

// admit hands slots to waiters, oldest first, while the limit allows.
func (g *gate) admit() {
	for len(g.waiters) > 0 && (g.limit == 0 || g.inflight < g.limit) {
		g.inflight++
		close(g.waiters[0])
		g.waiters = g.waiters[1:]
	}
}

// admission decides the gate's limit each admissionTick.
type admission struct {
	gate  gate
	cap   int
	drain atomic.Int64 // consumer calls seen; compared tick to tick
	// schedMean returns the mean scheduling latency since its last call
	// (a field for tests).
	schedMean func() time.Duration

	closed              bool
	lastDrain, lastWait int64
	calm                int // ticks in a row that would open a closed gate
}

// draining notes a consumer call (Dequeue, Ack, Nack, Extend).
func (a *admission) draining() { a.drain.Add(1) }

// tick looks at the last admissionTick and sets the gate. It closes
// (to cap) in a tick that saw consumers' calls and a mean scheduling
// latency over saturatedAfter. Closed, the gate itself brings the
// latency down, so that cannot open it again, or it would open and close
// by turns and let the backlog grow again. It
// opens after two ticks in a row in each of which no consumer called,
// or no enqueue had to wait (the demand fits under the cap), or the
// process idled (mean latency under idleBelow: the CPU is not what the
// enqueues wait for).
func (a *admission) tick() {
	d, w := a.drain.Load(), a.gate.waited.Load()
	mean := a.schedMean()
	draining, waited := d != a.lastDrain, w != a.lastWait
	a.lastDrain, a.lastWait = d, w
	switch {
	case !a.closed:
		if draining && mean > saturatedAfter {
			a.closed, a.calm = true, 0
			a.gate.setLimit(a.cap)
		}
	case !draining || !waited || mean < idleBelow:
		if a.calm++; a.calm >= 2 {
			a.closed = false
			a.gate.setLimit(0)
		}
	default:
		a.calm = 0
	}
}

// run ticks until stop is closed.
func (a *admission) run(stop <-chan struct{}) {
	t := time.NewTicker(admissionTick)
	defer t.Stop()
	for {
		select {
		case <-stop:
			a.gate.setLimit(0)
			return
		case <-t.C:
			a.tick()
		}
	}
}

// schedLatency reads a scheduling-latency histogram and returns the mean
// of what it gained since the previous call.
type schedLatency struct {
	// read returns the histogram as it stands, cumulative since the
	// process started, or nil when there is none. newSchedLatency reads
	// the Go runtime's; tests give their own.
	read func() *metrics.Float64Histogram
	prev []uint64
}

// newSchedLatency reads the Go scheduler's own histogram
// (runtime/metrics /sched/latencies:seconds).
func newSchedLatency() *schedLatency {
	sample := []metrics.Sample{{Name: "/sched/latencies:seconds"}}
	return &schedLatency{read: func() *metrics.Float64Histogram {
		metrics.Read(sample)
		if sample[0].Value.Kind() != metrics.KindFloat64Histogram {
			return nil
		}
		return sample[0].Value.Float64Histogram()
	}}
}

// mean is the mean latency of the samples the histogram gained since the
// previous call; 0 on the first call (the baseline) and when it gained
// none. A bucket's samples count at its midpoint; the first bucket starts
// at 0 when it is open below, and the last, open above, counts at its
// lower bound.
func (s *schedLatency) mean() time.Duration {
	h := s.read()
	if h == nil {
		return 0
	}
	if len(s.prev) != len(h.Counts) {
		s.prev = make([]uint64, len(h.Counts))
		copy(s.prev, h.Counts)
		return 0
	}
	var total uint64
	var sum float64
	for i, now := range h.Counts {
		c := now - s.prev[i]
		if c == 0 {
			continue
		}
		total += c
		// Bucket i runs from Buckets[i] to Buckets[i+1]; either end may
		// be infinite.
		lo, hi := h.Buckets[i], h.Buckets[i+1]
		switch {
		case math.IsInf(lo, -1):
			lo = 0
		case math.IsInf(hi, 1):
			hi = lo
		}
		sum += float64(c) * (lo + hi) / 2
	}
	copy(s.prev, h.Counts)
	if total == 0 {
		return 0
	}
	return time.Duration(sum / float64(total) * float64(time.Second))
}
