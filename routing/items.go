package routing

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/jmoiron/sqlx"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/triage-queue/triage/dequeuer"
	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
	"github.com/triage-queue/triage/routing/itemid"
	"github.com/triage-queue/triage/shardmap"
)

// MarshalMetadata stores metadata as a JSON object of strings, without
// HTML escaping (dequeuer.MarshalMetadata: one encoder for enqueue, update
// and nack, so validation measures what is stored).
func MarshalMetadata(m map[string]string) ([]byte, error) { return dequeuer.MarshalMetadata(m) }

// itemShard parses an item ID and returns its shard's primary; for a
// write, only when the shard may be written now.
func (r *Router) itemShard(m *shardmap.Map, s string, write bool) (itemid.ID, *sqlx.DB, error) {
	id, err := itemid.Parse(s)
	if err != nil {
		return id, nil, err
	}
	if _, ok := m.Shard(id.Shard); !ok {
		return id, nil, fmt.Errorf("%w %q: shard %d does not exist", itemid.ErrInvalid, s, id.Shard)
	}
	if write {
		db, err := r.cfg.Pool.Writer(r.cfg.Maps, id.Shard)
		return id, db, err
	}
	db, _, err := r.cfg.Pool.Primary(m, id.Shard)
	return id, db, err
}

type itemRow struct {
	ID           uint64         `db:"id"`
	Namespace    string         `db:"namespace"`
	Topic        string         `db:"topic"`
	Priority     int32          `db:"priority"`
	DeliverAfter int64          `db:"deliver_after"`
	EnqueuedAt   int64          `db:"enqueued_at"`
	LeaseMS      uint32         `db:"lease_ms"`
	ExpiresAt    sql.NullInt64  `db:"expires_at"`
	Attempts     int32          `db:"attempts"`
	LeaseToken   uint64         `db:"lease_token"`
	LeasedUntil  sql.NullInt64  `db:"leased_until"`
	DedupKey     sql.NullString `db:"dedup_key"`
	Payload      []byte         `db:"payload"`
	Metadata     []byte         `db:"metadata"`
	LastError    sql.NullString `db:"last_error"`
	UpdatedAt    int64          `db:"updated_at"`
	OrigPriority sql.NullInt32  `db:"original_priority"`
	ChangedBy    sql.NullString `db:"priority_changed_by"`
	ChangedAt    sql.NullInt64  `db:"priority_changed_at"`
}

const selectItem = `SELECT id, namespace, topic, priority, deliver_after, enqueued_at, lease_ms, expires_at, attempts,
	lease_token, leased_until, dedup_key, payload, metadata, last_error, updated_at,
	original_priority, priority_changed_by, priority_changed_at
FROM items WHERE id = ? AND namespace = ?`

func (row *itemRow) proto(shard uint32, region string, now time.Time) *triagev1.Item {
	it := &triagev1.Item{
		Id:            itemid.ID{Shard: shard, Key: row.ID}.String(),
		Namespace:     row.Namespace,
		Topic:         row.Topic,
		Priority:      row.Priority,
		Payload:       row.Payload,
		DeliverAfter:  timestamppb.New(time.UnixMicro(row.DeliverAfter)),
		LeaseDuration: durationpb.New(time.Duration(row.LeaseMS) * time.Millisecond),
		DedupKey:      row.DedupKey.String,
		Attempts:      row.Attempts,
		EnqueuedAt:    timestamppb.New(time.UnixMicro(row.EnqueuedAt)),
		LastError:     row.LastError.String,
		Region:        region,
		UpdatedAt:     timestamppb.New(time.UnixMicro(row.UpdatedAt)),
	}
	if row.ExpiresAt.Valid {
		it.ExpiresAt = timestamppb.New(time.UnixMicro(row.ExpiresAt.Int64))
	}
	it.OriginalPriority = row.Priority
	if row.OrigPriority.Valid {
		it.OriginalPriority = row.OrigPriority.Int32
		it.PriorityChangedBy = row.ChangedBy.String
		it.PriorityChangedAt = timestamppb.New(time.UnixMicro(row.ChangedAt.Int64))
	}
	if len(row.Metadata) > 0 {
		_ = json.Unmarshal(row.Metadata, &it.Metadata)
	}
	nowUS := now.UnixMicro()
	switch {
	case row.prefetched():
		// In a dequeuer's prefetch buffer: ready, not yet delivered.
		it.State = triagev1.ItemState_READY
	case row.LeaseToken != 0 && row.LeasedUntil.Valid && row.LeasedUntil.Int64 > nowUS:
		it.State = triagev1.ItemState_LEASED
		it.LeaseExpiresAt = timestamppb.New(time.UnixMicro(row.LeasedUntil.Int64))
	case row.DeliverAfter > nowUS:
		it.State = triagev1.ItemState_DELAYED
	default:
		it.State = triagev1.ItemState_READY
	}
	return it
}

