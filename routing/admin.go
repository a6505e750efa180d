package routing

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
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

// Failover implements triagev1.AdminServer by asking the controller
// leader (NATS request on regions.FailoverSubject, which only the leader
// subscribes to).
func (r *Router) Failover(ctx context.Context, req *triagev1.FailoverRequest) (*triagev1.FailoverResponse, error) {
	m := r.cfg.Maps.Current()
	if _, ok := m.Shard(req.Shard); !ok {
		return nil, toStatus(errorf(store.ErrNotFound, "shard %d is not in the shard map", req.Shard))
	}
	if req.ToRegion != "" && !m.HasRegion(req.ToRegion) {
		return nil, toStatus(invalid("to_region %q: allowed %v", req.ToRegion, m.Regions))
	}
	data, _ := json.Marshal(regions.FailoverRequest{Shard: req.Shard, ToRegion: req.ToRegion, Planned: req.Planned})
	rctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	msg, err := r.cfg.NC.RequestWithContext(rctx, regions.FailoverSubject, data)
	if err != nil {
		return nil, toStatus(errorf(ErrUnavailable, "no failover controller answered: %v", err))
	}
	var res regions.FailoverResult
	if err := json.Unmarshal(msg.Data, &res); err != nil {
		return nil, toStatus(err)
	}
	out := &triagev1.FailoverResponse{NewPrimary: res.NewPrimary, Epoch: res.Epoch}
	for _, e := range res.Events {
		out.Events = append(out.Events, failoverEvent(e))
	}
	if res.Error != "" {
		return out, toStatus(errorf(ErrFailover, "%s", res.Error))
	}
	return out, nil
}

// GetNamespace implements triagev1.AdminServer.
func (r *Router) GetNamespace(_ context.Context, req *triagev1.GetNamespaceRequest) (*triagev1.Namespace, error) {
	ns, err := r.cfg.Maps.Current().Namespace(req.Namespace)
	if err != nil {
		return nil, toStatus(err)
	}
	return namespaceProto(r.cfg.Maps.Current(), ns), nil
}

