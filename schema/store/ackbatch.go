package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/triage-queue/triage/schema"
)

// MaxAckBatch bounds the refs one coalesced ack takes: lists up to this
// size keep schema.Keys' plan (TestKeysPlan covers 1-1000), and a
// statement's row locks stay few.
const MaxAckBatch = 500

// AckBatcher coalesces the acks that concurrent callers make on one shard
// and namespace into one statement, as FOQS batches its acks: in
// steady state many consumers ack a few items each, and a transaction per
// call spends its time in commits and lock round trips rather than in
// deleting rows.
//
// A batch is one ItemAckDelete: in the common case, one round trip
// carrying a transaction that deletes the batch's (id, token) pairs.
//
// Unlike FOQS, an ack is answered only once its batch has committed, so an
// acknowledged ack is never undone. A caller waits for the batch in flight
// (if any) to finish and then for its own; the batch in flight is never
// held back to wait for more, so a lone ack costs one round trip.
// Each caller gets exactly the per-ref results ItemAck would have given its
// refs, in order; two callers acking the same item in one batch are
// answered as if one went first (the second finds it gone). A batch that
// fails fails every caller in it, and they retry as they would after a
// failed ItemAck.
//
// The zero value is ready to use.
type AckBatcher struct {
	coalescer[ackKey, ackBatch]
	// Now, when set, is the time of db's primary (shardmap.Clock.Now):
	// the dedup tombstones' window is measured on the shard's clock, as
	// the enqueue that checks them measures it, so a node whose clock runs
	// behind does not let a key be taken again early. Nil: time.Now.
	Now func(ctx context.Context, db *sqlx.DB) time.Time
}

type ackKey struct {
	db     *sqlx.DB
	ns     string
	window time.Duration
}

type ackBatch struct {
	refs []LeaseRef
	res  []error
	err  error
}

// flushTimeout bounds one coalesced statement, which no single caller's
// context owns.
const flushTimeout = 30 * time.Second

// Ack acks p.Refs on db through the batcher: see ItemAck for the results.
// p.Now is ignored; the batch's start on b.Now stamps the dedup tombstones.
// When ctx ends first, Ack returns ErrOutcomeUnknown wrapping ctx's
// error: the refs are in a batch that still runs, so they may or may not
// be acked.
func (b *AckBatcher) Ack(ctx context.Context, db *sqlx.DB, p ItemAckParams) ([]error, error) {
	if len(p.Refs) == 0 {
		return nil, nil
	}
	var off int
	bt := b.add(ackKey{db: db, ns: p.Namespace, window: p.DedupWindow},
		func(a *ackBatch) bool { return len(a.refs)+len(p.Refs) <= MaxAckBatch },
		func(a *ackBatch) { off = len(a.refs); a.refs = append(a.refs, p.Refs...) },
		b.run)
	select {
	case <-bt.done:
	case <-ctx.Done():
		return nil, fmt.Errorf("ack: %w: the call ended while its batch was queued or running (%w)", ErrOutcomeUnknown, ctx.Err())
	}
	if bt.v.err != nil {
		return nil, bt.v.err
	}
	return bt.v.res[off : off+len(p.Refs)], nil
}

// run runs one ack batch as ItemAckDelete.
func (b *AckBatcher) run(k ackKey, a *ackBatch) {
	ctx, cancel := context.WithTimeout(context.Background(), flushTimeout)
	defer cancel()
	now := time.Now()
	if b.Now != nil && k.window > 0 {
		now = b.Now(ctx, k.db)
	}
	a.res, a.err = New(k.db).ItemAckDelete(ctx, ItemAckParams{Namespace: k.ns, Refs: a.refs, DedupWindow: k.window, Now: now})
}

