package routing

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jmoiron/sqlx"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/triage-queue/triage/enqueuer"
	peerv1 "github.com/triage-queue/triage/proto/triage/peer/v1"
	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
	"github.com/triage-queue/triage/routing/itemid"
	"github.com/triage-queue/triage/schema"
	"github.com/triage-queue/triage/shardmap"
)

type deadRow struct {
	ID         uint64         `db:"id"`
	Topic      string         `db:"topic"`
	Priority   int32          `db:"priority"`
	EnqueuedAt int64          `db:"enqueued_at"`
	Attempts   int32          `db:"attempts"`
	Payload    []byte         `db:"payload"`
	Metadata   []byte         `db:"metadata"`
	LastError  sql.NullString `db:"last_error"`
	DiedAt     int64          `db:"died_at"`
	shard      uint32
}

// deadCursor is a position in (died_at, id) order; the page token is
// "<died_at>.<key>".
type deadCursor struct {
	diedAt int64
	key    uint64
}

func parseDeadCursor(s string) (deadCursor, error) {
	if s == "" {
		return deadCursor{}, nil
	}
	a, b, ok := strings.Cut(s, ".")
	died, err1 := strconv.ParseInt(a, 10, 64)
	key, err2 := strconv.ParseUint(b, 10, 64)
	if !ok || err1 != nil || err2 != nil {
		return deadCursor{}, invalid("page_token %q: pass back the next_page_token of the previous page", s)
	}
	return deadCursor{died, key}, nil
}

func (r *Router) topicShards(m *shardmap.Map, ns, topic, reqRegion string) ([]uint32, error) {
	if _, err := m.Namespace(ns); err != nil {
		return nil, err
	}
	if err := checkName("topic", topic); err != nil {
		return nil, err
	}
	region, err := r.region(reqRegion, m)
	if err != nil {
		return nil, err
	}
	return m.ShardsFor(ns, region)
}

// eachShard runs fn on every shard's primary concurrently; for writes only
// on shards that may be written now.
func (r *Router) eachShard(ctx context.Context, m *shardmap.Map, shards []uint32, write bool, fn func(ctx context.Context, shard uint32, db *sqlx.DB) error) error {
	groups := make(map[uint32][]int, len(shards))
	for i, id := range shards {
		groups[id] = []int{i}
	}
	return r.perShard(ctx, m, groups, func(ctx context.Context, shard uint32, _ []int) error {
		var db *sqlx.DB
		var err error
		if write {
			db, err = r.cfg.Pool.Writer(r.cfg.Maps, shard)
		} else {
			db, _, err = r.cfg.Pool.Primary(m, shard)
		}
		if err != nil {
			return err
		}
		return fn(ctx, shard, db)
	})
}

// ListDeadLetters implements triagev1.QueueServer: oldest first across the
// region's shards, paged by (died_at, id).
func (r *Router) ListDeadLetters(ctx context.Context, req *triagev1.ListDeadLettersRequest) (*triagev1.ListDeadLettersResponse, error) {
	m := r.cfg.Maps.Current()
	shards, err := r.topicShards(m, req.Namespace, req.Topic, req.Region)
	if err != nil {
		return nil, toStatus(err)
	}
	size := int(req.PageSize)
	if size < 0 || size > 1000 {
		return nil, toStatus(invalid("page_size %d: allowed 1 to 1000, or 0 for 100", size))
	}
	size = cmp.Or(size, 100)
	cur, err := parseDeadCursor(req.PageToken)
	if err != nil {
		return nil, toStatus(err)
	}
	var mu sync.Mutex
	var all []deadRow
	err = r.eachShard(ctx, m, shards, false, func(ctx context.Context, shard uint32, db *sqlx.DB) error {
		var rows []deadRow
		// The topic_died index serves this range in order.
		if err := db.SelectContext(ctx, &rows, `SELECT id, topic, priority, enqueued_at, attempts, payload, metadata, last_error, died_at
			FROM dead_letters WHERE namespace = ? AND topic = ? AND (died_at > ? OR (died_at = ? AND id > ?))
			ORDER BY died_at, id LIMIT ?`, req.Namespace, req.Topic, cur.diedAt, cur.diedAt, cur.key, size+1); err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		for i := range rows {
			rows[i].shard = shard
		}
		all = append(all, rows...)
		return nil
	})
	if err != nil {
		return nil, toStatus(err)
	}
	slices.SortFunc(all, func(a, b deadRow) int {
		return cmp.Or(cmp.Compare(a.DiedAt, b.DiedAt), cmp.Compare(a.ID, b.ID))
	})
	resp := &triagev1.ListDeadLettersResponse{}
	if len(all) > size {
		all = all[:size]
		last := all[size-1]
		resp.NextPageToken = fmt.Sprintf("%d.%d", last.DiedAt, last.ID)
	}
	for _, d := range all {
		dl := &triagev1.DeadLetter{
			Id: itemid.ID{Shard: d.shard, Key: d.ID}.String(), Topic: d.Topic, Priority: d.Priority, Payload: d.Payload,
			Attempts: d.Attempts, LastError: d.LastError.String,
			EnqueuedAt: timestamppb.New(time.UnixMicro(d.EnqueuedAt)), DiedAt: timestamppb.New(time.UnixMicro(d.DiedAt)),
		}
		if len(d.Metadata) > 0 {
			_ = json.Unmarshal(d.Metadata, &dl.Metadata)
		}
		resp.DeadLetters = append(resp.DeadLetters, dl)
	}
	return resp, nil
}

