package store

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/triage-queue/triage/schema"
)

// MaxAckBatch bounds the refs one coalesced transaction acks: lists up to
// this size keep schema.Keys' plan (TestKeysPlan covers 1-1000), and a
// statement's row locks stay few.
const MaxAckBatch = 500

// MaxServeBatch bounds the deliveries one coalesced serve takes, for the
// same reasons as MaxAckBatch.
const MaxServeBatch = 500

// flushTimeout bounds one coalesced transaction, which no single caller's
// context owns.
const flushTimeout = 30 * time.Second

// Batcher coalesces the writes concurrent callers make on one shard, acks
// and serves, into one transaction sent as one multi-statement query
// (writeAtOnce), as FOQS batches its acks with the next lease: in steady
// state many consumers ack a few items each while others are handed a
// few, and a commit per call spends the shard's time on commits (an fsync
// of the binary log and one of the redo log each) rather than on rows. A
// process that runs a router and a dequeuer gives both one Batcher, so a
// delivery's serve and the ack of an earlier one share a commit.
//
// Unlike FOQS, an ack is answered only once its transaction has committed,
// so an acknowledged ack is never undone. A caller waits for the
// transaction in flight (if any) to finish and then for its own; the one
// in flight is never held back to wait for more, so a lone call costs one
// round trip.
//
// Acks: each caller gets exactly the per-ref results ItemAck would have
// given its refs, in order; two callers acking the same item in one batch
// are answered as if one went first (the second finds it gone). The acks
// of one namespace and dedup window are one DELETE, kept only when every
// ref held (a savepoint takes it back otherwise, and each of its callers
// answers its own refs with ItemAck after the commit), so one stale token
// costs its own callers the long way and nobody else. A transaction that fails fails every caller
// in it, and they retry as they would after a failed ItemAck.
//
// Serves: each caller gets the result ItemServe would have given its
// deliveries alone: the ids served. A batch never holds the same row
// twice (a row buffered twice, read at two versions, goes to the next
// batch), so one caller's stale copy cannot keep another's current copy
// from being served.
//
// The zero value is ready to use.
type Batcher struct {
	coalescer[*sqlx.DB, shardWrites]
	// Now, when set, is the time of db's primary (shardmap.Clock.Now):
	// the dedup tombstones' window is measured on the shard's clock, as
	// the enqueue that checks them measures it, so a node whose clock runs
	// behind does not let a key be taken again early. Nil: time.Now.
	Now func(ctx context.Context, db *sqlx.DB) time.Time
}

// shardWrites is one transaction's worth of a shard's writes.
type shardWrites struct {
	acks  []*ackPart
	refs  int // over acks
	serve serveBatch
}

// ackPart is the acks of one namespace and dedup window in a batch: one
// DELETE. writeAtOnce leaves one outcome: res, err, longWay or lost.
type ackPart struct {
	ns     string
	window time.Duration
	refs   []LeaseRef
	// now stamps the dedup tombstones.
	now time.Time
	// res answers every ref: the part committed.
	res []error
	// err is every caller's: the transaction failed.
	err error
	// longWay: the part was not kept (a stale ref, an item gone, one id
	// under two tokens); each caller answers its own refs with ItemAck.
	longWay bool
	// lost is why the transaction's outcome is unknown: each caller
	// settles its own refs (settleAck).
	lost error
}

// answer is the results of the part's refs [off, off+n), for the caller
// that added them. The long way and a settle run here, on the caller's
// goroutine and context, not on the batcher's flusher: a namespace whose
// acks go the long way (stale tokens, ids of other namespaces) delays no
// other caller's transaction on the shard.
func (a *ackPart) answer(ctx context.Context, s Store, off, n int) ([]error, error) {
	p := ItemAckParams{Namespace: a.ns, Refs: a.refs[off : off+n], DedupWindow: a.window, Now: a.now}
	switch {
	case a.err != nil:
		return nil, a.err
	case a.lost != nil:
		all := make([]int, n)
		for i := range all {
			all[i] = i
		}
		return s.settleAck(ctx, p, all, nil, a.lost)
	case a.longWay:
		return s.ItemAck(ctx, p)
	}
	return a.res[off : off+n], nil
}

type serveBatch struct {
	ds    []Delivery
	ids   map[uint64]bool
	nowUS int64
	held  map[uint64]bool
	err   error
}

