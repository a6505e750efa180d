package dequeuer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/triage-queue/triage/proto/triage/peer"
	peerv1 "github.com/triage-queue/triage/proto/triage/peer/v1"
	"github.com/triage-queue/triage/schema/store"
)

// Prefetch sizing: a buffer holds about this long of a topic's observed
// dequeue rate, within these bounds. Small enough that an urgent item
// enqueued a moment later is not stuck behind a deep buffer, large enough
// that one round trip serves many consumers.
const (
	prefetchHorizon = 100 * time.Millisecond
	minFetch        = 16
	maxFetch        = 500
	// A shard's queue is read again after this long even without an
	// ItemsReady notice, to catch items that become ready because time
	// passed (deliver_after reached, a lease lapsed, a nack's delay over),
	// which nobody announces: an exhausted queue reads the head again, a
	// queue holding items reads only rows more urgent than its tail (cheap:
	// usually none), so a newly ready item never waits behind less urgent
	// buffered ones for longer than this.
	recheckEvery = 100 * time.Millisecond
	// An empty queue that reads keep finding empty is read again less
	// often when the dequeuer holds many queues (shardQueue.recheck): a
	// long poll re-reads every due queue of its topic, so at recheckEvery
	// consumers waiting on 250 topics of four shards each cost ten
	// thousand reads a second of empty queues. The wait doubles with
	// every empty read in a row, up to recheckEvery per quietQueues
	// queues the dequeuer holds, at most quietRecheckMax; a notice or a
	// read with rows brings it back. A dequeuer with up to 2*quietQueues
	// queues keeps recheckEvery. The price, only at that scale: an item
	// that becomes ready by time alone (a delay, a lapsed lease: nobody
	// announces those) in a queue that was empty for a while is found up
	// to that late.
	quietQueues     = 200
	quietRecheckMax = time.Second
	// servedFor is how long a queue remembers the versions of rows it
	// served or found changed (shardQueue.served): a read whose snapshot
	// predates a serve's commit returns the row as it was, and without the
	// memory it would be buffered again, only to fail its serve.
	servedFor = 5 * time.Second
)

// bufItem is a row read into buf, with the version (Item.UpdatedAt) its
// serve compares. Once served, token and untilUS are the delivery's.
type bufItem struct {
	store.Item
	buf     *topicBuf
	shard   uint32
	token   uint64
	untilUS int64
}

// shardQueue is one shard's ready head of a topic as read (rows at the
// versions read, not leased), in delivery order.
type shardQueue struct {
	items     []bufItem
	checkedAt time.Time // last unbounded read (the one that sets exhausted)
	headAt    time.Time // last read of any kind, bounded by the tail or not
	// exhausted: the last unbounded fetch returned fewer rows than asked,
	// and no notice since announced rows past the tail (leaveUnread).
	exhausted bool
	// quiet counts the head reads in a row that found nothing, no notice
	// between them (see recheck).
	quiet int
	dirty bool // ItemsReady arrived since the last fetch
	// dirtyFrom bounds what the notices that made the queue dirty may
	// have announced: no unread row they are about sorts before it. Items
	// before it can still be served without reading again (safeBefore).
	dirtyFrom store.Item
	notices   uint64        // ItemsReady count, to tell one that lands during a fetch
	fetchedAt uint64        // notices when the fetch in flight began
	fetching  chan struct{} // closed when the fetch in flight ends
	// unread counts the notices of rows past the tail that the queue
	// left for a later read (leaveUnread); fetchedUnread and
	// refillUnread are unread when the fetch or refill in flight began.
	unread, fetchedUnread, refillUnread uint64
	// fetchStart is when the take's fetch in flight began. A queue marked
	// fetching with no fetchStart is held without a read, and takes no
	// handed-in rows (handIn); no fetch of this package holds it so.
	fetchStart time.Time
	// refilling is closed when the background refill in flight ends (see
	// startRefills); refillAt is notices when it began. Takes go on
	// serving the queue's items meanwhile, and wait for the refill only
	// when the queue runs dry or needs a fresh read.
	refilling   chan struct{}
	refillAt    uint64
	refillStart time.Time
	// refillAfter is set while the refill in flight reads only the rows
	// after the queue's tail (the queue held items when it began): it is
	// no read of the head, and a take that needs one does not count it.
	refillAfter bool
	// served and servedOld hold, for servedFor to twice that, the
	// versions (id -> updated_at) of rows this queue served or found
	// changed when serving; a read returning a row at such a version is
	// stale and the row is not buffered again. Two generations, swapped
	// every servedFor at servedAt, bound the memory.
	served, servedOld map[uint64]int64
	servedAt          time.Time
	// inflight holds the rows taken from the queue whose serve has not
	// settled (id -> version): reads leave them out, as they do the rows
	// the queue holds, so a read racing their serve does not buffer them
	// again only for a second serve to fail on them.
	inflight map[uint64]int64
}

