package routing

import (
	"context"
	"fmt"
	"math"
	"runtime/metrics"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
	"github.com/triage-queue/triage/shardmap"
)

// TestGateAdmitsInArrivalOrder: past its limit the gate holds callers
// and admits them oldest first as slots come back; a caller whose
// context ends while it waits leaves without taking a slot; lifting the
// limit admits every waiter.
func TestGateAdmitsInArrivalOrder(t *testing.T) {
	t.Parallel()
	var g gate
	g.setLimit(2)
	ctx := context.Background()
	take := func() bool {
		held, err := g.acquire(ctx)
		require.NoError(t, err)
		return held
	}
	require.True(t, take())
	require.True(t, take())

	admitted := make(chan int, 4)
	wait := func(i int, ctx context.Context) {
		go func() {
			if held, err := g.acquire(ctx); err == nil && held {
				admitted <- i
			}
		}()
		require.Eventually(t, func() bool {
			g.mu.Lock()
			defer g.mu.Unlock()
			return len(g.waiters) == i
		}, 5*time.Second, time.Millisecond, "waiter %d queued", i)
	}
	wait(1, ctx)
	cctx, cancel := context.WithCancel(ctx)
	wait(2, cctx)
	wait(3, ctx)
	select {
	case i := <-admitted:
		t.Fatalf("waiter %d admitted past the limit", i)
	case <-time.After(50 * time.Millisecond):
	}

	cancel() // waiter 2 gives up
	require.Eventually(t, func() bool {
		g.mu.Lock()
		defer g.mu.Unlock()
		return len(g.waiters) == 2
	}, 5*time.Second, time.Millisecond)
	g.release()
	require.Equal(t, 1, <-admitted, "the oldest waiter first")
	g.release()
	require.Equal(t, 3, <-admitted, "the one that gave up took no slot")
	g.mu.Lock()
	require.Equal(t, 2, g.inflight)
	g.mu.Unlock()

	// Lifting the limit admits at once, and everyone after.
	wait(1, ctx)
	g.setLimit(0)
	require.Equal(t, 1, <-admitted)
	require.False(t, take(), "an open gate counts nobody")
}

// TestAdmissionClosesOnlyWhenSaturatedAndDraining: the gate closes to
// the cap only in a tick that saw both consumers' calls and a mean
// scheduling latency over saturatedAfter. Closed, the lower latency it
// brings keeps it closed; it opens after two ticks in a row without
// consumers, without an enqueue that waited, or with the process idle.
func TestAdmissionClosesOnlyWhenSaturatedAndDraining(t *testing.T) {
	t.Parallel()
	sched := time.Duration(0)
	a := &admission{cap: 64, schedMean: func() time.Duration { return sched }}
	limit := func() int {
		a.gate.mu.Lock()
		defer a.gate.mu.Unlock()
		return a.gate.limit
	}
	const gated = 300 * time.Microsecond // held closed, still busy
	steps := []struct {
		name          string
		drain, waited bool
		sched         time.Duration
		want          int
	}{
		{"idle", false, false, 0, 0},
		{"saturated, no consumers (a bulk load)", false, false, 5 * time.Millisecond, 0},
		{"consumers, not saturated", true, false, 100 * time.Microsecond, 0},
		{"consumers on a saturated process: closes", true, false, 3 * time.Millisecond, 64},
		{"held closed, busy", true, true, gated, 64},
		{"no enqueue waited: 1", true, false, gated, 64},
		{"an enqueue waited again", true, true, gated, 64},
		{"no enqueue waited: 1 again", true, false, gated, 64},
		{"no enqueue waited: 2, opens", true, false, gated, 0},
		{"closes again", true, true, 2 * time.Millisecond, 64},
		{"idle process: 1", true, true, 50 * time.Microsecond, 64},
		{"idle process: 2, opens", true, true, 50 * time.Microsecond, 0},
		{"closes again", true, true, 2 * time.Millisecond, 64},
		{"no consumer: 1", false, true, gated, 64},
		{"no consumer: 2, opens", false, true, 2 * time.Millisecond, 0},
	}
	for _, s := range steps {
		if s.drain {
			a.draining()
		}
		if s.waited {
			a.gate.waited.Add(1)
		}
		sched = s.sched
		a.tick()
		require.Equal(t, s.want, limit(), s.name)
	}
}

// fakeHistogram is a scheduling-latency histogram a test fills by hand,
// cumulative as the runtime's is, with the runtime's kind of buckets:
// open below and above.
type fakeHistogram struct{ h metrics.Float64Histogram }

func newFakeHistogram() *fakeHistogram {
	us := func(n float64) float64 { return n / 1e6 }
	buckets := []float64{math.Inf(-1), 0, us(1), us(10), us(100), us(1000), us(10000), math.Inf(1)}
	return &fakeHistogram{h: metrics.Float64Histogram{Buckets: buckets, Counts: make([]uint64, len(buckets)-1)}}
}

