package dequeuer

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

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
