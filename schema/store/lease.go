package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/triage-queue/triage/schema"
)

// The head of a topic's ready set, read without row locks and without
// writing anything: only this shard's owner reads it, and serving is a
// compare-and-set on each row's version (updated_at), which settles any
// race with UpdateItem, DeleteItem, a nack, an ack or an overlapping
// owner. Measured on the development box, an owner's read is twice the
// rate of SELECT ... FOR UPDATE SKIP LOCKED (ARCHITECTURE.md, environment
// facts).
//
// The priority bounds serve priority bands (dequeue min/max_priority and
// the weighted policy); without bounds they span all of int32 and the
// index range is the same.
const itemHeadSelect = `SELECT id, priority, deliver_after, enqueued_at, lease_ms, attempts, payload, metadata, last_error, traceparent, lease_token, leased_until, expires_at, updated_at
FROM items FORCE INDEX (ready)
WHERE namespace = ? AND topic = ? AND priority BETWEEN ? AND ? AND deliver_after <= ? AND (expires_at IS NULL OR expires_at > ?)`

// itemHeadBefore limits the head read to rows that sort before a buffered
// tail (priority, deliver_after, id): the recheck of a shard whose buffer
// holds items, which only needs rows more urgent than those. The caller
// narrows the priority range to the tail's priority, so the index range
// stays small.
var itemHeadBefore = itemHeadBound("<")

// itemHeadAfter limits the head read to rows that sort after a buffered
// tail: the refill of a buffer that holds the head up to there, which
// needs the rows that come next. The caller starts the priority range at
// the tail's priority, so the index range starts at the tail and the read
// walks none of the rows the buffer holds.
var itemHeadAfter = itemHeadBound(">")

// itemHeadBound is the condition that a row sorts on side op ("<" or ">")
// of a given row in delivery order, spelled out column by column. Its
// arguments: priority, priority, deliver_after, deliver_after, id.
func itemHeadBound(op string) string {
	return `
AND (priority ` + op + ` ? OR (priority = ? AND (deliver_after ` + op + ` ? OR (deliver_after = ? AND id ` + op + ` ?))))`
}

// itemHeadOrder ends the head read.
const itemHeadOrder = `
ORDER BY priority, deliver_after, id
LIMIT ?`

// bumpUpdatedAt is how every UPDATE of items sets updated_at: never to a
// value the row had before, whatever the writer's clock says, because
// updated_at is the version a serve compares (ItemServe). Two writers'
// clocks (a router's and a dequeuer's estimates of the primary's) can
// disagree by milliseconds, and a plain "updated_at = now" could write a
// value a buffered copy was read with.
const bumpUpdatedAt = "updated_at = GREATEST(?, updated_at + 1)"

// itemServeCheckSQL reads the tokens rows carry after a serve that did
// not update them all.
const itemServeCheckSQL = "SELECT id, lease_token FROM items WHERE id IN (?)"

// itemLockLeasesSQL reads the lease state of rows under row locks, by
// primary key lookups from k (schema.Keys("items", "i", ...)).
func itemLockLeasesSQL(k string) string {
	return `SELECT i.id, i.topic, i.attempts, i.lease_token, i.lease_ms, i.metadata, i.dedup_key, i.enqueued_at
		FROM ` + k + ` WHERE i.namespace = ? FOR UPDATE`
}

// itemNackSQL hands one locked row back to the ready set, taking back
// the attempt its delivery counted when the second argument is 1 (a
// release: the delivery does not count).
const itemNackSQL = `UPDATE items SET lease_token = 0, leased_until = NULL, deliver_after = ?,
				attempts = GREATEST(attempts - ?, 0),
				last_error = COALESCE(?, last_error), metadata = ?, ` + bumpUpdatedAt + ` WHERE id = ?`

// itemExtendSQL moves one locked row's delivery lease.
const itemExtendSQL = "UPDATE items SET deliver_after = ?, leased_until = ?, " + bumpUpdatedAt + " WHERE id = ?"