// markServed records that row id at version is spent: served, or found
// changed by its serve. Caller holds the buffer's lock.
func (q *shardQueue) markServed(id uint64, version int64, now time.Time) {
	if q.served == nil || now.Sub(q.servedAt) >= servedFor {
		q.servedOld, q.served, q.servedAt = q.served, map[uint64]int64{}, now
	}
	q.served[id] = version
}

// spent reports whether a read copy of a row is a version already served
// or found changed. Caller holds the buffer's lock.
func (q *shardQueue) spent(it *store.Item) bool {
	if v, ok := q.served[it.ID]; ok && v == it.UpdatedAt {
		return true
	}
	v, ok := q.servedOld[it.ID]
	return ok && v == it.UpdatedAt
}

// held returns the rows, at their versions, that the queue holds or has
// in flight: a read of its shard leaves them out, unless they changed
// since, in which case the read's copy replaces the stale one
// (mergeSorted). Leaving out a row by id alone let a stale copy (an
// in-flight fetch that buffered a row while UpdateItem changed it, or a
// lapsed lease acked or nacked late) hide the row's current version from
// every read, and a take served past it (the model-based test's
// inversion check). Caller holds the buffer's lock.
func (q *shardQueue) held() []store.RowVersion {
	out := make([]store.RowVersion, 0, len(q.items)+len(q.inflight))
	for i := range q.items {
		out = append(out, store.RowVersion{ID: q.items[i].ID, Version: q.items[i].UpdatedAt})
	}
	for id, v := range q.inflight {
		out = append(out, store.RowVersion{ID: id, Version: v})
	}
	return out
}

// take pops the queue's head and counts it in flight until its serve
// settles (settle). Caller holds the buffer's lock.
func (q *shardQueue) take() bufItem {
	it := q.items[0]
	q.items = q.items[1:]
	if q.inflight == nil {
		q.inflight = map[uint64]int64{}
	}
	q.inflight[it.ID] = it.UpdatedAt
	return it
}

// settle ends the flight of items taken from their queues (take), without
// anything else: putBack returns them, and a row whose TTL passed needs no
// read again.
func settle(items []bufItem) {
	for _, it := range items {
		b := it.buf
		b.mu.Lock()
		if q := b.queues[it.shard]; q != nil {
			delete(q.inflight, it.ID)
		}
		b.mu.Unlock()
	}
}

// fresh reports whether the queue can take part in a merge: it was read
// within recheckEvery and either has items (nothing ready sorts before its
// tail as of that read) or is known empty. Holding items is not enough: a
// row that turned ready since the last read may sort before them.
func (q *shardQueue) fresh(now time.Time, quietCap time.Duration) bool {
	return !q.dirty && q.read(now, quietCap)
}

// read reports whether the queue's last read is recent enough to merge
// from, notices aside: within recheckEvery, with items or known empty.
func (q *shardQueue) read(now time.Time, quietCap time.Duration) bool {
	if len(q.items) > 0 {
		return now.Sub(q.headAt) < recheckEvery
	}
	return q.exhausted && now.Sub(q.checkedAt) < q.recheck(quietCap)
}