// Ack acks p.Refs on db through the batcher: see ItemAck for the results.
// p.Now is ignored; the transaction's start on b.Now stamps the dedup
// tombstones. When ctx ends first, Ack returns ErrOutcomeUnknown wrapping
// ctx's error: the refs are in a transaction that still runs, so they may
// or may not be acked.
func (b *Batcher) Ack(ctx context.Context, db *sqlx.DB, p ItemAckParams) ([]error, error) {
	if len(p.Refs) == 0 {
		return nil, nil
	}
	var part *ackPart
	var off int
	bt := b.add(db,
		func(w *shardWrites) bool { return w.refs+len(p.Refs) <= MaxAckBatch },
		func(w *shardWrites) {
			part = w.ackPart(p.Namespace, p.DedupWindow)
			off = len(part.refs)
			part.refs = append(part.refs, p.Refs...)
			w.refs += len(p.Refs)
		},
		b.run)
	select {
	case <-bt.done:
	case <-ctx.Done():
		return nil, fmt.Errorf("ack: %w: the call ended while its batch was queued or running (%w)", ErrOutcomeUnknown, ctx.Err())
	}
	return part.answer(ctx, New(db), off, len(p.Refs))
}

// ackPart returns the batch's part for a namespace and window, new if
// there is none yet.
func (w *shardWrites) ackPart(ns string, window time.Duration) *ackPart {
	for _, a := range w.acks {
		if a.ns == ns && a.window == window {
			return a
		}
	}
	a := &ackPart{ns: ns, window: window}
	w.acks = append(w.acks, a)
	return a
}

// Serve serves p's deliveries on db through the batcher: see ItemServe.
// It waits for its batch even when ctx ends first (the flush has a
// deadline of its own, flushTimeout): a batch that stamped the rows has
// counted an attempt and hidden each row for its delivery lease, so the
// caller must learn which rows are now its own, to hand them out or
// unserve them. Returning early would lose that, and the rows would stay
// hidden for the whole lease (up to 12 h) with an attempt no consumer saw.
func (b *Batcher) Serve(_ context.Context, db *sqlx.DB, p ItemServeParams) (map[uint64]bool, error) {
	if len(p.Deliveries) == 0 {
		return map[uint64]bool{}, nil
	}
	bt := b.add(db, func(w *shardWrites) bool { return w.serve.fits(p.Deliveries) }, func(w *shardWrites) {
		sb := &w.serve
		if sb.ids == nil {
			sb.ids = map[uint64]bool{}
		}
		for _, d := range p.Deliveries {
			sb.ds = append(sb.ds, d)
			sb.ids[d.ID] = true
		}
		sb.nowUS = max(sb.nowUS, p.NowUS)
	}, b.run)
	<-bt.done
	sb := &bt.v.serve
	if sb.err != nil {
		return nil, sb.err
	}
	mine := make(map[uint64]bool, len(p.Deliveries))
	for _, d := range p.Deliveries {
		if sb.held[d.ID] {
			mine[d.ID] = true
		}
	}
	return mine, nil
}

// fits reports whether ds can join the batch: room left, and no row the
// batch already serves.
func (sb *serveBatch) fits(ds []Delivery) bool {
	if len(sb.ds)+len(ds) > MaxServeBatch {
		return false
	}
	for _, d := range ds {
		if sb.ids[d.ID] {
			return false
		}
	}
	return true
}

// run runs one batch as writeAtOnce.
func (b *Batcher) run(db *sqlx.DB, w *shardWrites) {
	ctx, cancel := context.WithTimeout(context.Background(), flushTimeout)
	defer cancel()
	now := time.Now()
	if b.Now != nil {
		for _, a := range w.acks {
			if a.window > 0 {
				now = b.Now(ctx, db)
				break
			}
		}
	}
	New(db).writeAtOnce(ctx, w.acks, &w.serve, now)
}

// ItemAckDelete acks like ItemAck, with the same per-ref results, but in
// the common case in one round trip instead of four (BEGIN, a locking
// read, DELETE, COMMIT): writeAtOnce with these acks alone.
func (s Store) ItemAckDelete(ctx context.Context, p ItemAckParams) ([]error, error) {
	if len(p.Refs) == 0 {
		return nil, nil
	}
	a := &ackPart{ns: p.Namespace, window: p.DedupWindow, refs: p.Refs}
	s.writeAtOnce(ctx, []*ackPart{a}, nil, p.Now)
	return a.answer(ctx, s, 0, len(p.Refs))
}

