package dequeuer

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	peerv1 "github.com/triage-queue/triage/proto/triage/peer/v1"
	"github.com/triage-queue/triage/schema/store"
)

// TestWRRFollowsWeights: over any window the smooth weighted round robin
// picks bands in proportion to their weights, and skipping empty bands
// hands their share to the rest.
func TestWRRFollowsWeights(t *testing.T) {
	t.Parallel()
	w := &wrr{weights: []float64{8, 4, 2, 1, 0.5}, credit: make([]float64, 5)}
	counts := make([]int, 5)
	skip := make([]bool, 5)
	for range 310 {
		counts[w.next(skip)]++
	}
	require.Equal(t, []int{160, 80, 40, 20, 10}, counts)

	skip[0] = true
	clear(counts)
	for range 75 {
		counts[w.next(skip)]++
	}
	require.Zero(t, counts[0])
	require.InDelta(t, 40, counts[1], 1)
	require.InDelta(t, 20, counts[2], 1)
	require.Equal(t, -1, w.next([]bool{true, true, true, true, true}))
}

func TestWeightedBandsCoverEveryPriority(t *testing.T) {
	t.Parallel()
	b := weightedBands(5)
	require.Equal(t, band{math.MinInt32, 0}, b[0])
	require.Equal(t, band{2, 2}, b[2])
	require.Equal(t, band{4, math.MaxInt32}, b[4])
}

// TestMergeTakeOrdersAcrossShards: the k-way merge serves in (priority,
// deliver_after, id) order across shard queues and stops at a queue that
// must be refilled before it can be compared.
func TestMergeTakeOrdersAcrossShards(t *testing.T) {
	t.Parallel()
	item := func(shard uint32, id uint64, prio int32, at int64) bufItem {
		return bufItem{Item: store.Item{ID: id, Priority: prio, DeliverAfter: at}, shard: shard}
	}
	b := newTopicBuf(bufKey{ns: "n", topic: "t", band: allPriorities})
	b.queue(1).items = []bufItem{item(1, 1, 0, 5), item(1, 3, 1, 1)}
	b.queue(2).items = []bufItem{item(2, 2, 0, 7), item(2, 4, 2, 0)}
	got := mergeTake(b, []uint32{1, 2}, 10, time.Time{}, nil)
	var ids []uint64
	for _, it := range got {
		ids = append(ids, it.ID)
	}
	// Shard 1 runs empty after id 3, and an empty queue that is not known
	// exhausted stops the merge.
	require.Equal(t, []uint64{1, 2, 3}, ids)
	require.Len(t, b.queue(2).items, 1, "id 4 waits until shard 1 is read again")
}

// TestReadyMarksOnlyQueuesItsItemsMayPrecede: a notice makes a queue read
// again only when its items may sort before the queue's tail: a more
// urgent priority, or the tail's priority with a deliver_after not known
// to be later. New enqueues into a backlog at the buffer's own priority
// sort after what it holds and leave it serving from memory.
func TestReadyMarksOnlyQueuesItsItemsMayPrecede(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name      string
		prio      int32
		afterUS   int64
		wantDirty bool
	}{
		{"more urgent", 2, 900, true},
		{"less urgent", 4, 1, false},
		{"same priority, later", 3, 501, false},
		{"same priority, same time", 3, 500, true},
		{"same priority, earlier", 3, 499, true},
		{"same priority, time unknown (handed back)", 3, 0, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := &Service{topics: map[bufKey]*topicBuf{}}
			b := s.buf(bufKey{ns: "n", topic: "t", band: allPriorities})
			b.queue(1).items = []bufItem{{Item: store.Item{ID: 1, Priority: 1, DeliverAfter: 900}}, {Item: store.Item{ID: 2, Priority: 3, DeliverAfter: 500}}}
			s.Ready(&peerv1.ItemsReady{Namespace: "n", Topic: "t", Shard: 1, MinPriority: c.prio, MinDeliverAfterUs: c.afterUS, Count: 1})
			require.Equal(t, c.wantDirty, b.queue(1).dirty)
			s.Ready(&peerv1.ItemsReady{Namespace: "n", Topic: "t", Shard: 2, MinPriority: c.prio, MinDeliverAfterUs: c.afterUS, Count: 1})
			require.True(t, b.queue(2).dirty, "an empty queue always reads again")
		})
	}
}

