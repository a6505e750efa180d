package store

import (
	"bytes"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	peerv1 "github.com/triage-queue/triage/proto/triage/peer/v1"
)

// TestItemList lists a topic's items by state in (priority,
// deliver_after, id) order, paged by cursor and within a priority range,
// and never another namespace's or topic's.
func TestItemList(t *testing.T) {
	f := newFixture(t)
	f.enqueue(1, 1, 2, 3, 4, 5, 6, 7, 8, 9) // priority id%3, deliver_after now-id
	insert := func(batch uint64, namespace, topic string, items ...*peerv1.BufferedItem) {
		t.Helper()
		b := &peerv1.EnqueueBatch{Namespace: namespace, Topic: topic, BatchId: batch, EnqueuedAtUs: f.nowUS, Items: items}
		out, err := f.s.ItemInsertBatch(f.ctx, ItemInsertBatchParams{Batches: []*peerv1.EnqueueBatch{b}, NowUS: f.nowUS})
		require.NoError(t, err)
		require.Empty(t, out[0].Error)
	}
	big := bytes.Repeat([]byte("x"), 3000)
	insert(2, ns, topic, &peerv1.BufferedItem{Key: 10, Priority: 3, DeliverAfterUs: f.nowUS - 100, LeaseMs: 1000, Payload: big},
		&peerv1.BufferedItem{Key: 20, Priority: 5, DeliverAfterUs: f.nowUS + 3600e6, LeaseMs: 1000},
		&peerv1.BufferedItem{Key: 21, Priority: 0, DeliverAfterUs: f.nowUS + 3600e6, LeaseMs: 1000},
		&peerv1.BufferedItem{Key: 22, Priority: 0, DeliverAfterUs: f.nowUS + 7200e6, LeaseMs: 1000})
	// Others' items, in every state's range: never listed.
	insert(3, "other", topic, &peerv1.BufferedItem{Key: 30, DeliverAfterUs: f.nowUS - 1000, LeaseMs: 1000},
		&peerv1.BufferedItem{Key: 32, DeliverAfterUs: f.nowUS + 1000e6, LeaseMs: 1000})
	insert(4, ns, "u", &peerv1.BufferedItem{Key: 31, DeliverAfterUs: f.nowUS - 1000, LeaseMs: 1000})
	// Lease 6 and 4 (and other's 30).
	var lease []Item
	for _, r := range f.readHead(ItemReadHeadParams{}) {
		if r.ID == 6 || r.ID == 4 {
			lease = append(lease, r)
		}
	}
	require.Len(t, lease, 2)
	f.serve(lease)
	other, _, err := f.s.ItemReadHead(f.ctx, ItemReadHeadParams{Namespace: "other", Topic: topic, PriorityLo: math.MinInt32, PriorityHi: math.MaxInt32, Limit: 10, NowUS: f.nowUS})
	require.NoError(t, err)
	f.serve(other[:1])

	list := func(state ItemState, lo, hi int32, limit int, after *Item) []Item {
		t.Helper()
		rows, err := f.s.ItemList(f.ctx, ItemListParams{Namespace: ns, Topic: topic, State: state, MinPriority: lo, MaxPriority: hi,
			After: after, Limit: limit, NowUS: f.nowUS})
		require.NoError(t, err)
		for _, r := range rows {
			require.Equal(t, ns, r.Namespace)
			require.Equal(t, topic, r.Topic)
		}
		return rows
	}
	all := func(state ItemState) []uint64 { return ids(list(state, math.MinInt32, math.MaxInt32, 100, nil)) }
	require.Equal(t, []uint64{9, 3, 7, 1, 8, 5, 2, 10}, all(StateReady))
	require.Equal(t, []uint64{6, 4}, all(StateLeased), "leased: by priority, then lease expiry")
	require.Equal(t, []uint64{21, 22, 20}, all(StateDelayed))

	// Paged two at a time from each page's last row: the same rows, each once.
	var paged []uint64
	var after *Item
	for {
		page := list(StateReady, math.MinInt32, math.MaxInt32, 2, after)
		paged = append(paged, ids(page)...)
		if len(page) < 2 {
			break
		}
		after = &page[len(page)-1]
	}
	require.Equal(t, all(StateReady), paged)

	// A priority range, and a cursor inside it.
	require.Equal(t, []uint64{7, 1, 8, 5, 2}, ids(list(StateReady, 1, 2, 100, nil)))
	require.Equal(t, []uint64{1, 8}, ids(list(StateReady, 1, 2, 2, &Item{Priority: 1, DeliverAfter: f.nowUS - 7, ID: 7})))
	require.Equal(t, []uint64{20}, ids(list(StateDelayed, 1, math.MaxInt32, 100, nil)))
	require.Empty(t, list(StateReady, 4, 4, 100, nil))
	require.Equal(t, []uint64{21, 22}, ids(list(StateDelayed, math.MinInt32, 0, 100, nil)), "the whole INT range below")

	// Payloads come cut, with their whole length.
	rows := list(StateReady, 3, 3, 100, nil)
	require.Len(t, rows, 1)
	require.Equal(t, big[:ListPayloadBytes], rows[0].Payload)
	require.Equal(t, int64(len(big)), rows[0].PayloadBytes)
	require.True(t, slices.ContainsFunc(list(StateLeased, 0, 0, 1, nil), func(r Item) bool { return r.LeaseToken == 1006 }))

	_, err = f.s.ItemList(f.ctx, ItemListParams{Namespace: ns, Topic: topic, Limit: 1})
	require.Error(t, err, "a state is required")
}

// TestItemListPastItsBudget: a list that must read past many rows of
// another state to fill its page stops at its budget with
// ErrListTooSlow, instead of holding a connection.
func TestItemListPastItsBudget(t *testing.T) {
	f := newFixture(t)
	for batch := range 20 {
		b := &peerv1.EnqueueBatch{Namespace: ns, Topic: topic, BatchId: uint64(batch + 1), EnqueuedAtUs: f.nowUS}
		for i := range 1000 {
			b.Items = append(b.Items, &peerv1.BufferedItem{Key: uint64(batch*1000 + i + 1), DeliverAfterUs: f.nowUS - 1, LeaseMs: 1000})
		}
		_, err := f.s.ItemInsertBatch(f.ctx, ItemInsertBatchParams{Batches: []*peerv1.EnqueueBatch{b}, NowUS: f.nowUS})
		require.NoError(t, err)
	}
	// No item is leased: the read goes through all 20000 ready ones.
	_, err := f.s.ItemList(f.ctx, ItemListParams{Namespace: ns, Topic: topic, State: StateLeased, MinPriority: math.MinInt32, MaxPriority: math.MaxInt32,
		Limit: 10, NowUS: f.nowUS, Budget: time.Millisecond})
	require.ErrorIs(t, err, ErrListTooSlow)
	rows, err := f.s.ItemList(f.ctx, ItemListParams{Namespace: ns, Topic: topic, State: StateReady, MinPriority: math.MinInt32, MaxPriority: math.MaxInt32,
		Limit: 10, NowUS: f.nowUS, Budget: time.Minute})
	require.NoError(t, err)
	require.Len(t, rows, 10)
}
