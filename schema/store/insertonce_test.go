package store

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	peerv1 "github.com/triage-queue/triage/proto/triage/peer/v1"
)

// TestInsertAtOnceStoresAndReportsTheVersion: a group without dedup keys
// goes in one round trip; every batch's answer carries the version its
// rows were stored at, which is what a serve compares. A redelivered
// group, in which one batch is recorded already, goes the long way: the
// recorded batch is answered as the first time, with no version (its
// rows may have changed since), and the new one is stored once.
func TestInsertAtOnceStoresAndReportsTheVersion(t *testing.T) {
	f := newFixture(t)
	batch := func(id uint64, keys ...uint64) *peerv1.EnqueueBatch {
		b := &peerv1.EnqueueBatch{Namespace: ns, Topic: topic, BatchId: id, EnqueuedAtUs: f.nowUS - 5}
		for _, k := range keys {
			b.Items = append(b.Items, &peerv1.BufferedItem{Key: k, Priority: 2, DeliverAfterUs: f.nowUS - 1, LeaseMs: 1000,
				Payload: []byte("p"), Metadata: []byte(`{"a":"b"}`), ExpiresAtUs: f.nowUS + 60e6})
		}
		return b
	}
	a := batch(10, 10, 11)
	out, err := f.s.ItemInsertBatch(f.ctx, ItemInsertBatchParams{Batches: []*peerv1.EnqueueBatch{a}, NowUS: f.nowUS})
	require.NoError(t, err)
	require.Equal(t, f.nowUS, out[0].VersionUs)
	require.Equal(t, []uint64{0, 0}, out[0].DuplicateOf)
	row := f.get(11)
	require.Equal(t, f.nowUS, row.UpdatedAt, "the version reported is the row's")
	require.Equal(t, []byte("p"), row.Payload)
	require.Equal(t, f.nowUS-5, row.EnqueuedAt)
	require.Equal(t, f.nowUS+60e6, row.ExpiresAt.Int64)
	require.Equal(t, 1, f.count("SELECT COUNT(*) FROM enqueue_batches WHERE batch_id = 10"))

	b := batch(20, 20)
	out, err = f.s.ItemInsertBatch(f.ctx, ItemInsertBatchParams{Batches: []*peerv1.EnqueueBatch{a, b}, NowUS: f.nowUS + 7})
	require.NoError(t, err)
	require.Zero(t, out[0].VersionUs, "a batch applied before reports no version")
	require.Equal(t, []uint64{0, 0}, out[0].DuplicateOf)
	require.Equal(t, f.nowUS+7, out[1].VersionUs)
	require.Equal(t, 3, f.count("SELECT COUNT(*) FROM items"))
	require.Equal(t, f.nowUS, f.get(10).UpdatedAt, "the redelivery wrote nothing to the recorded batch's rows")
}

// TestInsertAtOnceRollsBackARefusedGroup: when the database refuses an
// item, nothing of the group stays, not even the batch record that the
// same multi-statement query wrote before the refused INSERT. The query
// stops at the failed statement with its transaction open on the
// connection; without the ROLLBACK there, the next query on that
// connection (its START TRANSACTION commits implicitly) would keep a
// record of a batch whose items were never stored, and its redelivery
// would be answered "applied": a lost enqueue. One connection in the
// pool makes the next insert use that very connection.
func TestInsertAtOnceRollsBackARefusedGroup(t *testing.T) {
	f := newFixture(t)
	f.db.SetMaxOpenConns(1)
	big := &peerv1.EnqueueBatch{Namespace: ns, Topic: topic, BatchId: 5, Items: []*peerv1.BufferedItem{
		{Key: 5}, {Key: 6, Metadata: []byte(`{"k":"` + strings.Repeat("x", 70000) + `"}`)}}}
	_, err := f.s.ItemInsertBatch(f.ctx, ItemInsertBatchParams{Batches: []*peerv1.EnqueueBatch{big}, NowUS: f.nowUS})
	require.True(t, IsPermanent(err), "%v", err)

	f.enqueue(7, 7)
	require.Zero(t, f.count("SELECT COUNT(*) FROM enqueue_batches WHERE batch_id = 5"), "the refused batch is not recorded")
	require.Zero(t, f.count("SELECT COUNT(*) FROM items WHERE id IN (5, 6)"))
	require.Equal(t, 1, f.count("SELECT COUNT(*) FROM items WHERE id = 7"))

	// Placed alone with Isolate, as the worker does next: the good item
	// goes in, the refused one to the dead letters.
	out, err := f.s.ItemInsertBatch(f.ctx, ItemInsertBatchParams{Batches: []*peerv1.EnqueueBatch{big}, NowUS: f.nowUS, Isolate: true})
	require.NoError(t, err)
	require.Contains(t, out[0].Error, "dead letters")
	require.Equal(t, 1, f.count("SELECT COUNT(*) FROM items WHERE id = 5"))
}
