package store

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestServeComparesEachRowsVersion: one ItemServe over rows read at
// different times serves each row only at the version it names: a
// delivery of an older version, or of an unknown id, is left alone and
// missing from the result.
func TestServeComparesEachRowsVersion(t *testing.T) {
	f := newFixture(t)
	f.enqueue(1, 1, 2, 3)
	first := f.readHead(ItemReadHeadParams{Limit: 3})
	require.Len(t, first, 3)
	_, err := f.s.ItemUpdate(f.ctx, ItemUpdateParams{Namespace: ns, ID: first[1].ID, Update: func(*Item) error { return nil }})
	require.NoError(t, err)
	f.enqueue(2, 4, 5)
	second := f.readHead(ItemReadHeadParams{Exclude: versions(first)})
	require.ElementsMatch(t, []uint64{first[1].ID, 4, 5}, ids(second), "the updated row is read again, at its new version")
	byID := map[uint64]Item{}
	for _, r := range second {
		byID[r.ID] = r
	}
	stale := f.delivery(first[1])
	held, err := f.s.ItemServe(f.ctx, ItemServeParams{NowUS: f.nowUS, Deliveries: []Delivery{
		f.delivery(first[0]), stale, f.delivery(byID[4]), f.delivery(byID[5]), {ID: 99, Token: 1, UntilUS: f.nowUS + 30e6}}})
	require.NoError(t, err)
	require.Equal(t, map[uint64]bool{first[0].ID: true, 4: true, 5: true}, held)
	require.Equal(t, uint64(1004), f.get(4).LeaseToken)
	require.Equal(t, int32(1), f.get(4).Attempts)
	require.Zero(t, f.get(first[1].ID).LeaseToken, "the row updated since the first read is not served from it")
	require.Zero(t, f.get(first[1].ID).Attempts, "and counts no attempt")
	require.Equal(t, map[uint64]bool{first[1].ID: true}, f.serve([]Item{byID[first[1].ID]}), "it is served at its new version")
}

// TestServeStampsEachRowsOwnValues: one serve gives every row its own
// token (the full uint64 range, which a derived table's column must carry
// exactly whatever the other rows hold), its own expiry and an attempt,
// and moves its version forward; a repeated delivery of one row counts
// once.
func TestServeStampsEachRowsOwnValues(t *testing.T) {
	f := newFixture(t)
	f.enqueue(1, 1, 2, 3, 4)
	rows := f.readHead(ItemReadHeadParams{})
	require.Len(t, rows, 4)
	tokens := []uint64{7, 1<<63 + 5, ^uint64(0), 1<<63 - 1}
	var ds []Delivery
	for i, r := range rows {
		ds = append(ds, Delivery{ID: r.ID, Token: tokens[i], UntilUS: f.nowUS + int64(i+1)*1e6, Version: r.UpdatedAt})
	}
	ds = append(ds, ds[0]) // the same delivery twice
	held, err := f.s.ItemServe(f.ctx, ItemServeParams{NowUS: f.nowUS, Deliveries: ds})
	require.NoError(t, err)
	require.Equal(t, map[uint64]bool{1: true, 2: true, 3: true, 4: true}, held)
	for i, r := range rows {
		got := f.get(r.ID)
		require.Equal(t, tokens[i], got.LeaseToken, "row %d", r.ID)
		require.Equal(t, f.nowUS+int64(i+1)*1e6, got.DeliverAfter, "row %d", r.ID)
		require.Equal(t, f.nowUS+int64(i+1)*1e6, got.LeasedUntil.Int64, "row %d", r.ID)
		require.Equal(t, int32(1), got.Attempts, "row %d", r.ID)
		require.Greater(t, got.UpdatedAt, r.UpdatedAt, "row %d: its version moved", r.ID)
	}
}

// TestBatcherServeCoalesces: serves that arrive while one is in flight go
// out in one statement, each caller learns which of its own rows were
// served, and a copy of a row another caller serves waits for a statement
// of its own.
func TestBatcherServeCoalesces(t *testing.T) {
	f := newFixture(t)
	const callers = 8
	var keys []uint64
	for i := uint64(1); i <= callers+1; i++ {
		keys = append(keys, i)
	}
	f.enqueue(1, keys...)
	rows := f.readHead(ItemReadHeadParams{})
	require.Len(t, rows, callers+1)

	// Hold item 1's row lock, so the first serve waits while the others
	// arrive.
	tx := f.db.MustBeginTx(f.ctx, nil)
	defer tx.Rollback()
	tx.MustExecContext(f.ctx, "UPDATE items SET updated_at = updated_at WHERE id = 1")
	var b Batcher
	version := map[uint64]int64{}
	for _, r := range rows {
		version[r.ID] = r.UpdatedAt
	}
	dl := func(id, tok uint64) Delivery {
		return Delivery{ID: id, Token: tok, UntilUS: f.nowUS + 30e6, Version: version[id]}
	}
	type answer struct {
		held map[uint64]bool
		err  error
	}
	first := make(chan answer, 1)
	go func() {
		held, err := b.Serve(f.ctx, f.db, ItemServeParams{NowUS: f.nowUS, Deliveries: []Delivery{dl(1, 1001)}})
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
			id := uint64(c + 2)
			d := dl(id, 2000+uint64(c))
			switch {
			case c == callers: // a second copy of caller 0's row
				d = dl(2, 2000+uint64(c))
				id = 2
			case c%3 == 2:
				d.Version = 7 // not the version the row has
			}
			held, err := b.Serve(f.ctx, f.db, ItemServeParams{NowUS: f.nowUS,
				Deliveries: []Delivery{d, dl(9000+id, 1)}})
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
					n += len(bt.v.serve.ds)
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
			require.Zero(t, f.get(uint64(c+2)).Attempts, "caller %d", c)
		} else {
			require.Equal(t, map[uint64]bool{uint64(c + 2): true}, a.held, "caller %d", c)
			require.Equal(t, 2000+uint64(c), f.get(uint64(c+2)).LeaseToken, "caller %d", c)
		}
	}
	require.NoError(t, results[callers].err)
	require.Empty(t, results[callers].held, "the row was served already, under caller 0's delivery")
	require.Equal(t, uint64(2000), f.get(2).LeaseToken)
}