// RedriveDeadLetters implements triagev1.QueueServer (SQS-style redrive):
// dead letters go back to their topic, ready now, attempts reset. A dead
// letter whose dedup key a live item holds stays where it is.
func (r *Router) RedriveDeadLetters(ctx context.Context, req *triagev1.RedriveDeadLettersRequest) (*triagev1.RedriveDeadLettersResponse, error) {
	m := r.cfg.Maps.Current()
	shards, err := r.topicShards(m, req.Namespace, req.Topic, req.Region)
	if err != nil {
		return nil, toStatus(err)
	}
	byShard := map[uint32][]uint64{}
	if len(req.Ids) > MaxRefsPerCall {
		return nil, toStatus(invalid("%d ids in one call; at most %d allowed", len(req.Ids), MaxRefsPerCall))
	}
	for _, s := range req.Ids {
		id, err := itemid.Parse(s)
		if err != nil {
			return nil, toStatus(err)
		}
		if !slices.Contains(shards, id.Shard) {
			return nil, toStatus(fmt.Errorf("%w %q: shard %d does not serve namespace %q here", itemid.ErrInvalid, s, id.Shard, req.Namespace))
		}
		byShard[id.Shard] = append(byShard[id.Shard], id.Key)
	}
	if len(req.Ids) > 0 {
		shards = shards[:0:0]
		for id := range byShard {
			shards = append(shards, id)
		}
	}
	var total int64
	var mu sync.Mutex
	err = r.eachShard(ctx, m, shards, true, func(ctx context.Context, shard uint32, db *sqlx.DB) error {
		n, err := redriveShard(ctx, db, req.Namespace, req.Topic, byShard[shard], r.cfg.Clock.Now(ctx, db).UnixMicro())
		if err == nil {
			err = r.afterWrite(shard)
		}
		mu.Lock()
		total += n
		mu.Unlock()
		if n > 0 {
			r.announce(req.Namespace, req.Topic, shard, int32(min(n, 1<<30)))
		}
		return err
	})
	if err != nil {
		return nil, toStatus(err)
	}
	return &triagev1.RedriveDeadLettersResponse{Redriven: total}, nil
}

// redriveShard moves dead letters of a topic (only keys, when given) back
// to items, 500 per transaction.
func redriveShard(ctx context.Context, db *sqlx.DB, ns, topic string, keys []uint64, nowUS int64) (int64, error) {
	var total int64
	for {
		tx, err := db.BeginTxx(ctx, nil)
		if err != nil {
			return total, err
		}
		var ids []uint64
		q, args := "SELECT id FROM dead_letters WHERE namespace = ? AND topic = ? ORDER BY died_at, id LIMIT 500 FOR UPDATE", []any{ns, topic}
		if len(keys) > 0 {
			k, kargs := schema.Keys("dead_letters", "d", keys)
			q = "SELECT d.id FROM " + k + " WHERE d.namespace = ? AND d.topic = ? FOR UPDATE"
			args = append(kargs, ns, topic)
		}
		if err := tx.SelectContext(ctx, &ids, q, args...); err != nil || len(ids) == 0 {
			tx.Rollback()
			return total, err
		}
		k, kargs := schema.Keys("dead_letters", "d", ids)
		if _, err := tx.ExecContext(ctx, `INSERT INTO items (id, namespace, topic, priority, deliver_after, enqueued_at, lease_ms, attempts,
				dedup_key, payload, metadata, last_error, updated_at)
			SELECT d.id, d.namespace, d.topic, d.priority, ?, d.enqueued_at, d.lease_ms, 0, d.dedup_key, d.payload, d.metadata, d.last_error, ?
			FROM `+k+`
			ON DUPLICATE KEY UPDATE id = items.id`, append([]any{nowUS, nowUS}, kargs...)...); err != nil {
			tx.Rollback()
			return total, err
		}
		// Only what landed in items leaves the dead-letter table.
		res, err := tx.ExecContext(ctx, `DELETE d FROM `+k+` STRAIGHT_JOIN items i FORCE INDEX (PRIMARY) ON i.id = d.id`, kargs...)
		if err != nil {
			tx.Rollback()
			return total, err
		}
		if err := tx.Commit(); err != nil {
			return total, err
		}
		n, _ := res.RowsAffected()
		total += n
		if len(keys) > 0 || n == 0 {
			return total, nil
		}
	}
}

// announce tells dequeuers that a topic on shard has new ready items of
// unknown priority.
func (r *Router) announce(ns, topic string, shard uint32, count int32) {
	ready := &peerv1.ItemsReady{Namespace: ns, Topic: topic, Shard: shard, MinPriority: math.MinInt32, Count: count}
	if r.cfg.Local != nil {
		r.cfg.Local.Ready(ready)
	}
	if data, err := proto.Marshal(ready); err == nil {
		_ = r.cfg.NC.Publish(enqueuer.ReadySubject(ns), data)
	}
}
