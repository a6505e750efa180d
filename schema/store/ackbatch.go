package store

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/triage-queue/triage/schema"
)

// MaxAckBatch bounds the refs one coalesced ack takes: lists up to this
// size keep the DELETE's primary-key range plan (from 1000 ids on, an IN
// list becomes a semi-join) and schema.Keys' plan for the fallback
// (TestKeysPlan covers 1-1000), and a statement's row locks stay few.
const MaxAckBatch = 500

// AckBatcher coalesces the acks that concurrent callers make on one shard
// and namespace into one statement, as FOQS batches its acks: in
// steady state many consumers ack a few items each, and a transaction per
// call spends its time in commits and lock round trips rather than in
// deleting rows.
//
// A batch is one ItemAckDelete: one autocommit DELETE of the batch's
// (id, token) pairs, plus a diagnostic read only when some refs were not
// acked.
//
// Unlike FOQS, an ack is answered only once its batch has committed, so an
// acknowledged ack is never undone. A caller waits for the batch in flight
// (if any) to finish and then for its own; the batch in flight is never
// held back to wait for more, so a lone ack costs one statement.
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
// When ctx ends first, Ack returns ctx's error, and the refs may or may not
// be acked (as with any call whose answer is lost).
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
		return nil, ctx.Err()
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
// the common case with one autocommit statement instead of a transaction
// of four round trips (BEGIN, a locking read, DELETE, COMMIT):
//
//	DELETE FROM items WHERE id IN (...) AND (id, lease_token) IN ((...), ...)
//	  AND namespace = ? [AND dedup_key IS NULL] ORDER BY id LIMIT n RETURNING id, lease_token
//
// The row constructor carries the token check, so a stale token deletes
// nothing; RETURNING says exactly which refs were acked. "id IN" with
// ORDER BY id LIMIT n is what makes MariaDB 10.11 read the rows by a range
// of the primary key (a single-table DELETE takes no FORCE INDEX, and
// without them it scans a small table and waits for every row lock on the
// way: see schema.Keys); LIMIT is the number of distinct ids, so it never
// cuts the match short. TestByIDStatementsLockOnlyTheirRows holds the plan.
//
// Only when fewer rows come back than refs were given does a diagnostic
// read (no locks) tell the rest apart: no such row in the namespace is
// ErrNotFound, another token ErrStaleLease. A row that still carries the
// ref's token was left out on purpose: it has a dedup key that must stay
// taken (DedupWindow > 0), and that tombstone has to be written in the
// deleting transaction, so those refs go through ItemAck.
func (s Store) ItemAckDelete(ctx context.Context, p ItemAckParams) ([]error, error) {
	results := make([]error, len(p.Refs))
	if len(p.Refs) == 0 {
		return results, nil
	}
	type pair struct{ id, token uint64 }
	pairs := make([]pair, 0, len(p.Refs))
	seen := make(map[pair]bool, len(p.Refs))
	ids := make([]uint64, 0, len(p.Refs))
	seenID := make(map[uint64]bool, len(p.Refs))
	for _, r := range p.Refs {
		if pr := (pair{r.Key, r.Token}); !seen[pr] {
			seen[pr] = true
			pairs = append(pairs, pr)
		}
		if !seenID[r.Key] {
			seenID[r.Key] = true
			ids = append(ids, r.Key)
		}
	}
	slices.Sort(ids)
	var q stmt
	q.add("DELETE FROM items WHERE id").in(ids)
	q.add(" AND (id, lease_token) IN (")
	for i, pr := range pairs {
		if i > 0 {
			q.add(",")
		}
		q.add("(?,?)", pr.id, pr.token)
	}
	q.add(") AND namespace = ?", p.Namespace)
	if p.DedupWindow > 0 {
		q.add(" AND dedup_key IS NULL")
	}
	q.add(" ORDER BY id LIMIT ? RETURNING id, lease_token", len(ids))
	var gone []Item
	err := schema.Retry(ctx, func() error {
		gone = gone[:0]
		return s.db.SelectContext(ctx, &gone, q.sql.String(), q.args...)
	})
	if err != nil {
		return nil, fmt.Errorf("ack: %w", err)
	}
	// An item's refs answer in order, as ItemAck's would: the one that
	// carried the deleting token acks it, any later ref finds it gone, an
	// earlier one with another token was stale.
	deleted := make(map[uint64]uint64, len(gone))
	for _, g := range gone {
		deleted[g.ID] = g.LeaseToken
	}
	acked := make(map[uint64]bool, len(gone))
	var rest []int
	for i, r := range p.Refs {
		tok, ok := deleted[r.Key]
		switch {
		case !ok:
			rest = append(rest, i)
		case acked[r.Key]:
			results[i] = ErrNotFound
		case tok == r.Token:
			acked[r.Key] = true
		default:
			results[i] = ErrStaleLease
		}
	}
	if len(rest) == 0 {
		return results, nil
	}
	return results, s.ackDiagnose(ctx, p, rest, results)
}

// itemAckDiagnoseSQL reads, without locks, what a short ack DELETE left.
const itemAckDiagnoseSQL = "SELECT id, lease_token, dedup_key FROM items WHERE namespace = ? AND id IN (?)"

// ackDiagnose answers the refs at rest that ItemAckDelete's DELETE did not
// remove: not found, stale, or (their dedup key needs a tombstone) acked
// through ItemAck.
func (s Store) ackDiagnose(ctx context.Context, p ItemAckParams, rest []int, results []error) error {
	keys := make([]uint64, len(rest))
	for j, i := range rest {
		keys[j] = p.Refs[i].Key
	}
	sel, args, err := sqlx.In(itemAckDiagnoseSQL, p.Namespace, keys)
	if err != nil {
		return err
	}
	var rows []Item
	if err := s.db.SelectContext(ctx, &rows, sel, args...); err != nil {
		return fmt.Errorf("ack: %w", err)
	}
	st := make(map[uint64]Item, len(rows))
	for _, r := range rows {
		st[r.ID] = r
	}
	var slow []int
	for _, i := range rest {
		if results[i] = check(st, p.Refs[i]); results[i] == nil {
			slow = append(slow, i)
		}
	}
	if len(slow) == 0 {
		return nil
	}
	refs := make([]LeaseRef, len(slow))
	for j, i := range slow {
		refs[j] = p.Refs[i]
	}
	res, err := s.ItemAck(ctx, ItemAckParams{Namespace: p.Namespace, Refs: refs, DedupWindow: p.DedupWindow, Now: p.Now})
	if err != nil {
		return err
	}
	for j, i := range slow {
		results[i] = res[j]
	}
	return nil
}
