package enqueuer

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"

	"github.com/go-sql-driver/mysql"

	"github.com/jmoiron/sqlx"

	peerv1 "github.com/triage-queue/triage/proto/triage/peer/v1"
	"github.com/triage-queue/triage/schema"
)

const (
	// maxRowsPerInsert keeps one INSERT well under MySQL's 65,535
	// placeholders and its packet limit.
	maxRowsPerInsert = 1000
	// maxBytesPerInsert caps the payload bytes of one INSERT (the bed sets
	// max_allowed_packet to 64 MiB).
	maxBytesPerInsert = 8 << 20
	itemColumns       = 13
)

const insertItemsPrefix = `INSERT INTO items (id, namespace, topic, priority, deliver_after, enqueued_at, lease_ms,
	expires_at, dedup_key, payload, metadata, updated_at, attempts) VALUES `

// "id = id" makes a duplicate a no-op that still reports 0 rows affected,
// where INSERT IGNORE would also swallow real errors as warnings.
const insertItemsSuffix = ` ON DUPLICATE KEY UPDATE id = id`

// Insert writes batches to one shard in one transaction and returns, per
// batch, what EnqueueCommitted reports. Batches recorded as applied are
// skipped. It is idempotent.
func Insert(ctx context.Context, db *sqlx.DB, batches []*peerv1.EnqueueBatch, nowUS int64) ([]*peerv1.EnqueueCommitted, error) {
	out := make([]*peerv1.EnqueueCommitted, len(batches))
	for i, b := range batches {
		out[i] = &peerv1.EnqueueCommitted{BatchId: b.BatchId, DuplicateOf: make([]uint64, len(b.Items))}
	}
	err := schema.Retry(ctx, func() error {
		tx, err := db.BeginTxx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		applied, err := appliedBatches(ctx, tx, batches)
		if err != nil {
			return err
		}
		var fresh []int
		for i, b := range batches {
			if !applied[b.BatchId] {
				fresh = append(fresh, i)
			}
		}
		if len(fresh) == 0 {
			return nil
		}
		taken, err := tombstoned(ctx, tx, batches, fresh, nowUS)
		if err != nil {
			return err
		}
		inserted := 0
		total := 0
		var args []any
		rows, bytes := 0, 0
		flush := func() error {
			if rows == 0 {
				return nil
			}
			q := insertItemsPrefix + strings.TrimSuffix(strings.Repeat("(?,?,?,?,?,?,?,?,?,?,?,?,0),", rows), ",") + insertItemsSuffix
			res, err := tx.ExecContext(ctx, q, args...)
			if err != nil {
				return fmt.Errorf("insert items: %w", err)
			}
			n, _ := res.RowsAffected()
			inserted += int(n)
			args, rows, bytes = args[:0], 0, 0
			return nil
		}
		for _, i := range fresh {
			b := batches[i]
			for j, it := range b.Items {
				if orig, ok := taken[tombKey{b.Namespace, b.Topic, it.DedupKey}]; ok && it.DedupKey != "" {
					out[i].DuplicateOf[j] = orig // its key's item is gone but still within the window
					continue
				}
				var expires, dedup, meta any
				if it.ExpiresAtUs != 0 {
					expires = it.ExpiresAtUs
				}
				if it.DedupKey != "" {
					dedup = it.DedupKey
				}
				if len(it.Metadata) > 0 {
					meta = it.Metadata
				}
				payload := it.Payload
				if payload == nil {
					payload = []byte{} // an empty payload is not NULL
				}
				args = append(args, it.Key, b.Namespace, b.Topic, it.Priority, it.DeliverAfterUs, b.EnqueuedAtUs,
					it.LeaseMs, expires, dedup, payload, meta, nowUS)
				rows++
				total++
				bytes += len(it.Payload) + len(it.Metadata)
				if rows == maxRowsPerInsert || bytes >= maxBytesPerInsert {
					if err := flush(); err != nil {
						return err
					}
				}
			}
		}
		if err := flush(); err != nil {
			return err
		}
		if inserted < total {
			if err := findDuplicates(ctx, tx, batches, fresh, out, taken); err != nil {
				return err
			}
		}
		q := "INSERT INTO enqueue_batches (batch_id, applied_at) VALUES " +
			strings.TrimSuffix(strings.Repeat("(?,?),", len(fresh)), ",")
		bargs := make([]any, 0, 2*len(fresh))
		for _, i := range fresh {
			bargs = append(bargs, batches[i].BatchId, nowUS)
		}
		if _, err := tx.ExecContext(ctx, q, bargs...); err != nil {
			return fmt.Errorf("record batches: %w", err)
		}
		return tx.Commit()
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

func appliedBatches(ctx context.Context, tx *sqlx.Tx, batches []*peerv1.EnqueueBatch) (map[uint64]bool, error) {
	ids := make([]uint64, len(batches))
	for i, b := range batches {
		ids[i] = b.BatchId
	}
	q, args, err := sqlx.In("SELECT batch_id FROM enqueue_batches WHERE batch_id IN (?)", ids)
	if err != nil {
		return nil, err
	}
	var got []uint64
	if err := tx.SelectContext(ctx, &got, q, args...); err != nil {
		return nil, fmt.Errorf("applied batches: %w", err)
	}
	applied := make(map[uint64]bool, len(got))
	for _, id := range got {
		applied[id] = true
	}
	return applied, nil
}

type tombKey struct{ ns, topic, key string }

// tombstoned returns the dedup keys of the fresh batches that a gone item
// still holds (dedup_tombstones within the namespace's window), with that
// item's key.
func tombstoned(ctx context.Context, tx *sqlx.Tx, batches []*peerv1.EnqueueBatch, fresh []int, nowUS int64) (map[tombKey]uint64, error) {
	byTopic := map[[2]string][]string{}
	for _, i := range fresh {
		b := batches[i]
		for _, it := range b.Items {
			if it.DedupKey != "" {
				k := [2]string{b.Namespace, b.Topic}
				byTopic[k] = append(byTopic[k], it.DedupKey)
			}
		}
	}
	taken := map[tombKey]uint64{}
	for k, keys := range byTopic {
		q, args, err := sqlx.In(`SELECT dedup_key, item_id FROM dedup_tombstones
			WHERE namespace = ? AND topic = ? AND dedup_key IN (?) AND expires_at > ?`, k[0], k[1], keys, nowUS)
		if err != nil {
			return nil, err
		}
		var rows []struct {
			Key  string `db:"dedup_key"`
			Item uint64 `db:"item_id"`
		}
		if err := tx.SelectContext(ctx, &rows, q, args...); err != nil {
			return nil, fmt.Errorf("dedup tombstones: %w", err)
		}
		for _, r := range rows {
			taken[tombKey{k[0], k[1], r.Key}] = r.Item
		}
	}
	return taken, nil
}

// findDuplicates fills DuplicateOf for items that were not inserted under
// their own key because a live item holds their dedup key.
func findDuplicates(ctx context.Context, tx *sqlx.Tx, batches []*peerv1.EnqueueBatch, fresh []int, out []*peerv1.EnqueueCommitted, taken map[tombKey]uint64) error {
	var keys []uint64
	for _, i := range fresh {
		for _, it := range batches[i].Items {
			keys = append(keys, it.Key)
		}
	}
	present := map[uint64]bool{}
	for start := 0; start < len(keys); start += maxRowsPerInsert {
		chunk := keys[start:min(start+maxRowsPerInsert, len(keys))]
		q, args, err := sqlx.In("SELECT id FROM items WHERE id IN (?)", chunk)
		if err != nil {
			return err
		}
		var got []uint64
		if err := tx.SelectContext(ctx, &got, q, args...); err != nil {
			return err
		}
		for _, id := range got {
			present[id] = true
		}
	}
	for _, i := range fresh {
		b := batches[i]
		for j, it := range b.Items {
			if present[it.Key] || it.DedupKey == "" || out[i].DuplicateOf[j] != 0 {
				continue
			}
			var orig uint64
			err := tx.GetContext(ctx, &orig, "SELECT id FROM items WHERE namespace = ? AND topic = ? AND dedup_key = ?",
				b.Namespace, b.Topic, it.DedupKey)
			if err != nil && !errors.Is(err, sql.ErrNoRows) {
				return fmt.Errorf("dedup lookup: %w", err)
			}
			out[i].DuplicateOf[j] = orig
		}
	}
	return nil
}

// IsPermanent reports whether err is MySQL refusing the data itself (bad
// value, too long, NULL where not allowed): retrying the same batch can
// never succeed, unlike a lost connection, a deadlock or a fenced primary.
func IsPermanent(err error) bool {
	var me *mysql.MySQLError
	if !errors.As(err, &me) {
		return false
	}
	switch me.Number {
	case 1048, // column cannot be null
		1292, // incorrect value
		1264, // out of range
		1366, // incorrect string value
		1406, // data too long
		1153: // packet bigger than max_allowed_packet
		return true
	}
	return false
}
