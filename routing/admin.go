package routing

import (
	"context"
	"encoding/json"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/triage-queue/triage/regions"
	"github.com/triage-queue/triage/schema/store"

	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
	"github.com/triage-queue/triage/shardmap"
)

// MapPublisher stores a new shard map version; the node backs it with the
// NATS KV bucket (shardmap.Publish), so every router sees it within a
// second.
type MapPublisher interface {
	PublishMap(ctx context.Context, prev, next *shardmap.Map) error
}

// Admin implements the Admin service (triagev1.AdminServer): shard map,
// namespaces, shards, failovers and drill reports. It is its own type so
// that the Queue and Admin APIs, which authorization and the node's
// listeners treat apart, are apart in the code too; it shares its
// Router's state.
type Admin struct {
	triagev1.UnimplementedAdminServer
	r *Router
}

// Admin returns the Admin service of r.
func (r *Router) Admin() *Admin { return &Admin{r: r} }

// Failover implements triagev1.AdminServer by asking the controller
// leader (NATS request on regions.FailoverSubject, which only the leader
// subscribes to).
func (a *Admin) Failover(ctx context.Context, req *triagev1.FailoverRequest) (*triagev1.FailoverResponse, error) {
	r := a.r
	m := r.cfg.Maps.Current()
	if _, ok := m.Shard(req.Shard); !ok {
		return nil, errorf(store.ErrNotFound, "shard %d is not in the shard map", req.Shard)
	}
	if req.ToRegion != "" && !m.HasRegion(req.ToRegion) {
		return nil, invalid("to_region %q: allowed %v", req.ToRegion, m.Regions)
	}
	data, _ := json.Marshal(regions.FailoverRequest{Shard: req.Shard, ToRegion: req.ToRegion, Planned: req.Planned})
	rctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	msg, err := r.cfg.NC.RequestWithContext(rctx, regions.FailoverSubject, data)
	if err != nil {
		return nil, errorf(ErrUnavailable, "no failover controller answered: %v", err)
	}
	var res regions.FailoverResult
	if err := json.Unmarshal(msg.Data, &res); err != nil {
		return nil, err
	}
	out := &triagev1.FailoverResponse{NewPrimary: res.NewPrimary, Epoch: res.Epoch}
	for _, e := range res.Events {
		out.Events = append(out.Events, failoverEvent(e))
	}
	if res.Error != "" {
		return out, errorf(ErrFailover, "%s", res.Error)
	}
	return out, nil
}

// ListFailoverEvents implements triagev1.AdminServer by asking the
// controller leader for its recent failover steps (NATS request on
// regions.EventsSubject, which only the leader subscribes to).
func (a *Admin) ListFailoverEvents(ctx context.Context, req *triagev1.ListFailoverEventsRequest) (*triagev1.ListFailoverEventsResponse, error) {
	r := a.r
	if req.Limit < 0 || req.Limit > 1000 {
		return nil, invalid("limit %d: allowed 0 (100) to 1000", req.Limit)
	}
	data, _ := json.Marshal(regions.EventsRequest{Limit: int(req.Limit)})
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	msg, err := r.cfg.NC.RequestWithContext(rctx, regions.EventsSubject, data)
	if err != nil {
		return nil, errorf(ErrUnavailable, "no failover controller answered: %v", err)
	}
	var res regions.EventsResult
	if err := json.Unmarshal(msg.Data, &res); err != nil {
		return nil, err
	}
	out := &triagev1.ListFailoverEventsResponse{Controller: res.Controller}
	for _, e := range res.Events {
		out.Events = append(out.Events, failoverEvent(e))
	}
	return out, nil
}

func failoverEvent(e regions.Event) *triagev1.FailoverEvent {
	return &triagev1.FailoverEvent{At: timestamppb.New(e.At), Shard: e.Shard, Step: e.Step, Details: e.Details}
}