// prefetched reports whether the row sits in a dequeuer's prefetch
// buffer: leased under a batch token, with no delivery lease (no
// leased_until). Its deliver_after is the prefetch lease's expiry.
func (row *itemRow) prefetched() bool { return row.LeaseToken != 0 && !row.LeasedUntil.Valid }

func getRow(ctx context.Context, q sqlx.QueryerContext, namespace string, key uint64, forUpdate bool) (*itemRow, error) {
	query := selectItem
	if forUpdate {
		query += " FOR UPDATE"
	}
	var row itemRow
	if err := sqlx.GetContext(ctx, q, &row, query, key, namespace); err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return nil, dequeuer.ErrNotFound
		}
		return nil, err
	}
	return &row, nil
}

// GetItem implements triagev1.QueueServer.
func (r *Router) GetItem(ctx context.Context, req *triagev1.GetItemRequest) (*triagev1.Item, error) {
	m := r.cfg.Maps.Current()
	if _, err := m.Namespace(req.Namespace); err != nil {
		return nil, toStatus(err)
	}
	id, db, err := r.itemShard(m, req.Id, false)
	if err != nil {
		return nil, toStatus(err)
	}
	row, err := getRow(ctx, db, req.Namespace, id.Key, false)
	if err != nil {
		return nil, toStatus(err)
	}
	s, _ := m.Shard(id.Shard)
	return row.proto(id.Shard, s.HomeRegion, r.cfg.Clock.Now(ctx, db)), nil
}