// ItemReadHeadParams: see ItemReadHead.
type ItemReadHeadParams struct {
	Namespace, Topic string
	// PriorityLo, PriorityHi: the band read, inclusive.
	PriorityLo, PriorityHi int32
	// Tail: when set, only rows that sort before it are read (and the band
	// is narrowed to its priority).
	Tail *Item
	// After: when set, only rows that sort after it are read (and the band
	// starts at its priority): the rows that follow a buffer holding the
	// head up to After. Such a read says nothing about the rows before it.
	After *Item
	// Exclude: rows not to read at the versions given (those the caller's
	// buffer holds already); Limit counts the others. A row that changed
	// since is read: the caller's copy is stale, and a stale copy must not
	// keep the row's current version out of the buffer.
	Exclude []RowVersion
	// MaxAttempts: rows delivered this many times are dead-lettered
	// instead (0: never).
	MaxAttempts int
	// AtMostOnce: rows whose delivery lease lapsed are deleted.
	AtMostOnce bool
	// DedupWindow: how long the dedup keys of rows that leave stay taken.
	DedupWindow time.Duration
	Limit       int
	NowUS       int64
	// Observe, when set, is told what the read found besides ready rows
	// (metrics), once the dead and expired rows are retired.
	Observe func(LeaseHeadCounts)
}

// RowVersion names a row at a version (its updated_at).
type RowVersion struct {
	ID      uint64
	Version int64
}

// LeaseHeadCounts is what one ItemReadHead read found.
type LeaseHeadCounts struct {
	// Lapsed: rows whose delivery lease had lapsed (redelivered now,
	// dead-lettered or deleted).
	Lapsed int
	// Dead: rows moved to dead_letters; Expired: rows of an at-most-once
	// topic deleted because their delivery lease lapsed.
	Dead, Expired int
}

// ItemReadHead reads up to Limit ready items of a topic's band, leaving
// out Exclude (rows at the versions named), in delivery order, each with its version (UpdatedAt) for
// ItemServe. It writes nothing to them: a row stays ready, in place, until
// a serve that finds it unchanged leases it to a consumer. Rows out of
// attempts go to dead_letters, and for at-most-once topics rows whose
// delivery lease expired are deleted; neither is returned.
//
// full reports whether the read came back with Limit rows (before those
// retired), that is whether the band may hold more ready rows than were
// read.
func (s Store) ItemReadHead(ctx context.Context, p ItemReadHeadParams) (rows []Item, full bool, err error) {
	var q stmt
	q.add(itemHeadSelect, p.Namespace, p.Topic, p.PriorityLo, p.PriorityHi, p.NowUS, p.NowUS)
	if tail := p.Tail; tail != nil {
		q.args[3] = min(p.PriorityHi, tail.Priority)
		q.add(itemHeadBefore, tail.Priority, tail.Priority, tail.DeliverAfter, tail.DeliverAfter, tail.ID)
	}
	if after := p.After; after != nil {
		q.args[2] = max(p.PriorityLo, after.Priority)
		q.add(itemHeadAfter, after.Priority, after.Priority, after.DeliverAfter, after.DeliverAfter, after.ID)
	}
	if len(p.Exclude) > 0 {
		// MariaDB sorts a constant IN list, row constructors too, and
		// looks each scanned row up in it.
		q.add(" AND (id, updated_at) NOT IN (")
		for i, e := range p.Exclude {
			if i > 0 {
				q.add(",")
			}
			q.add("(?,?)", e.ID, e.Version)
		}
		q.add(")")
	}
	q.add(itemHeadOrder, p.Limit)
	if err := s.db.SelectContext(ctx, &rows, q.sql.String(), q.args...); err != nil {
		return nil, false, fmt.Errorf("read ready head: %w", err)
	}
	full = len(rows) == p.Limit
	var dead, expired []uint64
	lapsed := 0
	kept := rows[:0]
	for _, r := range rows {
		if r.LeaseToken != 0 && r.LeasedUntil.Valid {
			lapsed++
		}
		switch {
		case p.AtMostOnce && r.LeaseToken != 0 && r.LeasedUntil.Valid:
			// A delivery lease lapsed (a lapsed prefetch lease of an older
			// version has no leased_until: that item never reached anyone).
			expired = append(expired, r.ID)
		case p.MaxAttempts > 0 && int(r.Attempts) >= p.MaxAttempts:
			dead = append(dead, r.ID)
		default:
			kept = append(kept, r)
		}
	}
	rows = kept
	if err := s.retire(ctx, dead, expired, p.DedupWindow, p.NowUS); err != nil {
		return nil, false, err
	}
	if p.Observe != nil && lapsed+len(dead)+len(expired) > 0 {
		p.Observe(LeaseHeadCounts{Lapsed: lapsed, Dead: len(dead), Expired: len(expired)})
	}
	return rows, full, nil
}

