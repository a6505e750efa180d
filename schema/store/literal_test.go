package store

import (
	"bytes"
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	peerv1 "github.com/triage-queue/triage/proto/triage/peer/v1"
)

// TestInsertStoresEveryValueAsSent: rows go into the INSERT as literals
// (sqlValues), so every column must come back exactly as sent, whatever
// bytes a value holds (quotes, backslashes, NUL, '?', every byte value)
// and whatever its size (a payload over maxHexLiteral is a placeholder),
// on each of the insert's paths: at once, the long way (a dedup key), and
// row by row (Isolate).
func TestInsertStoresEveryValueAsSent(t *testing.T) {
	f := newFixture(t)
	every := make([]byte, 256)
	for i := range every {
		every[i] = byte(i)
	}
	tricky := []byte("a'b\"c\\d?e\x00f\x1ag;--")
	large := bytes.Repeat(every, maxHexLiteral/256+3) // a placeholder
	items := func(base uint64, dedup string) []*peerv1.BufferedItem {
		return []*peerv1.BufferedItem{
			{Key: base, Payload: every, Metadata: []byte(`{"q":"it's \"x\" \\ ?"}`), Priority: math.MinInt32,
				DeliverAfterUs: -1, LeaseMs: math.MaxUint32, ExpiresAtUs: math.MaxInt64, DedupKey: dedup},
			{Key: base + 1, Payload: tricky, Priority: math.MaxInt32, DeliverAfterUs: f.nowUS},
			{Key: base + 2, Payload: large, Metadata: large[:maxHexLiteral]},
			{Key: base + 3, Payload: nil},
			{Key: math.MaxUint64 - base, Payload: []byte{}},
		}
	}
	paths := []struct {
		name    string
		base    uint64
		dedup   string
		isolate bool
	}{
		{"at once", 100, "", false},
		{"the long way", 200, "k'?\\\x00", false},
		{"row by row", 300, "", true},
	}
	for _, p := range paths {
		t.Run(p.name, func(t *testing.T) {
			b := &peerv1.EnqueueBatch{Namespace: ns, Topic: topic, BatchId: p.base, EnqueuedAtUs: f.nowUS - 3, Items: items(p.base, p.dedup)}
			tp := "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
			out, err := f.s.ItemInsertBatch(f.ctx, ItemInsertBatchParams{Batches: []*peerv1.EnqueueBatch{b}, NowUS: f.nowUS,
				Isolate: p.isolate, Traceparents: []string{tp}})
			require.NoError(t, err)
			require.Empty(t, out[0].Error)
			for _, it := range b.Items {
				row := f.get(it.Key)
				require.Equal(t, ns, row.Namespace)
				require.Equal(t, topic, row.Topic)
				require.Equal(t, it.Priority, row.Priority)
				require.Equal(t, it.DeliverAfterUs, row.DeliverAfter)
				require.Equal(t, f.nowUS-3, row.EnqueuedAt)
				require.Equal(t, it.LeaseMs, row.LeaseMS)
				require.Equal(t, it.ExpiresAtUs != 0, row.ExpiresAt.Valid)
				require.Equal(t, it.ExpiresAtUs, row.ExpiresAt.Int64)
				require.Equal(t, it.DedupKey != "", row.DedupKey.Valid)
				require.Equal(t, it.DedupKey, row.DedupKey.String)
				require.True(t, bytes.Equal(it.Payload, row.Payload), "payload of %d: %d bytes back for %d", it.Key, len(row.Payload), len(it.Payload))
				require.NotNil(t, row.Payload, "an empty payload is not NULL")
				require.True(t, bytes.Equal(it.Metadata, row.Metadata), "metadata of %d", it.Key)
				require.Equal(t, len(it.Metadata) == 0, row.Metadata == nil, "no metadata is NULL")
				require.Equal(t, tp, row.Traceparent.String)
				require.Equal(t, f.nowUS, row.UpdatedAt)
			}
		})
	}
}