// writeAtOnce runs a shard's acks and serves as one transaction in one
// round trip, one multi-statement query:
//
//	START TRANSACTION;
//	-- per ack part j (a namespace and dedup window), n_j distinct ids:
//	SAVEPOINT triage_ack<j>;
//	[INSERT INTO dedup_tombstones ... SELECT ... FROM <schema.KeyValues: id, tok>
//	  WHERE i.lease_token = k.tok AND i.namespace = ? AND i.dedup_key IS NOT NULL ...;]
//	DELETE i FROM <schema.KeyValues: id, tok> WHERE i.lease_token = k.tok
//	  AND i.namespace = ?;
//	SET @triage_acked<j> = ROW_COUNT();
//	BEGIN NOT ATOMIC IF @triage_acked<j> <> n_j THEN ROLLBACK TO SAVEPOINT triage_ack<j>; END IF; END;
//	-- the serves, as ItemServe's UPDATE:
//	UPDATE <schema.KeyValues: id, tok, until_us, ver> SET ... WHERE i.updated_at = k.ver ...;
//	SET @triage_served = ROW_COUNT();
//	COMMIT;
//	SELECT @triage_acked0, ..., @triage_served
//
// An ack part is kept only when every ref's row was deleted, which
// answers every ref; with a dedup window its rows' dedup keys stay taken
// (tombstones) in the same transaction. Otherwise (a stale token, an item
// gone) the savepoint takes the part back and its callers answer their
// refs the long way after the commit (ackPart.answer), as they do for a
// part that names one item under two tokens. A row's token cannot become the ref's between the tombstones'
// read and the DELETE (a token is the delivery's, given before the ack),
// so when the count is n every tombstone is of a row deleted. The DELETE
// goes through schema.KeyValues, so it locks, and waits for, the named
// rows only, in id order, as the serve UPDATE does.
//
// It is not one single-table "DELETE ... WHERE id IN (...) RETURNING":
// RETURNING needs the single-table form, which takes no index hint in
// MariaDB 10.11, and once a batch names more ids than the optimizer
// believes the table holds (a steady-state table of a few dozen rows, acks
// of a hundred), that form scans the whole table under row locks, waits
// for rows being served or inserted, and deadlocks with serves.
//
// When the answer is lost after the query was sent (ErrOutcomeUnknown),
// the COMMIT took effect for all of it or none: the acks' callers settle
// them (settleAck) and the serves are read back by token (servedOf), so
// every caller still learns what holds. The outcomes land in the parts
// and in sv (nil: no serves).
func (s Store) writeAtOnce(ctx context.Context, acks []*ackPart, sv *serveBatch, now time.Time) {
	var q stmt
	q.add("START TRANSACTION;")
	var sent []*ackPart
	var distinct []int
	for _, a := range acks {
		a.now = now
		n, ok := s.addAckPart(&q, a, len(sent), now)
		if !ok {
			a.longWay = true
			continue
		}
		sent = append(sent, a)
		distinct = append(distinct, n)
	}
	serving := sv != nil && len(sv.ds) > 0
	if serving {
		addServe(&q, sv.ds, sv.nowUS)
		q.add(";SET @triage_served = ROW_COUNT();")
	}
	if len(sent) > 0 || serving {
		q.add("COMMIT;SELECT ")
		for j := range sent {
			q.add("@triage_acked" + strconv.Itoa(j) + ",")
		}
		if serving {
			q.add("@triage_served")
		} else {
			q.add("0")
		}
		var counts []int
		err := schema.Retry(ctx, func() error {
			var err error
			counts, err = countsAtOnce(ctx, s.db, q.sql.String(), q.args, len(sent)+1)
			return err
		})
		for j, a := range sent {
			switch {
			case errors.Is(err, ErrOutcomeUnknown):
				a.lost = fmt.Errorf("ack: %w", err)
			case err != nil:
				a.err = fmt.Errorf("ack: %w", err)
			case counts[j] != distinct[j]:
				a.longWay = true
			default:
				a.res = ackedOnce(a.refs)
			}
		}
		if serving {
			switch {
			case errors.Is(err, ErrOutcomeUnknown):
				if sv.held, sv.err = s.servedOf(ctx, sv.ds); sv.err != nil {
					sv.err = fmt.Errorf("serve leases: %w (and reading what it served: %w)", err, sv.err)
				}
			case err != nil:
				sv.err = fmt.Errorf("serve leases: %w", err)
			case counts[len(sent)] == len(sv.ds):
				sv.held = make(map[uint64]bool, len(sv.ds))
				for _, d := range sv.ds {
					sv.held[d.ID] = true
				}
			default:
				if sv.held, sv.err = s.servedOf(ctx, sv.ds); sv.err != nil {
					sv.err = fmt.Errorf("serve leases: %w", sv.err)
				}
			}
		}
	}
}