// recheck is how long an empty queue's last read stands: recheckEvery,
// doubled for every read in a row that found nothing, up to quietCap
// (Service.quietCap; below recheckEvery reads as recheckEvery).
func (q *shardQueue) recheck(quietCap time.Duration) time.Duration {
	return max(recheckEvery, min(recheckEvery<<min(q.quiet, 4), quietCap))
}

// markDirty records a notice of rows that sort at or after from.
func (q *shardQueue) markDirty(from store.Item) {
	q.quiet = 0
	if !q.dirty || from.Less(&q.dirtyFrom) {
		q.dirtyFrom = from
	}
	q.dirty = true
}

// markAllDirty records that any row may be unread.
func (q *shardQueue) markAllDirty() {
	q.markDirty(store.Item{Priority: math.MinInt32, DeliverAfter: math.MinInt64})
}

// leaveUnread records a notice of rows that sort after the queue's tail
// and that it does not take in. Every row the queue holds sorts before
// them, so it stays clean and serves them without a read; but it no
// longer holds everything ready, and neither does a read in flight that
// began before the notice (noteRead). Taken for exhausted, the queue
// would count as known empty once drained and leave the rows unread
// until its recheck; not exhausted, it is refilled, or read when drained.
func (q *shardQueue) leaveUnread() {
	q.exhausted = false
	q.unread++
}

// safeBefore reports whether it may be served before the queue is read
// again as far as the queue's notices go: it sorts before every row they
// announced. (An announced row with its priority and deliver_after may
// have a smaller id, so those ties are not safe: dirtyFrom's id is 0.)
func (q *shardQueue) safeBefore(it *store.Item) bool {
	return !q.dirty || it.Less(&q.dirtyFrom)
}

// handIn takes rows a notice carried (Service.handedRows: ready, as
// stored, in delivery order) into the queue, as a read would have
// buffered them; the queue's other reads
// and notices are untouched. In steady state this is how items reach
// consumers: the insert's notice brings them, and no read of the shard
// is needed (a read per notice would be as many statements as the
// inserts).
//
// A row goes in when the queue would have it after a read: it sorts
// before the tail (the queue holds the head up to there), or the queue's
// last full read found everything (exhausted), in which case the queue
// still holds everything with it. The queue keeps at most maxFetch rows;
// dropping rows from the end keeps "the head up to the tail" true, but
// no longer "everything". Rows outside the buffer's band are not its
// own. A row left out that may sort before what the queue holds, or of a
// queue that holds nothing, marks the queue dirty as a notice without
// rows does, so the next take reads it; rows after the tail wait for a
// refill or the read that drains the queue (leaveUnread). A queue held
// without a read (fetching, no fetchStart) takes nothing. Caller holds
// b.mu.
func (q *shardQueue) handIn(b *topicBuf, rows []bufItem) {
	heldUnread := q.fetching != nil && q.fetchStart.IsZero()
	tail := q.tail()
	var left *bufItem // the first row left out (rows are in order)
	for i := range rows {
		it := rows[i]
		switch {
		case it.Priority < b.band.lo || it.Priority > b.band.hi:
			continue
		case heldUnread || !q.exhausted && (tail == nil || !it.Less(tail)):
			if left == nil {
				left = &rows[i]
			}
			continue
		}
		// Not if a read that began after the insert committed buffered it
		// already, or it is taken or served since: a second copy would be
		// taken beside the first and fail its serve. Each row goes in at
		// its place (mergeSorted's full sort, per notice, cost more than
		// the rows).
		if _, flying := q.inflight[it.ID]; flying || q.spent(&it.Item) {
			continue
		}
		// By index, not slices.BinarySearchFunc: its comparator takes
		// bufItems by value, and those frames grew the stack of every
		// committed Enqueue's goroutine that handed a row in.
		at := sort.Search(len(q.items), func(i int) bool { return q.items[i].Compare(&it.Item) >= 0 })
		if at == len(q.items) || q.items[at].Compare(&it.Item) != 0 {
			it.buf = b
			q.items = slices.Insert(q.items, at, it)
		}
	}
	switch {
	case left == nil:
	case len(q.items) == 0 || tail != nil && left.Less(tail):
		q.markDirty(store.Item{Priority: left.Priority, DeliverAfter: left.DeliverAfter})
		q.notices++
	default:
		q.leaveUnread()
	}
	if len(q.items) > maxFetch {
		q.items = q.items[:maxFetch]
		q.exhausted = false
	}
}

