package routing

import (
	"context"
	"runtime"
	"sync"
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

// TestSchedLatencySeesASaturatedProcess: with four goroutines per core
// spinning, each waits for the others' time slices (10 ms before the
// runtime preempts), and the median the gate reads is over
// saturatedAfter.
func TestSchedLatencySeesASaturatedProcess(t *testing.T) {
	s := newSchedLatency()
	s.mean() // the baseline
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 * runtime.GOMAXPROCS(0) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
			}
		}()
	}
	time.Sleep(300 * time.Millisecond)
	got := s.mean()
	close(stop)
	wg.Wait()
	require.Greater(t, got, saturatedAfter)
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
	require.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
	require.Less(t, time.Since(start), time.Second, "refused before waiting")

	ctx, cancel = context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err = r.Enqueue(ctx, &triagev1.EnqueueRequest{Namespace: "ns", Topic: "t", Items: []*triagev1.NewItem{{}}})
	require.Equal(t, codes.DeadlineExceeded, status.Code(err), "%v", err)
	require.ErrorContains(t, err, "enqueue not started")
	require.ErrorContains(t, err, "nothing was done")
	r.admit.gate.mu.Lock()
	defer r.admit.gate.mu.Unlock()
	require.Empty(t, r.admit.gate.waiters, "the caller that gave up left the queue")
}
