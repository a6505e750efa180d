package store

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	peerv1 "github.com/triage-queue/triage/proto/triage/peer/v1"
)

// TestBatcherAckCoalesces: acks that arrive while a batch is in flight go
// out together in the next transaction, and every caller gets the results
// of its own refs, stale tokens and unknown items included.
func TestBatcherAckCoalesces(t *testing.T) {
	f := newFixture(t)
	const callers = 12
	var keys []uint64
	for i := uint64(1); i <= callers+1; i++ {
		keys = append(keys, i)
	}
	f.enqueue(1, keys...)
	rows := f.readHead(ItemReadHeadParams{})
	require.Len(t, f.serve(rows), callers+1)

	// Hold item 1's row lock, so the first batch (item 1's ack) waits in
	// its transaction while the other callers arrive.
	tx := f.db.MustBeginTx(f.ctx, nil)
	defer tx.Rollback()
	tx.MustExecContext(f.ctx, "UPDATE items SET updated_at = updated_at WHERE id = 1")

	var b Batcher
	type answer struct {
		res []error
		err error
	}
	first := make(chan answer, 1)
	go func() {
		res, err := b.Ack(f.ctx, f.db, ItemAckParams{Namespace: ns, DedupWindow: time.Minute, Refs: []LeaseRef{{Key: 1, Token: 1001}}})
		first <- answer{res, err}
	}()
	// The first batch waits for item 1's lock. InnoDB refreshes its lock
	// tables only when they were not read for 100 ms, so polling faster
	// would keep reading the answer of the first poll.
	require.Eventually(t, func() bool {
		var n int
		err := f.db.GetContext(f.ctx, &n, "SELECT COUNT(*) FROM information_schema.innodb_lock_waits")
		return err == nil && n > 0
	}, 10*time.Second, 200*time.Millisecond, "the first batch waits for item 1's lock")

	results := make([]answer, callers)
	var wg sync.WaitGroup
	for c := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := uint64(c + 2)
			tok := 1000 + id
			if c%4 == 3 {
				tok = 7 // stale
			}
			res, err := b.Ack(f.ctx, f.db, ItemAckParams{Namespace: ns, DedupWindow: time.Minute,
				Refs: []LeaseRef{{Key: id, Token: tok}, {Key: 9000 + id, Token: 1}}})
			results[c] = answer{res, err}
		}()
	}
	// Every caller is queued behind the batch in flight before it ends.
	require.Eventually(t, func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		for _, q := range b.queues {
			n := 0
			for _, bt := range q.pending {
				n += bt.v.refs
			}
			return n == 2*callers
		}
		return false
	}, 10*time.Second, 5*time.Millisecond)
	require.NoError(t, tx.Rollback())
	wg.Wait()
	a := <-first
	require.NoError(t, a.err)
	require.Equal(t, []error{nil}, a.res)
	require.Equal(t, int64(2), b.flushes.Load(), "the waiting callers' acks went out in one transaction")
	for c, a := range results {
		require.NoError(t, a.err, "caller %d", c)
		res := a.res
		require.Len(t, res, 2)
		if c%4 == 3 {
			require.ErrorIs(t, res[0], ErrStaleLease, "caller %d", c)
		} else {
			require.NoError(t, res[0], "caller %d", c)
		}
		require.ErrorIs(t, res[1], ErrNotFound, "caller %d", c)
	}
	require.Equal(t, callers/4, f.count("SELECT COUNT(*) FROM items"), "only the stale refs' items are left")
}

