package enqueuer

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
)

// seqMsg is a buffered batch that only knows its place in the test.
type seqMsg struct {
	jetstream.Msg
	n int
}

func seqs(batch []jetstream.Msg) []int {
	out := make([]int, len(batch))
	for i, m := range batch {
		out[i] = m.(seqMsg).n
	}
	return out
}

// TestGatherSharesACommitInFlight: with no transaction in flight a batch
// goes at once, alone; batches that arrive while one is in flight wait
// for it and go together in the next (on the mixed benchmark every batch
// used to find a free goroutine and cost a commit of its own); minGather
// waiting batches go without waiting; and a stop hands back what was taken.
func TestGatherSharesACommitInFlight(t *testing.T) {
	defer func(d time.Duration) { gatherLinger = d }(gatherLinger)
	gatherLinger = time.Hour // only a finishing transaction starts the next
	ctx := context.Background()
	g := newGate()
	msgs := make(chan jetstream.Msg, 1000)

	msgs <- seqMsg{n: 1}
	first, ok := g.gather(ctx, msgs, nil, 512)
	require.True(t, ok)
	require.Equal(t, []int{1}, seqs(first), "nothing in flight: the first batch goes alone, at once")

	type result struct {
		batch []jetstream.Msg
		ok    bool
	}
	next := make(chan result, 1)
	go func() {
		b, ok := g.gather(ctx, msgs, nil, 512)
		next <- result{b, ok}
	}()
	for n := 2; n <= 4; n++ {
		msgs <- seqMsg{n: n}
		time.Sleep(5 * time.Millisecond)
	}
	select {
	case r := <-next:
		t.Fatalf("a gather went while a transaction was in flight, with %v", seqs(r.batch))
	case <-time.After(50 * time.Millisecond):
	}
	g.done() // the first transaction ends
	r := <-next
	require.True(t, r.ok)
	require.Equal(t, []int{2, 3, 4}, seqs(r.batch), "the batches that came during the first commit share the next")

	// Two in flight now (the first ended, the second is counted): enough
	// waiting batches go without waiting for either.
	for n := 5; n < 5+minGather; n++ {
		msgs <- seqMsg{n: n}
	}
	b, ok := g.gather(ctx, msgs, nil, 512)
	require.True(t, ok)
	require.Len(t, b, minGather)

	// Stopped while waiting for company: what it took comes back to hand back.
	cctx, cancel := context.WithCancel(ctx)
	msgs <- seqMsg{n: 100}
	go func() { time.Sleep(20 * time.Millisecond); cancel() }()
	b, ok = g.gather(cctx, msgs, nil, 512)
	require.False(t, ok)
	require.Equal(t, []int{100}, seqs(b))
}

// TestGatherLingersNoLongerThanGatherLinger: where a commit is long (a
// semi-sync acknowledgement across the WAN), a batch waits for company
// gatherLinger at most, not for the commit in flight.
func TestGatherLingersNoLongerThanGatherLinger(t *testing.T) {
	defer func(d time.Duration) { gatherLinger = d }(gatherLinger)
	gatherLinger = 30 * time.Millisecond
	g := newGate()
	msgs := make(chan jetstream.Msg, 10)
	msgs <- seqMsg{n: 1}
	_, ok := g.gather(context.Background(), msgs, nil, 512) // in flight, never done
	require.True(t, ok)
	msgs <- seqMsg{n: 2}
	start := time.Now()
	b, ok := g.gather(context.Background(), msgs, nil, 512)
	took := time.Since(start)
	require.True(t, ok)
	require.Equal(t, []int{2}, seqs(b))
	require.GreaterOrEqual(t, took, gatherLinger, "went before the linger with a transaction in flight")
	require.Less(t, took, time.Second, "waited for the transaction in flight, not the linger")
}
