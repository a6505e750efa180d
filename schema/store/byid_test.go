package store

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/triage-queue/triage/schema/schematest"
)

// TestByIDStatementsLockOnlyTheirRows: ack (both forms), nack, extend, unserve and the
// dead-lettering of the lease path name their rows by id. Left to itself, the
// optimizer reads such a statement through the ready index (namespace
// prefix) or a full scan whenever the table is small, as a queue that keeps
// up is, and then locks, and waits for, every row it scans. A
// drill saw acks and unserves queue behind buffered rows for 10 s after
// each failover that way. Each statement must go by primary key: with an
// unrelated row of the same namespace locked by another transaction for
// the whole test, every one of them completes.
func TestByIDStatementsLockOnlyTheirRows(t *testing.T) {
	ctx := t.Context()
	db := schematest.DB(t, map[string]string{"tx_isolation": "'READ-COMMITTED'"})
	s := New(db)

	now := time.Now()
	nowUS := now.UnixMicro()
	const ns, topic = "ns", "t"
	// Statistics taken while the table was empty, as they are on a queue
	// that keeps up (and on a just-promoted primary): with a few dozen rows
	// in it now, the optimizer reads a lookup of ten ids as a full scan.
	_, err := db.ExecContext(ctx, "ANALYZE TABLE items")
	require.NoError(t, err)
	// Rows 1..39 are leased with token 100+id; row 40 is the unrelated one.
	for id := uint64(1); id <= 40; id++ {
		_, err := db.ExecContext(ctx, `INSERT INTO items (id, namespace, topic, priority, deliver_after, enqueued_at, lease_ms,
			attempts, lease_token, leased_until, payload, updated_at) VALUES (?, ?, ?, 0, ?, ?, 30000, 1, ?, ?, '', ?)`,
			id, ns, topic, nowUS+30e6, nowUS, 100+id, nowUS+30e6, nowUS)
		require.NoError(t, err)
	}
	// Rows 41..50 were delivered five times and their leases lapsed: the
	// lease path dead-letters or (at-most-once) deletes such rows.
	for id := uint64(41); id <= 50; id++ {
		_, err := db.ExecContext(ctx, `INSERT INTO items (id, namespace, topic, priority, deliver_after, enqueued_at, lease_ms,
			attempts, lease_token, leased_until, payload, updated_at) VALUES (?, ?, ?, 0, ?, ?, 30000, 5, ?, ?, '', ?)`,
			id, ns, topic, nowUS-1e6, nowUS, 100+id, nowUS-1e6, nowUS)
		require.NoError(t, err)
	}

	// Rows 101..600 leased with token 100+id: a full ack batch
	// (MaxAckBatch).
	var q strings.Builder
	var args []any
	q.WriteString(`INSERT INTO items (id, namespace, topic, priority, deliver_after, enqueued_at, lease_ms,
		attempts, lease_token, leased_until, payload, updated_at) VALUES `)
	for id := uint64(101); id <= 600; id++ {
		if id > 101 {
			q.WriteString(",")
		}
		q.WriteString("(?, ?, ?, 0, ?, ?, 30000, 1, ?, ?, '', ?)")
		args = append(args, id, ns, topic, nowUS+30e6, nowUS, 100+id, nowUS+30e6, nowUS)
	}
	_, err = db.ExecContext(ctx, q.String(), args...)
	require.NoError(t, err)

	holder, err := db.BeginTxx(ctx, nil)
	require.NoError(t, err)
	t.Cleanup(func() { holder.Rollback() })
	_, err = holder.ExecContext(ctx, "SELECT id FROM items WHERE id = 40 FOR UPDATE")
	require.NoError(t, err)

	// Each call gets far less than innodb_lock_wait_timeout (50 s): a
	// statement that scans into row 9 waits until its context ends.
	within := func() context.Context {
		c, cancel := context.WithTimeout(ctx, 5*time.Second)
		t.Cleanup(cancel)
		return c
	}
	// Each call names ten rows: a single id is a const lookup, which the
	// optimizer always takes by primary key.
	refs := func(from uint64) []LeaseRef {
		var out []LeaseRef
		for id := from; id < from+10; id++ {
			out = append(out, LeaseRef{Key: id, Token: 100 + id})
		}
		return out
	}
	res, err := s.ItemAck(within(), ItemAckParams{Namespace: ns, Refs: refs(1), DedupWindow: time.Minute, Now: now})
	require.NoError(t, err, "ack")
	require.Equal(t, make([]error, 10), res)

	// The one-statement ack (ItemAckDelete): a few rows, a stale token
	// and a missing id among them (the diagnostic read), and a full batch.
	small := append(refs(1)[:0:0], LeaseRef{Key: 32, Token: 132}, LeaseRef{Key: 33, Token: 7}, LeaseRef{Key: 34, Token: 134},
		LeaseRef{Key: 35, Token: 135}, LeaseRef{Key: 36, Token: 136}, LeaseRef{Key: 9999, Token: 1})
	res, err = s.ItemAckDelete(within(), ItemAckParams{Namespace: ns, Refs: small, DedupWindow: time.Minute, Now: now})
	require.NoError(t, err, "ack delete")
	require.Equal(t, []error{nil, ErrStaleLease, nil, nil, nil, ErrNotFound}, res)
	var full []LeaseRef
	for id := uint64(101); id < 101+MaxAckBatch; id++ {
		full = append(full, LeaseRef{Key: id, Token: 100 + id})
	}
	res, err = s.ItemAckDelete(within(), ItemAckParams{Namespace: ns, Refs: full, DedupWindow: time.Minute, Now: now})
	require.NoError(t, err, "ack delete of a full batch")
	require.Equal(t, make([]error, MaxAckBatch), res)

	var nacks []Nack
	for _, r := range refs(11) {
		nacks = append(nacks, Nack{LeaseRef: r, Delay: time.Second})
	}
	res, _, err = s.ItemNack(within(), ItemNackParams{Namespace: ns, Nacks: nacks, DedupWindow: time.Minute, NowUS: nowUS})
	require.NoError(t, err, "nack")
	require.Equal(t, make([]error, 10), res)

	var us []Undelivered
	for _, r := range refs(21) {
		us = append(us, Undelivered{LeaseRef: r, DeliverAfterUS: nowUS})
	}
	require.NoError(t, s.ItemUnserve(within(), ItemUnserveParams{Namespace: ns, Items: us, NowUS: nowUS}), "unserve")
	var leased int
	require.NoError(t, db.GetContext(ctx, &leased, "SELECT COUNT(*) FROM items WHERE id BETWEEN 21 AND 30 AND lease_token <> 0"))
	require.Zero(t, leased, "unserve hands the items back")

	require.NoError(t, s.retire(within(), []uint64{41, 42, 43, 44, 45}, []uint64{46, 47, 48, 49, 50}, time.Minute, nowUS), "retire")
	var dead, left int
	require.NoError(t, db.GetContext(ctx, &dead, "SELECT COUNT(*) FROM dead_letters WHERE id BETWEEN 41 AND 45"))
	require.NoError(t, db.GetContext(ctx, &left, "SELECT COUNT(*) FROM items WHERE id BETWEEN 41 AND 50"))
	require.Equal(t, 5, dead, "out of attempts: dead-lettered")
	require.Zero(t, left, "dead-lettered or expired at most once: gone from items")

	_, err = s.ItemExtend(within(), ItemExtendParams{Namespace: ns, Ref: LeaseRef{Key: 31, Token: 131}, Lease: time.Minute, Now: now})
	require.NoError(t, err, "extend")
}