// Delivery is one buffered row handed to a consumer: its own lease token
// and lease expiry, and the version the row was read with.
type Delivery struct {
	ID      uint64
	Token   uint64
	UntilUS int64
	// Version is the row's updated_at as read (ItemReadHead): the serve
	// applies only if the row has not changed since.
	Version int64
}

// ItemServeParams: see ItemServe.
type ItemServeParams struct {
	Deliveries []Delivery
	NowUS      int64
}

// ItemServe leases buffered rows to a consumer, in one UPDATE, each only
// if it is unchanged since it was read (its version, updated_at, is the
// one read, so it is as ready as it was) and its TTL has not passed: each row gets its own token and
// expiry (deliver_after moves with it, so a lapsed lease makes the row
// ready again) and counts one attempt, since this is the moment it reaches
// a consumer. A row that was deleted, updated, acked, nacked, served by
// someone else or expired (TTL) since the read is left alone and missing
// from the result: the caller must not deliver it.
func (s Store) ItemServe(ctx context.Context, p ItemServeParams) (map[uint64]bool, error) {
	ds := p.Deliveries
	if len(ds) == 0 {
		return map[uint64]bool{}, nil
	}
	var q stmt
	addServe(&q, ds, p.NowUS)
	affected, err := retryExec(ctx, s.db, q.sql.String(), q.args)
	if err != nil {
		return nil, fmt.Errorf("serve leases: %w", err)
	}
	if int(affected) == len(ds) {
		held := make(map[uint64]bool, len(ds))
		for _, d := range ds {
			held[d.ID] = true
		}
		return held, nil
	}
	held, err := s.servedOf(ctx, ds)
	if err != nil {
		return nil, fmt.Errorf("serve leases: %w", err)
	}
	return held, nil
}

// addServe adds ItemServe's UPDATE of ds to q.
func addServe(q *stmt, ds []Delivery, nowUS int64) {
	rows := make([][]any, len(ds))
	for i, d := range ds {
		rows[i] = []any{d.ID, d.Token, d.UntilUS, d.Version}
	}
	// Each row's token, expiry and version come from a table
	// joined by primary key (schema.KeyValues), not from CASE lists
	// MariaDB scans for every row. Each expiry is spelled out rather than
	// copied from another column: MariaDB evaluates SET left to right, and
	// relying on that is fragile. WHERE sees the row as it was, before
	// any of SET; a row whose version is not the one read is not served.
	k, args := schema.KeyValues("items", "i", []string{"tok", "until_us", "ver"}, rows)
	q.add("UPDATE "+k, args...)
	q.add(" SET i.attempts = i.attempts + 1, "+bumpUpdatedAt, nowUS) // k has no updated_at
	q.add(", i.lease_token = k.tok, i.leased_until = k.until_us, i.deliver_after = k.until_us")
	// Not "deliver_after <= now": a row at the version read was ready when
	// read, and the estimate of the primary's clock the serve stamps with
	// may sit a hair behind the read's after a re-measure (shardmap.Clock),
	// which failed the serve of a row that had not changed.
	q.add(" WHERE i.updated_at = k.ver AND (i.expires_at IS NULL OR i.expires_at > ?)", nowUS)
}

// servedOf reads which of ds's rows carry their delivery's token: after a
// serve that did not update them all (some rows changed under it), or
// whose answer was lost.
func (s Store) servedOf(ctx context.Context, ds []Delivery) (map[uint64]bool, error) {
	ids := make([]uint64, len(ds))
	want := make(map[uint64]uint64, len(ds))
	for i, d := range ds {
		ids[i] = d.ID
		want[d.ID] = d.Token
	}
	sel, qargs, err := sqlx.In(itemServeCheckSQL, ids)
	if err != nil {
		return nil, err
	}
	var got []Item
	if err := s.db.SelectContext(ctx, &got, sel, qargs...); err != nil {
		return nil, err
	}
	held := make(map[uint64]bool, len(ds))
	for _, g := range got {
		if want[g.ID] == g.LeaseToken {
			held[g.ID] = true
		}
	}
	return held, nil
}

// LeaseRef names a leased item on one shard: its key and its delivery's
// token.
type LeaseRef struct {
	Key   uint64
	Token uint64
}