// addAckPart adds part j's statements to q (see writeAtOnce) and returns
// the number of distinct ids it names; ok is false, and q is left alone,
// when it names one id under two tokens: which token a full count matched
// would be unknown.
func (s Store) addAckPart(q *stmt, a *ackPart, j int, now time.Time) (n int, ok bool) {
	token := make(map[uint64]uint64, len(a.refs))
	ids := make([]uint64, 0, len(a.refs))
	for _, r := range a.refs {
		t, seen := token[r.Key]
		switch {
		case !seen:
			token[r.Key] = r.Token
			ids = append(ids, r.Key)
		case t != r.Token:
			return 0, false
		}
	}
	rows := make([][]any, len(ids))
	for i, id := range ids {
		rows[i] = []any{id, token[id]}
	}
	k, kargs := schema.KeyValues("items", "i", []string{"tok"}, rows)
	sp := "triage_ack" + strconv.Itoa(j)
	q.add("SAVEPOINT " + sp + ";")
	// The tombstones of the rows about to go, in the deleting transaction
	// (see tombstoneAt); a count short of n takes them back with the
	// DELETE.
	nowUS := now.UnixMicro()
	q.add(ackTombstonesSQL(k), append(append([]any{nowUS + a.window.Microseconds(),
		nowUS + max(a.window, KeyMemory).Microseconds()}, kargs...), a.ns)...)
	q.add("DELETE i FROM "+k, kargs...)
	q.add(" WHERE i.lease_token = k.tok AND i.namespace = ?", a.ns)
	v := "@triage_acked" + strconv.Itoa(j)
	q.add(";SET "+v+" = ROW_COUNT();BEGIN NOT ATOMIC IF "+v+" <> ? THEN ROLLBACK TO SAVEPOINT "+sp+"; END IF; END;", len(ids))
	return len(ids), true
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

// ackedOnce answers refs whose every row was deleted under its one token:
// the first ref to an id acked it, any later ref to it finds it gone.
func ackedOnce(refs []LeaseRef) []error {
	results := make([]error, len(refs))
	done := make(map[uint64]bool, len(refs))
	for i, r := range refs {
		if done[r.Key] {
			results[i] = ErrNotFound
		}
		done[r.Key] = true
	}
	return results
}

// countsAtOnce runs writeAtOnce's multi-statement query (see onConn) and
// returns the n integers of its one row. An error after the query was
// sent with no answer from the server is ErrOutcomeUnknown (sentErr): its
// COMMIT may have run.
func countsAtOnce(ctx context.Context, db *sqlx.DB, q string, args []any, n int) (counts []int, err error) {
	err = onConn(ctx, db, func(conn *sqlx.Conn) error {
		counts, err = lastCounts(ctx, conn, q, args, n)
		return sentErr(err)
	})
	return counts, err
}

// lastCounts runs q and returns the n integers of its only result set's
// one row (the driver skips the results without rows), or the first
// error of any of its statements.
func lastCounts(ctx context.Context, conn *sqlx.Conn, q string, args []any, n int) ([]int, error) {
	rows, err := conn.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var counts []int
	for rows.Next() {
		counts = make([]int, n)
		dest := make([]any, n)
		for i := range counts {
			dest[i] = &counts[i]
		}
		if err := rows.Scan(dest...); err != nil {
			return nil, err
		}
	}
	for rows.NextResultSet() {
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if counts == nil {
		return nil, errors.New("no counts came back")
	}
	return counts, nil
}
