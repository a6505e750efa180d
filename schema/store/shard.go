package store

import (
	"context"
	"database/sql"
	"errors"
	"time"
)

// dedupHolderSQL reads the item that holds a dedup key, live or as a
// tombstone within its window or its retry window: the lookup a router makes on the shard a
// dedup slot moved away from (shardmap.Namespace.SlotsFrom). Both reads
// are point reads of a unique key (items.dedup, the tombstones' primary
// key).
const dedupHolderSQL = `SELECT id FROM items WHERE namespace = ? AND topic = ? AND dedup_key = ?
	UNION ALL
	SELECT item_id FROM dedup_tombstones WHERE namespace = ? AND topic = ? AND dedup_key = ? AND (window_until > ? OR held_since > ?)
	LIMIT 1`

// shardContentsSQL counts what a shard still holds before it may be
// retired. On a drained shard these are small; items and dead_letters are
// counted whole because retiring must see every row, whatever its state.
const shardContentsSQL = `SELECT
	(SELECT COUNT(*) FROM items),
	(SELECT COUNT(*) FROM dead_letters),
	(SELECT COUNT(*) FROM dedup_tombstones WHERE window_until > ?),
	(SELECT COUNT(*) FROM refused_items)`

// DedupHolderParams: see DedupHolder.
type DedupHolderParams struct {
	Namespace, Topic, DedupKey string
	NowUS                      int64
	// RetryWindow is the namespace's dedup retry window.
	RetryWindow time.Duration
}

// DedupHolder returns the key of the item on this shard that holds a dedup
// key (a live item, or a tombstone within its window or RetryWindow of
// its item's enqueue), and false when
// none does. It takes no locks: the caller makes sure nothing can insert
// the key here any more (the shard is drained and its buffer empty).
func (s Store) DedupHolder(ctx context.Context, p DedupHolderParams) (uint64, bool, error) {
	var id uint64
	err := s.db.QueryRowxContext(ctx, dedupHolderSQL, p.Namespace, p.Topic, p.DedupKey, p.Namespace, p.Topic, p.DedupKey, p.NowUS, p.NowUS-p.RetryWindow.Microseconds()).Scan(&id)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, false, nil
	}
	return id, err == nil, err
}

// ShardContents is what a shard holds, counted by ShardContentsCount.
type ShardContents struct {
	Items, DeadLetters, Tombstones, Refused int64
}

// Empty reports whether nothing is left that retiring would lose.
func (c ShardContents) Empty() bool {
	return c.Items == 0 && c.DeadLetters == 0 && c.Tombstones == 0 && c.Refused == 0
}

// ShardContentsCount counts the shard's items, dead letters, live dedup
// tombstones and refused items (see ShardContents).
func (s Store) ShardContentsCount(ctx context.Context, nowUS int64) (ShardContents, error) {
	var c ShardContents
	err := s.db.QueryRowxContext(ctx, shardContentsSQL, nowUS).Scan(&c.Items, &c.DeadLetters, &c.Tombstones, &c.Refused)
	return c, err
}
