package routing

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/jmoiron/sqlx"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
	"github.com/triage-queue/triage/schema/itemid"
	"github.com/triage-queue/triage/schema/store"
	"github.com/triage-queue/triage/shardmap"
)

// MarshalMetadata stores metadata as a JSON object of strings, without
// HTML escaping (store.MarshalMetadata: one encoder for enqueue, update
// and nack, so validation measures what is stored).
func MarshalMetadata(m map[string]string) ([]byte, error) { return store.MarshalMetadata(m) }

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

// itemProto is the API's view of an item row at now (the shard
// primary's time), for an item of shard homed in region.
func itemProto(row *store.Item, shard uint32, region string, now time.Time) *triagev1.Item {
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
		Traceparent:   row.Traceparent.String,
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
	case row.Prefetched():
		// Under an older version's prefetch lease: ready, not yet delivered.
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

// GetItem implements triagev1.QueueServer.
func (r *Router) GetItem(ctx context.Context, req *triagev1.GetItemRequest) (*triagev1.Item, error) {
	m := r.cfg.Maps.Current()
	ns, err := m.Namespace(req.Namespace)
	if err != nil {
		return nil, err
	}
	id, db, err := r.itemShard(m, req.Id, false)
	if err != nil {
		return nil, err
	}
	row, err := store.New(db).ItemGet(ctx, store.ItemGetParams{Namespace: req.Namespace, ID: id.Key})
	if err != nil {
		return nil, err
	}
	s, _ := m.Shard(id.Shard)
	it := itemProto(row, id.Shard, s.HomeRegion, r.cfg.Clock.Now(ctx, db))
	it.MaxAttempts = maxAttempts(ns, it.Topic)
	return it, nil
}

// maxAttempts is the deliveries topic's items of ns get (0: no limit).
func maxAttempts(ns *shardmap.Namespace, topic string) int32 {
	n, _ := ns.Retry(topic)
	return int32(n)
}

// UpdateItem implements triagev1.QueueServer. Priority and metadata change
// in any state; deliver_after only while the item is not leased, because
// for a leased item it is the lease's expiry.
func (r *Router) UpdateItem(ctx context.Context, req *triagev1.UpdateItemRequest) (*triagev1.Item, error) {
	m := r.cfg.Maps.Current()
	ns, err := m.Namespace(req.Namespace)
	if err != nil {
		return nil, err
	}
	if req.Priority == nil && req.DeliverAfter == nil && len(req.Metadata) == 0 {
		return nil, invalid("nothing to update: set priority, deliver_after or metadata")
	}
	if err := checkTimestamp("deliver_after", req.DeliverAfter, r.cfg.Now(), MaxDeliverDelay); err != nil {
		return nil, err
	}
	if err := checkMetadata(req.Metadata); err != nil {
		return nil, err
	}
	id, db, err := r.itemShard(m, req.Id, true)
	if err != nil {
		return nil, err
	}
	if err := r.unbuffer(ctx, req.Namespace, id); err != nil {
		return nil, err
	}
	// Lease state and stamps are in the primary's time (Config.Clock).
	now := r.cfg.Clock.Now(ctx, db)
	row, err := store.New(db).ItemUpdate(ctx, store.ItemUpdateParams{Namespace: req.Namespace, ID: id.Key,
		Update: func(row *store.Item) error { return updateRow(row, req, now) }})
	if err != nil {
		return nil, writeOutcome(err, id.Shard, retryUpdate)
	}
	if err := r.afterWrite(id.Shard); err != nil {
		return nil, err
	}
	// A fetch in flight during the first unbuffer may have buffered a
	// stale copy since; drop it (it could not be served anyway, see
	// updateRow) so it does not hold a place in the merge.
	if err := r.unbuffer(ctx, req.Namespace, id); err != nil {
		r.log.Warn("unbuffer after update failed; the stale copy is dropped when served", "err", err)
	}
	if req.Priority != nil || req.DeliverAfter != nil || row.LeaseToken == 0 {
		// Let prefetch buffers holding less urgent items look again, so
		// the change takes effect on the next dequeue.
		r.announce(req.Namespace, row.Topic, id.Shard, 1)
	}
	s, _ := m.Shard(id.Shard)
	it := itemProto(row, id.Shard, s.HomeRegion, now)
	it.MaxAttempts = maxAttempts(ns, it.Topic)
	return it, nil
}

// updateRow applies an update to the item's row, read under its lock at
// now (the primary's time).
func updateRow(row *store.Item, req *triagev1.UpdateItemRequest, now time.Time) error {
	leased := row.LeaseToken != 0 && row.LeasedUntil.Valid && row.LeasedUntil.Int64 > now.UnixMicro()
	if req.DeliverAfter != nil && leased {
		return fmt.Errorf("%w: item %s is leased until %s; deliver_after can change once it is acked, nacked or its lease lapses",
			store.ErrStaleLease, req.Id, time.UnixMicro(row.LeasedUntil.Int64).UTC().Format(time.RFC3339))
	}
	if len(req.UpdatedBy) > 128 {
		return invalid("updated_by is %d bytes; at most 128 allowed", len(req.UpdatedBy))
	}
	if req.Priority != nil && *req.Priority != row.Priority {
		if !row.OrigPriority.Valid {
			row.OrigPriority = sql.NullInt32{Int32: row.Priority, Valid: true}
		}
		row.Priority = *req.Priority
		row.ChangedBy = sql.NullString{String: cmp.Or(req.UpdatedBy, "api"), Valid: true}
		row.ChangedAt = sql.NullInt64{Int64: now.UnixMicro(), Valid: true}
	}
	if row.Prefetched() {
		// Under the prefetch lease of an older version (a rolling
		// upgrade): take it back, so the row is ready again at once. Its
		// deliver_after was the prefetch lease's expiry; the item was ready
		// before, so now.
		row.LeaseToken = 0
		row.DeliverAfter = min(row.DeliverAfter, now.UnixMicro())
	}
	if row.LeaseToken != 0 && row.LeasedUntil.Valid && !leased {
		// The lease lapsed: this update ends it, so the old consumer's
		// token no longer holds the row. Its ack, nack or extend would
		// otherwise go on to undo what this update wrote (a nack moving
		// deliver_after back, an ack deleting the item).
		row.LeaseToken = 0
		row.LeasedUntil = sql.NullInt64{}
	}
	if req.DeliverAfter != nil {
		row.DeliverAfter = req.DeliverAfter.AsTime().UnixMicro()
	}
	var err error
	if row.Metadata, err = store.MergeMetadata(row.Metadata, req.Metadata); err != nil {
		return err
	}
	row.UpdatedAt = now.UnixMicro()
	return nil
}

// DeleteItem implements triagev1.QueueServer.
func (r *Router) DeleteItem(ctx context.Context, req *triagev1.DeleteItemRequest) (*triagev1.DeleteItemResponse, error) {
	m := r.cfg.Maps.Current()
	if _, err := m.Namespace(req.Namespace); err != nil {
		return nil, err
	}
	id, db, err := r.itemShard(m, req.Id, true)
	if err != nil {
		return nil, err
	}
	if err := r.unbuffer(ctx, req.Namespace, id); err != nil {
		return nil, err
	}
	ns, _ := m.Namespace(req.Namespace)
	// The tombstone's window runs on this router's clock, as it always has.
	if err := store.New(db).ItemDelete(ctx, store.ItemDeleteParams{Namespace: req.Namespace, ID: id.Key,
		DedupWindow: time.Duration(ns.DedupWindow), Now: time.Now()}); err != nil {
		return nil, writeOutcome(err, id.Shard, retryDelete)
	}
	if err := r.afterWrite(id.Shard); err != nil {
		return nil, err
	}
	return &triagev1.DeleteItemResponse{}, nil
}

// GetTopicStats implements triagev1.QueueServer. It counts with index
// range scans over the topic, so its cost grows with the topic's depth:
// fine for dashboards, not for a hot loop.
func (r *Router) GetTopicStats(ctx context.Context, req *triagev1.GetTopicStatsRequest) (*triagev1.TopicStats, error) {
	m := r.cfg.Maps.Current()
	if _, err := m.Namespace(req.Namespace); err != nil {
		return nil, err
	}
	if err := checkName("topic", req.Topic); err != nil {
		return nil, err
	}
	region, err := r.region(req.Region, m)
	if err != nil {
		return nil, err
	}
	shards, err := m.ShardsFor(req.Namespace, region)
	if err != nil {
		return nil, err
	}
	nowUS := r.cfg.Now().UnixMicro()
	stats := &triagev1.TopicStats{Namespace: req.Namespace, Topic: req.Topic, Paused: topicPaused(m, req.Namespace, req.Topic)}
	byPrio := map[int32]int64{}
	oldest := int64(0)
	var mu sync.Mutex
	err = r.eachShard(ctx, m, shards, false, func(ctx context.Context, _ uint32, db *sqlx.DB) error {
		// Prefetched rows count as ready (see store.TopicStats).
		t, err := store.New(db).TopicStats(ctx, store.TopicStatsParams{Namespace: req.Namespace, Topic: req.Topic, NowUS: nowUS})
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		for _, p := range t.Ready {
			byPrio[p.Priority] += p.Ready
			stats.Ready += p.Ready
			if p.Oldest != 0 && (oldest == 0 || p.Oldest < oldest) {
				oldest = p.Oldest
			}
		}
		stats.Total += t.Total
		stats.Leased += t.Leased
		stats.DeadLetters += t.DeadLetters
		return nil
	})
	if err != nil {
		return nil, err
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

// addPaused marks the topics of ns on pause in counts and adds those
// after the page token that hold nothing, so that a topic on pause stays
// listed (and can be found and resumed) when it is empty. Every shard's
// page and the topics on pause are each sorted from the token on, so the
// merged page is still the first topics after it.
func addPaused(m *shardmap.Map, ns, after string, counts map[string]*triagev1.TopicSummary) {
	n, err := m.Namespace(ns)
	if err != nil {
		return
	}
	for name, tc := range n.Topics {
		if !tc.Paused || name <= after {
			continue
		}
		if c := counts[name]; c != nil {
			c.Paused = true
		} else {
			counts[name] = &triagev1.TopicSummary{Topic: name, Paused: true}
		}
	}
}

// ListTopics implements triagev1.QueueServer: topics that hold items or
// dead letters on the region's shards, or are paused, in name order,
// paged by name.
func (r *Router) ListTopics(ctx context.Context, req *triagev1.ListTopicsRequest) (*triagev1.ListTopicsResponse, error) {
	m := r.cfg.Maps.Current()
	if _, err := m.Namespace(req.Namespace); err != nil {
		return nil, err
	}
	region, err := r.region(req.Region, m)
	if err != nil {
		return nil, err
	}
	size := int(req.PageSize)
	if size < 0 || size > 1000 {
		return nil, invalid("page_size %d: allowed 1 to 1000, or 0 for 100", size)
	}
	if size == 0 {
		size = 100
	}
	shards, err := m.ShardsFor(req.Namespace, region)
	if err != nil {
		return nil, err
	}
	counts := map[string]*triagev1.TopicSummary{}
	var mu sync.Mutex
	err = r.eachShard(ctx, m, shards, false, func(ctx context.Context, _ uint32, db *sqlx.DB) error {
		rows, err := store.New(db).TopicList(ctx, store.TopicListParams{Namespace: req.Namespace, After: req.PageToken, Limit: size + 1})
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		for _, row := range rows {
			c := counts[row.Topic]
			if c == nil {
				c = &triagev1.TopicSummary{Topic: row.Topic}
				counts[row.Topic] = c
			}
			c.Items += row.N
			c.DeadLetters += row.DeadLetters
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	addPaused(m, req.Namespace, req.PageToken, counts)
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
		resp.Topics = append(resp.Topics, counts[t])
	}
	return resp, nil
}

// GetShardMap implements triagev1.AdminServer.
func (a *Admin) GetShardMap(context.Context, *triagev1.GetShardMapRequest) (*triagev1.ShardMap, error) {
	r := a.r
	m := r.cfg.Maps.Current()
	out := &triagev1.ShardMap{Version: m.Version, Regions: m.Regions}
	for _, s := range m.Shards {
		out.Shards = append(out.Shards, shardProto(s))
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
		n, err := store.New(db).ItemCountNamespace(ctx, store.ItemCountNamespaceParams{Namespace: ns, Limit: limit})
		if err != nil {
			return err
		}
		mu.Lock()
		total += n
		mu.Unlock()
		return nil
	})
	return total, err
}