// TestBatcherServeAnswersAfterCtxEnds: a caller whose context ends while
// its batch waits still learns what the batch stamped. The rows are its
// own now, with an attempt counted and their delivery lease hiding them;
// returning early would leave them hidden for the whole lease with an
// attempt no consumer saw, and nobody to unserve them.
func TestBatcherServeAnswersAfterCtxEnds(t *testing.T) {
	f := newFixture(t)
	f.enqueue(1, 1)
	rows := f.readHead(ItemReadHeadParams{})
	require.Len(t, rows, 1)
	tx := f.db.MustBeginTx(f.ctx, nil)
	defer tx.Rollback()
	tx.MustExecContext(f.ctx, "UPDATE items SET updated_at = updated_at WHERE id = 1")

	var b Batcher
	ctx, cancel := context.WithCancel(f.ctx)
	type answer struct {
		held map[uint64]bool
		err  error
	}
	done := make(chan answer, 1)
	go func() {
		held, err := b.Serve(ctx, f.db, ItemServeParams{NowUS: f.nowUS,
			Deliveries: []Delivery{{ID: 1, Token: 4242, UntilUS: f.nowUS + 30e6, Version: rows[0].UpdatedAt}}})
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

// TestBatcherAcksAndServesShareATransaction: acks and serves that arrive
// while a transaction is in flight go out in the next one together, and
// an ack part with a stale ref is taken back to its savepoint and
// answered the long way without failing the serve or another part
// beside it.
func TestBatcherAcksAndServesShareATransaction(t *testing.T) {
	f := newFixture(t)
	f.enqueue(1, 1, 2, 3, 4, 5, 6)
	rows := f.readHead(ItemReadHeadParams{})
	require.Len(t, f.serve(pick(rows, 1, 2, 3)), 3)
	fresh := pick(f.readHead(ItemReadHeadParams{}), 4, 5)
	require.Len(t, fresh, 2, "items 4 and 5 are ready")

	tx := f.db.MustBeginTx(f.ctx, nil)
	defer tx.Rollback()
	tx.MustExecContext(f.ctx, "UPDATE items SET updated_at = updated_at WHERE id = 1")
	var b Batcher
	first := make(chan error, 1)
	go func() {
		res, err := b.Ack(f.ctx, f.db, ItemAckParams{Namespace: ns, Refs: []LeaseRef{{Key: 1, Token: 1001}}})
		if err == nil {
			err = errors.Join(res...)
		}
		first <- err
	}()
	require.Eventually(t, func() bool {
		var n int
		err := f.db.GetContext(f.ctx, &n, "SELECT COUNT(*) FROM information_schema.innodb_lock_waits")
		return err == nil && n > 0
	}, 10*time.Second, 200*time.Millisecond, "the first transaction waits for item 1's lock")

	var wg sync.WaitGroup
	var good, stale []error
	var goodErr, staleErr, serveErr error
	var held map[uint64]bool
	wg.Add(3)
	go func() {
		defer wg.Done()
		good, goodErr = b.Ack(f.ctx, f.db, ItemAckParams{Namespace: ns, DedupWindow: time.Minute, Refs: []LeaseRef{{Key: 2, Token: 1002}}})
	}()
	go func() {
		defer wg.Done()
		stale, staleErr = b.Ack(f.ctx, f.db, ItemAckParams{Namespace: ns, Refs: []LeaseRef{{Key: 3, Token: 7}}})
	}()
	go func() {
		defer wg.Done()
		held, serveErr = b.Serve(f.ctx, f.db, ItemServeParams{NowUS: f.nowUS, Deliveries: []Delivery{f.delivery(fresh[0]), f.delivery(fresh[1])}})
	}()
	require.Eventually(t, func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		for _, q := range b.queues {
			return len(q.pending) == 1 && q.pending[0].v.refs == 2 && len(q.pending[0].v.serve.ds) == 2
		}
		return false
	}, 10*time.Second, 5*time.Millisecond, "the acks and the serve wait in one batch")
	require.NoError(t, tx.Rollback())
	wg.Wait()
	require.NoError(t, <-first)
	require.NoError(t, goodErr)
	require.Equal(t, []error{nil}, good)
	require.NoError(t, staleErr)
	require.Len(t, stale, 1)
	require.ErrorIs(t, stale[0], ErrStaleLease)
	require.NoError(t, serveErr)
	require.Equal(t, map[uint64]bool{4: true, 5: true}, held)
	require.Equal(t, int64(2), b.flushes.Load(), "the acks and the serve went out in one transaction")
	require.Equal(t, []uint64{3, 4, 5, 6}, f.ids("SELECT id FROM items ORDER BY id"), "1 and 2 acked, 3 kept")
	require.Equal(t, uint64(1003), f.get(3).LeaseToken, "the stale ack changed nothing")
	require.Equal(t, uint64(1004), f.get(4).LeaseToken)
	require.Equal(t, int32(1), f.get(5).Attempts)
	require.Zero(t, f.get(6).Attempts)
}

// pick returns the rows with the given ids, in that order.
func pick(rows []Item, ids ...uint64) []Item {
	var out []Item
	for _, id := range ids {
		for _, r := range rows {
			if r.ID == id {
				out = append(out, r)
			}
		}
	}
	return out
}
