package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/triage-queue/triage/schema"
)

const deadLetterColumns = `id, namespace, topic, priority, enqueued_at, lease_ms, attempts, dedup_key, payload, metadata, last_error, died_at`

// deadLetterMoveSQL copies the rows of k (schema.Keys("items", "i", ...))
// to dead_letters, with a reason for those without a last error of their
// own and the time they died.
func deadLetterMoveSQL(k string) string {
	return `INSERT INTO dead_letters (` + deadLetterColumns + `)
		SELECT i.id, i.namespace, i.topic, i.priority, i.enqueued_at, i.lease_ms, i.attempts, i.dedup_key, i.payload, i.metadata,
		       COALESCE(?, i.last_error), ?
		FROM ` + k + ``
}

// itemDeleteKeysSQL deletes the rows of k (schema.Keys("items", "i",
// ...)) that match cond, an SQL condition on i ("" for all of them).
func itemDeleteKeysSQL(k, cond string) string {
	q := "DELETE i FROM " + k
	if cond != "" {
		q += " WHERE " + cond
	}
	return q
}

// itemLockGoingSQL locks the rows of k (schema.Keys("items", "i", ...))
// that match cond and reads what their dedup tombstones need.
func itemLockGoingSQL(k, cond string) string {
	return `SELECT i.id, i.namespace, i.topic, i.dedup_key, i.enqueued_at
		FROM ` + k + ` WHERE ` + cond + ` FOR UPDATE`
}

// tombstoneUpsertSQL takes a dedup key (see tombstoneAt), or keeps it
// longer if a tombstone already does.
const tombstoneUpsertSQL = tombstoneInsert + ` VALUES (?, ?, ?, ?, ?, ?, ?)` + tombstoneOnDuplicate

// tombstoneInsert and tombstoneOnDuplicate frame a tombstone upsert, of
// one row (tombstoneUpsertSQL) or of the rows a SELECT gives (the
// one-round-trip ack). The table is named in the update because in
// INSERT ... SELECT a bare expires_at could be the selected table's.
const (
	tombstoneInsert      = `INSERT INTO dedup_tombstones (namespace, topic, dedup_key, item_id, window_until, held_since, expires_at)`
	tombstoneOnDuplicate = ` ON DUPLICATE KEY UPDATE item_id = VALUES(item_id),
		window_until = GREATEST(dedup_tombstones.window_until, VALUES(window_until)),
		held_since = GREATEST(dedup_tombstones.held_since, VALUES(held_since)),
		expires_at = GREATEST(dedup_tombstones.expires_at, VALUES(expires_at))`
)

// moveToDeadLetters moves items that match cond (an SQL condition on
// items i, with condArgs) to dead_letters in tx, recording reason when the
// item has no last error of its own. It returns how many moved. Their
// dedup keys stay taken for window (see tombstoneAt): a dead-lettered
// item is gone from items, and its producer's retry must still be a
// duplicate.
func moveToDeadLetters(ctx context.Context, tx *sqlx.Tx, ids []uint64, cond string, condArgs []any, reason string, window time.Duration, nowUS int64) (int64, error) {
	if len(ids) == 0 {
		return 0, nil
	}
	// Lock the rows that still qualify first, so the copy and the delete
	// see the same set even if an ack races with us.
	gone, err := lockGoing(ctx, tx, ids, cond, condArgs)
	if err != nil {
		return 0, fmt.Errorf("dead-letter: %w", err)
	}
	if len(gone) == 0 {
		return 0, nil
	}
	locked := make([]uint64, len(gone))
	for i, g := range gone {
		locked[i] = g.ID
	}
	if err := tombstoneRows(ctx, tx, gone, window, nowUS); err != nil {
		return 0, err
	}
	k, args := schema.Keys("items", "i", locked)
	if _, err := tx.ExecContext(ctx, deadLetterMoveSQL(k), append([]any{nullIfEmpty(reason), nowUS}, args...)...); err != nil {
		return 0, fmt.Errorf("dead-letter: %w", err)
	}
	n, err := deleteItems(ctx, tx, locked, "")
	if err != nil {
		return 0, fmt.Errorf("dead-letter: %w", err)
	}
	return n, nil
}

