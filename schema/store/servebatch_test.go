package store

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestServeMixedPrefetchTokens: one ItemServe over rows of two prefetch
// batches serves each row only under its own batch's token: a delivery
// naming another batch's token, a released row or an unknown id is left
// alone and missing from the result.
func TestServeMixedPrefetchTokens(t *testing.T) {
	f := newFixture(t)
	f.enqueue(1, 1, 2, 3)
	first, tok1 := f.leaseHead(ItemLeaseHeadParams{Limit: 3})
	require.Len(t, first, 3)
	require.NoError(t, f.s.ItemRelease(f.ctx, ItemReleaseParams{Rows: first[2:], Token: tok1, NowUS: f.nowUS}))
	f.enqueue(2, 4, 5)
	second, tok2 := f.leaseHead(ItemLeaseHeadParams{})
	require.ElementsMatch(t, []uint64{first[2].ID, 4, 5}, ids(second))
	d := func(id, prefetch uint64) Delivery {
		return Delivery{ID: id, Token: 1000 + id, UntilUS: f.nowUS + 30e6, Prefetch: prefetch}
	}
	held, err := f.s.ItemServe(f.ctx, ItemServeParams{NowUS: f.nowUS, Deliveries: []Delivery{
		d(first[0].ID, tok1), d(first[1].ID, tok2) /* the wrong batch */, d(first[2].ID, tok1) /* released, re-leased under tok2 */, d(4, tok2), d(5, tok2), d(99, tok2)}})
	require.NoError(t, err)
	require.Equal(t, map[uint64]bool{first[0].ID: true, 4: true, 5: true}, held)
	require.Equal(t, uint64(1004), f.get(4).LeaseToken)
	require.Equal(t, int32(1), f.get(4).Attempts)
	require.True(t, f.get(first[1].ID).Prefetched(), "a row named with another batch's token keeps its prefetch lease")
	require.Zero(t, f.get(first[1].ID).Attempts, "and counts no attempt")
	require.True(t, f.get(first[2].ID).Prefetched())
}

// TestServeBatcherCoalesces: serves that arrive while one is in flight go
// out in one statement, each caller learns which of its own rows were
// served, and a copy of a row another caller serves waits for a statement
// of its own.
func TestServeBatcherCoalesces(t *testing.T) {
	f := newFixture(t)
	const callers = 8
	var keys []uint64
	for i := uint64(1); i <= callers+1; i++ {
		keys = append(keys, i)
	}
	f.enqueue(1, keys...)
	rows, token := f.leaseHead(ItemLeaseHeadParams{})
	require.Len(t, rows, callers+1)

	// Hold item 1's row lock, so the first serve waits while the others
	// arrive.
	tx := f.db.MustBeginTx(f.ctx, nil)
	defer tx.Rollback()
	tx.MustExecContext(f.ctx, "UPDATE items SET updated_at = updated_at WHERE id = 1")
	var b ServeBatcher
	dl := func(id, tok uint64) Delivery { return Delivery{ID: id, Token: tok, UntilUS: f.nowUS + 30e6} }
	type answer struct {
		held map[uint64]bool
		err  error
	}
	first := make(chan answer, 1)
	go func() {
		held, err := b.Serve(f.ctx, f.db, ItemServeParams{PrefetchToken: token, NowUS: f.nowUS, Deliveries: []Delivery{dl(1, 1001)}})
		first <- answer{held, err}
	}()
	require.Eventually(t, func() bool {
		var n int
		err := f.db.GetContext(f.ctx, &n, "SELECT COUNT(*) FROM information_schema.innodb_lock_waits")
		return err == nil && n > 0
	}, 10*time.Second, 200*time.Millisecond, "the first serve waits for item 1's lock")

	results := make([]answer, callers+1)
	var wg sync.WaitGroup
	serve := func(c int) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id, tok := uint64(c+2), token
			switch {
			case c == callers: // a second copy of caller 0's row
				id = 2
			case c%3 == 2:
				tok = 7 // not this row's prefetch batch
			}
			held, err := b.Serve(f.ctx, f.db, ItemServeParams{PrefetchToken: tok, NowUS: f.nowUS,
				Deliveries: []Delivery{dl(id, 2000+uint64(c)), dl(9000+id, 1)}})
			results[c] = answer{held, err}
		}()
	}
	pending := func(deliveries, batches int) func() bool {
		return func() bool {
			b.mu.Lock()
			defer b.mu.Unlock()
			for _, q := range b.queues {
				n := 0
				for _, bt := range q.pending {
					n += len(bt.v.ds)
				}
				return n == deliveries && len(q.pending) == batches
			}
			return false
		}
	}
	for c := range callers {
		serve(c)
	}
	require.Eventually(t, pending(2*callers, 1), 10*time.Second, 5*time.Millisecond, "the waiting callers share one batch")
	serve(callers)
	require.Eventually(t, pending(2*(callers+1), 2), 10*time.Second, 5*time.Millisecond, "the row's second copy waits in a batch of its own")
	require.NoError(t, tx.Rollback())
	wg.Wait()
	a := <-first
	require.NoError(t, a.err)
	require.Equal(t, map[uint64]bool{1: true}, a.held)
	require.Equal(t, int64(3), b.flushes.Load(), "the waiting callers went out in two statements")
	for c, a := range results[:callers] {
		require.NoError(t, a.err, "caller %d", c)
		if c%3 == 2 {
			require.Empty(t, a.held, "caller %d", c)
			require.True(t, f.get(uint64(c+2)).Prefetched(), "caller %d", c)
		} else {
			require.Equal(t, map[uint64]bool{uint64(c + 2): true}, a.held, "caller %d", c)
			require.Equal(t, 2000+uint64(c), f.get(uint64(c+2)).LeaseToken, "caller %d", c)
		}
	}
	require.NoError(t, results[callers].err)
	require.Empty(t, results[callers].held, "the row was served already, under caller 0's delivery")
	require.Equal(t, uint64(2000), f.get(2).LeaseToken)
}