// TestAckDelete: the one-statement ack answers every ref as ItemAck would
// in a batch that mixes them: acked, stale token, no such item, a second
// ref to an item acked, another namespace's item, and items with dedup
// keys, which keep their key taken (tombstone) only when the namespace has
// a dedup window.
func TestAckDelete(t *testing.T) {
	f := newFixture(t)
	f.enqueue(1, 1, 2, 3, 4, 5)
	b := &peerv1.EnqueueBatch{Namespace: ns, Topic: topic, BatchId: 2, Items: []*peerv1.BufferedItem{
		{Key: 10, DedupKey: "d10"}, {Key: 11, DedupKey: "d11"}, {Key: 12, DedupKey: "d12"}}}
	_, err := f.s.ItemInsertBatch(f.ctx, ItemInsertBatchParams{Batches: []*peerv1.EnqueueBatch{b}, NowUS: f.nowUS})
	require.NoError(t, err)
	other := &peerv1.EnqueueBatch{Namespace: "other", Topic: topic, BatchId: 3, Items: []*peerv1.BufferedItem{{Key: 20}}}
	_, err = f.s.ItemInsertBatch(f.ctx, ItemInsertBatchParams{Batches: []*peerv1.EnqueueBatch{other}, NowUS: f.nowUS})
	require.NoError(t, err)
	rows := f.readHead(ItemReadHeadParams{})
	require.Len(t, f.serve(rows), 8)
	f.db.MustExecContext(f.ctx, "UPDATE items SET lease_token = 1020 WHERE id = 20")

	tests := []struct {
		name   string
		window time.Duration
		refs   []LeaseRef
		want   []error
	}{
		{"all acked: no diagnostic read needed", time.Minute,
			[]LeaseRef{{Key: 1, Token: 1001}, {Key: 2, Token: 1002}}, []error{nil, nil}},
		{"mixed batch", time.Minute,
			[]LeaseRef{{Key: 3, Token: 999}, {Key: 3, Token: 1003}, {Key: 3, Token: 1003}, {Key: 4, Token: 7}, {Key: 77, Token: 1},
				{Key: 1, Token: 1001}, {Key: 20, Token: 1020}, {Key: 10, Token: 1010}, {Key: 10, Token: 1010}},
			[]error{ErrStaleLease, nil, ErrNotFound, ErrStaleLease, ErrNotFound, ErrNotFound, ErrNotFound, nil, ErrNotFound}},
		{"a ref twice in one round trip: the second finds the item gone", time.Minute,
			[]LeaseRef{{Key: 5, Token: 1005}, {Key: 5, Token: 1005}}, []error{nil, ErrNotFound}},
		{"dedup key with a window, every ref holding: one round trip with its tombstone", time.Minute,
			[]LeaseRef{{Key: 12, Token: 1012}}, []error{nil}},
		{"dedup key without a window: deleted at once", 0,
			[]LeaseRef{{Key: 11, Token: 1011}, {Key: 4, Token: 1004}}, []error{nil, nil}},
	}
	for _, tt := range tests {
		res, err := f.s.ItemAckDelete(f.ctx, ItemAckParams{Namespace: ns, Refs: tt.refs, DedupWindow: tt.window, Now: f.now})
		require.NoError(t, err, tt.name)
		require.Len(t, res, len(tt.want), tt.name)
		for i, w := range tt.want {
			if w == nil {
				require.NoError(t, res[i], "%s: ref %d", tt.name, i)
			} else {
				require.ErrorIs(t, res[i], w, "%s: ref %d", tt.name, i)
			}
		}
	}
	require.Equal(t, 1, f.count("SELECT COUNT(*) FROM items"), "only the other namespace's item is left")
	require.Equal(t, 1, f.count("SELECT COUNT(*) FROM items WHERE id = 20"))
	require.Equal(t, 1, f.count("SELECT COUNT(*) FROM dedup_tombstones WHERE dedup_key = 'd10' AND item_id = 10"),
		"an item with a dedup key keeps it taken for the window")
	require.Equal(t, 1, f.count("SELECT COUNT(*) FROM dedup_tombstones WHERE dedup_key = 'd11' AND window_until = ? AND expires_at = ?",
		f.now.UnixMicro(), f.now.Add(KeyMemory).UnixMicro()), "no window: the key is remembered for KeyMemory, for older envelopes only")
	require.Equal(t, 1, f.count("SELECT COUNT(*) FROM dedup_tombstones WHERE dedup_key = 'd12' AND item_id = 12 AND window_until = ?",
		f.now.Add(time.Minute).UnixMicro()), "the one-round-trip ack keeps the key taken for the window")
}

