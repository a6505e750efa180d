package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"
)

// itemGetSQL reads one item of a namespace by id, every column.
const itemGetSQL = `SELECT id, namespace, topic, priority, deliver_after, enqueued_at, lease_ms, expires_at, attempts,
	lease_token, leased_until, dedup_key, payload, metadata, last_error, updated_at,
	original_priority, priority_changed_by, priority_changed_at, traceparent
FROM items WHERE id = ? AND namespace = ?`

// itemGetForUpdateSQL is itemGetSQL under a row lock.
const itemGetForUpdateSQL = itemGetSQL + " FOR UPDATE"

// itemUpdateSQL writes the columns an update may change.
const itemUpdateSQL = `UPDATE items SET priority = ?, deliver_after = ?, metadata = ?, ` + bumpUpdatedAt + `,
		original_priority = ?, priority_changed_by = ?, priority_changed_at = ?, lease_token = ?, leased_until = ? WHERE id = ?`

// itemDeleteSQL deletes one locked item.
const itemDeleteSQL = "DELETE FROM items WHERE id = ?"

func getItem(ctx context.Context, q sqlx.QueryerContext, query, namespace string, key uint64) (*Item, error) {
	var row Item
	if err := sqlx.GetContext(ctx, q, &row, query, key, namespace); err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return nil, ErrNotFound
		}
		return nil, err
	}
	return &row, nil
}

// ItemGetParams: see ItemGet.
type ItemGetParams struct {
	Namespace string
	ID        uint64
}

// ItemGet reads an item of a namespace, without locks; ErrNotFound, bare,
// if the namespace holds no such item.
func (s Store) ItemGet(ctx context.Context, p ItemGetParams) (*Item, error) {
	return getItem(ctx, s.db, itemGetSQL, p.Namespace, p.ID)
}

// ItemUpdateParams: see ItemUpdate.
type ItemUpdateParams struct {
	Namespace string
	ID        uint64
	// Update changes the locked row in memory: priority and its history,
	// deliver_after, metadata, updated_at, lease_token and leased_until
	// are written back. An error from it aborts the update and is returned as it is.
	// It runs again if the transaction is retried, on a fresh read.
	Update func(row *Item) error
}

// ItemUpdate changes an item under a row lock, in one transaction, and
// returns the row as written; ErrNotFound, bare, if the namespace holds no
// such item. A COMMIT whose answer is lost is settled by running the
// update again on a fresh connection (Update sets the values it was asked
// to, so a repeat writes what the lost one did); ErrOutcomeUnknown means
// the repeat failed too, or was refused, which cannot tell whether the
// lost one was.
func (s Store) ItemUpdate(ctx context.Context, p ItemUpdateParams) (*Item, error) {
	out, err := s.itemUpdate(ctx, p)
	if !errors.Is(err, ErrOutcomeUnknown) {
		return out, err
	}
	sctx, cancel := settleCtx(ctx)
	defer cancel()
	out, serr := s.itemUpdate(sctx, p)
	if serr != nil {
		return nil, settleFailed(fmt.Errorf("update: %w", err), serr)
	}
	return out, nil
}

