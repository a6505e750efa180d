package routing

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
	"github.com/triage-queue/triage/routing/auth"
	"github.com/triage-queue/triage/shardmap"
)

// MaxTopicConfigs bounds a namespace's topic configs. They live in the
// shard map, which every router holds and which is one NATS KV value: a
// namespace admin could otherwise grow it until no change to it, a
// failover's included, can be published.
const MaxTopicConfigs = 64

// GetNamespace implements triagev1.AdminServer.
func (a *Admin) GetNamespace(_ context.Context, req *triagev1.GetNamespaceRequest) (*triagev1.Namespace, error) {
	r := a.r
	ns, err := r.cfg.Maps.Current().Namespace(req.Namespace)
	if err != nil {
		return nil, err
	}
	return namespaceProto(r.cfg.Maps.Current(), ns), nil
}

// PutNamespace implements triagev1.AdminServer: it creates a namespace,
// replaces its configuration or, with an update_mask, changes the fields
// the mask names. Shards and quotas are cluster-admin's: a caller without
// cluster-admin whose request would change one (leaving it out of a
// replace included) is refused with PERMISSION_DENIED naming the fields,
// before anything is published. The check compares against the map the
// change is built on, and publishing is a compare-and-set on that map, so
// no concurrent change slips past it; when another writer published
// first, it builds and checks the change again on the new map.
func (a *Admin) PutNamespace(ctx context.Context, req *triagev1.PutNamespaceRequest) (*triagev1.Namespace, error) {
	r := a.r
	if r.cfg.Publisher == nil {
		return nil, errorf(ErrUnavailable, "this router cannot change the shard map")
	}
	if err := checkName("namespace", req.Namespace); err != nil {
		return nil, err
	}
	cfg := req.Config
	if cfg == nil {
		cfg = &triagev1.Namespace{}
	}
	if cfg.Name != "" && cfg.Name != req.Namespace {
		return nil, invalid("body name %q differs from the URL's namespace %q", cfg.Name, req.Namespace)
	}
	upd, err := parseMask(req.UpdateMask)
	if err != nil {
		return nil, err
	}
	who := callerOf(ctx)
	for attempt := 0; ; attempt++ {
		m := r.cfg.Maps.Current()
		next, err := namespaceChange(m, req.Namespace, cfg, upd, who)
		if err != nil {
			return nil, err
		}
		// An item must fit one message of the enqueue buffer alone.
		if after, _ := next.Namespace(req.Namespace); after.MaxPayloadBytes > r.MaxPayloadFor(req.Namespace) {
			return nil, invalid("max_payload_bytes %d: the enqueue buffer (NATS max_payload %d) carries payloads of at most %d bytes beside full metadata; lower it or raise NATS max_payload",
				after.MaxPayloadBytes, r.maxMsg(), r.MaxPayloadFor(req.Namespace))
		}
		err = r.cfg.Publisher.PublishMap(ctx, m, next)
		if err == nil {
			stored, _ := next.Namespace(req.Namespace)
			return namespaceProto(next, stored), nil
		}
		if errors.Is(err, shardmap.ErrTooLarge) {
			return nil, fmt.Errorf("publish shard map: %w", err) // RESOURCE_EXHAUSTED: no retry helps
		}
		if !errors.Is(err, shardmap.ErrConflict) || attempt == 4 {
			return nil, errorf(ErrUnavailable, "publish shard map: %v", err)
		}
		// Someone else published; wait for our watcher to see it.
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// namespaceChange is the map after a PutNamespace of namespace name on m,
// or why the change is refused: bad input, a caller who may not make it,
// a limit of the map.
func namespaceChange(m *shardmap.Map, name string, cfg *triagev1.Namespace, upd update, who caller) (*shardmap.Map, error) {
	stored, err := m.Namespace(name)
	if err != nil {
		stored = nil
	}
	if stored == nil && !who.clusterAdmin {
		// routing/auth refuses this first; a namespace that is new to this
		// router's map is refused here too.
		return nil, errorf(ErrPermissionDenied, "namespace %q does not exist, and creating one needs cluster-admin; %s is not", name, who.name)
	}
	ns, err := namespaceUpdate(m, stored, name, cfg, upd)
	if err != nil {
		return nil, err
	}
	var refused []string
	if !who.clusterAdmin {
		// Shards compare by what each region serves, and stay as stored:
		// GetNamespace lists every region's shards, so writing back what
		// it shows changes nothing, and a region that uses all its shards
		// keeps taking the ones added later.
		refused = shardChanges(m, stored, &ns)
		ns.Shards = stored.Shards
	}
	next, err := m.WithNamespace(ns)
	if err != nil {
		return nil, errorf(ErrInvalid, "%v", err)
	}
	after, _ := next.Namespace(name)
	if !who.clusterAdmin {
		// After the map's defaults: a replace that leaves out a quota
		// changes it only if the default differs from what is stored.
		refused = append(refused, quotaChanges(stored, after)...)
	}
	if len(refused) > 0 {
		return nil, errorf(ErrPermissionDenied, "%s may not change %s of namespace %q: shards and quotas (%s) are set by cluster-admin only; "+
			"nothing was changed. Leave them out of update_mask (PATCH), or send their current values",
			who.name, strings.Join(refused, ", "), name, strings.Join(clusterFields, ", "))
	}
	if n := len(after.Topics); n > MaxTopicConfigs && (stored == nil || n > len(stored.Topics)) {
		return nil, invalid("topics: %d topic configs; a namespace has at most %d (the shard map, which every router holds, carries them)", n, MaxTopicConfigs)
	}
	return next, nil
}

// caller is who asks for a namespace change, as routing/auth admitted
// them.
type caller struct {
	name         string // quoted, for messages
	clusterAdmin bool
}

// callerOf reads the identity routing/auth put in ctx. A context without
// one never passed an Authorizer, so nothing vouches for cluster-admin.
func callerOf(ctx context.Context) caller {
	id, ok := auth.FromContext(ctx)
	if !ok {
		return caller{name: "a caller no authorizer admitted"}
	}
	return caller{name: strconv.Quote(id.Name), clusterAdmin: id.ClusterAdmin()}
}

// clusterFields are the Namespace fields only cluster-admin changes: what
// a tenant takes from the shared shards (which shards, how much they
// write). The rest shape the namespace's own behaviour and are its
// admin's.
var clusterFields = []string{"shards", "max_payload_bytes", "enqueue_rate_limit", "enqueue_burst", "max_depth"}

// quotaChanges names the quotas that after changes from stored, as
// "field (old → new)".
func quotaChanges(stored, after *shardmap.Namespace) []string {
	var out []string
	add := func(field string, old, now any) {
		if old != now {
			out = append(out, fmt.Sprintf("%s (%v → %v)", field, old, now))
		}
	}
	add("max_payload_bytes", stored.MaxPayloadBytes, after.MaxPayloadBytes)
	add("enqueue_rate_limit", stored.EnqueueRateLimit, after.EnqueueRateLimit)
	add("enqueue_burst", stored.EnqueueBurst, after.EnqueueBurst)
	add("max_depth", stored.MaxDepth, after.MaxDepth)
	return out
}

// shardChanges names the regions whose shards ns serves differently from
// stored, as "shards in region (1, 2 → 1)".
func shardChanges(m *shardmap.Map, stored, ns *shardmap.Namespace) []string {
	var out []string
	for _, region := range m.Regions {
		old, now := regionShards(m, stored, region), regionShards(m, ns, region)
		if !slices.Equal(old, now) {
			out = append(out, fmt.Sprintf("shards in %s (%s → %s)", region, shardList(old), shardList(now)))
		}
	}
	return out
}

// shardList writes shard IDs as "1, 2", or "none".
func shardList(ids []uint32) string {
	if len(ids) == 0 {
		return "none"
	}
	s := make([]string, len(ids))
	for i, id := range ids {
		s[i] = strconv.FormatUint(uint64(id), 10)
	}
	return strings.Join(s, ", ")
}

// regionShards is the shards ns uses in region, sorted: its list there,
// or every shard of the region when it has none.
func regionShards(m *shardmap.Map, ns *shardmap.Namespace, region string) []uint32 {
	ids, ok := ns.Shards[region]
	if !ok {
		ids = m.RegionShards(region)
	}
	return slices.Sorted(slices.Values(ids))
}

// update is what a PutNamespace's update_mask asks for: replace the whole
// configuration, or change the fields paths name.
type update struct {
	replace bool
	paths   []string
}

// namespaceFields are the update_mask paths of a Namespace, each with the
// function that copies its field from the request's namespace.
var namespaceFields = map[string]func(dst *shardmap.Namespace, src shardmap.Namespace){
	// The URL names the namespace; a body name must equal it.
	"name":                   func(*shardmap.Namespace, shardmap.Namespace) {},
	"shards":                 func(d *shardmap.Namespace, s shardmap.Namespace) { d.Shards = s.Shards },
	"max_payload_bytes":      func(d *shardmap.Namespace, s shardmap.Namespace) { d.MaxPayloadBytes = s.MaxPayloadBytes },
	"default_lease_duration": func(d *shardmap.Namespace, s shardmap.Namespace) { d.DefaultLeaseDuration = s.DefaultLeaseDuration },
	"max_attempts":           func(d *shardmap.Namespace, s shardmap.Namespace) { d.MaxAttempts = s.MaxAttempts },
	"default_ttl":            func(d *shardmap.Namespace, s shardmap.Namespace) { d.DefaultTTL = s.DefaultTTL },
	"enqueue_rate_limit":     func(d *shardmap.Namespace, s shardmap.Namespace) { d.EnqueueRateLimit = s.EnqueueRateLimit },
	"enqueue_burst":          func(d *shardmap.Namespace, s shardmap.Namespace) { d.EnqueueBurst = s.EnqueueBurst },
	"max_depth":              func(d *shardmap.Namespace, s shardmap.Namespace) { d.MaxDepth = s.MaxDepth },
	"dedup_window":           func(d *shardmap.Namespace, s shardmap.Namespace) { d.DedupWindow = s.DedupWindow },
	"dedup_retry_window":     func(d *shardmap.Namespace, s shardmap.Namespace) { d.DedupRetryWindow = s.DedupRetryWindow },
	"topics":                 func(d *shardmap.Namespace, s shardmap.Namespace) { d.Topics = s.Topics },
}

// parseMask checks an update_mask. No mask, or "*" among its paths, is a
// replace; an empty mask changes nothing. An empty path names nothing:
// the gateway's mask of PATCH {} is one empty path.
func parseMask(mask *fieldmaskpb.FieldMask) (update, error) {
	if mask == nil {
		return update{replace: true}, nil
	}
	var paths []string
	for _, p := range mask.GetPaths() {
		switch p {
		case "":
			continue
		case "*":
			return update{replace: true}, nil
		}
		if topic, ok := strings.CutPrefix(p, "topics."); ok {
			if !shardmap.ValidName(topic) {
				return update{}, invalid("update_mask path %q: topic names are 1-128 letters, digits, '_', '.', '-'", p)
			}
		} else if _, ok := namespaceFields[p]; !ok {
			return update{}, invalid("update_mask path %q: allowed %s, topics.NAME, or * (replace all)",
				p, strings.Join(slices.Sorted(maps.Keys(namespaceFields)), ", "))
		}
		paths = append(paths, p)
	}
	return update{paths: paths}, nil
}

// namespaceUpdate is the namespace a request asks for: cfg whole (a
// replace), or the stored namespace (the defaults, for a new one) with
// the fields upd names taken from cfg. The dedup slot tables, the record
// of slots a drain moved and the topics' pauses are kept either way: the
// API has no field that sets them (pauses: see keepPauses), and a key's
// shard must not move while its item or tombstone lives, so a change
// that drops a shard a region's slots name is refused by the map.
func namespaceUpdate(m *shardmap.Map, stored *shardmap.Namespace, name string, cfg *triagev1.Namespace, upd update) (shardmap.Namespace, error) {
	want, err := namespaceFromProto(name, cfg, m)
	if err != nil {
		return want, err
	}
	ns := want
	if !upd.replace {
		ns = shardmap.Namespace{Name: name}
		if stored != nil {
			ns = *stored
			ns.Shards, ns.Topics = maps.Clone(stored.Shards), maps.Clone(stored.Topics)
		}
		for _, p := range upd.paths {
			topic, ok := strings.CutPrefix(p, "topics.")
			if !ok {
				namespaceFields[p](&ns, want)
				continue
			}
			tc, set := want.Topics[topic]
			switch {
			case !set:
				delete(ns.Topics, topic)
			case ns.Topics == nil:
				ns.Topics = map[string]shardmap.TopicConfig{topic: tc}
			default:
				ns.Topics[topic] = tc
			}
		}
	}
	if stored != nil {
		ns.Slots, ns.SlotsFrom = stored.Slots, stored.SlotsFrom
	}
	keepPauses(stored, &ns)
	return ns, nil
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
		// Always said: its default is not 0, so leaving it out would read
		// as the default of the other durations.
		DedupRetryWindow: durationpb.New(ns.RetryWindow()),
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
				AgingThreshold: dur(tc.AgingThreshold), Paused: tc.Paused, MaxAttempts: int32(tc.MaxAttempts),
				RetryBackoff: backoffProto(tc.Backoff)}
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
	if p.DedupRetryWindow != nil {
		w, err := durOf("dedup_retry_window", p.DedupRetryWindow)
		if err != nil {
			return ns, err
		}
		if time.Duration(w) > shardmap.MaxDedupRetryWindow {
			return ns, invalid("dedup_retry_window %s: at most %s allowed", time.Duration(w), shardmap.MaxDedupRetryWindow)
		}
		ns.DedupRetryWindow = &w
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
		if tc.MaxAttempts < 0 {
			return ns, invalid("topics[%q].max_attempts %d: allowed 0 (the namespace's) or more", topic, tc.MaxAttempts)
		}
		c.MaxAttempts = int(tc.MaxAttempts)
		if c.Backoff, err = backoffOf(topic, tc.RetryBackoff); err != nil {
			return ns, err
		}
		ns.Topics[topic] = c
	}
	return ns, nil
}

// backoffOf is a topic's retry_backoff as the shard map stores it: every
// field set, the defaults (shardmap.DefaultBackoff) where the request left
// one out. Nil: the topic has none.
func backoffOf(topic string, p *triagev1.RetryBackoff) (*shardmap.Backoff, error) {
	if p == nil {
		return nil, nil
	}
	b := shardmap.DefaultBackoff
	what := "topics[" + strconv.Quote(topic) + "].retry_backoff"
	switch p.Kind {
	case triagev1.RetryBackoff_KIND_UNSPECIFIED, triagev1.RetryBackoff_EXPONENTIAL:
	case triagev1.RetryBackoff_FIXED:
		b.Fixed, b.Cap = true, 0
	default:
		return nil, invalid("%s.kind %d: allowed EXPONENTIAL or FIXED", what, p.Kind)
	}
	var err error
	if p.Base != nil {
		if b.Base, err = durOf(what+".base", p.Base); err != nil {
			return nil, err
		}
	}
	if p.Cap != nil && !b.Fixed {
		if b.Cap, err = durOf(what+".cap", p.Cap); err != nil {
			return nil, err
		}
	}
	if p.Jitter != nil {
		b.Jitter = *p.Jitter
	}
	switch {
	case time.Duration(b.Base) < time.Millisecond || time.Duration(b.Base) > shardmap.MaxBackoff:
		return nil, invalid("%s.base %s: allowed 1ms to %s", what, time.Duration(b.Base), shardmap.MaxBackoff)
	case !b.Fixed && p.Cap == nil && b.Cap < b.Base:
		b.Cap = b.Base // a base above the default cap, no cap given: the base is the cap
	case !b.Fixed && (b.Cap < b.Base || time.Duration(b.Cap) > shardmap.MaxBackoff):
		return nil, invalid("%s.cap %s: allowed base (%s) to %s", what, time.Duration(b.Cap), time.Duration(b.Base), shardmap.MaxBackoff)
	case !(b.Jitter >= 0 && b.Jitter <= 1):
		return nil, invalid("%s.jitter %g: allowed 0 to 1", what, b.Jitter)
	}
	return &b, nil
}

// backoffProto is the API's view of a stored backoff.
func backoffProto(b *shardmap.Backoff) *triagev1.RetryBackoff {
	if b == nil {
		return nil
	}
	jitter := b.Jitter
	out := &triagev1.RetryBackoff{Kind: triagev1.RetryBackoff_EXPONENTIAL, Base: dur(b.Base), Jitter: &jitter}
	if b.Fixed {
		out.Kind = triagev1.RetryBackoff_FIXED
	} else {
		out.Cap = dur(b.Cap)
	}
	return out
}