// Undelivered names a served item that never reached its consumer (a
// router kept fewer items than several owners served, or the reply carrying
// it could not be sent).
type Undelivered struct {
	LeaseRef
	// DeliverAfterUS is the deliver_after the item had before it was
	// leased (LeasedItem.deliver_after), restored so it keeps its place in
	// the delivery order.
	DeliverAfterUS int64
}

// ItemUnserveParams: see ItemUnserve.
type ItemUnserveParams struct {
	Namespace string
	Items     []Undelivered
	NowUS     int64
}

// ItemUnserve undoes deliveries that never reached a consumer: the item is
// ready again at its old deliver_after with the attempt the delivery
// counted taken back, as if it had never been leased. Only rows still
// under the delivery's own token change, so an item acked, nacked or
// leased again since is left alone. Unlike a nack it never dead-letters:
// an item that keeps being handed back was never delivered.
func (s Store) ItemUnserve(ctx context.Context, p ItemUnserveParams) error {
	if len(p.Items) == 0 {
		return nil
	}
	ids := make([]uint64, len(p.Items))
	was := make([]any, len(p.Items))
	tokens := make([]any, len(p.Items))
	for i, it := range p.Items {
		ids[i], was[i], tokens[i] = it.Key, it.DeliverAfterUS, it.Token
	}
	var q stmt
	q.add("UPDATE items FORCE INDEX (PRIMARY) SET lease_token = 0, leased_until = NULL, attempts = GREATEST(attempts - 1, 0), "+bumpUpdatedAt+", deliver_after = ", p.NowUS).caseByID(ids, was, "deliver_after")
	q.add(" WHERE namespace = ? AND lease_token = ", p.Namespace).caseByID(ids, tokens, "0")
	q.add(" AND lease_token <> 0 AND leased_until IS NOT NULL AND id").in(ids)
	if _, err := retryExec(ctx, s.db, q.sql.String(), q.args); err != nil {
		return fmt.Errorf("hand back undelivered items: %w", err)
	}
	return nil
}

// lockLeases reads the lease state of keys under row locks in tx, by
// primary key lookups (schema.Keys). Items of other namespaces are
// invisible, so an ID cannot reach across tenants.
func lockLeases(ctx context.Context, tx *sqlx.Tx, namespace string, keys []uint64) (map[uint64]Item, error) {
	k, args := schema.Keys("items", "i", keys)
	var rows []Item
	if err := tx.SelectContext(ctx, &rows, itemLockLeasesSQL(k), append(args, namespace)...); err != nil {
		return nil, err
	}
	out := make(map[uint64]Item, len(rows))
	for _, r := range rows {
		out[r.ID] = r
	}
	return out, nil
}

func check(st map[uint64]Item, ref LeaseRef) error {
	s, ok := st[ref.Key]
	switch {
	case !ok:
		return ErrNotFound
	case s.LeaseToken != ref.Token:
		return ErrStaleLease
	}
	return nil
}

// ItemAckParams: see ItemAck.
type ItemAckParams struct {
	Namespace string
	Refs      []LeaseRef
	// DedupWindow: how long the acked items' dedup keys stay taken, from
	// Now.
	DedupWindow time.Duration
	Now         time.Time
}

// ItemAck deletes the items whose refs carry their current lease token, in
// one transaction, and returns a per-ref error (nil for acked, else
// ErrNotFound or ErrStaleLease). An ack after the lease expired still
// succeeds while nobody has leased the item again. A COMMIT whose answer
// is lost is settled (settleAck); ErrOutcomeUnknown means that failed too.
func (s Store) ItemAck(ctx context.Context, p ItemAckParams) ([]error, error) {
	results, err := s.itemAck(ctx, p)
	if errors.Is(err, ErrOutcomeUnknown) {
		// The refs the transaction acked: refused ones were answered
		// under the row locks and stay refused.
		var lost []int
		for i, r := range results {
			if r == nil {
				lost = append(lost, i)
			}
		}
		return s.settleAck(ctx, p, lost, results, err)
	}
	return results, err
}