// TestAckOfMoreRowsThanTheTableHoldsLocksOnlyItsRows: in steady state the
// items table holds a few dozen rows and a coalesced ack names a hundred
// ids (triage-steady: 70 rows, acks of 146). Given such a statement the
// optimizer reads the whole table instead of looking ids up, and a
// statement that scans locks, and waits for, every row it passes: the
// single-table ack DELETE of before waited for rows being served and
// deadlocked with serves (72 deadlocks in 40 s on one shard). With one
// ready row locked by another transaction (a serve in progress), an ack of
// more rows than the statistics say the table holds must complete and
// answer each ref, both when every ref holds (one round trip) and when
// some name rows that are gone (the long way).
func TestAckOfMoreRowsThanTheTableHoldsLocksOnlyItsRows(t *testing.T) {
	ctx := t.Context()
	db := schematest.DB(t, map[string]string{"tx_isolation": "'READ-COMMITTED'"})
	s := New(db)
	nowUS := time.Now().UnixMicro()
	const ns, topic = "ns", "t"
	insert := func(from, to uint64) {
		for id := from; id <= to; id++ {
			_, err := db.ExecContext(ctx, `INSERT INTO items (id, namespace, topic, priority, deliver_after, enqueued_at, lease_ms,
				attempts, lease_token, leased_until, payload, updated_at) VALUES (?, ?, ?, ?, ?, ?, 30000, 1, ?, ?, '', ?)`,
				id, ns, topic, id%3, nowUS+30e6, nowUS, 100+id, nowUS+30e6, nowUS)
			require.NoError(t, err)
		}
	}
	// Statistics of an 8-row table, kept while it grows, as a table that
	// churns holds statistics of some moment.
	insert(1, 8)
	_, err := db.ExecContext(ctx, "ALTER TABLE items STATS_AUTO_RECALC=0")
	require.NoError(t, err)
	_, err = db.ExecContext(ctx, "ANALYZE TABLE items")
	require.NoError(t, err)
	insert(9, 60)

	serving, err := db.BeginTxx(ctx, nil)
	require.NoError(t, err)
	t.Cleanup(func() { serving.Rollback() })
	_, err = serving.ExecContext(ctx, "SELECT id FROM items WHERE id = 4 FOR UPDATE")
	require.NoError(t, err)

	ack := func(name string, refs []LeaseRef, want []error) {
		t.Helper()
		c, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		res, err := s.ItemAckDelete(c, ItemAckParams{Namespace: ns, Refs: refs, DedupWindow: time.Minute, Now: time.Now()})
		require.NoError(t, err, "%s: the ack must not wait for the row being served", name)
		require.Equal(t, want, res, name)
	}
	var refs []LeaseRef
	var want []error
	for id := uint64(1); id <= 30; id++ {
		if id != 4 {
			refs = append(refs, LeaseRef{Key: id, Token: 100 + id})
			want = append(want, nil)
		}
	}
	ack("every ref holds", refs, want)
	refs, want = nil, nil
	for id := uint64(31); id <= 60; id++ {
		refs = append(refs, LeaseRef{Key: id, Token: 100 + id})
		want = append(want, nil)
	}
	for id := uint64(1000); id < 1020; id++ { // acked before, or never there
		refs = append(refs, LeaseRef{Key: id, Token: id})
		want = append(want, ErrNotFound)
	}
	ack("some refs name rows gone", refs, want)
	var left []uint64
	require.NoError(t, db.SelectContext(ctx, &left, "SELECT id FROM items"))
	require.Equal(t, []uint64{4}, left)
}

