package dequeuer

import (
	"cmp"
	"context"
	"sort"
	"sync"
	"time"
)

// Prefetch sizing: a buffer holds about this long of a topic's observed
// dequeue rate, within these bounds. Small enough that an urgent item
// enqueued a moment later is not stuck behind a deep buffer, large enough
// that one round trip serves many consumers.
const (
	prefetchHorizon = 100 * time.Millisecond
	minFetch        = 16
	maxFetch        = 500
	// An exhausted shard (last fetch came back short) is read again after
	// this long even without an ItemsReady notice, to catch delayed items and
	// expired leases becoming ready.
	recheckEvery = 100 * time.Millisecond
	// A buffered item whose lease has less than this left is dropped, not
	// served: the consumer would get a lease about to lapse.
	minLeaseLeft = time.Second
)

// bufItem is a row leased into the buffer under token until untilUS.
type bufItem struct {
	Row
	shard   uint32
	token   uint64
	untilUS int64
}

// shardQueue is one shard's leased head of a topic, in delivery order.
type shardQueue struct {
	items     []bufItem
	checkedAt time.Time
	exhausted bool          // last fetch returned fewer rows than asked
	dirty     bool          // ItemsReady arrived since the last fetch
	notices   uint64        // ItemsReady count, to tell one that lands during a fetch
	fetchedAt uint64        // notices when the fetch in flight began
	fetching  chan struct{} // closed when the fetch in flight ends
}

// fresh reports whether the queue can take part in a merge: it has items,
// or it is known empty as of a recent read.
func (q *shardQueue) fresh(now time.Time) bool {
	if q.dirty {
		return false
	}
	return len(q.items) > 0 || (q.exhausted && now.Sub(q.checkedAt) < recheckEvery)
}

// topicBuf is the prefetch buffer of one (namespace, topic).
//
// Lock order: Service.mu before topicBuf.mu; neither is held across SQL.
type topicBuf struct {
	bufKey

	mu       sync.Mutex
	queues   map[uint32]*shardQueue
	waiters  []chan struct{}
	lastUsed time.Time
	rate     float64 // items/s, exponentially weighted
	rateAt   time.Time
}

// bufKey names a prefetch buffer: a topic's priority band. Bands of one
// topic never share rows: each row is leased into exactly one buffer.
type bufKey struct {
	ns, topic string
	band      band
}

func newTopicBuf(k bufKey) *topicBuf {
	return &topicBuf{bufKey: k, queues: map[uint32]*shardQueue{}}
}

func (b *topicBuf) queue(shard uint32) *shardQueue {
	q := b.queues[shard]
	if q == nil {
		q = &shardQueue{}
		b.queues[shard] = q
	}
	return q
}

// observe folds n served items into the rate estimate. Caller holds b.mu.
func (b *topicBuf) observe(n int, now time.Time) {
	if b.rateAt.IsZero() {
		b.rateAt = now
	}
	dt := now.Sub(b.rateAt).Seconds()
	if dt > 0.05 {
		inst := float64(n) / dt
		b.rate = 0.7*b.rate + 0.3*inst
		b.rateAt = now
	} else {
		b.rate += float64(n) * 0.3 / 0.05
	}
}

func (b *topicBuf) fetchSize(needed int) int {
	target := int(b.rate * prefetchHorizon.Seconds())
	return max(needed, min(maxFetch, max(minFetch, target)))
}

// wait registers a waiter woken by wake. Caller holds b.mu.
func (b *topicBuf) wait() chan struct{} {
	ch := make(chan struct{}, 1)
	b.waiters = append(b.waiters, ch)
	return ch
}

// wake wakes up to n waiters, oldest first, so one new item does not send
// every parked consumer to the database.
func (b *topicBuf) wake(n int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for n > 0 && len(b.waiters) > 0 {
		close(b.waiters[0])
		b.waiters = b.waiters[1:]
		n--
	}
}

func (b *topicBuf) unwait(ch chan struct{}) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i, w := range b.waiters {
		if w == ch {
			b.waiters = append(b.waiters[:i], b.waiters[i+1:]...)
			return
		}
	}
}