// itemAck is ItemAck without the settling: on ErrOutcomeUnknown it
// returns the results the transaction would have committed too.
func (s Store) itemAck(ctx context.Context, p ItemAckParams) ([]error, error) {
	results := make([]error, len(p.Refs))
	err := inTx(ctx, s.db, func(tx *sqlx.Tx) error {
		keys := make([]uint64, len(p.Refs))
		for i, r := range p.Refs {
			keys[i] = r.Key
		}
		st, err := lockLeases(ctx, tx, p.Namespace, keys)
		if err != nil {
			return err
		}
		var del []uint64
		for i, r := range p.Refs {
			results[i] = check(st, r)
			if results[i] == nil {
				del = append(del, r.Key)
				g := st[r.Key]
				if err := tombstoneAt(ctx, tx, p.Namespace, g.Topic, g.DedupKey.String, g.ID, g.EnqueuedAt, p.Now.UnixMicro(), p.DedupWindow); err != nil {
					return fmt.Errorf("dedup tombstone: %w", err)
				}
				delete(st, r.Key) // a second ref to the same item finds it gone
			}
		}
		if len(del) > 0 {
			if _, err := deleteItems(ctx, tx, del, ""); err != nil {
				return err
			}
		}
		return nil
	})
	if errors.Is(err, ErrOutcomeUnknown) {
		return results, fmt.Errorf("ack: %w", err)
	}
	if err != nil {
		return nil, fmt.Errorf("ack: %w", err)
	}
	return results, nil
}

// Nack is one item handed back.
type Nack struct {
	LeaseRef
	// Delay before redelivery, unless Backoff.
	Delay time.Duration
	// Backoff: no delay was given; wait the topic's RetryPolicy.Backoff.
	Backoff bool
	// Error is kept on the item as last_error.
	Error string
	// Metadata is merged into the item's; an empty value deletes a key.
	Metadata map[string]string
	// DeadLetter moves the item to dead_letters now, whatever attempts it
	// has left (a permanent failure).
	DeadLetter bool
	// Release: the delivery does not count. The attempt it counted is
	// taken back and the nack never dead-letters; Backoff is ignored (no
	// failure to back off from), so the item waits Delay only.
	Release bool
}

// ItemNackParams: see ItemNack.
type ItemNackParams struct {
	Namespace string
	Nacks     []Nack
	// Retry is the retry policy of an item's topic; nil: no limit and no
	// backoff.
	Retry       func(topic string) RetryPolicy
	DedupWindow time.Duration
	NowUS       int64
	// OnDeadLetter, when set, is called after the commit with the topic of
	// each item the batch dead-lettered (metrics).
	OnDeadLetter func(topic string)
}

// RetryPolicy is what a nack needs of a topic's configuration.
type RetryPolicy struct {
	// MaxAttempts: an item delivered this many times is dead-lettered
	// (0: no limit).
	MaxAttempts int
	// Backoff is the delay of a nack with Backoff set, after attempts
	// deliveries.
	Backoff func(attempts int) time.Duration
}

// ItemNack returns items to the ready set after their delay, in one
// transaction, recording the error and merging metadata. An item that has
// been delivered its topic's MaxAttempts times, or whose nack says DeadLetter, goes to
// dead_letters instead, with the nack's error and metadata, its dedup key
// kept taken for DedupWindow. A Release nack takes back the attempt its
// delivery counted and never dead-letters.
//
// A merge whose result would exceed MaxMetadataBytes fails the whole
// batch with ErrMetadataTooLarge and changes nothing. readyNow lists, per
// nack, the topic of an item that is ready again at once (no delay); ""
// otherwise. A COMMIT whose answer is lost is settled (settleNack);
// ErrOutcomeUnknown means that failed too.
func (s Store) ItemNack(ctx context.Context, p ItemNackParams) (results []error, readyNow []string, err error) {
	var deadTopics []string
	results, readyNow, deadTopics, err = s.itemNack(ctx, p)
	if errors.Is(err, ErrOutcomeUnknown) {
		results, readyNow, deadTopics, err = s.settleNack(ctx, p, results, readyNow, deadTopics, err)
	}
	if err != nil {
		return nil, nil, err
	}
	if p.OnDeadLetter != nil {
		for _, t := range deadTopics {
			p.OnDeadLetter(t)
		}
	}
	return results, readyNow, nil
}

