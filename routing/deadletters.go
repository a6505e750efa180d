package routing

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jmoiron/sqlx"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/triage-queue/triage/proto/triage/peer"
	peerv1 "github.com/triage-queue/triage/proto/triage/peer/v1"
	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
	"github.com/triage-queue/triage/schema/itemid"
	"github.com/triage-queue/triage/schema/store"
	"github.com/triage-queue/triage/shardmap"
)

// deadRow is a dead letter and the shard it was read from.
type deadRow struct {
	store.DeadLetter
	shard uint32
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
		return nil, err
	}
	size := int(req.PageSize)
	if size < 0 || size > 1000 {
		return nil, invalid("page_size %d: allowed 1 to 1000, or 0 for 100", size)
	}
	size = cmp.Or(size, 100)
	cur, err := parseDeadCursor(req.PageToken)
	if err != nil {
		return nil, err
	}
	var mu sync.Mutex
	var all []deadRow
	err = r.eachShard(ctx, m, shards, false, func(ctx context.Context, shard uint32, db *sqlx.DB) error {
		rows, err := store.New(db).DeadLetterList(ctx, store.DeadLetterListParams{Namespace: req.Namespace, Topic: req.Topic,
			AfterDiedAt: cur.diedAt, AfterID: cur.key, Limit: size + 1})
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		for _, d := range rows {
			all = append(all, deadRow{d, shard})
		}
		return nil
	})
	if err != nil {
		return nil, err
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
		return nil, err
	}
	shards, byShard, err := deadLetterKeys(req.Namespace, req.Ids, shards)
	if err != nil {
		return nil, err
	}
	var total int64
	var mu sync.Mutex
	err = r.eachShard(ctx, m, shards, true, func(ctx context.Context, shard uint32, db *sqlx.DB) error {
		n, err := store.New(db).DeadLetterRedrive(ctx, store.DeadLetterRedriveParams{Namespace: req.Namespace, Topic: req.Topic,
			Keys: byShard[shard], NowUS: r.cfg.Clock.Now(ctx, db).UnixMicro()})
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
		return nil, err
	}
	r.cfg.Metrics.Topic(req.Namespace, req.Topic).Redriven.Add(float64(total))
	return &triagev1.RedriveDeadLettersResponse{Redriven: total}, nil
}

// deadLetterKeys parses the dead-letter IDs of a redrive or delete and
// groups their keys by shard. With IDs it returns only their shards;
// without, all of shards (the whole topic) and no keys.
func deadLetterKeys(ns string, ids []string, shards []uint32) ([]uint32, map[uint32][]uint64, error) {
	if len(ids) > MaxRefsPerCall {
		return nil, nil, invalid("%d ids in one call; at most %d allowed", len(ids), MaxRefsPerCall)
	}
	byShard := map[uint32][]uint64{}
	for _, s := range ids {
		id, err := itemid.Parse(s)
		if err != nil {
			return nil, nil, err
		}
		if !slices.Contains(shards, id.Shard) {
			return nil, nil, fmt.Errorf("%w %q: shard %d does not serve namespace %q here", itemid.ErrInvalid, s, id.Shard, ns)
		}
		byShard[id.Shard] = append(byShard[id.Shard], id.Key)
	}
	if len(ids) == 0 {
		return shards, byShard, nil
	}
	return slices.Sorted(maps.Keys(byShard)), byShard, nil
}

// DeleteDeadLetters implements triagev1.QueueServer: it deletes the
// listed dead letters, or with all every one of the topic's on the
// region's shards, each shard's in bounded transactions
// (store.DeadLetterDelete), only those that died before req.Before when
// set. The request must say which of the two it means: an empty ID list
// never stands for everything, so a client that lost its list deletes
// nothing. Every check comes before the first delete.
func (r *Router) DeleteDeadLetters(ctx context.Context, req *triagev1.DeleteDeadLettersRequest) (*triagev1.DeleteDeadLettersResponse, error) {
	m := r.cfg.Maps.Current()
	shards, err := r.topicShards(m, req.Namespace, req.Topic, req.Region)
	if err != nil {
		return nil, err
	}
	switch {
	case req.All && len(req.Ids) > 0:
		return nil, invalid("ids and all together: give either ids (1 to %d dead letter IDs) or all: true, not both", MaxRefsPerCall)
	case !req.All && len(req.Ids) == 0:
		return nil, invalid("nothing to delete: give ids (1 to %d dead letter IDs) or all: true (every dead letter of the topic, optionally before a time)", MaxRefsPerCall)
	}
	var beforeUS int64
	if req.Before != nil {
		if err := req.Before.CheckValid(); err != nil {
			return nil, invalid("before: %v; want a time after 1970-01-01T00:00:00Z (RFC 3339 in JSON)", err)
		}
		if beforeUS = req.Before.AsTime().UnixMicro(); beforeUS <= 0 {
			return nil, invalid("before %s: want a time after 1970-01-01T00:00:00Z (RFC 3339 in JSON)", req.Before.AsTime().Format(time.RFC3339Nano))
		}
	}
	shards, byShard, err := deadLetterKeys(req.Namespace, req.Ids, shards)
	if err != nil {
		return nil, err
	}
	var total int64
	var mu sync.Mutex
	err = r.eachShard(ctx, m, shards, true, func(ctx context.Context, shard uint32, db *sqlx.DB) error {
		n, err := store.New(db).DeadLetterDelete(ctx, store.DeadLetterDeleteParams{Namespace: req.Namespace, Topic: req.Topic,
			Keys: byShard[shard], BeforeUS: beforeUS})
		if err == nil {
			err = r.afterWrite(shard)
		}
		mu.Lock()
		total += n
		mu.Unlock()
		return err
	})
	r.cfg.Metrics.Topic(req.Namespace, req.Topic).DeadLettersDeleted.Add(float64(total))
	if err != nil {
		return nil, err
	}
	return &triagev1.DeleteDeadLettersResponse{Deleted: total}, nil
}

// announce tells dequeuers that a topic on shard has new ready items of
// unknown priority.
func (r *Router) announce(ns, topic string, shard uint32, count int32) {
	ready := &peerv1.ItemsReady{Namespace: ns, Topic: topic, Shard: shard, MinPriority: math.MinInt32, Count: count}
	if r.cfg.Local != nil {
		r.cfg.Local.Ready(ready)
	}
	if data, err := proto.Marshal(ready); err == nil {
		_ = r.cfg.NC.Publish(peer.ReadySubject(ns), data)
	}
}