// take removes up to n items from the buffer in delivery order across
// shards, fetching from shards whose queue cannot yet take part in the
// merge. The k-way merge only serves an item when every other shard either
// has a buffered head to compare against or is known empty, so order holds
// across shards.
func (s *Service) take(ctx context.Context, b *topicBuf, shards []uint32, n int) ([]bufItem, error) {
	var out []bufItem
	// A queue read during this call counts as fresh for the rest of it,
	// even if notices made it dirty again meanwhile: under a steady flood
	// of enqueues there is always a newer notice, and re-reading forever
	// would serve nothing.
	read := map[uint32]bool{}
	for len(out) < n {
		now := s.cfg.Now()
		b.mu.Lock()
		b.lastUsed = now
		var stale []uint32
		var inflight []chan struct{}
		var lapsed []bufItem
		for _, id := range shards {
			q := b.queue(id)
			lapsed = dropLapsed(q, now, lapsed)
			switch {
			case q.fetching != nil:
				inflight = append(inflight, q.fetching)
			case !q.fresh(now) && !(read[id] && len(q.items) > 0):
				stale = append(stale, id)
				read[id] = true
				q.fetching = make(chan struct{})
				q.fetchedAt = q.notices
			}
		}
		if len(lapsed) > 0 {
			// Hand them back now rather than let them count an attempt (or,
			// at-most-once, be deleted) when their prefetch lease lapses.
			go s.releaseItems(context.WithoutCancel(ctx), lapsed)
		}
		if len(stale) == 0 && len(inflight) == 0 {
			got := mergeTake(b, shards, n-len(out), now, read)
			out = append(out, got...)
			if len(got) > 0 {
				b.observe(len(got), now)
			}
			done := len(got) == 0 || len(out) >= n
			b.mu.Unlock()
			if done {
				return out, nil
			}
			continue
		}
		size := b.fetchSize(n - len(out))
		b.mu.Unlock()
		if len(stale) > 0 {
			if err := s.fetch(ctx, b, stale, size); err != nil && len(out) == 0 {
				return nil, err
			}
		}
		for _, ch := range inflight {
			select {
			case <-ch:
			case <-ctx.Done():
				return out, ctx.Err()
			}
		}
	}
	return out, nil
}

// mergeTake pops up to n items while every queue is fresh. Caller holds
// b.mu.
func mergeTake(b *topicBuf, shards []uint32, n int, now time.Time, read map[uint32]bool) []bufItem {
	var out []bufItem
	for len(out) < n {
		var best *shardQueue
		for _, id := range shards {
			q := b.queues[id]
			if !q.fresh(now) && !(read[id] && len(q.items) > 0) {
				return out // refill before comparing further
			}
			if len(q.items) > 0 && (best == nil || q.items[0].less(&best.items[0].Row)) {
				best = q
			}
		}
		if best == nil {
			return out
		}
		out = append(out, best.items[0])
		best.items = best.items[1:]
	}
	return out
}

// dropLapsed removes items whose prefetch lease is about to lapse and
// appends them to dropped.
func dropLapsed(q *shardQueue, now time.Time, dropped []bufItem) []bufItem {
	limit := now.Add(minLeaseLeft).UnixMicro()
	kept := q.items[:0]
	for _, it := range q.items {
		if it.untilUS > limit {
			kept = append(kept, it)
		} else {
			dropped = append(dropped, it)
		}
	}
	q.items = kept
	return dropped
}

// fetch leases the ready heads of shards into b, concurrently. A shard that
// fails is treated as empty until the next recheck, so one shard down does
// not stop dequeues from the others; fetch fails only when every shard did.
func (s *Service) fetch(ctx context.Context, b *topicBuf, shards []uint32, size int) error {
	pol := s.policy(s.cfg.Maps.Current(), b.ns, b.topic)
	var wg sync.WaitGroup
	results := make([][]bufItem, len(shards))
	errs := make([]error, len(shards))
	fulls := make([]bool, len(shards))
	for i, id := range shards {
		wg.Add(1)
		go func() {
			defer wg.Done()
			db, err := s.cfg.Pool.Writer(s.cfg.Maps, id)
			if err != nil {
				errs[i] = err
				return
			}
			now := s.cfg.Now()
			rows, token, full, err := leaseHead(ctx, db, b.ns, b.topic, b.band, pol, size, now.UnixMicro())
			if err == nil {
				// Leased on a primary that may have been deposed while the
				// statement waited: serve none of it (see shardmap.Writable).
				err = s.cfg.Maps.Writable(id)
			}
			if err != nil {
				errs[i] = err
				return
			}
			fulls[i] = full
			items := make([]bufItem, len(rows))
			for j, r := range rows {
				items[j] = bufItem{Row: r, shard: id, token: token, untilUS: now.UnixMicro() + int64(r.LeaseMS)*1000}
			}
			results[i] = items
		}()
	}
	wg.Wait()
	now := s.cfg.Now()
	b.mu.Lock()
	defer b.mu.Unlock()
	failed := 0
	var firstErr error
	for i, id := range shards {
		q := b.queue(id)
		if errs[i] != nil {
			failed++
			firstErr = cmp.Or(firstErr, errs[i])
			s.log.Warn("prefetch failed; shard skipped until recheck", "shard", id, "topic", b.topic, "err", errs[i])
		}
		// Rows leased now may be more urgent than ones buffered earlier
		// (new arrivals); merge to keep delivery order.
		q.items = mergeSorted(q.items, results[i])
		q.exhausted = errs[i] != nil || !fulls[i]
		// A notice that arrived while the fetch ran may be about rows it
		// did not see: keep the queue dirty for another look.
		q.dirty = q.notices != q.fetchedAt
		q.checkedAt = now
		close(q.fetching)
		q.fetching = nil
	}
	if failed == len(shards) {
		return firstErr
	}
	return nil
}

func mergeSorted(a, b []bufItem) []bufItem {
	if len(a) == 0 {
		return b
	}
	out := append(a, b...)
	sort.SliceStable(out, func(i, j int) bool { return out[i].less(&out[j].Row) })
	return out
}