// noticeFrom is the least sort key a notice's rows may have.
func noticeFrom(r *peerv1.ItemsReady) store.Item {
	at := r.MinDeliverAfterUs
	if at == 0 {
		at = math.MinInt64 // unknown: an item handed back keeps an old time
	}
	return store.Item{Priority: r.MinPriority, DeliverAfter: at}
}

// tail returns the last buffered row, the bound of a recheck, or nil.
func (q *shardQueue) tail() *store.Item {
	if len(q.items) == 0 {
		return nil
	}
	return &q.items[len(q.items)-1].Item
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
	// quietCap is the dequeuer's quietCap as of the last take.
	quietCap time.Duration
	rate     float64 // items/s, exponentially weighted
	rateAt   time.Time
}

// bufKey names a prefetch buffer: a topic's priority band. Bands of one
// topic may overlap (a weighted topic's bands beside a request's
// min/max_priority), and then two buffers may hold copies of one row;
// the serve's compare-and-set delivers it once.
type bufKey struct {
	ns, topic string
	band      band
}

func newTopicBuf(k bufKey) *topicBuf {
	return &topicBuf{bufKey: k, queues: map[uint32]*shardQueue{}}
}

// quietCap is the longest an empty queue's read stands (see
// quietQueues): recheckEvery per quietQueues queues the dequeuer holds,
// at most quietRecheckMax.
func (s *Service) quietCap() time.Duration {
	return min(quietRecheckMax, recheckEvery*time.Duration(max(1, s.queueTotal.Load()/quietQueues)))
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

// lowWater is the queue length below which a shard's queue is refilled in
// the background: half a fetch, so about prefetchHorizon/2 of the topic's
// observed rate, and the refill lands before the rest is served.
func (b *topicBuf) lowWater() int { return b.fetchSize(0) / 2 }

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
	// waited: this call fetched or waited for a fetch, so what it takes
	// after that is a prefetch miss.
	waited := false
	start := s.cfg.Now()
	for len(out) < n {
		now := s.cfg.Now()
		b.mu.Lock()
		b.lastUsed = now
		b.quietCap = s.quietCap()
		// First what can be served without a read: the queues' items that
		// sort before anything announced since their last reads.
		if got := mergeTake(b, shards, n-len(out), now, read); len(got) > 0 {
			out = append(out, got...)
			b.observe(len(got), now)
			s.cfg.Metrics.Prefetch(!waited, len(got))
			if len(out) >= n {
				s.startRefills(b, shards)
				b.mu.Unlock()
				return out, nil
			}
		}
		plan := planReads(b, shards, now, read)
		if len(plan.stale) == 0 && len(plan.pending) == 0 {
			// Every queue could take part, so the merge above stopped only
			// because all ran empty: there is nothing more to serve.
			s.startRefills(b, shards)
			b.mu.Unlock()
			return out, nil
		}
		size := b.fetchSize(n - len(out))
		b.mu.Unlock()
		waited = true
		if len(plan.stale) > 0 {
			if err := s.fetch(ctx, b, plan.stale, plan.tails, plan.excludes, size); err != nil && len(out) == 0 {
				return nil, err
			}
		}
		if err := awaitReads(ctx, plan.pending, start, read); err != nil {
			return out, err
		}
	}
	return out, nil
}

// readPlan is what a take must read before it can merge further: the
// stale shards it reads itself (with each queue's tail and held rows,
// see fetch), and the reads in flight it waits for.
type readPlan struct {
	stale    []uint32
	tails    []*store.Item
	excludes [][]store.RowVersion
	pending  []pendingRead
}