// PutNamespace implements triagev1.AdminServer: it creates or replaces a
// namespace's configuration in the shard map. Fields left out take their
// defaults. It retries when another writer published in between.
func (r *Router) PutNamespace(ctx context.Context, req *triagev1.PutNamespaceRequest) (*triagev1.Namespace, error) {
	if r.cfg.Publisher == nil {
		return nil, toStatus(errorf(ErrUnavailable, "this router cannot change the shard map"))
	}
	if err := checkName("namespace", req.Namespace); err != nil {
		return nil, toStatus(err)
	}
	cfg := req.Config
	if cfg == nil {
		cfg = &triagev1.Namespace{}
	}
	if cfg.Name != "" && cfg.Name != req.Namespace {
		return nil, toStatus(invalid("body name %q differs from the URL's namespace %q", cfg.Name, req.Namespace))
	}
	for attempt := 0; ; attempt++ {
		m := r.cfg.Maps.Current()
		ns, err := namespaceFromProto(req.Namespace, cfg, m)
		if err != nil {
			return nil, toStatus(err)
		}
		// Keep the dedup slot tables (the API has no field for them): a
		// key's shard must not move while its item or tombstone lives, so
		// a change that drops a shard a region's slots name is refused by
		// the map. A region without a table yet gets one filled there.
		if stored, err := m.Namespace(req.Namespace); err == nil {
			ns.Slots = stored.Slots
		}
		next, err := m.WithNamespace(ns)
		if err != nil {
			return nil, toStatus(errorf(ErrInvalid, "%v", err))
		}
		// An item must fit one message of the enqueue buffer alone.
		if stored, _ := next.Namespace(req.Namespace); stored.MaxPayloadBytes > r.MaxPayloadFor(req.Namespace) {
			return nil, toStatus(invalid("max_payload_bytes %d: the enqueue buffer (NATS max_payload %d) carries payloads of at most %d bytes beside full metadata; lower it or raise NATS max_payload",
				stored.MaxPayloadBytes, r.maxMsg(), r.MaxPayloadFor(req.Namespace)))
		}
		err = r.cfg.Publisher.PublishMap(ctx, m, next)
		if err == nil {
			stored, _ := next.Namespace(req.Namespace)
			return namespaceProto(next, stored), nil
		}
		if !errors.Is(err, shardmap.ErrConflict) || attempt == 4 {
			return nil, toStatus(errorf(ErrUnavailable, "publish shard map: %v", err))
		}
		// Someone else published; wait for our watcher to see it.
		select {
		case <-ctx.Done():
			return nil, toStatus(ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func dur(d shardmap.Duration) *durationpb.Duration {
	if d == 0 {
		return nil
	}
	return durationpb.New(time.Duration(d))
}

func namespaceProto(m *shardmap.Map, ns *shardmap.Namespace) *triagev1.Namespace {
	out := &triagev1.Namespace{
		Name:                 ns.Name,
		MaxPayloadBytes:      int32(ns.MaxPayloadBytes),
		DefaultLeaseDuration: dur(ns.DefaultLeaseDuration),
		MaxAttempts:          int32(ns.MaxAttempts),
		DefaultTtl:           dur(ns.DefaultTTL),
		EnqueueRateLimit:     ns.EnqueueRateLimit,
		EnqueueBurst:         int32(ns.EnqueueBurst),
		MaxDepth:             ns.MaxDepth,
		DedupWindow:          dur(ns.DedupWindow),
	}
	for _, region := range m.Regions {
		if ids, err := m.ShardsFor(ns.Name, region); err == nil {
			out.Shards = append(out.Shards, &triagev1.NamespaceShards{Namespace: ns.Name, Region: region, Shards: ids})
		}
	}
	if len(ns.Topics) > 0 {
		out.Topics = map[string]*triagev1.TopicConfig{}
		for name, tc := range ns.Topics {
			p := triagev1.DequeuePolicy_STRICT
			if tc.Policy == shardmap.PolicyWeighted {
				p = triagev1.DequeuePolicy_WEIGHTED
			}
			out.Topics[name] = &triagev1.TopicConfig{Policy: p, BandWeights: tc.BandWeights, AtMostOnce: tc.AtMostOnce,
				AgingThreshold: dur(tc.AgingThreshold)}
		}
	}
	return out
}

func durOf(what string, d *durationpb.Duration) (shardmap.Duration, error) {
	if d == nil {
		return 0, nil
	}
	if err := d.CheckValid(); err != nil || d.AsDuration() < 0 {
		return 0, invalid("%s must be a non-negative duration", what)
	}
	return shardmap.Duration(d.AsDuration()), nil
}

func namespaceFromProto(name string, p *triagev1.Namespace, m *shardmap.Map) (shardmap.Namespace, error) {
	ns := shardmap.Namespace{
		Name:             name,
		MaxPayloadBytes:  int(p.MaxPayloadBytes),
		MaxAttempts:      int(p.MaxAttempts),
		EnqueueRateLimit: p.EnqueueRateLimit,
		EnqueueBurst:     int(p.EnqueueBurst),
		MaxDepth:         p.MaxDepth,
	}
	var err error
	if ns.DefaultLeaseDuration, err = durOf("default_lease_duration", p.DefaultLeaseDuration); err != nil {
		return ns, err
	}
	if ns.DefaultTTL, err = durOf("default_ttl", p.DefaultTtl); err != nil {
		return ns, err
	}
	if ns.DedupWindow, err = durOf("dedup_window", p.DedupWindow); err != nil {
		return ns, err
	}
	for _, s := range p.Shards {
		if !m.HasRegion(s.Region) {
			return ns, invalid("shards: region %q: allowed %v", s.Region, m.Regions)
		}
		if ns.Shards == nil {
			ns.Shards = map[string][]uint32{}
		}
		ns.Shards[s.Region] = s.Shards
	}
	for topic, tc := range p.Topics {
		if ns.Topics == nil {
			ns.Topics = map[string]shardmap.TopicConfig{}
		}
		c := shardmap.TopicConfig{BandWeights: tc.BandWeights, AtMostOnce: tc.AtMostOnce}
		switch tc.Policy {
		case triagev1.DequeuePolicy_DEQUEUE_POLICY_UNSPECIFIED, triagev1.DequeuePolicy_STRICT:
			c.Policy = shardmap.PolicyStrict
		case triagev1.DequeuePolicy_WEIGHTED:
			c.Policy = shardmap.PolicyWeighted
		default:
			return ns, invalid("topics[%q].policy %d: allowed STRICT or WEIGHTED", topic, tc.Policy)
		}
		if c.AgingThreshold, err = durOf("topics["+topic+"].aging_threshold", tc.AgingThreshold); err != nil {
			return ns, err
		}
		ns.Topics[topic] = c
	}
	return ns, nil
}

// ListFailoverEvents implements triagev1.AdminServer by asking the
// controller leader for its recent failover steps (NATS request on
// regions.EventsSubject, which only the leader subscribes to).
func (r *Router) ListFailoverEvents(ctx context.Context, req *triagev1.ListFailoverEventsRequest) (*triagev1.ListFailoverEventsResponse, error) {
	if req.Limit < 0 || req.Limit > 1000 {
		return nil, toStatus(invalid("limit %d: allowed 0 (100) to 1000", req.Limit))
	}
	data, _ := json.Marshal(regions.EventsRequest{Limit: int(req.Limit)})
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	msg, err := r.cfg.NC.RequestWithContext(rctx, regions.EventsSubject, data)
	if err != nil {
		return nil, toStatus(errorf(ErrUnavailable, "no failover controller answered: %v", err))
	}
	var res regions.EventsResult
	if err := json.Unmarshal(msg.Data, &res); err != nil {
		return nil, toStatus(err)
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