// deleteItems deletes the rows of ids in tx, those matching cond (an SQL
// condition on items i, with condArgs) if cond is set, by primary key
// lookups only (schema.Keys), and returns how many it deleted.
func deleteItems(ctx context.Context, tx *sqlx.Tx, ids []uint64, cond string, condArgs ...any) (int64, error) {
	k, args := schema.Keys("items", "i", ids)
	res, err := tx.ExecContext(ctx, itemDeleteKeysSQL(k, cond), append(args, condArgs...)...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// retire takes rows the lease path must not deliver: dead-letters those
// out of attempts, and for at-most-once topics deletes those whose lease
// expired. Both are conditional on the row still being ready, so a
// concurrent ack or update wins.
func (s Store) retire(ctx context.Context, dead, expired []uint64, window time.Duration, nowUS int64) error {
	if len(dead) == 0 && len(expired) == 0 {
		return nil
	}
	return inTx(ctx, s.db, func(tx *sqlx.Tx) error {
		if _, err := moveToDeadLetters(ctx, tx, dead, "i.deliver_after <= ?", []any{nowUS},
			"out of attempts: the last lease expired", window, nowUS); err != nil {
			return err
		}
		if len(expired) > 0 {
			const cond = "i.deliver_after <= ? AND i.lease_token <> 0 AND i.leased_until IS NOT NULL"
			gone, err := lockGoing(ctx, tx, expired, cond, []any{nowUS})
			if err != nil {
				return fmt.Errorf("at-most-once expiry: %w", err)
			}
			if err := tombstoneRows(ctx, tx, gone, window, nowUS); err != nil {
				return err
			}
			if _, err := deleteItems(ctx, tx, expired, cond, nowUS); err != nil {
				return fmt.Errorf("at-most-once expiry: %w", err)
			}
		}
		return nil
	})
}

// lockGoing locks the rows of ids that match cond and returns them.
func lockGoing(ctx context.Context, tx *sqlx.Tx, ids []uint64, cond string, condArgs []any) ([]Item, error) {
	k, args := schema.Keys("items", "i", ids)
	var rows []Item
	if err := tx.SelectContext(ctx, &rows, itemLockGoingSQL(k, cond), append(args, condArgs...)...); err != nil {
		return nil, err
	}
	return rows, nil
}

// tombstoneRows keeps the dedup keys of rows leaving items at nowUS (see
// tombstoneAt).
func tombstoneRows(ctx context.Context, tx *sqlx.Tx, rows []Item, window time.Duration, nowUS int64) error {
	for _, r := range rows {
		if err := tombstoneAt(ctx, tx, r.Namespace, r.Topic, r.DedupKey.String, r.ID, r.EnqueuedAt, nowUS, window); err != nil {
			return fmt.Errorf("dedup tombstone: %w", err)
		}
	}
	return nil
}

// tombstoneAt keeps the dedup key of an item that leaves items at nowUS,
// in tx: taken for any enqueue for window, and for envelopes enqueued
// before the item (enqueuedAtUS) for KeyMemory or the window, whichever is
// longer. No key keeps nothing.
func tombstoneAt(ctx context.Context, tx *sqlx.Tx, namespace, topic, dedupKey string, item uint64, enqueuedAtUS, nowUS int64, window time.Duration) error {
	if dedupKey == "" {
		return nil
	}
	_, err := tx.ExecContext(ctx, tombstoneUpsertSQL, namespace, topic, dedupKey, item,
		nowUS+window.Microseconds(), enqueuedAtUS, nowUS+max(window, KeyMemory).Microseconds())
	return err
}

// KeyMemory is how long a dedup key is remembered after its item left,
// whatever the namespace's dedup window: an enqueue answered anything but
// ok may still be inserted later (its envelope waits in the enqueue
// buffer, for example on a region that is down), after the producer
// retried with the same keys and the retry's item was delivered and
// acked. Its envelope then finds the tombstone of the newer item and is
// a duplicate of it (see settleDedup). It matches the enqueuers' default
// BatchRetention, the time within which a redelivered envelope is known
// for what it is.
const KeyMemory = 24 * time.Hour

// deadLetterListSQL pages a topic's dead letters in (died_at, id) order;
// the topic_died index serves the range in order.
const deadLetterListSQL = `SELECT id, topic, priority, enqueued_at, attempts, payload, metadata, last_error, died_at
			FROM dead_letters WHERE namespace = ? AND topic = ? AND (died_at > ? OR (died_at = ? AND id > ?))
			ORDER BY died_at, id LIMIT ?`

// DeadLetterListParams: see DeadLetterList.
type DeadLetterListParams struct {
	Namespace, Topic string
	// AfterDiedAt, AfterID: the page starts after this (died_at, id).
	AfterDiedAt int64
	AfterID     uint64
	Limit       int
}

// DeadLetterList returns up to Limit dead letters of a topic after the
// cursor, oldest first.
func (s Store) DeadLetterList(ctx context.Context, p DeadLetterListParams) ([]DeadLetter, error) {
	var rows []DeadLetter
	if err := s.db.SelectContext(ctx, &rows, deadLetterListSQL, p.Namespace, p.Topic, p.AfterDiedAt, p.AfterDiedAt, p.AfterID, p.Limit); err != nil {
		return nil, err
	}
	return rows, nil
}

// The statements of a redrive. A batch of a topic is its oldest 500; a
// batch of keys is read by primary key lookups (schema.Keys).
const deadLetterLockBatchSQL = "SELECT id FROM dead_letters WHERE namespace = ? AND topic = ? ORDER BY died_at, id LIMIT 500 FOR UPDATE"

func deadLetterLockKeysSQL(k string) string {
	return "SELECT d.id FROM " + k + " WHERE d.namespace = ? AND d.topic = ? FOR UPDATE"
}

// deadLetterRedriveSQL copies the dead letters of k (schema.Keys(
// "dead_letters", "d", ...)) back to items, ready at once, attempts
// reset; an id items already holds stays where it is.
func deadLetterRedriveSQL(k string) string {
	return `INSERT INTO items (id, namespace, topic, priority, deliver_after, enqueued_at, lease_ms, attempts,
				dedup_key, payload, metadata, last_error, updated_at)
			SELECT d.id, d.namespace, d.topic, d.priority, ?, d.enqueued_at, d.lease_ms, 0, d.dedup_key, d.payload, d.metadata, d.last_error, ?
			FROM ` + k + `
			ON DUPLICATE KEY UPDATE id = items.id`
}

// deadLetterDeleteRedrivenSQL deletes the dead letters of k that landed
// in items.
func deadLetterDeleteRedrivenSQL(k string) string {
	return `DELETE d FROM ` + k + ` STRAIGHT_JOIN items i FORCE INDEX (PRIMARY) ON i.id = d.id`
}

// DeadLetterRedriveParams: see DeadLetterRedrive.
type DeadLetterRedriveParams struct {
	Namespace, Topic string
	// Keys: only these dead letters; none for all of the topic's.
	Keys  []uint64
	NowUS int64
}

// DeadLetterRedrive moves dead letters of a topic (only Keys, when given)
// back to items, ready at NowUS with attempts reset, 500 per transaction,
// and returns how many moved. A dead letter whose dedup key a live item
// holds stays where it is.
func (s Store) DeadLetterRedrive(ctx context.Context, p DeadLetterRedriveParams) (int64, error) {
	var total int64
	for {
		var n int64
		var empty bool
		err := inTx(ctx, s.db, func(tx *sqlx.Tx) error {
			n, empty = 0, false
			var ids []uint64
			q, args := deadLetterLockBatchSQL, []any{p.Namespace, p.Topic}
			if len(p.Keys) > 0 {
				k, kargs := schema.Keys("dead_letters", "d", p.Keys)
				q = deadLetterLockKeysSQL(k)
				args = append(kargs, p.Namespace, p.Topic)
			}
			if err := tx.SelectContext(ctx, &ids, q, args...); err != nil {
				return err
			}
			if len(ids) == 0 {
				empty = true
				return nil
			}
			k, kargs := schema.Keys("dead_letters", "d", ids)
			if _, err := tx.ExecContext(ctx, deadLetterRedriveSQL(k), append([]any{p.NowUS, p.NowUS}, kargs...)...); err != nil {
				return err
			}
			// Only what landed in items leaves the dead-letter table.
			res, err := tx.ExecContext(ctx, deadLetterDeleteRedrivenSQL(k), kargs...)
			if err != nil {
				return err
			}
			n, _ = res.RowsAffected()
			return nil
		})
		if err != nil || empty {
			return total, err
		}
		total += n
		if len(p.Keys) > 0 || n == 0 {
			return total, nil
		}
	}
}