func (s Store) itemUpdate(ctx context.Context, p ItemUpdateParams) (*Item, error) {
	var out *Item
	err := inTx(ctx, s.db, func(tx *sqlx.Tx) error {
		row, err := getItem(ctx, tx, itemGetForUpdateSQL, p.Namespace, p.ID)
		if err != nil {
			return err
		}
		was := row.UpdatedAt
		if err := p.Update(row); err != nil {
			return err
		}
		row.UpdatedAt = max(row.UpdatedAt, was+1) // as bumpUpdatedAt writes it
		if _, err := tx.ExecContext(ctx, itemUpdateSQL, row.Priority, row.DeliverAfter, row.Metadata, row.UpdatedAt,
			row.OrigPriority, row.ChangedBy, row.ChangedAt, row.LeaseToken, row.LeasedUntil, row.ID); err != nil {
			return err
		}
		out = row
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// ItemDeleteParams: see ItemDelete.
type ItemDeleteParams struct {
	Namespace string
	ID        uint64
	// DedupWindow: how long the item's dedup key stays taken, from Now.
	DedupWindow time.Duration
	Now         time.Time
}

// ItemDelete deletes an item whatever its state, keeping its dedup key
// taken for DedupWindow, in one transaction; ErrNotFound, bare, if the
// namespace holds no such item. A COMMIT whose answer is lost is settled
// by deleting again on a fresh connection, where an item gone means the
// lost delete took effect; ErrOutcomeUnknown means the repeat failed.
func (s Store) ItemDelete(ctx context.Context, p ItemDeleteParams) error {
	err := s.itemDelete(ctx, p)
	if !errors.Is(err, ErrOutcomeUnknown) {
		return err
	}
	sctx, cancel := settleCtx(ctx)
	defer cancel()
	if serr := s.itemDelete(sctx, p); serr != nil && serr != ErrNotFound {
		return settleFailed(fmt.Errorf("delete: %w", err), serr)
	}
	return nil
}

func (s Store) itemDelete(ctx context.Context, p ItemDeleteParams) error {
	return inTx(ctx, s.db, func(tx *sqlx.Tx) error {
		row, err := getItem(ctx, tx, itemGetForUpdateSQL, p.Namespace, p.ID)
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, itemDeleteSQL, p.ID); err != nil {
			return err
		}
		return tombstoneAt(ctx, tx, p.Namespace, row.Topic, row.DedupKey.String, row.ID, row.EnqueuedAt, p.Now.UnixMicro(), p.DedupWindow)
	})
}

// topicReadySQL counts a topic's ready items per priority, with the oldest
// ready time. A row under an older version's prefetch lease (lease_token
// set, leased_until NULL) is ready: it waits for a consumer, and its
// deliver_after is only the prefetch lease's expiry, so its ready time is
// ready_since, whether its prefetch lease runs or lapsed.
const topicReadySQL = `SELECT priority, COUNT(*) AS ready,
			COALESCE(MIN(` + readySinceSQL + `), 0) AS oldest FROM items
			WHERE namespace = ? AND topic = ? AND (deliver_after <= ? OR (lease_token <> 0 AND leased_until IS NULL))
			GROUP BY priority`

// readySinceSQL is when a ready row became ready, NULL for a row that is
// not ready (its one argument: now, µs). Rows prefetched before ready_since
// existed have none and are left out of the oldest age until released.
const readySinceSQL = `CASE WHEN lease_token <> 0 AND leased_until IS NULL THEN ready_since
				WHEN deliver_after <= ? THEN deliver_after END`

// topicTotalsSQL counts a topic's items and those under a running
// delivery lease.
const topicTotalsSQL = `SELECT COUNT(*) AS total, SUM(lease_token <> 0 AND leased_until > ?) AS leased FROM items
			WHERE namespace = ? AND topic = ?`

// topicDeadSQL counts a topic's dead letters.
const topicDeadSQL = `SELECT COUNT(*) FROM dead_letters WHERE namespace = ? AND topic = ?`

// PriorityReady is a priority's ready count and the deliver_after of its
// oldest ready item (0: none counted).
type PriorityReady struct {
	Priority int32 `db:"priority"`
	Ready    int64 `db:"ready"`
	Oldest   int64 `db:"oldest"`
}

// TopicStatsParams: see TopicStats.
type TopicStatsParams struct {
	Namespace, Topic string
	NowUS            int64
}

// TopicStatsResult is one shard's counts of a topic.
type TopicStatsResult struct {
	Ready       []PriorityReady
	Total       int64
	Leased      int64
	DeadLetters int64
}

// TopicStats counts a topic's items on the shard with index range scans
// over the topic: its cost grows with the topic's depth.
func (s Store) TopicStats(ctx context.Context, p TopicStatsParams) (*TopicStatsResult, error) {
	out := &TopicStatsResult{}
	if err := s.db.SelectContext(ctx, &out.Ready, topicReadySQL, p.NowUS, p.Namespace, p.Topic, p.NowUS); err != nil {
		return nil, err
	}
	var t struct {
		Total  int64         `db:"total"`
		Leased sql.NullInt64 `db:"leased"`
	}
	if err := s.db.GetContext(ctx, &t, topicTotalsSQL, p.NowUS, p.Namespace, p.Topic); err != nil {
		return nil, err
	}
	out.Total, out.Leased = t.Total, t.Leased.Int64
	if err := s.db.GetContext(ctx, &out.DeadLetters, topicDeadSQL, p.Namespace, p.Topic); err != nil {
		return nil, err
	}
	return out, nil
}

// topicListSQL lists a namespace's topics after a name with their item
// and dead-letter counts. The ready index and dead_letters' topic_died
// both lead with (namespace, topic), so each side walks the namespace's
// index range in topic order and stops after Limit topics; a topic among
// the first Limit of the union is among the first Limit of each table
// that has it, so its counts are whole.
const topicListSQL = `SELECT topic, SUM(n) AS n, SUM(d) AS d FROM (
			(SELECT topic, COUNT(*) AS n, 0 AS d FROM items FORCE INDEX (ready)
				WHERE namespace = ? AND topic > ? GROUP BY topic ORDER BY topic LIMIT ?)
			UNION ALL
			(SELECT topic, 0 AS n, COUNT(*) AS d FROM dead_letters FORCE INDEX (topic_died)
				WHERE namespace = ? AND topic > ? GROUP BY topic ORDER BY topic LIMIT ?)
		) AS t GROUP BY topic ORDER BY topic LIMIT ?`

// TopicCount is a topic and how many items and dead letters it holds.
type TopicCount struct {
	Topic       string `db:"topic"`
	N           int64  `db:"n"`
	DeadLetters int64  `db:"d"`
}

// TopicListParams: see TopicList.
type TopicListParams struct {
	Namespace string
	// After: the list starts after this topic name.
	After string
	Limit int
}

// TopicList returns up to Limit topics of a namespace that hold items or
// dead letters on the shard, in name order after After.
func (s Store) TopicList(ctx context.Context, p TopicListParams) ([]TopicCount, error) {
	var rows []TopicCount
	if err := s.db.SelectContext(ctx, &rows, topicListSQL, p.Namespace, p.After, p.Limit, p.Namespace, p.After, p.Limit, p.Limit); err != nil {
		return nil, err
	}
	return rows, nil
}

// itemCountNamespaceSQL counts a namespace's items up to a cap, reading
// at most that many entries of an index whose prefix is the namespace.
const itemCountNamespaceSQL = "SELECT COUNT(*) FROM (SELECT 1 FROM items WHERE namespace = ? LIMIT ?) AS capped"

// ItemCountNamespaceParams: see ItemCountNamespace.
type ItemCountNamespaceParams struct {
	Namespace string
	Limit     int64
}

// ItemCountNamespace counts a namespace's items on the shard, up to Limit:
// enough to tell whether a depth quota is reached, never the whole
// backlog.
func (s Store) ItemCountNamespace(ctx context.Context, p ItemCountNamespaceParams) (int64, error) {
	var n int64
	if err := s.db.GetContext(ctx, &n, itemCountNamespaceSQL, p.Namespace, p.Limit); err != nil {
		return 0, err
	}
	return n, nil
}

// itemExpiredSQL locks the oldest expired items (TTL), through the ttl
// index, so the sweep touches only expired rows whatever the backlog.
const itemExpiredSQL = `SELECT id, namespace, topic, dedup_key, enqueued_at FROM items
			WHERE expires_at <= ? ORDER BY expires_at LIMIT ? FOR UPDATE`

// tombstoneSweepSQL deletes dedup tombstones past their window, through
// their expires index.
const tombstoneSweepSQL = "DELETE FROM dedup_tombstones WHERE expires_at <= ? ORDER BY expires_at LIMIT ?"

// itemNextExpirySQL reads the earliest TTL of the shard's items, through
// the ttl index (NULLs, items without a TTL, sort first and MIN skips
// them).
const itemNextExpirySQL = "SELECT MIN(expires_at) FROM items"

// ItemNextExpiry returns when the shard's next item expires (unix µs, the
// primary's clock), and false when no item has a TTL: a sweeper with
// nothing due can wait until then.
func (s Store) ItemNextExpiry(ctx context.Context) (int64, bool, error) {
	var us sql.NullInt64
	if err := s.db.GetContext(ctx, &us, itemNextExpirySQL); err != nil {
		return 0, false, fmt.Errorf("next expiry: %w", err)
	}
	return us.Int64, us.Valid, nil
}

// ItemSweepExpiredParams: see ItemSweepExpired.
type ItemSweepExpiredParams struct {
	NowUS int64
	Limit int
	// Window is the dedup window of a namespace.
	Window func(namespace string) time.Duration
}

// ItemSweepExpired deletes up to Limit items whose TTL has passed, keeping
// their dedup keys taken for their namespace's window, then up to Limit
// dedup tombstones past their window. It returns the larger of the two
// counts, so a caller sweeps again while either is at Limit.
func (s Store) ItemSweepExpired(ctx context.Context, p ItemSweepExpiredParams) (int64, error) {
	var n int64
	err := inTx(ctx, s.db, func(tx *sqlx.Tx) error {
		n = 0
		var rows []Item
		if err := tx.SelectContext(ctx, &rows, itemExpiredSQL, p.NowUS, p.Limit); err != nil {
			return err
		}
		if len(rows) == 0 {
			return nil
		}
		ids := make([]uint64, len(rows))
		for i, r := range rows {
			ids[i] = r.ID
			if r.DedupKey.Valid {
				w := p.Window(r.Namespace)
				if err := tombstoneAt(ctx, tx, r.Namespace, r.Topic, r.DedupKey.String, r.ID, r.EnqueuedAt, p.NowUS, w); err != nil {
					return err
				}
			}
		}
		var err error
		n, err = deleteItems(ctx, tx, ids, "")
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("ttl sweep: %w", err)
	}
	res, err := s.db.ExecContext(ctx, tombstoneSweepSQL, p.NowUS, p.Limit)
	if err != nil {
		return n, fmt.Errorf("tombstone sweep: %w", err)
	}
	m, _ := res.RowsAffected()
	return max(n, m), nil
}