// ItemAckDelete acks like ItemAck, with the same per-ref results, but in
// the common case in one round trip instead of four (BEGIN, a locking
// read, DELETE, COMMIT): one multi-statement query
//
//	START TRANSACTION;
//	[INSERT INTO dedup_tombstones ... SELECT ... FROM <schema.KeyValues: id, tok>
//	  WHERE i.lease_token = k.tok AND i.namespace = ? AND i.dedup_key IS NOT NULL ...;]
//	DELETE i FROM <schema.KeyValues: id, tok> WHERE i.lease_token = k.tok
//	  AND i.namespace = ?;
//	SET @triage_acked = ROW_COUNT();
//	BEGIN NOT ATOMIC IF @triage_acked <> n THEN ROLLBACK; END IF; END;
//	COMMIT;
//	SELECT @triage_acked
//
// that keeps the deletion only when every ref's row was deleted (n is the
// number of ids), which answers every ref. With a dedup window, the rows'
// dedup keys stay taken (tombstones) in the same transaction. Otherwise
// (a stale token, an item gone) nothing is kept, and ItemAck answers the
// batch the long way. A row's token cannot become the ref's between the
// tombstones' read and the DELETE (a token is the delivery's, given before
// the ack), so when the count is n every tombstone is of a row deleted. The DELETE goes through
// schema.KeyValues, so it locks, and waits for, the named rows only, in id
// order, as the serve UPDATE does.
//
// It is not one single-table "DELETE ... WHERE id IN (...) RETURNING":
// RETURNING needs the single-table form, which takes no index hint in
// MariaDB 10.11, and once a batch names more ids than the optimizer
// believes the table holds (a steady-state table of a few dozen rows, acks
// of a hundred), that form scans the whole table under row locks, waits
// for rows being served or inserted, and deadlocks with serves.
func (s Store) ItemAckDelete(ctx context.Context, p ItemAckParams) ([]error, error) {
	results := make([]error, len(p.Refs))
	if len(p.Refs) == 0 {
		return results, nil
	}
	token := make(map[uint64]uint64, len(p.Refs))
	ids := make([]uint64, 0, len(p.Refs))
	for _, r := range p.Refs {
		t, ok := token[r.Key]
		switch {
		case !ok:
			token[r.Key] = r.Token
			ids = append(ids, r.Key)
		case t != r.Token:
			// Which token a full count matched would be unknown.
			return s.ItemAck(ctx, p)
		}
	}
	rows := make([][]any, len(ids))
	for i, id := range ids {
		rows[i] = []any{id, token[id]}
	}
	k, kargs := schema.KeyValues("items", "i", []string{"tok"}, rows)
	var q stmt
	q.add("START TRANSACTION;")
	// The tombstones of the rows about to go, in the deleting transaction
	// (see tombstoneAt); a count short of n rolls them back with the
	// DELETE.
	nowUS := p.Now.UnixMicro()
	q.add(ackTombstonesSQL(k), append(append([]any{nowUS + p.DedupWindow.Microseconds(),
		nowUS + max(p.DedupWindow, KeyMemory).Microseconds()}, kargs...), p.Namespace)...)
	q.add("DELETE i FROM "+k, kargs...)
	q.add(" WHERE i.lease_token = k.tok AND i.namespace = ?", p.Namespace)
	q.add(";SET @triage_acked = ROW_COUNT();BEGIN NOT ATOMIC IF @triage_acked <> ? THEN ROLLBACK; END IF; END;COMMIT;SELECT @triage_acked", len(ids))
	var acked int
	err := schema.Retry(ctx, func() error {
		var err error
		acked, err = ackAtOnce(ctx, s.db, q.sql.String(), q.args)
		return err
	})
	if errors.Is(err, ErrOutcomeUnknown) {
		// The query, COMMIT included, was sent and its answer lost: it
		// deleted every ref's row or none.
		lost := make([]int, len(p.Refs))
		for i := range lost {
			lost[i] = i
		}
		return s.settleAck(ctx, p, lost, results, fmt.Errorf("ack: %w", err))
	}
	if err != nil {
		return nil, fmt.Errorf("ack: %w", err)
	}
	if acked != len(ids) {
		return s.ItemAck(ctx, p)
	}
	// Every id's row went under its one token: the first ref acked it,
	// any later ref to it finds it gone.
	done := make(map[uint64]bool, len(ids))
	for i, r := range p.Refs {
		if done[r.Key] {
			results[i] = ErrNotFound
		}
		done[r.Key] = true
	}
	return results, nil
}

// ackTombstonesSQL keeps the dedup keys of the rows of k (schema.KeyValues
// with a tok column) that carry k's token taken: tombstoneUpsertSQL for a
// set of rows. Its arguments: the window's end, the expiry, k's, the
// namespace. READ
// COMMITTED reads the rows without locks; the DELETE after it, which
// locks them, settles whether they go.
func ackTombstonesSQL(k string) string {
	return tombstoneInsert + " SELECT i.namespace, i.topic, i.dedup_key, i.id, ?, i.enqueued_at, ? FROM " + k +
		" WHERE i.lease_token = k.tok AND i.dedup_key IS NOT NULL AND i.namespace = ?" + tombstoneOnDuplicate + ";"
}

// ackAtOnce runs ItemAckDelete's multi-statement query (see onConn) and
// returns the count its last statement reads. An error after the query
// was sent with no answer from the server is ErrOutcomeUnknown (sentErr):
// its COMMIT may have run.
func ackAtOnce(ctx context.Context, db *sqlx.DB, q string, args []any) (n int, err error) {
	err = onConn(ctx, db, func(conn *sqlx.Conn) error {
		n, err = lastCount(ctx, conn, q, args)
		return sentErr(err)
	})
	return n, err
}

// lastCount runs q and returns the one integer of its only result set
// (the driver skips the results without rows), or the first error of any
// of its statements.
func lastCount(ctx context.Context, conn *sqlx.Conn, q string, args []any) (int, error) {
	rows, err := conn.QueryContext(ctx, q, args...)
	if err != nil {
		return 0, err
	}
	defer rows.Close()
	n, got := 0, false
	for rows.Next() {
		if err := rows.Scan(&n); err != nil {
			return 0, err
		}
		got = true
	}
	for rows.NextResultSet() {
	}
	if err := rows.Err(); err != nil {
		return 0, err
	}
	if !got {
		return 0, errors.New("no count came back")
	}
	return n, nil
}