// UpdateItem implements triagev1.QueueServer. Priority and metadata change
// in any state; deliver_after only while the item is not leased, because
// for a leased item it is the lease's expiry.
func (r *Router) UpdateItem(ctx context.Context, req *triagev1.UpdateItemRequest) (*triagev1.Item, error) {
	m := r.cfg.Maps.Current()
	if _, err := m.Namespace(req.Namespace); err != nil {
		return nil, toStatus(err)
	}
	if req.Priority == nil && req.DeliverAfter == nil && len(req.Metadata) == 0 {
		return nil, toStatus(invalid("nothing to update: set priority, deliver_after or metadata"))
	}
	if err := checkTimestamp("deliver_after", req.DeliverAfter, r.cfg.Now(), MaxDeliverDelay); err != nil {
		return nil, toStatus(err)
	}
	if err := checkMetadata(req.Metadata); err != nil {
		return nil, toStatus(err)
	}
	id, db, err := r.itemShard(m, req.Id, true)
	if err != nil {
		return nil, toStatus(err)
	}
	if err := r.unbuffer(ctx, req.Namespace, id); err != nil {
		return nil, toStatus(err)
	}
	// Lease state and stamps are in the primary's time (Config.Clock).
	now := r.cfg.Clock.Now(ctx, db)
	tx, err := db.BeginTxx(ctx, nil)
	if err != nil {
		return nil, toStatus(err)
	}
	defer tx.Rollback()
	row, err := getRow(ctx, tx, req.Namespace, id.Key, true)
	if err != nil {
		return nil, toStatus(err)
	}
	leased := row.LeaseToken != 0 && row.LeasedUntil.Valid && row.LeasedUntil.Int64 > now.UnixMicro()
	if req.DeliverAfter != nil && leased {
		return nil, toStatus(fmt.Errorf("%w: item %s is leased until %s; deliver_after can change once it is acked, nacked or its lease lapses",
			dequeuer.ErrStaleLease, req.Id, time.UnixMicro(row.LeasedUntil.Int64).UTC().Format(time.RFC3339)))
	}
	if len(req.UpdatedBy) > 128 {
		return nil, toStatus(invalid("updated_by is %d bytes; at most 128 allowed", len(req.UpdatedBy)))
	}
	if req.Priority != nil && *req.Priority != row.Priority {
		if !row.OrigPriority.Valid {
			row.OrigPriority = sql.NullInt32{Int32: row.Priority, Valid: true}
		}
		row.Priority = *req.Priority
		row.ChangedBy = sql.NullString{String: cmp.Or(req.UpdatedBy, "api"), Valid: true}
		row.ChangedAt = sql.NullInt64{Int64: now.UnixMicro(), Valid: true}
	}
	if row.prefetched() {
		// A fetch that was in flight during the unbuffer above holds the
		// row: take it from the buffer. Its stale copy cannot be served,
		// since serving is conditional on the batch token cleared here,
		// and the row is ready again at once. Its deliver_after was the
		// prefetch lease's expiry; the item was ready before, so now.
		row.LeaseToken = 0
		row.DeliverAfter = min(row.DeliverAfter, now.UnixMicro())
	}
	if req.DeliverAfter != nil {
		row.DeliverAfter = req.DeliverAfter.AsTime().UnixMicro()
	}
	if row.Metadata, err = dequeuer.MergeMetadata(row.Metadata, req.Metadata); err != nil {
		return nil, toStatus(err)
	}
	row.UpdatedAt = now.UnixMicro()
	if _, err := tx.ExecContext(ctx, `UPDATE items SET priority = ?, deliver_after = ?, metadata = ?, updated_at = ?,
		original_priority = ?, priority_changed_by = ?, priority_changed_at = ?, lease_token = ? WHERE id = ?`,
		row.Priority, row.DeliverAfter, row.Metadata, row.UpdatedAt, row.OrigPriority, row.ChangedBy, row.ChangedAt, row.LeaseToken, row.ID); err != nil {
		return nil, toStatus(err)
	}
	if err := tx.Commit(); err != nil {
		return nil, toStatus(err)
	}
	if err := r.afterWrite(id.Shard); err != nil {
		return nil, toStatus(err)
	}
	// A fetch in flight during the first unbuffer may have buffered a
	// stale copy since; drop it (it could not be served anyway, see
	// above) so it does not hold a place in the merge.
	if err := r.unbuffer(ctx, req.Namespace, id); err != nil {
		r.log.Warn("unbuffer after update failed; the stale copy is dropped when served", "err", err)
	}
	if req.Priority != nil || req.DeliverAfter != nil || row.LeaseToken == 0 {
		// Let prefetch buffers holding less urgent items look again, so
		// the change takes effect on the next dequeue.
		r.announce(req.Namespace, row.Topic, id.Shard, 1)
	}
	s, _ := m.Shard(id.Shard)
	return row.proto(id.Shard, s.HomeRegion, now), nil
}

// DeleteItem implements triagev1.QueueServer.
func (r *Router) DeleteItem(ctx context.Context, req *triagev1.DeleteItemRequest) (*triagev1.DeleteItemResponse, error) {
	m := r.cfg.Maps.Current()
	if _, err := m.Namespace(req.Namespace); err != nil {
		return nil, toStatus(err)
	}
	id, db, err := r.itemShard(m, req.Id, true)
	if err != nil {
		return nil, toStatus(err)
	}
	if err := r.unbuffer(ctx, req.Namespace, id); err != nil {
		return nil, toStatus(err)
	}
	ns, _ := m.Namespace(req.Namespace)
	tx, err := db.BeginTxx(ctx, nil)
	if err != nil {
		return nil, toStatus(err)
	}
	defer tx.Rollback()
	row, err := getRow(ctx, tx, req.Namespace, id.Key, true)
	if err != nil {
		return nil, toStatus(err)
	}
	if _, err := tx.ExecContext(ctx, "DELETE FROM items WHERE id = ?", id.Key); err != nil {
		return nil, toStatus(err)
	}
	if err := dequeuer.Tombstone(ctx, tx, req.Namespace, row.Topic, row.DedupKey.String, row.ID, time.Duration(ns.DedupWindow)); err != nil {
		return nil, toStatus(err)
	}
	if err := tx.Commit(); err != nil {
		return nil, toStatus(err)
	}
	if err := r.afterWrite(id.Shard); err != nil {
		return nil, toStatus(err)
	}
	return &triagev1.DeleteItemResponse{}, nil
}