// planReads finds, for a take, the shards whose queues cannot take part
// in the merge: those with a fetch or refill in flight to wait for, and
// the stale ones, which it marks as fetching (and as read this call).
// Caller holds b.mu.
func planReads(b *topicBuf, shards []uint32, now time.Time, read map[uint32]bool) readPlan {
	var p readPlan
	for _, id := range shards {
		q := b.queue(id)
		switch {
		case q.fetching != nil:
			p.pending = append(p.pending, pendingRead{q.fetching, id, q.fetchStart})
		case q.refilling != nil && (len(q.items) == 0 || !q.fresh(now, b.quietCap) && !readThisCall(q, read[id])):
			// A second read beside the refill could merge rows after
			// ones it has read and not merged yet, and serve them out
			// of order: wait for it. Its read counts as of when it
			// began (refillStart), so a refill that began long ago is
			// followed by a fresh read; one of the rows after the tail
			// does not count at all.
			began := q.refillStart
			if q.refillAfter {
				began = time.Time{}
			}
			p.pending = append(p.pending, pendingRead{q.refilling, id, began})
		case !q.fresh(now, b.quietCap) && !readThisCall(q, read[id]):
			p.stale = append(p.stale, id)
			var tail *store.Item
			if t := q.tail(); t != nil {
				c := *t
				tail = &c
			}
			p.tails = append(p.tails, tail)
			p.excludes = append(p.excludes, q.held())
			read[id] = true
			q.fetching = make(chan struct{})
			q.fetchedAt, q.fetchedUnread, q.fetchStart = q.notices, q.unread, now
		}
	}
	return p
}

// awaitReads waits for the reads in flight a take found, and counts as
// the take's own read each that began after the take did (start).
func awaitReads(ctx context.Context, pending []pendingRead, start time.Time, read map[uint32]bool) error {
	for _, p := range pending {
		select {
		case <-p.done:
		case <-ctx.Done():
			return ctx.Err()
		}
		if !p.began.IsZero() && !p.began.Before(start) {
			read[p.shard] = true
		}
	}
	return nil
}

// pendingRead is another take's fetch, or a refill, that a take waits
// for. One that began after the take did is as good as a read of the
// take's own (see readThisCall): it saw every row announced before the
// take began. Without this, consumers under a flood of enqueues would form
// a convoy: each would wait for another's fetch, find the queue dirty
// again (a notice lands during every fetch) and wait for the next one,
// until its own turn to read.
type pendingRead struct {
	done  chan struct{}
	shard uint32
	began time.Time
}

// readThisCall reports whether a queue read during the current take counts
// as fresh for the rest of it: it holds items (nothing ready sorted before
// them as of the read), or that read found everything ready (exhausted).
// Under a steady flood of enqueues there is always a newer notice, and a
// take that re-read such queues would loop, one fetch per arriving item,
// a round trip each (across the WAN for a failover's old owner). A queue the take drained after a full
// read is not fresh: rows past the read may sort before other shards'.
func readThisCall(q *shardQueue, read bool) bool {
	return read && (len(q.items) > 0 || q.exhausted)
}

// mergeTake pops up to n items while every queue can take part: read
// recently, and, if notices arrived since, only items that sort before
// every row those notices announced (safeBefore). Under a steady flood of
// enqueues into a backlog, a notice arrives between any two takes; a
// take that waited for a read after each would serve nothing from
// memory, while the new rows mostly sort after what the buffer holds.
// Caller holds b.mu.
func mergeTake(b *topicBuf, shards []uint32, n int, now time.Time, read map[uint32]bool) []bufItem {
	var out []bufItem
	for len(out) < n {
		var best *shardQueue
		for _, id := range shards {
			q := b.queue(id)
			if !q.read(now, b.quietCap) && !readThisCall(q, read[id]) {
				return out // refill before comparing further
			}
			if len(q.items) > 0 && (best == nil || q.items[0].Less(&best.items[0].Item)) {
				best = q
			}
		}
		if best == nil {
			return out
		}
		for _, id := range shards {
			if q := b.queues[id]; !readThisCall(q, read[id]) && !q.safeBefore(&best.items[0].Item) {
				return out // an announced row may come first: read it
			}
		}
		out = append(out, best.take())
	}
	return out
}

