package dequeuer

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"

	"github.com/triage-queue/triage/cmd/triage/natsserver/natstest"
	"github.com/triage-queue/triage/deploy/mariadb/mariadbtest"
	"github.com/triage-queue/triage/proto/triage/peer"
	peerv1 "github.com/triage-queue/triage/proto/triage/peer/v1"
	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
	"github.com/triage-queue/triage/schema/itemid"
	"github.com/triage-queue/triage/schema/store"
	"github.com/triage-queue/triage/shardmap"
)

// noticeBed is a dequeuer owning shard 1 of a real database, whose local
// clock stands still: every step of a test happens within recheckEvery
// of the last read, as a dequeue sent right after an enqueue does, so
// only a read or a notice can bring a new row into a buffer.
type noticeBed struct {
	t    *testing.T
	ctx  context.Context
	s    *Service
	st   store.Store
	base time.Time // deliver_after of the rows: base + their key in ms
}

// newNoticeBed starts the bed's dequeuer with beforeBuffer as its
// Config.BeforeBuffer.
func newNoticeBed(t *testing.T, beforeBuffer func(shard uint32, keys []uint64)) *noticeBed {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	nc, js := natstest.JetStream(t)
	dsn, err := mysql.ParseDSN(mariadbtest.Database(t))
	require.NoError(t, err)
	migrateDB(t, dsn)
	maps := shardmap.NewHolder(dbShardMap(t, 1, "a", dsn))
	touched := confirmMaps(ctx, maps)
	t.Cleanup(func() { cancel(); <-touched })
	pool := shardmap.NewPool(shardmap.Credentials{User: dsn.User, Password: dsn.Passwd})
	t.Cleanup(func() { pool.Close() })
	local := time.Now()
	s, err := New(Config{Region: "a", ID: "deq-a", Maps: maps, Pool: pool, NC: nc, JS: js,
		OwnerTTL: time.Minute, Logger: slog.New(slog.DiscardHandler),
		Now: func() time.Time { return local }, BeforeBuffer: beforeBuffer})
	require.NoError(t, err)
	require.NoError(t, s.Start(ctx))
	t.Cleanup(s.Stop)
	require.Eventually(t, func() bool { return s.owner.owns(1) }, 5*time.Second, 10*time.Millisecond)
	db, err := pool.Writer(maps, 1)
	require.NoError(t, err)
	return &noticeBed{t: t, ctx: ctx, s: s, st: store.New(db), base: time.Now().Add(-time.Minute)}
}

// enqueue commits the items of keys (priority 0) as the enqueuer does and
// announces them as the router does before answering a COMMITTED
// enqueue: with their rows (handed), or, as for a batch too large to
// carry them or rows not ready yet by the primary's clock, without.
func (b *noticeBed) enqueue(handed bool, keys ...uint64) {
	batch := &peerv1.EnqueueBatch{Namespace: "default", Topic: "t", Shard: 1, BatchId: keys[0], EnqueuedAtUs: time.Now().UnixMicro()}
	for _, k := range keys {
		batch.Items = append(batch.Items, &peerv1.BufferedItem{Key: k, Payload: []byte("x"), LeaseMs: 60_000,
			DeliverAfterUs: b.base.Add(time.Duration(k) * time.Millisecond).UnixMicro()})
	}
	out, err := b.st.ItemInsertBatch(b.ctx, store.ItemInsertBatchParams{NowUS: time.Now().UnixMicro(), Batches: []*peerv1.EnqueueBatch{batch}})
	require.NoError(b.t, err)
	notice := peer.BatchReady(batch)
	if handed {
		notice = peer.CommittedReady(batch, out[0])
		require.True(b.t, peer.Handed(notice))
	}
	b.s.Ready(notice)
}

// dequeue is a Dequeue without a wait; it returns the keys served.
func (b *noticeBed) dequeue(n int32) []uint64 {
	items, err := b.s.Dequeue(b.ctx, &triagev1.DequeueRequest{Namespace: "default", Topics: []*triagev1.TopicCount{{Topic: "t", Count: n}}}, []uint32{1})
	require.NoError(b.t, err)
	var keys []uint64
	for _, it := range items {
		id, err := itemid.Parse(it.Id)
		require.NoError(b.t, err)
		keys = append(keys, id.Key)
	}
	return keys
}

// TestNoticePastAnExhaustedTail: a queue whose last read found every
// ready row holds a row when a notice without rows announces rows that
// sort after it. They are not read at once (the queue serves what it
// holds), but the queue no longer holds everything: once it is drained, a
// dequeue reads the shard and serves them rather than counting the queue
// as known empty until its recheck.
func TestNoticePastAnExhaustedTail(t *testing.T) {
	b := newNoticeBed(t, nil)
	b.enqueue(true, 1, 2)
	require.Equal(t, []uint64{1}, b.dequeue(1), "read both, served the first")
	b.enqueue(false, 3)
	require.Equal(t, []uint64{2}, b.dequeue(1))
	require.Equal(t, []uint64{3}, b.dequeue(1), "the row announced after the queue's last read")
}

// TestNoticeDuringARefill: a notice announces a row past a queue's tail
// while a refill of the rows after the tail is in flight, its SELECT run
// before the row was committed. The refill finds no more rows, yet the
// queue must not take that for "nothing more is ready": the row is
// served by the next dequeue.
func TestNoticeDuringARefill(t *testing.T) {
	var armed atomic.Bool
	entered, release := make(chan struct{}), make(chan struct{})
	b := newNoticeBed(t, func(_ uint32, keys []uint64) {
		if slices.Contains(keys, 17) && armed.CompareAndSwap(true, false) {
			close(entered)
			<-release
		}
	})
	released := sync.OnceFunc(func() { close(release) })
	t.Cleanup(released) // before the bed stops: it waits for the refill
	var keys []uint64
	for k := uint64(1); k <= 20; k++ {
		keys = append(keys, k)
	}
	b.enqueue(true, keys...)
	require.Equal(t, []uint64{1}, b.dequeue(1), "read 1-16, a full read")
	armed.Store(true)
	// Below the low-water mark: a refill reads the rows after 16.
	require.Equal(t, []uint64{2, 3, 4, 5, 6, 7, 8, 9}, b.dequeue(8))
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("no refill of the rows after the tail started")
	}
	b.enqueue(true, 21)
	released()
	require.Equal(t, []uint64{10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21}, b.dequeue(20))
}
