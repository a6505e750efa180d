package dequeuer

import (
	"context"
	"fmt"

	"github.com/jmoiron/sqlx"
)

// Policy is what the lease path needs of a topic's configuration.
type Policy struct {
	// MaxAttempts: an item delivered this many times is dead-lettered
	// instead of delivered again. 0: never.
	MaxAttempts int
	// AtMostOnce: an item whose lease expired is deleted, not redelivered.
	AtMostOnce bool
}

const deadLetterColumns = `id, namespace, topic, priority, enqueued_at, lease_ms, attempts, dedup_key, payload, metadata, last_error, died_at`

// moveToDeadLetters moves items that match cond (an SQL condition on
// items, with condArgs) to dead_letters in tx, recording reason when the
// item has no last error of its own. It returns how many moved.
func moveToDeadLetters(ctx context.Context, tx *sqlx.Tx, ids []uint64, cond string, condArgs []any, reason string, nowUS int64) (int64, error) {
	if len(ids) == 0 {
		return 0, nil
	}
	// Lock the rows that still qualify first, so the copy and the delete
	// see the same set even if an ack races with us.
	q, args, err := sqlx.In(`SELECT id FROM items WHERE id IN (?) AND `+cond+` FOR UPDATE`, append([]any{ids}, condArgs...)...)
	if err != nil {
		return 0, err
	}
	var locked []uint64
	if err := tx.SelectContext(ctx, &locked, q, args...); err != nil {
		return 0, fmt.Errorf("dead-letter: %w", err)
	}
	if len(locked) == 0 {
		return 0, nil
	}
	q, args, err = sqlx.In(`INSERT INTO dead_letters (`+deadLetterColumns+`)
		SELECT id, namespace, topic, priority, enqueued_at, lease_ms, attempts, dedup_key, payload, metadata,
		       COALESCE(?, last_error), ?
		FROM items WHERE id IN (?)`, nullIfEmpty(reason), nowUS, locked)
	if err != nil {
		return 0, err
	}
	if _, err := tx.ExecContext(ctx, q, args...); err != nil {
		return 0, fmt.Errorf("dead-letter: %w", err)
	}
	q, args, err = sqlx.In(`DELETE FROM items WHERE id IN (?)`, locked)
	if err != nil {
		return 0, err
	}
	res, err := tx.ExecContext(ctx, q, args...)
	if err != nil {
		return 0, fmt.Errorf("dead-letter: %w", err)
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
func retire(ctx context.Context, db *sqlx.DB, dead, expired []uint64, nowUS int64) error {
	if len(dead) == 0 && len(expired) == 0 {
		return nil
	}
	tx, err := db.BeginTxx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if _, err := moveToDeadLetters(ctx, tx, dead, "deliver_after <= ?", []any{nowUS},
		"out of attempts: the last lease expired", nowUS); err != nil {
		return err
	}
	if len(expired) > 0 {
		q, args, err := sqlx.In("DELETE FROM items WHERE id IN (?) AND deliver_after <= ? AND lease_token <> 0", expired, nowUS)
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, q, args...); err != nil {
			return fmt.Errorf("at-most-once expiry: %w", err)
		}
	}
	return tx.Commit()
}