// fetch reads the ready heads of shards into b, concurrently, leaving out
// the rows each queue holds already at their versions (excludes[i]). A
// shard that
// fails is treated as empty until the next recheck, so one shard down does
// not stop dequeues from the others; fetch fails only when every shard did.
//
// A shard whose queue holds items (tails[i] != nil) is read only for rows
// that sort before its tail: the buffer already holds the head up to there,
// and rows after it are not needed until the buffer drains. Such a bounded
// read says nothing about rows past the tail, so it clears exhausted: the
// queue is read in full once it drains. When it comes back full, unread ready rows may sort between
// the rows read and the buffered ones, so the buffered rows after the last
// row read are dropped rather than served out of order.
func (s *Service) fetch(ctx context.Context, b *topicBuf, shards []uint32, tails []*store.Item, excludes [][]store.RowVersion, size int) error {
	return s.fetchInto(ctx, b, shards, readSpec{tails: tails, excludes: excludes}, size, false)
}

// readSpec says what fetchInto reads of each shard: the rows before
// tails[i] (all of them when nil) but those in excludes[i]; or, for a
// refill with after set, only the rows after it.
type readSpec struct {
	tails    []*store.Item
	excludes [][]store.RowVersion
	after    *store.Item
}

// startRefills starts a background refill of each of shards' queues that
// holds fewer than lowWater items and may have more ready rows (its last
// full read was not short), so that consumers find the next items
// buffered instead of waiting for a read round trip when the queue runs
// dry. A refill of an empty queue reads the ready head, like its fetch; a
// refill of a queue that holds items reads the rows after its tail, which
// is what the queue lacks: the rows before the tail are the ones it holds,
// or ones that its rechecks find. Reading the head instead, leaving out
// what the queue holds, would walk every held row's index entry and
// primary key on every refill, a second row read per row served on a
// deep backlog. It merges what it read (see fetchInto). Caller holds b.mu.
func (s *Service) startRefills(b *topicBuf, shards []uint32) {
	low := b.lowWater()
	size := b.fetchSize(0)
	for _, id := range shards {
		q := b.queues[id]
		if q == nil || q.fetching != nil || q.refilling != nil || q.exhausted || len(q.items) >= low {
			continue
		}
		if !s.refillAdd() {
			return
		}
		q.refilling = make(chan struct{})
		q.refillAt, q.refillUnread, q.refillStart = q.notices, q.unread, s.cfg.Now()
		var after *store.Item
		var exclude []store.RowVersion
		if t := q.tail(); t != nil {
			// What the queue holds and has in flight sorts up to its
			// tail, so the read after it leaves all of that out.
			c := *t
			after = &c
		} else {
			exclude = q.held()
		}
		q.refillAfter = after != nil
		go func() {
			defer s.refills.Done()
			_ = s.fetchInto(s.bgCtx, b, []uint32{id}, readSpec{tails: []*store.Item{nil}, excludes: [][]store.RowVersion{exclude}, after: after}, size, true)
		}()
	}
}

// refillAdd counts a refill about to start, unless the service is
// stopping (halt waits for those counted). Lock order: refillMu is taken
// last, under topicBuf.mu.
func (s *Service) refillAdd() bool {
	s.refillMu.Lock()
	defer s.refillMu.Unlock()
	if s.stopping || s.bgCtx == nil {
		return false
	}
	s.refills.Add(1)
	return true
}