// The batcher stamps dedup tombstones with its Now (the shard primary's
// clock in the router), not the local clock: a key stays taken for the
// window as the shard measures it.
func TestBatcherAckTombstoneUsesItsClock(t *testing.T) {
	f := newFixture(t)
	b := &peerv1.EnqueueBatch{Namespace: ns, Topic: topic, BatchId: 2, Items: []*peerv1.BufferedItem{{Key: 10, DedupKey: "d10"}}}
	_, err := f.s.ItemInsertBatch(f.ctx, ItemInsertBatchParams{Batches: []*peerv1.EnqueueBatch{b}, NowUS: f.nowUS})
	require.NoError(t, err)
	rows := f.readHead(ItemReadHeadParams{})
	require.Len(t, f.serve(rows), 1)

	shardNow := time.Now().Add(time.Hour).Truncate(time.Microsecond)
	var asked []*sqlx.DB
	ab := Batcher{Now: func(_ context.Context, db *sqlx.DB) time.Time { asked = append(asked, db); return shardNow }}
	res, err := ab.Ack(f.ctx, f.db, ItemAckParams{Namespace: ns, DedupWindow: time.Minute, Refs: []LeaseRef{{Key: 10, Token: 1010}},
		Now: time.Now().Add(-time.Hour)})
	require.NoError(t, err)
	require.NoError(t, res[0])
	require.Equal(t, []*sqlx.DB{f.db}, asked, "the clock of the shard acked on")
	require.Equal(t, 1, f.count(fmt.Sprintf("SELECT COUNT(*) FROM dedup_tombstones WHERE dedup_key = 'd10' AND window_until = %d",
		shardNow.Add(time.Minute).UnixMicro())), "tombstone until the shard's now + window")
}

// TestRetriedEnqueueYieldsOneItemPerKey: an enqueue answered 504 is
// retried with the same dedup key and no dedup window. Whichever attempt
// is inserted first and however late the other lands, after the first
// one's item was delivered and acked, the other is a duplicate of it: on
// either ack path and after DeleteItem. An enqueue made the namespace's
// retry window after the item's is a new item.
func TestRetriedEnqueueYieldsOneItemPerKey(t *testing.T) {
	f := newFixture(t)
	first := f.nowUS - 10*time.Second.Microseconds()
	retried := first + 5*time.Second.Microseconds()
	const retryWindow = time.Minute
	insert := func(batch, key uint64, dedup string, enqueuedAt int64) []uint64 {
		t.Helper()
		b := &peerv1.EnqueueBatch{Namespace: ns, Topic: topic, BatchId: batch, EnqueuedAtUs: enqueuedAt,
			Items: []*peerv1.BufferedItem{{Key: key, DedupKey: dedup}}}
		out, err := f.s.ItemInsertBatch(f.ctx, ItemInsertBatchParams{Batches: []*peerv1.EnqueueBatch{b}, NowUS: f.nowUS,
			RetryWindow: func(string) time.Duration { return retryWindow }})
		require.NoError(t, err)
		require.Empty(t, out[0].Error)
		return out[0].DuplicateOf
	}
	gone := map[string]func(id uint64){
		"one-round-trip ack": func(id uint64) {
			f.serve(f.readHead(ItemReadHeadParams{}))
			res, err := f.s.ItemAckDelete(f.ctx, ItemAckParams{Namespace: ns, Refs: []LeaseRef{{Key: id, Token: 1000 + id}}, Now: f.now})
			require.NoError(t, err)
			require.NoError(t, res[0])
		},
		"locking ack": func(id uint64) {
			f.serve(f.readHead(ItemReadHeadParams{}))
			res, err := f.s.ItemAck(f.ctx, ItemAckParams{Namespace: ns, Refs: []LeaseRef{{Key: id, Token: 1000 + id}}, Now: f.now})
			require.NoError(t, err)
			require.NoError(t, res[0])
		},
		"delete": func(id uint64) {
			require.NoError(t, f.s.ItemDelete(f.ctx, ItemDeleteParams{Namespace: ns, ID: id, Now: f.now}))
		},
	}
	var n uint64
	for name, remove := range gone {
		for _, order := range [][2]int64{{retried, first}, {first, retried}} {
			n += 10
			key := fmt.Sprint("k", n)
			require.Equal(t, []uint64{0}, insert(n, n+1, key, order[0]), "%s: the attempt that lands first is inserted", name)
			remove(n + 1)
			require.Zero(t, f.count("SELECT COUNT(*) FROM items"), name)
			require.Equal(t, []uint64{n + 1}, insert(n+1, n+2, key, order[1]), "%s: the other attempt, landing after the ack, is a duplicate", name)
			require.Zero(t, f.count("SELECT COUNT(*) FROM items"), "%s: and is not stored", name)
			later := order[0] + retryWindow.Microseconds()
			require.Equal(t, []uint64{0}, insert(n+2, n+3, key, later), "%s: an enqueue the retry window after the item's is a new item", name)
			require.Equal(t, 1, f.count("SELECT COUNT(*) FROM items WHERE id = ?", n+3), name)
			_, err := f.db.ExecContext(f.ctx, "DELETE FROM items")
			require.NoError(t, err)
		}
	}
}