// itemNack is ItemNack without the settling and the OnDeadLetter calls:
// it returns the topics of the items it dead-lettered, and on
// ErrOutcomeUnknown what the transaction would have committed.
func (s Store) itemNack(ctx context.Context, p ItemNackParams) (results []error, readyNow, deadTopics []string, err error) {
	results = make([]error, len(p.Nacks))
	readyNow = make([]string, len(p.Nacks))
	nowUS := p.NowUS
	err = inTx(ctx, s.db, func(tx *sqlx.Tx) error {
		clear(readyNow)
		deadTopics = deadTopics[:0]
		keys := make([]uint64, len(p.Nacks))
		for i, n := range p.Nacks {
			keys[i] = n.Key
		}
		st, err := lockLeases(ctx, tx, p.Namespace, keys)
		if err != nil {
			return err
		}
		for i, n := range p.Nacks {
			if results[i] = check(st, n.LeaseRef); results[i] != nil {
				continue
			}
			// Merge first: an item that dead-letters keeps the nack's
			// metadata and error, as one that stays does.
			meta, err := MergeMetadata(st[n.Key].Metadata, n.Metadata)
			if err != nil {
				return err
			}
			var lastErr any
			if n.Error != "" {
				lastErr = n.Error
			}
			attempts := int(st[n.Key].Attempts)
			var retry RetryPolicy
			if p.Retry != nil {
				retry = p.Retry(st[n.Key].Topic)
			}
			dead := n.DeadLetter || retry.MaxAttempts > 0 && attempts >= retry.MaxAttempts
			delay := n.Delay
			if n.Backoff && !n.Release && !dead && retry.Backoff != nil {
				delay = retry.Backoff(attempts)
			}
			uncount := 0
			if n.Release {
				dead, uncount = false, 1
			}
			if _, err := tx.ExecContext(ctx, itemNackSQL, nowUS+delay.Microseconds(), uncount, lastErr, meta, nowUS, n.Key); err != nil {
				return err
			}
			if dead {
				reason := n.Error
				switch {
				case reason != "":
				case n.DeadLetter:
					reason = fmt.Sprintf("dead-lettered by the consumer after %d deliveries", attempts)
				default:
					reason = fmt.Sprintf("nacked after %d deliveries", attempts)
				}
				if _, err := moveToDeadLetters(ctx, tx, []uint64{n.Key}, "1 = 1", nil, reason, p.DedupWindow, nowUS); err != nil {
					return err
				}
				deadTopics = append(deadTopics, st[n.Key].Topic)
			} else if delay <= 0 {
				readyNow[i] = st[n.Key].Topic
			}
			delete(st, n.Key)
		}
		return nil
	})
	if errors.Is(err, ErrOutcomeUnknown) {
		return results, readyNow, deadTopics, fmt.Errorf("nack: %w", err)
	}
	if err != nil {
		return nil, nil, nil, fmt.Errorf("nack: %w", err)
	}
	return results, readyNow, deadTopics, nil
}

// ItemExtendParams: see ItemExtend.
type ItemExtendParams struct {
	Namespace string
	Ref       LeaseRef
	// Lease: the new lease from Now; 0 for the item's own lease duration.
	Lease time.Duration
	Now   time.Time
}

// ItemExtend moves a lease's expiry to Now + Lease and returns the new
// expiry; ErrNotFound or ErrStaleLease, bare, when the ref does not hold
// the item. A COMMIT whose answer is lost is settled by extending again,
// to the same expiry, on a fresh connection: that answer is the call's,
// since an extension that took effect changed no token.
// ErrOutcomeUnknown means that failed too.
func (s Store) ItemExtend(ctx context.Context, p ItemExtendParams) (time.Time, error) {
	until, err := s.itemExtend(ctx, p)
	if !errors.Is(err, ErrOutcomeUnknown) {
		return until, err
	}
	sctx, cancel := settleCtx(ctx)
	defer cancel()
	until, serr := s.itemExtend(sctx, p)
	if serr != nil && serr != ErrNotFound && serr != ErrStaleLease {
		return time.Time{}, settleFailed(fmt.Errorf("extend: %w", err), serr)
	}
	return until, serr
}

func (s Store) itemExtend(ctx context.Context, p ItemExtendParams) (time.Time, error) {
	var until int64
	err := inTx(ctx, s.db, func(tx *sqlx.Tx) error {
		st, err := lockLeases(ctx, tx, p.Namespace, []uint64{p.Ref.Key})
		if err != nil {
			return err
		}
		if err := check(st, p.Ref); err != nil {
			return err
		}
		lease := p.Lease
		if lease == 0 {
			lease = time.Duration(st[p.Ref.Key].LeaseMS) * time.Millisecond
		}
		until = p.Now.Add(lease).UnixMicro()
		_, err = tx.ExecContext(ctx, itemExtendSQL, until, until, p.Now.UnixMicro(), p.Ref.Key)
		return err
	})
	if err != nil {
		return time.Time{}, err
	}
	return time.UnixMicro(until), nil
}