// fetchInto is fetch; with refill set it is the background refill of one
// queue that startRefills began, which ends q.refilling rather than
// q.fetching. It reads the shards at once (readShards), then, under b's
// lock, merges each read into its queue (mergeRead) and records it
// (noteRead).
func (s *Service) fetchInto(ctx context.Context, b *topicBuf, shards []uint32, spec readSpec, size int, refill bool) error {
	reads := s.readShards(ctx, b, shards, spec, size)
	now := s.cfg.Now()
	b.mu.Lock()
	defer b.mu.Unlock()
	failed := 0
	var firstErr error
	for i, id := range shards {
		q := b.queue(id)
		r := &reads[i]
		if r.err == nil && !s.owner.owns(id) {
			// The shard was handed over while the fetch ran, and its
			// buffers were dropped already: these rows belong to the new
			// owner's reads now.
			r.items = nil
			r.err = fmt.Errorf("%w %d", peer.ErrNotOwner, id)
		}
		if r.err != nil {
			failed++
			firstErr = cmp.Or(firstErr, r.err)
			if !errors.Is(r.err, peer.ErrNotOwner) {
				s.log.Warn("prefetch failed; shard skipped until recheck", "shard", id, "topic", b.topic, "err", r.err)
			}
		}
		q.mergeRead(r)
		q.noteRead(r, spec.tails[i] != nil, spec.after != nil, refill, now)
	}
	if failed == len(shards) {
		return firstErr
	}
	return nil
}

// shardRead is what a fetch read of one shard: its rows, in delivery
// order, whether they were as many as asked (full), or why none.
type shardRead struct {
	items []bufItem
	full  bool
	err   error
}

// readShards reads what spec says of each of shards' ready heads, at
// once: each read waits for a round trip to its own primary.
func (s *Service) readShards(ctx context.Context, b *topicBuf, shards []uint32, spec readSpec, size int) []shardRead {
	pol := s.policy(s.cfg.Maps.Current(), b.ns, b.topic)
	reads := make([]shardRead, len(shards))
	var wg sync.WaitGroup
	for i, id := range shards {
		wg.Add(1)
		go func() {
			defer wg.Done()
			reads[i] = s.readShard(ctx, b, id, store.ItemReadHeadParams{
				Namespace: b.ns, Topic: b.topic, PriorityLo: b.band.lo, PriorityHi: b.band.hi,
				Tail: spec.tails[i], Exclude: spec.excludes[i], After: spec.after,
				MaxAttempts: pol.MaxAttempts, AtMostOnce: pol.AtMostOnce, DedupWindow: pol.DedupWindow,
				Limit: size,
			})
		}()
	}
	wg.Wait()
	return reads
}

// readShard reads one shard's ready head as params say, on the shard's
// primary and at its time, while this dequeuer owns the shard.
func (s *Service) readShard(ctx context.Context, b *topicBuf, id uint32, params store.ItemReadHeadParams) shardRead {
	if !s.owner.owns(id) {
		return shardRead{err: fmt.Errorf("%w %d", peer.ErrNotOwner, id)}
	}
	db, err := s.cfg.Pool.Writer(s.cfg.Maps, id)
	if err != nil {
		return shardRead{err: err}
	}
	params.NowUS = s.cfg.Clock.Now(ctx, db).UnixMicro()
	params.Observe = func(c store.LeaseHeadCounts) {
		tm := s.cfg.Metrics.Topic(b.ns, b.topic)
		tm.LeaseExpiries.Add(float64(c.Lapsed))
		tm.DeadLettered.Add(float64(c.Dead))
	}
	rows, full, err := store.New(db).ItemReadHead(ctx, params)
	if err == nil {
		// Read on a primary that may have been deposed while the
		// statement waited, which may lack rows the new one has: buffer
		// none of it (see shardmap.Writable).
		err = s.cfg.Maps.Writable(id)
	}
	if err != nil {
		return shardRead{err: err}
	}
	if s.cfg.BeforeBuffer != nil {
		keys := make([]uint64, len(rows))
		for j, r := range rows {
			keys[j] = r.ID
		}
		s.cfg.BeforeBuffer(id, keys)
	}
	items := make([]bufItem, len(rows))
	for j, r := range rows {
		items[j] = bufItem{Item: r, buf: b, shard: id}
	}
	return shardRead{items: items, full: full}
}