// TestMergeTakeServesWhatSortsBeforeTheNotices: a queue made dirty by a
// notice still serves, without a read, the items that sort before every
// row the notice may be about; the first one that may not waits for the
// read. A queue read during the call serves regardless.
func TestMergeTakeServesWhatSortsBeforeTheNotices(t *testing.T) {
	t.Parallel()
	fill := func() *topicBuf {
		b := newTopicBuf(bufKey{ns: "n", topic: "t", band: allPriorities})
		q := b.queue(1)
		q.items = []bufItem{
			{Item: store.Item{ID: 1, Priority: 1, DeliverAfter: 10}, shard: 1},
			{Item: store.Item{ID: 2, Priority: 2, DeliverAfter: 10}, shard: 1},
			{Item: store.Item{ID: 3, Priority: 2, DeliverAfter: 30}, shard: 1},
		}
		q.exhausted, q.headAt, q.checkedAt = true, time.Unix(100, 0), time.Unix(100, 0)
		return b
	}
	ids := func(items []bufItem) (out []uint64) {
		for _, it := range items {
			out = append(out, it.ID)
		}
		return out
	}
	now := time.Unix(100, 0)
	for _, c := range []struct {
		name string
		from *peerv1.ItemsReady
		want []uint64
	}{
		{"no notice", nil, []uint64{1, 2, 3}},
		{"notice after the tail's time", &peerv1.ItemsReady{MinPriority: 2, MinDeliverAfterUs: 31}, []uint64{1, 2, 3}},
		{"notice between", &peerv1.ItemsReady{MinPriority: 2, MinDeliverAfterUs: 20}, []uint64{1, 2}},
		{"notice at an item's time (ids unknown)", &peerv1.ItemsReady{MinPriority: 2, MinDeliverAfterUs: 10}, []uint64{1}},
		{"notice of unknown time", &peerv1.ItemsReady{MinPriority: 2}, []uint64{1}},
		{"more urgent than all", &peerv1.ItemsReady{MinPriority: 0, MinDeliverAfterUs: 99}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			b := fill()
			if c.from != nil {
				b.queue(1).markDirty(noticeFrom(c.from))
			}
			require.Equal(t, c.want, ids(mergeTake(b, []uint32{1}, 10, now, nil)))
			b = fill()
			b.queue(1).markAllDirty()
			require.Equal(t, []uint64{1, 2, 3}, ids(mergeTake(b, []uint32{1}, 10, now, map[uint32]bool{1: true})),
				"a queue read during the call serves whatever notices came since")
		})
	}
}

// TestHandInTakesWhatAReadWouldHave: rows a notice carries go into a
// queue where a read would have put them: anywhere in a queue whose last
// full read found everything, before the tail of one that holds only the
// head; rows past the tail wait for the read that drains the queue, and
// a queue that holds nothing and knows nothing reads them (dirty). A row
// the queue has already (a read that began after the insert), has in
// flight or has served is not added again, rows outside the band are not
// the buffer's, a release holding the queue takes nothing, and the queue
// keeps at most maxFetch rows.
func TestHandInTakesWhatAReadWouldHave(t *testing.T) {
	t.Parallel()
	row := func(id uint64, prio int32, at int64) bufItem {
		return bufItem{Item: store.Item{ID: id, Priority: prio, DeliverAfter: at, UpdatedAt: 7}, shard: 1}
	}
	ids := func(q *shardQueue) (out []uint64) {
		for _, it := range q.items {
			out = append(out, it.ID)
		}
		return out
	}
	held := func(exhausted bool) (*topicBuf, *shardQueue) {
		b := newTopicBuf(bufKey{ns: "n", topic: "t", band: band{lo: 0, hi: 5}})
		q := b.queue(1)
		q.items = []bufItem{row(1, 1, 10), row(2, 3, 10)}
		q.exhausted = exhausted
		return b, q
	}

	b, q := held(true)
	q.handIn(b, []bufItem{row(3, 0, 50), row(4, 2, 50), row(5, 4, 50), row(6, 9, 50)})
	require.Equal(t, []uint64{3, 1, 4, 2, 5}, ids(q), "everything in the band, in order")
	require.False(t, q.dirty)
	require.Same(t, b, q.items[0].buf)

	b, q = held(false)
	q.handIn(b, []bufItem{row(3, 0, 50), row(5, 4, 50)})
	require.Equal(t, []uint64{3, 1, 2}, ids(q), "only what sorts before the tail")
	require.False(t, q.dirty, "the row past the tail is the drain's read's")

	b = newTopicBuf(bufKey{ns: "n", topic: "t", band: allPriorities})
	q = b.queue(1)
	q.handIn(b, []bufItem{row(3, 4, 50)})
	require.Empty(t, q.items, "a queue never read takes nothing")
	require.True(t, q.dirty, "and reads")
	require.Equal(t, uint64(1), q.notices)

	b, q = held(true)
	q.inflight = map[uint64]int64{8: 7}
	q.markServed(9, 7, time.Now())
	q.handIn(b, []bufItem{row(2, 3, 10), row(8, 2, 50), row(9, 2, 60), row(10, 2, 70)})
	require.Equal(t, []uint64{1, 10, 2}, ids(q), "buffered, in flight and served rows are not added again")

	b, q = held(true)
	q.fetching = make(chan struct{}) // a release: fetching, not reading
	q.handIn(b, []bufItem{row(3, 0, 50)})
	require.Equal(t, []uint64{1, 2}, ids(q))
	require.True(t, q.dirty, "a left-out row before the tail is read")

	b, q = held(true)
	var many []bufItem
	for i := range maxFetch {
		many = append(many, row(uint64(100+i), 4, int64(i)))
	}
	q.handIn(b, many)
	require.Len(t, q.items, maxFetch)
	require.False(t, q.exhausted, "a queue cut at maxFetch no longer holds everything")
	require.Equal(t, uint64(1), q.items[0].ID)
}