// GetTopicStats implements triagev1.QueueServer. It counts with index
// range scans over the topic, so its cost grows with the topic's depth:
// fine for dashboards, not for a hot loop.
func (r *Router) GetTopicStats(ctx context.Context, req *triagev1.GetTopicStatsRequest) (*triagev1.TopicStats, error) {
	m := r.cfg.Maps.Current()
	if _, err := m.Namespace(req.Namespace); err != nil {
		return nil, toStatus(err)
	}
	if err := checkName("topic", req.Topic); err != nil {
		return nil, toStatus(err)
	}
	region, err := r.region(req.Region, m)
	if err != nil {
		return nil, toStatus(err)
	}
	shards, err := m.ShardsFor(req.Namespace, region)
	if err != nil {
		return nil, toStatus(err)
	}
	nowUS := r.cfg.Now().UnixMicro()
	type prio struct {
		Priority int32 `db:"priority"`
		Ready    int64 `db:"ready"`
		Oldest   int64 `db:"oldest"`
	}
	type totals struct {
		Total  int64         `db:"total"`
		Leased sql.NullInt64 `db:"leased"`
	}
	stats := &triagev1.TopicStats{Namespace: req.Namespace, Topic: req.Topic}
	byPrio := map[int32]int64{}
	oldest := int64(0)
	var mu sync.Mutex
	err = r.eachShard(ctx, m, shards, false, func(ctx context.Context, _ uint32, db *sqlx.DB) error {
		var ps []prio
		// A prefetched row (a dequeuer's buffer holds it: lease_token set,
		// leased_until NULL) is ready: it waits for a consumer, and its
		// deliver_after is only the prefetch lease's expiry. Its ready
		// time is not stored, so it does not count toward the oldest age.
		if err := db.SelectContext(ctx, &ps, `SELECT priority, COUNT(*) AS ready,
			COALESCE(MIN(CASE WHEN deliver_after <= ? THEN deliver_after END), 0) AS oldest FROM items
			WHERE namespace = ? AND topic = ? AND (deliver_after <= ? OR (lease_token <> 0 AND leased_until IS NULL))
			GROUP BY priority`, nowUS, req.Namespace, req.Topic, nowUS); err != nil {
			return err
		}
		var t totals
		if err := db.GetContext(ctx, &t, `SELECT COUNT(*) AS total, SUM(lease_token <> 0 AND leased_until > ?) AS leased FROM items
			WHERE namespace = ? AND topic = ?`, nowUS, req.Namespace, req.Topic); err != nil {
			return err
		}
		var dead int64
		if err := db.GetContext(ctx, &dead, `SELECT COUNT(*) FROM dead_letters WHERE namespace = ? AND topic = ?`,
			req.Namespace, req.Topic); err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		for _, p := range ps {
			byPrio[p.Priority] += p.Ready
			stats.Ready += p.Ready
			if p.Oldest != 0 && (oldest == 0 || p.Oldest < oldest) {
				oldest = p.Oldest
			}
		}
		stats.Total += t.Total
		stats.Leased += t.Leased.Int64
		stats.DeadLetters += dead
		return nil
	})
	if err != nil {
		return nil, toStatus(err)
	}
	stats.Delayed = stats.Total - stats.Ready - stats.Leased
	for p, n := range byPrio {
		stats.ReadyByPriority = append(stats.ReadyByPriority, &triagev1.PriorityDepth{Priority: p, Ready: n})
	}
	sort.Slice(stats.ReadyByPriority, func(i, j int) bool { return stats.ReadyByPriority[i].Priority < stats.ReadyByPriority[j].Priority })
	if oldest != 0 {
		stats.OldestReadyAge = durationpb.New(time.Duration(nowUS-oldest) * time.Microsecond)
	}
	return stats, nil
}