// TestAckAtOnceReportsALaterStatementsError: the one-round-trip ack's
// transaction fails as a whole when a statement after its DELETE fails:
// the error is returned, and nothing of it is committed.
func TestAckAtOnceReportsALaterStatementsError(t *testing.T) {
	ctx := t.Context()
	db := schematest.DB(t, map[string]string{"tx_isolation": "'READ-COMMITTED'"})
	_, err := db.ExecContext(ctx, `INSERT INTO items (id, namespace, topic, priority, deliver_after, enqueued_at, lease_ms,
		payload, updated_at) VALUES (1, 'ns', 't', 0, 0, 0, 30000, '', 0)`)
	require.NoError(t, err)
	count := func() (n int) {
		require.NoError(t, db.GetContext(ctx, &n, "SELECT COUNT(*) FROM items"))
		return n
	}
	for _, q := range []string{
		"START TRANSACTION;DELETE FROM items;SELECT * FROM no_such_table;COMMIT;SELECT 1",
		"START TRANSACTION;DELETE FROM items;INSERT INTO items (id) VALUES ('x');COMMIT;SELECT 1",
	} {
		_, err := countsAtOnce(ctx, db, q, nil, 1)
		require.Error(t, err, q)
		require.Equal(t, 1, count(), "nothing of %q is committed", q)
	}
	_, err = countsAtOnce(ctx, db, "START TRANSACTION;SELECT 1;COMMIT;SELECT * FROM no_such_table", nil, 1)
	require.Error(t, err, "an error after the count is reported too")
	n, err := countsAtOnce(ctx, db, "START TRANSACTION;SAVEPOINT a;DELETE FROM items;SET @triage_acked = ROW_COUNT();"+
		"BEGIN NOT ATOMIC IF @triage_acked <> 2 THEN ROLLBACK TO SAVEPOINT a; END IF; END;COMMIT;SELECT @triage_acked", nil, 1)
	require.NoError(t, err)
	require.Equal(t, []int{1}, n)
	require.Equal(t, 1, count(), "a count short of the one wanted rolls back")
	n, err = countsAtOnce(ctx, db, "START TRANSACTION;SAVEPOINT a;DELETE FROM items;SET @triage_acked = ROW_COUNT();"+
		"BEGIN NOT ATOMIC IF @triage_acked <> 1 THEN ROLLBACK TO SAVEPOINT a; END IF; END;COMMIT;SELECT @triage_acked", nil, 1)
	require.NoError(t, err)
	require.Equal(t, []int{1}, n)
	require.Zero(t, count(), "the count wanted commits")
}
