package dequeuer

import (
	"context"
	"fmt"
	"time"

	"database/sql"

	"github.com/jmoiron/sqlx"

	"github.com/triage-queue/triage/schema"
)

// Policy is what the lease path needs of a topic's configuration.
type Policy struct {
	// MaxAttempts: an item delivered this many times is dead-lettered
	// instead of delivered again. 0: never.
	MaxAttempts int
	// AtMostOnce: an item whose lease expired is deleted, not redelivered.
	AtMostOnce bool
	// DedupWindow: the dedup keys of items that leave (dead-lettered,
	// expired) stay taken this long.
	DedupWindow time.Duration
}

const deadLetterColumns = `id, namespace, topic, priority, enqueued_at, lease_ms, attempts, dedup_key, payload, metadata, last_error, died_at`

// moveToDeadLetters moves items that match cond (an SQL condition on
// items i, with condArgs) to dead_letters in tx, recording reason when the
// item has no last error of its own. It returns how many moved. Their
// dedup keys stay taken for window (see Tombstone): a dead-lettered item
// is gone from items, and its producer's retry must still be a duplicate.
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
	if _, err := tx.ExecContext(ctx, `INSERT INTO dead_letters (`+deadLetterColumns+`)
		SELECT i.id, i.namespace, i.topic, i.priority, i.enqueued_at, i.lease_ms, i.attempts, i.dedup_key, i.payload, i.metadata,
		       COALESCE(?, i.last_error), ?
		FROM `+k+``, append([]any{nullIfEmpty(reason), nowUS}, args...)...); err != nil {
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
	q := "DELETE i FROM " + k
	if cond != "" {
		q += " WHERE " + cond
	}
	res, err := tx.ExecContext(ctx, q, append(args, condArgs...)...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

func nullIfEmpty(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// retire takes rows the lease path must not deliver: dead-letters those
// out of attempts, and for at-most-once topics deletes those whose lease
// expired. Both are conditional on the row still being ready, so a
// concurrent ack or update wins.
func retire(ctx context.Context, db *sqlx.DB, dead, expired []uint64, window time.Duration, nowUS int64) error {
	if len(dead) == 0 && len(expired) == 0 {
		return nil
	}
	tx, err := db.BeginTxx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
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
	return tx.Commit()
}

// goingRow is what a row that leaves items needs for its dedup tombstone.
type goingRow struct {
	ID        uint64         `db:"id"`
	Namespace string         `db:"namespace"`
	Topic     string         `db:"topic"`
	DedupKey  sql.NullString `db:"dedup_key"`
}

// lockGoing locks the rows of ids that match cond and returns them.
func lockGoing(ctx context.Context, tx *sqlx.Tx, ids []uint64, cond string, condArgs []any) ([]goingRow, error) {
	k, args := schema.Keys("items", "i", ids)
	var rows []goingRow
	if err := tx.SelectContext(ctx, &rows, `SELECT i.id, i.namespace, i.topic, i.dedup_key
		FROM `+k+` WHERE `+cond+` FOR UPDATE`, append(args, condArgs...)...); err != nil {
		return nil, err
	}
	return rows, nil
}

// tombstoneRows keeps the dedup keys of rows leaving items taken until
// nowUS + window.
func tombstoneRows(ctx context.Context, tx *sqlx.Tx, rows []goingRow, window time.Duration, nowUS int64) error {
	for _, r := range rows {
		if err := tombstoneAt(ctx, tx, r.Namespace, r.Topic, r.DedupKey.String, r.ID, nowUS+window.Microseconds(), window); err != nil {
			return fmt.Errorf("dedup tombstone: %w", err)
		}
	}
	return nil
}
