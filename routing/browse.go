package routing

import (
	"cmp"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/jmoiron/sqlx"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
	"github.com/triage-queue/triage/schema/metrics"
	"github.com/triage-queue/triage/schema/store"
)

// ListItems page sizes: the default and the most one page may hold.
const (
	DefaultItemPage = 50
	MaxItemPage     = 500
)

// itemStates are the states ListItems lists, by the names it takes.
var itemStates = map[string]store.ItemState{
	"ready":   store.StateReady,
	"leased":  store.StateLeased,
	"delayed": store.StateDelayed,
}

// itemCursor is the position after a page of ListItems: the state it
// lists and the last row's (priority, deliver_after, key). Item keys are
// unique across shards (NodeClaim), so the triple orders every shard's
// rows as one list, and each shard's page starts after it.
type itemCursor struct {
	state string
	row   store.Item
}

// String encodes the cursor as the opaque page token: base64url of
// "state.priority.deliver_after.key".
func (c itemCursor) String() string {
	s := fmt.Sprintf("%s.%d.%d.%d", c.state, c.row.Priority, c.row.DeliverAfter, c.row.ID)
	return base64.RawURLEncoding.EncodeToString([]byte(s))
}

func parseItemCursor(token, state string) (*store.Item, error) {
	if token == "" {
		return nil, nil
	}
	bad := invalid("page_token %q: pass back the next_page_token of the previous page, with the same state", token)
	raw, err := base64.RawURLEncoding.DecodeString(token)
	if err != nil {
		return nil, bad
	}
	parts := strings.Split(string(raw), ".")
	if len(parts) != 4 || parts[0] != state {
		return nil, bad
	}
	prio, err1 := strconv.ParseInt(parts[1], 10, 32)
	after, err2 := strconv.ParseInt(parts[2], 10, 64)
	key, err3 := strconv.ParseUint(parts[3], 10, 64)
	if err1 != nil || err2 != nil || err3 != nil {
		return nil, bad
	}
	return &store.Item{Priority: int32(prio), DeliverAfter: after, ID: key}, nil
}

// listItemsParams checks a ListItems request and turns it into the
// store's parameters, all but the time.
func listItemsParams(req *triagev1.ListItemsRequest) (store.ItemListParams, string, error) {
	p := store.ItemListParams{Namespace: req.Namespace, Topic: req.Topic, MinPriority: math.MinInt32, MaxPriority: math.MaxInt32}
	state := strings.ToLower(req.State)
	var ok bool
	if p.State, ok = itemStates[state]; !ok {
		return p, "", invalid("state %q: allowed ready, leased or delayed", req.State)
	}
	size := int(req.PageSize)
	if size < 0 || size > MaxItemPage {
		return p, "", invalid("page_size %d: allowed 1 to %d, or 0 for %d", size, MaxItemPage, DefaultItemPage)
	}
	p.Limit = cmp.Or(size, DefaultItemPage)
	if req.MinPriority != nil {
		p.MinPriority = *req.MinPriority
	}
	if req.MaxPriority != nil {
		p.MaxPriority = *req.MaxPriority
	}
	if p.MinPriority > p.MaxPriority {
		return p, "", invalid("min_priority %d is above max_priority %d: allowed min_priority <= max_priority", p.MinPriority, p.MaxPriority)
	}
	var err error
	p.After, err = parseItemCursor(req.PageToken, state)
	return p, state, err
}

// itemRow is an item row and the shard it was read from.
type itemRow struct {
	store.Item
	shard uint32
}

// ListItems implements triagev1.QueueServer: a topic's items in one
// state, across the region's shards, in delivery order. Each shard reads
// its first page_size+1 rows after the cursor (store.ItemList: ranges of
// the ready index), and the merge keeps the first page_size of them all,
// so a page is what one list of every shard's rows would show. Every
// shard's read names the namespace: the list holds only its items. A
// shard's read that runs past its budget (store.ErrListTooSlow) is
// ErrPrecondition, which says to narrow the priority range.
func (r *Router) ListItems(ctx context.Context, req *triagev1.ListItemsRequest) (*triagev1.ListItemsResponse, error) {
	m := r.cfg.Maps.Current()
	shards, err := r.topicShards(m, req.Namespace, req.Topic, req.Region)
	if err != nil {
		return nil, err
	}
	p, state, err := listItemsParams(req)
	if err != nil {
		return nil, err
	}
	now := r.cfg.Now()
	p.NowUS = now.UnixMicro()
	size := p.Limit
	p.Limit = size + 1
	var mu sync.Mutex
	var all []itemRow
	err = r.eachShard(ctx, m, shards, false, func(ctx context.Context, shard uint32, db *sqlx.DB) error {
		rows, err := store.New(db).ItemList(ctx, p)
		if errors.Is(err, store.ErrListTooSlow) {
			return fmt.Errorf("%w: listing %s items of %q read past its time budget on shard %d (%v); narrow it with min_priority and max_priority",
				ErrPrecondition, state, req.Topic, shard, err)
		}
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		for _, row := range rows {
			all = append(all, itemRow{row, shard})
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	slices.SortFunc(all, func(a, b itemRow) int { return a.Compare(&b.Item) })
	resp := &triagev1.ListItemsResponse{}
	if len(all) > size {
		all = all[:size]
		resp.NextPageToken = itemCursor{state: state, row: all[size-1].Item}.String()
	}
	ns, _ := m.Namespace(req.Namespace) // topicShards found it
	for _, row := range all {
		s, _ := m.Shard(row.shard)
		it := itemProto(&row.Item, row.shard, s.HomeRegion, now)
		it.PayloadTruncated = row.PayloadBytes > int64(len(row.Payload))
		it.MaxAttempts = maxAttempts(ns, req.Topic)
		resp.Items = append(resp.Items, it)
	}
	return resp, nil
}

// GetThroughput implements triagev1.QueueServer: the namespace's rates
// over the last hour from this node's own counters (metrics.Throughput),
// which count each namespace apart.
func (r *Router) GetThroughput(_ context.Context, req *triagev1.GetThroughputRequest) (*triagev1.Throughput, error) {
	m := r.cfg.Maps.Current()
	if _, err := m.Namespace(req.Namespace); err != nil {
		return nil, err
	}
	t := r.cfg.Metrics.Throughput(req.Namespace)
	return &triagev1.Throughput{
		Namespace:    req.Namespace,
		Start:        timestamppb.New(t.Start),
		Interval:     durationpb.New(t.Interval),
		Enqueued:     t.Rates[metrics.RateEnqueued],
		Delivered:    t.Rates[metrics.RateDelivered],
		Acked:        t.Rates[metrics.RateAcked],
		DeadLettered: t.Rates[metrics.RateDeadLettered],
	}, nil
}