// TestServeBatcherAnswersAfterCtxEnds: a caller whose context ends while
// its batch waits still learns what the batch stamped. The rows are its
// own now, with an attempt counted and their delivery lease hiding them;
// returning early would leave them hidden for the whole lease with an
// attempt no consumer saw, and nobody to unserve them.
func TestServeBatcherAnswersAfterCtxEnds(t *testing.T) {
	f := newFixture(t)
	f.enqueue(1, 1)
	rows, token := f.leaseHead(ItemLeaseHeadParams{})
	require.Len(t, rows, 1)
	tx := f.db.MustBeginTx(f.ctx, nil)
	defer tx.Rollback()
	tx.MustExecContext(f.ctx, "UPDATE items SET updated_at = updated_at WHERE id = 1")

	var b ServeBatcher
	ctx, cancel := context.WithCancel(f.ctx)
	type answer struct {
		held map[uint64]bool
		err  error
	}
	done := make(chan answer, 1)
	go func() {
		held, err := b.Serve(ctx, f.db, ItemServeParams{PrefetchToken: token, NowUS: f.nowUS,
			Deliveries: []Delivery{{ID: 1, Token: 4242, UntilUS: f.nowUS + 30e6}}})
		done <- answer{held, err}
	}()
	require.Eventually(t, func() bool {
		var n int
		err := f.db.GetContext(f.ctx, &n, "SELECT COUNT(*) FROM information_schema.innodb_lock_waits")
		return err == nil && n > 0
	}, 10*time.Second, 100*time.Millisecond, "the serve waits for item 1's lock")
	cancel()
	select {
	case a := <-done:
		t.Fatalf("Serve returned before its batch committed: %v, %v", a.held, a.err)
	case <-time.After(300 * time.Millisecond):
	}
	require.NoError(t, tx.Rollback())
	a := <-done
	require.NoError(t, a.err)
	require.Equal(t, map[uint64]bool{1: true}, a.held, "the stamped row is reported")
	require.Equal(t, uint64(4242), f.get(1).LeaseToken)
}
