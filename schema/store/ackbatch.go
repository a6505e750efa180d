package store

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jmoiron/sqlx"
)

// MaxAckBatch bounds the refs one coalesced ack transaction takes: lists up
// to this size keep schema.Keys' plan (TestKeysPlan covers 1-1000), and a
// transaction's row locks stay few.
const MaxAckBatch = 500

// AckBatcher coalesces the acks that concurrent callers make on one shard
// and namespace into one ItemAck transaction, as FOQS batches its acks: in
// steady state many consumers ack a few items each, and a transaction per
// call spends its time in commits and lock round trips rather than in
// deleting rows.
//
// Unlike FOQS, an ack is answered only once its batch has committed, so an
// acknowledged ack is never undone. A caller waits for the batch in flight
// (if any) to finish and then for its own; the batch in flight is never
// held back to wait for more, so a lone ack costs what ItemAck costs.
// Each caller gets exactly the per-ref results ItemAck would have given its
// refs, in order; two callers acking the same item in one batch are
// answered as if one went first (the second finds it gone). A batch that
// fails fails every caller in it, and they retry as they would after a
// failed ItemAck.
//
// The zero value is ready to use.
type AckBatcher struct {
	mu     sync.Mutex
	queues map[ackKey]*ackQueue

	flushes atomic.Int64 // ItemAck transactions run, for tests
}

type ackKey struct {
	db     *sqlx.DB
	ns     string
	window time.Duration
}

// ackQueue is one key's batches: pending collect refs, oldest first; one
// flusher goroutine runs them while any are pending.
type ackQueue struct {
	pending []*ackBatch
	running bool
}

type ackBatch struct {
	refs []LeaseRef
	done chan struct{}
	res  []error
	err  error
}

// flushTimeout bounds one coalesced transaction, which no single caller's
// context owns.
const flushTimeout = 30 * time.Second

// Ack acks p.Refs on db through the batcher: see ItemAck for the results.
// p.Now is ignored; the batch's commit time stamps the dedup tombstones.
// When ctx ends first, Ack returns ctx's error, and the refs may or may not
// be acked (as with any call whose answer is lost).
func (b *AckBatcher) Ack(ctx context.Context, db *sqlx.DB, p ItemAckParams) ([]error, error) {
	if len(p.Refs) == 0 {
		return nil, nil
	}
	k := ackKey{db: db, ns: p.Namespace, window: p.DedupWindow}
	b.mu.Lock()
	if b.queues == nil {
		b.queues = map[ackKey]*ackQueue{}
	}
	q := b.queues[k]
	if q == nil {
		q = &ackQueue{}
		b.queues[k] = q
	}
	var bt *ackBatch
	if n := len(q.pending); n > 0 && len(q.pending[n-1].refs)+len(p.Refs) <= MaxAckBatch {
		bt = q.pending[n-1]
	} else {
		bt = &ackBatch{done: make(chan struct{})}
		q.pending = append(q.pending, bt)
	}
	off := len(bt.refs)
	bt.refs = append(bt.refs, p.Refs...)
	if !q.running {
		q.running = true
		go b.flush(k, q)
	}
	b.mu.Unlock()
	select {
	case <-bt.done:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if bt.err != nil {
		return nil, bt.err
	}
	return bt.res[off : off+len(p.Refs)], nil
}

// flush runs k's pending batches one after another until none is left.
func (b *AckBatcher) flush(k ackKey, q *ackQueue) {
	for {
		b.mu.Lock()
		if len(q.pending) == 0 {
			q.running = false
			delete(b.queues, k)
			b.mu.Unlock()
			return
		}
		bt := q.pending[0]
		q.pending = q.pending[1:]
		b.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), flushTimeout)
		bt.res, bt.err = New(k.db).ItemAck(ctx, ItemAckParams{Namespace: k.ns, Refs: bt.refs, DedupWindow: k.window, Now: time.Now()})
		cancel()
		b.flushes.Add(1)
		close(bt.done)
	}
}
