package store

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestAckBatcherCoalesces: acks that arrive while a batch is in flight go
// out together in the next transaction, and every caller gets the results
// of its own refs, stale tokens and unknown items included.
func TestAckBatcherCoalesces(t *testing.T) {
	f := newFixture(t)
	const callers = 12
	var keys []uint64
	for i := uint64(1); i <= callers+1; i++ {
		keys = append(keys, i)
	}
	f.enqueue(1, keys...)
	rows, token := f.leaseHead(ItemLeaseHeadParams{})
	require.Len(t, f.serve(rows, token), callers+1)

	// Hold item 1's row lock, so the first batch (item 1's ack) waits in
	// its transaction while the other callers arrive.
	tx := f.db.MustBeginTx(f.ctx, nil)
	defer tx.Rollback()
	tx.MustExecContext(f.ctx, "UPDATE items SET updated_at = updated_at WHERE id = 1")

	var b AckBatcher
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
				n += len(bt.refs)
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