// mergeRead merges the rows of a read into the queue, in delivery order.
// Caller holds the buffer's lock.
func (q *shardQueue) mergeRead(r *shardRead) {
	if r.full && len(r.items) > 0 {
		// Rows past the last one read may be preceded by ready rows
		// this read did not reach (a bounded recheck, or a refill of a
		// queue that still held items).
		last := &r.items[len(r.items)-1].Item
		q.items = slices.DeleteFunc(q.items, func(it bufItem) bool { return last.Less(&it.Item) })
	}
	// A row served (or found changed) since the read's snapshot was
	// taken comes back as it was, and one taken since the read began
	// is in flight: neither goes in again.
	r.items = slices.DeleteFunc(r.items, func(it bufItem) bool {
		v, flying := q.inflight[it.ID]
		return flying && v == it.UpdatedAt || q.spent(&it.Item)
	})
	// Rows read now may be more urgent than ones buffered earlier
	// (new arrivals, items turned ready); merge to keep delivery order.
	q.items = mergeSorted(q.items, r.items)
}

// noteRead records what a merged read says of the queue (exhausted,
// when, whether still dirty) and ends the fetch or refill in flight.
// bounded: the read was of the rows before the queue's tail; after: of
// the rows after it (a refill). Caller holds the buffer's lock.
func (q *shardQueue) noteRead(r *shardRead, bounded, after, refill bool, now time.Time) {
	readAt, unread := now, q.fetchedUnread
	if refill {
		// What the refill read is as old as its SELECT, which may
		// have run long before now.
		readAt, unread = q.refillStart, q.refillUnread
	}
	// "Nothing more is ready" stands only if no notice announced rows
	// past the tail while the read ran: its SELECT may predate them.
	found := r.err != nil || !r.full && q.unread == unread
	if after {
		// The rows after the tail: whether there are more says nothing
		// about the rows before it, whose last read stands (headAt),
		// and the queue is as dirty as it was, or dirtier. "Nothing
		// more" dates from that read: the buffer may drain before the
		// next one.
		q.exhausted = found
		q.checkedAt = q.headAt
		q.dirty = q.dirty || q.notices != q.refillAt
		q.refillAfter = false
		close(q.refilling)
		q.refilling = nil
		return
	}
	if !bounded || r.err != nil {
		q.exhausted = found
		q.checkedAt = readAt
		if r.err == nil && len(r.items) == 0 && !q.dirty {
			q.quiet++
		} else {
			q.quiet = 0
		}
	} else {
		// A bounded read says nothing about rows past the tail, and the
		// notice that may have caused it can be about such a row (an
		// item escalated to a priority after the tail's): once the
		// buffer drains, read in full instead of trusting an older
		// "known empty".
		q.exhausted = false
	}
	q.headAt = readAt
	// A notice that arrived while the fetch ran may be about rows it
	// did not see: keep the queue dirty for another look.
	// (Its dirtyFrom stays: the least of all notices since the one
	// before the read, which bounds the later ones too.)
	if refill {
		q.dirty = q.notices != q.refillAt
		close(q.refilling)
		q.refilling = nil
	} else {
		q.dirty = q.notices != q.fetchedAt
		close(q.fetching)
		q.fetching = nil
	}
}

// mergeSorted merges b into a in delivery order. A row of b already in a
// replaces it: b's copy is the later read, at the row's current version
// (a read leaves out only the versions the queue holds), and only the
// copy at the current version can be served; a stale copy would take the
// row's place in a take and then fail to serve, leaving the answer short.
func mergeSorted(a, b []bufItem) []bufItem {
	if len(a) == 0 {
		return b
	}
	if len(b) > 0 {
		ids := make(map[uint64]bool, len(b))
		for _, it := range b {
			ids[it.ID] = true
		}
		a = slices.DeleteFunc(a, func(it bufItem) bool { return ids[it.ID] })
	}
	out := append(a, b...)
	sort.SliceStable(out, func(i, j int) bool { return out[i].Less(&out[j].Item) })
	return out
}

// putBack returns taken, unserved items to their buffers, in order.
func putBack(items []bufItem) {
	for _, it := range items {
		b := it.buf
		b.mu.Lock()
		q := b.queue(it.shard)
		delete(q.inflight, it.ID)
		// A copy fetched again meanwhile is the current one: keep it.
		if !slices.ContainsFunc(q.items, func(o bufItem) bool { return o.ID == it.ID }) {
			q.items = mergeSorted(q.items, []bufItem{it})
		}
		b.mu.Unlock()
	}
}
