package store

import (
	"sync"
	"sync/atomic"
)

// coalescer is Batcher's queue: per key (a shard), batches that collect the
// work of concurrent callers, oldest first, and one flusher goroutine
// that runs them one after another while any are pending. The batch in
// flight never waits for more, so a lone call costs one statement, and a
// caller waits for the batch in flight (if any) and then for its own.
//
// The zero value is ready to use.
type coalescer[K comparable, B any] struct {
	mu     sync.Mutex
	queues map[K]*coalesceQueue[B]

	flushes atomic.Int64 // batches run, for tests
}

type coalesceQueue[B any] struct {
	pending []*batchOf[B]
	running bool
}

// batchOf is a batch and the channel closed once run has run it.
type batchOf[B any] struct {
	v    B
	done chan struct{}
}

// add puts a caller's work into k's newest pending batch when fits says
// that batch can take it, else into a new one (fill makes the change,
// under the coalescer's lock), and starts k's flusher, which calls run on
// each batch, if none is running. The caller waits for the returned
// batch's done.
func (c *coalescer[K, B]) add(k K, fits func(*B) bool, fill func(*B), run func(K, *B)) *batchOf[B] {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.queues == nil {
		c.queues = map[K]*coalesceQueue[B]{}
	}
	q := c.queues[k]
	if q == nil {
		q = &coalesceQueue[B]{}
		c.queues[k] = q
	}
	var bt *batchOf[B]
	if n := len(q.pending); n > 0 && fits(&q.pending[n-1].v) {
		bt = q.pending[n-1]
	} else {
		bt = &batchOf[B]{done: make(chan struct{})}
		q.pending = append(q.pending, bt)
	}
	fill(&bt.v)
	if !q.running {
		q.running = true
		go c.flush(k, q, run)
	}
	return bt
}

// flush runs k's pending batches one after another until none is left.
func (c *coalescer[K, B]) flush(k K, q *coalesceQueue[B], run func(K, *B)) {
	for {
		c.mu.Lock()
		if len(q.pending) == 0 {
			q.running = false
			delete(c.queues, k)
			c.mu.Unlock()
			return
		}
		bt := q.pending[0]
		q.pending = q.pending[1:]
		c.mu.Unlock()
		run(k, &bt.v)
		c.flushes.Add(1)
		close(bt.done)
	}
}
