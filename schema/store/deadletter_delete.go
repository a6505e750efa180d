package store

import (
	"context"
	"fmt"

	"github.com/jmoiron/sqlx"

	"github.com/triage-queue/triage/schema"
)

// DeadLetterDeleteBatch is how many dead letters one transaction of a
// purge deletes: a topic's whole dead-letter queue in one transaction
// would hold its row locks, undo log and the semi-sync wait of one
// giant commit for as long as it takes, as the TTL sweep's bound avoids
// for items.
const DeadLetterDeleteBatch = 500

// deadLetterPurgeBatchSQL locks a topic's oldest dead letters that died
// before a time, at most DeadLetterDeleteBatch of them, through the
// topic_died index (namespace, topic, died_at, id), which serves both the
// range and the order, so the statement locks only the rows it returns.
// The hint is needed: on a small table the optimizer scans it (and waits
// for every row another transaction holds, any topic's), and a
// single-table DELETE takes no hint in MariaDB 10.11, so the purge reads
// the batch here and deletes it by key (deadLetterDeleteKeysSQL).
const deadLetterPurgeBatchSQL = `SELECT id FROM dead_letters FORCE INDEX (topic_died)
			WHERE namespace = ? AND topic = ? AND died_at < ? ORDER BY died_at, id LIMIT ? FOR UPDATE`

// deadLetterDeleteKeysSQL deletes the dead letters of k (schema.Keys(
// "dead_letters", "d", ...)) of one topic that died before a time, by
// primary key lookups only.
func deadLetterDeleteKeysSQL(k string) string {
	return "DELETE d FROM " + k + " WHERE d.namespace = ? AND d.topic = ? AND d.died_at < ?"
}

// DeadLetterDeleteParams: see DeadLetterDelete.
type DeadLetterDeleteParams struct {
	Namespace, Topic string
	// Keys: only these dead letters (one transaction); none for all of
	// the topic's.
	Keys []uint64
	// BeforeUS: only dead letters whose died_at is before it (unix µs);
	// 0 for no bound.
	BeforeUS int64
}

// DeadLetterDelete deletes dead letters of a topic, only Keys when given,
// only those that died before BeforeUS when set, and returns how many it
// deleted. All of a topic's go DeadLetterDeleteBatch per transaction
// until none is left, so a failure after some batches leaves those
// deleted (the error says how many). Nothing else changes with them: an
// enqueue's dedup check never reads dead_letters, and a dead letter's key
// was tombstoned when it died.
func (s Store) DeadLetterDelete(ctx context.Context, p DeadLetterDeleteParams) (int64, error) {
	before := p.BeforeUS
	if before <= 0 {
		before = 1<<63 - 1
	}
	if len(p.Keys) > 0 {
		k, args := schema.Keys("dead_letters", "d", p.Keys)
		var n int64
		err := inTx(ctx, s.db, func(tx *sqlx.Tx) error {
			res, err := tx.ExecContext(ctx, deadLetterDeleteKeysSQL(k), append(args, p.Namespace, p.Topic, before)...)
			if err != nil {
				return err
			}
			n, err = res.RowsAffected()
			return err
		})
		if err != nil {
			return 0, fmt.Errorf("delete dead letters: %w", err)
		}
		return n, nil
	}
	var total int64
	for {
		var n int64
		err := inTx(ctx, s.db, func(tx *sqlx.Tx) error {
			n = 0
			var ids []uint64
			if err := tx.SelectContext(ctx, &ids, deadLetterPurgeBatchSQL, p.Namespace, p.Topic, before, DeadLetterDeleteBatch); err != nil || len(ids) == 0 {
				return err
			}
			k, args := schema.Keys("dead_letters", "d", ids)
			res, err := tx.ExecContext(ctx, deadLetterDeleteKeysSQL(k), append(args, p.Namespace, p.Topic, before)...)
			if err != nil {
				return err
			}
			n, err = res.RowsAffected()
			return err
		})
		if err != nil {
			return total, fmt.Errorf("delete dead letters (%d deleted before the failure): %w", total, err)
		}
		total += n
		if n < DeadLetterDeleteBatch {
			return total, nil
		}
	}
}
