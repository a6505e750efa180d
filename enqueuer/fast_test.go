package enqueuer

import (
	"context"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/triage-queue/triage/cmd/triage/natsserver/natstest"
	"github.com/triage-queue/triage/proto/triage/peer"
	peerv1 "github.com/triage-queue/triage/proto/triage/peer/v1"
)

func setupFast(t *testing.T) *bundle {
	t.Helper()
	nc, js := natstest.JetStream(t)
	return setupOn(t, nc, js, StreamConfig{}, io.Discard, func(c *Config) { c.FastCopies = true })
}

// sendFast sends the fast copy of an envelope, as a router does once the
// stream acknowledged it.
func (b *bundle) sendFast(t *testing.T, batches ...*peerv1.EnqueueBatch) {
	t.Helper()
	data, err := proto.Marshal(&peerv1.EnqueueEnvelope{Batches: batches})
	require.NoError(t, err)
	require.NoError(t, b.nc.Publish(peer.EnqueueNowSubject("r", 1), data))
	require.NoError(t, b.nc.Flush())
}

// settled reports whether the shard's consumer has nothing pending or
// unacknowledged.
func (b *bundle) settled() bool {
	info, err := consumerInfo(context.Background(), b.js, peer.EnqueueStream("r"), "enq-1")
	return err == nil && info.NumPending == 0 && info.NumAckPending == 0
}

// TestFastCopyIsInsertedAndItsStreamCopyAcked: a fast copy is inserted
// on its own and answers its router with the stored version; the stream's
// copy of the same envelope is then acked without a second insert or
// answer. A fast copy that comes after its stream copy was inserted is
// answered from enqueue_batches and stores nothing twice.
func TestFastCopyIsInsertedAndItsStreamCopyAcked(t *testing.T) {
	t.Parallel()
	b := setupFast(t)
	replies := b.replies(t, "reply.fast")

	first := batch(100, "t", "reply.fast", 100, 101)
	// The worker subscribes as it starts: send until it has the copy.
	require.Eventually(t, func() bool {
		b.sendFast(t, first)
		return b.count(t) == 2
	}, 10*time.Second, 50*time.Millisecond)
	c := reply(t, replies)
	require.NotZero(t, c.VersionUs, "inserted by this copy")
	require.Equal(t, 1, b.rowsIn(t, "enqueue_batches"))

	b.publish(t, first)
	require.Eventually(t, func() bool { return b.settled() }, 10*time.Second, 20*time.Millisecond, "the stream's copy is acked")
	select {
	case m := <-replies:
		t.Fatalf("the stream's copy was answered again: %s", m.Data)
	case <-time.After(300 * time.Millisecond):
	}
	require.Equal(t, 2, b.count(t))

	late := batch(200, "t", "reply.fast", 200)
	b.publish(t, late)
	require.Eventually(t, func() bool { return b.count(t) == 3 && b.settled() }, 10*time.Second, 20*time.Millisecond)
	require.NotZero(t, reply(t, replies).VersionUs)
	b.sendFast(t, late)
	require.Zero(t, reply(t, replies).VersionUs, "a late fast copy is answered as applied")
	require.Equal(t, 3, b.count(t))
	require.Equal(t, 2, b.rowsIn(t, "enqueue_batches"))
}

// TestFastAndStreamCopiesRaceToOneInsert: both copies of many envelopes,
// sent at once as a router does, leave every item stored once and every
// stream message acked, whichever copy each worker loop took first.
func TestFastAndStreamCopiesRaceToOneInsert(t *testing.T) {
	t.Parallel()
	b := setupFast(t)
	// Wait for the subscription (a fast copy alone is inserted).
	require.Eventually(t, func() bool {
		b.sendFast(t, batch(1, "t", "", 1))
		return b.count(t) == 1
	}, 10*time.Second, 50*time.Millisecond)
	b.publish(t, batch(1, "t", "", 1))

	const n = 200
	var wg sync.WaitGroup
	for i := range uint64(n) {
		id := 1000 + i
		bt := batch(id, "t", "", id)
		wg.Go(func() { b.publish(t, bt) })
		wg.Go(func() { b.sendFast(t, bt) })
	}
	wg.Wait()
	require.Eventually(t, func() bool { return b.count(t) == n+1 && b.settled() }, 20*time.Second, 50*time.Millisecond,
		"every item once, every stream copy acked")
	require.Equal(t, n+1, b.rowsIn(t, "enqueue_batches"))
}

// TestFastStateTellsEachCopyWhatToDo: the bookkeeping alone. A fast copy
// claims its batches unless they are in flight or inserted by a fast copy;
// the stream's copy is acked when a fast copy inserted them (and
// forgotten), waits while one inserts them, and is inserted otherwise.
func TestFastStateTellsEachCopyWhatToDo(t *testing.T) {
	t.Parallel()
	f := &fastState{inflight: map[uint64]bool{}, done: map[uint64]time.Time{}}
	now := time.Now()
	require.True(t, f.claim([]uint64{1, 2}))
	require.False(t, f.claim([]uint64{2}), "in flight")
	require.Equal(t, copyInFlight, f.seen([]uint64{1, 2}))
	f.settle([]uint64{1, 2}, true, now)
	require.False(t, f.claim([]uint64{1}), "inserted: a second fast copy is dropped")
	require.Equal(t, copyInserted, f.seen([]uint64{1, 2}))
	require.Empty(t, f.done, "the stream's copy is the last one")

	require.Equal(t, copyNew, f.seen([]uint64{3}))
	require.False(t, f.claim([]uint64{3}), "the stream's copy has it in flight")
	f.settle([]uint64{3}, false, now)
	require.True(t, f.claim([]uint64{3}))
	f.settle([]uint64{3}, false, now) // failed: the stream's copy inserts it
	require.Equal(t, copyNew, f.seen([]uint64{3}))

	require.True(t, f.claim([]uint64{4}))
	f.settle([]uint64{4}, true, now)
	f.settle(nil, false, now.Add(fastDoneFor))
	require.Empty(t, f.done, "a fast copy whose stream copy went elsewhere is forgotten")
}