// add records n samples in the bucket that starts at from.
func (f *fakeHistogram) add(from time.Duration, n uint64) {
	for i, lo := range f.h.Buckets[:len(f.h.Counts)] {
		if lo == from.Seconds() {
			f.h.Counts[i] += n
			return
		}
	}
	panic(fmt.Sprintf("no bucket starts at %v", from))
}

func (f *fakeHistogram) read() *metrics.Float64Histogram {
	h := f.h
	h.Counts = slices.Clone(f.h.Counts)
	return &h
}

// TestSchedLatencySeesASaturatedProcess: the gate's reading of the
// scheduler is the mean of the latencies sampled since its last reading.
// Goroutines that wait for each other's time slices (up to the runtime's
// 10 ms before it preempts) read over saturatedAfter, and a process that
// schedules in microseconds reads under idleBelow, whatever was sampled
// before; and a saturated reading with consumers served closes the gate.
// The histogram is filled by hand: what the runtime samples on a loaded
// machine is no test's to assert.
func TestSchedLatencySeesASaturatedProcess(t *testing.T) {
	t.Parallel()
	f := newFakeHistogram()
	f.add(time.Microsecond, 1000) // samples before the baseline
	s := &schedLatency{read: f.read}
	require.Zero(t, s.mean(), "the first reading is the baseline")
	require.Zero(t, s.mean(), "nothing sampled since")

	f.add(time.Millisecond, 90) // 1-10 ms: waiting behind time slices
	f.add(10*time.Microsecond, 10)
	got := s.mean()
	require.Greater(t, got, saturatedAfter)
	require.InDelta(t, float64(90*5500+10*55)*float64(time.Microsecond)/100, float64(got), float64(time.Microsecond),
		"each sample at its bucket's midpoint")

	f.add(time.Microsecond, 200) // 1-10 µs: an idle process
	require.Less(t, s.mean(), idleBelow, "only what was sampled since the last reading counts")

	f.add(10*time.Millisecond, 1) // open above: counts at its lower bound
	require.Equal(t, 10*time.Millisecond, s.mean())
	f.h.Counts[0]++ // open below: counts from 0 to its upper bound, 0
	require.Zero(t, s.mean())

	// The reading drives the gate: saturated while consumers are served
	// closes it.
	a := &admission{cap: 8, schedMean: s.mean}
	f.add(time.Millisecond, 50)
	a.draining()
	a.tick()
	a.gate.mu.Lock()
	require.Equal(t, 8, a.gate.limit)
	a.gate.mu.Unlock()
}

// TestSchedLatencyReadsTheRuntimeHistogram: the gate's signal is the Go
// runtime's own scheduling-latency histogram, which exists under the name
// it reads; without it the gate would never close.
func TestSchedLatencyReadsTheRuntimeHistogram(t *testing.T) {
	t.Parallel()
	s := newSchedLatency()
	h := s.read()
	require.NotNil(t, h, "/sched/latencies:seconds is a histogram")
	require.NotEmpty(t, h.Counts)
	require.Len(t, h.Buckets, len(h.Counts)+1)
	require.Zero(t, s.mean(), "the first reading is the baseline")
	require.GreaterOrEqual(t, s.mean(), time.Duration(0))
}

// TestEnqueueAtAClosedGate: while the gate holds every slot, bad input is
// refused at once (INVALID_ARGUMENT) rather than after its wait, and a
// valid call whose deadline passes while it waits answers
// DEADLINE_EXCEEDED saying nothing was done.
func TestEnqueueAtAClosedGate(t *testing.T) {
	t.Parallel()
	m, err := shardmap.New(shardmap.Map{Version: 1, Regions: []string{"r"},
		Shards:     []shardmap.Shard{{ID: 1, HomeRegion: "r", Primary: "127.0.0.1:1", Database: "d"}},
		Namespaces: []shardmap.Namespace{{Name: "ns"}}})
	require.NoError(t, err)
	r := &Router{cfg: Config{Region: "r", Maps: shardmap.NewHolder(m), Now: time.Now}, admit: &admission{cap: 1}}
	r.admit.gate.setLimit(1)
	held, err := r.admit.gate.acquire(context.Background()) // the one slot, held
	require.NoError(t, err)
	require.True(t, held)

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	_, err = r.Enqueue(ctx, &triagev1.EnqueueRequest{Namespace: "ns", Topic: "bad topic", Items: []*triagev1.NewItem{{}}})
	require.Equal(t, codes.InvalidArgument, status.Code(toStatus(err)), "%v", err)
	require.Less(t, time.Since(start), time.Second, "refused before waiting")

	ctx, cancel = context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err = r.Enqueue(ctx, &triagev1.EnqueueRequest{Namespace: "ns", Topic: "t", Items: []*triagev1.NewItem{{}}})
	require.Equal(t, codes.DeadlineExceeded, status.Code(toStatus(err)), "%v", err)
	require.ErrorContains(t, err, "enqueue not started")
	require.ErrorContains(t, err, "nothing was done")
	r.admit.gate.mu.Lock()
	defer r.admit.gate.mu.Unlock()
	require.Empty(t, r.admit.gate.waiters, "the caller that gave up left the queue")
}