// ListTopics implements triagev1.QueueServer: topics that hold items on the
// region's shards, in name order, paged by name.
func (r *Router) ListTopics(ctx context.Context, req *triagev1.ListTopicsRequest) (*triagev1.ListTopicsResponse, error) {
	m := r.cfg.Maps.Current()
	if _, err := m.Namespace(req.Namespace); err != nil {
		return nil, toStatus(err)
	}
	region, err := r.region(req.Region, m)
	if err != nil {
		return nil, toStatus(err)
	}
	size := int(req.PageSize)
	if size < 0 || size > 1000 {
		return nil, toStatus(invalid("page_size %d: allowed 1 to 1000, or 0 for 100", size))
	}
	if size == 0 {
		size = 100
	}
	shards, err := m.ShardsFor(req.Namespace, region)
	if err != nil {
		return nil, toStatus(err)
	}
	counts := map[string]int64{}
	var mu sync.Mutex
	err = r.eachShard(ctx, m, shards, false, func(ctx context.Context, _ uint32, db *sqlx.DB) error {
		var rows []struct {
			Topic string `db:"topic"`
			N     int64  `db:"n"`
		}
		// The ready index leads with (namespace, topic), so this walks the
		// namespace's index range in topic order.
		if err := db.SelectContext(ctx, &rows, `SELECT topic, COUNT(*) AS n FROM items FORCE INDEX (ready)
			WHERE namespace = ? AND topic > ? GROUP BY topic ORDER BY topic LIMIT ?`, req.Namespace, req.PageToken, size+1); err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		for _, row := range rows {
			counts[row.Topic] += row.N
		}
		return nil
	})
	if err != nil {
		return nil, toStatus(err)
	}
	names := make([]string, 0, len(counts))
	for t := range counts {
		names = append(names, t)
	}
	sort.Strings(names)
	resp := &triagev1.ListTopicsResponse{}
	if len(names) > size {
		names = names[:size]
		resp.NextPageToken = names[size-1]
	}
	for _, t := range names {
		resp.Topics = append(resp.Topics, &triagev1.TopicSummary{Topic: t, Items: counts[t]})
	}
	return resp, nil
}

// GetShardMap implements triagev1.AdminServer.
func (r *Router) GetShardMap(context.Context, *triagev1.GetShardMapRequest) (*triagev1.ShardMap, error) {
	m := r.cfg.Maps.Current()
	out := &triagev1.ShardMap{Version: m.Version, Regions: m.Regions}
	for _, s := range m.Shards {
		out.Shards = append(out.Shards, &triagev1.Shard{Id: s.ID, HomeRegion: s.HomeRegion, Primary: s.Primary, Replicas: s.Replicas,
			Epoch: s.Epoch, PrimaryRegion: cmp.Or(s.PrimaryRegion, s.HomeRegion), ReplicaRegions: s.ReplicaRegions, Fenced: s.Fenced})
	}
	for _, ns := range m.Namespaces {
		for _, region := range m.Regions {
			ids, err := m.ShardsFor(ns.Name, region)
			if err != nil {
				continue
			}
			out.Namespaces = append(out.Namespaces, &triagev1.NamespaceShards{Namespace: ns.Name, Region: region, Shards: ids})
		}
	}
	return out, nil
}

// countItems counts a namespace's items on shards (for max_depth), up to
// limit per shard: the quota only needs to know whether max_depth is
// reached, so each shard reads at most limit entries of an index whose
// prefix is the namespace, never the whole backlog.
func (r *Router) countItems(ctx context.Context, m *shardmap.Map, ns string, shards []uint32, limit int64) (int64, error) {
	var mu sync.Mutex
	var total int64
	err := r.eachShard(ctx, m, shards, false, func(ctx context.Context, _ uint32, db *sqlx.DB) error {
		var n int64
		if err := db.GetContext(ctx, &n, "SELECT COUNT(*) FROM (SELECT 1 FROM items WHERE namespace = ? LIMIT ?) AS capped", ns, limit); err != nil {
			return err
		}
		mu.Lock()
		total += n
		mu.Unlock()
		return nil
	})
	return total, err
}
