package routing

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/triage-queue/triage/proto/triage/peer"
	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
	"github.com/triage-queue/triage/schema"
	"github.com/triage-queue/triage/schema/store"
	"github.com/triage-queue/triage/shardmap"
)

// changeMap applies change to the current map and publishes the result
// with compare-and-set on the stored version (shardmap.Publish). When
// another admin or the failover controller published in between, it waits
// for the newer map and applies change to it again, preconditions
// included, so two concurrent changes are both applied or refused on
// what the other left, never one over a map it did not see.
func (r *Router) changeMap(ctx context.Context, change func(m *shardmap.Map) (*shardmap.Map, error)) (*shardmap.Map, error) {
	if r.cfg.Publisher == nil {
		return nil, errorf(ErrUnavailable, "this router cannot change the shard map")
	}
	for attempt := 0; ; attempt++ {
		m := r.cfg.Maps.Current()
		next, err := change(m)
		if err != nil {
			return nil, mapChangeError(err)
		}
		err = r.cfg.Publisher.PublishMap(ctx, m, next)
		if err == nil {
			return next, nil
		}
		if errors.Is(err, shardmap.ErrTooLarge) {
			return nil, fmt.Errorf("publish shard map: %w", err) // RESOURCE_EXHAUSTED: no retry helps
		}
		if !errors.Is(err, shardmap.ErrConflict) || attempt == 9 {
			return nil, errorf(ErrUnavailable, "publish shard map: %v", err)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// mapChangeError keeps the kinds toStatus knows and makes the rest (the
// map's validation) INVALID_ARGUMENT.
func mapChangeError(err error) error {
	for _, kind := range []error{shardmap.ErrUnknownShard, shardmap.ErrShardState, shardmap.ErrUnknownNamespace, shardmap.ErrNoShards,
		ErrInvalid, ErrUnavailable, ErrPrecondition, schema.ErrUnsupportedServer, context.Canceled, context.DeadlineExceeded} {
		if errors.Is(err, kind) {
			return err
		}
	}
	return invalid("%v", err)
}

func shardProto(s shardmap.Shard) *triagev1.Shard {
	out := &triagev1.Shard{Id: s.ID, HomeRegion: s.HomeRegion, Primary: s.Primary, Replicas: s.Replicas,
		Epoch: s.Epoch, PrimaryRegion: cmp.Or(s.PrimaryRegion, s.HomeRegion), ReplicaRegions: s.ReplicaRegions, Fenced: s.Fenced,
		Database: s.Database, Weight: max(1, s.Weight), Draining: s.Draining}
	if s.DrainedAtMs != 0 {
		out.DrainedAt = timestamppb.New(time.UnixMilli(s.DrainedAtMs))
	}
	return out
}

func changed(m *shardmap.Map, id uint32) *triagev1.ShardChange {
	out := &triagev1.ShardChange{Version: m.Version}
	if s, ok := m.Shard(id); ok {
		out.Shard = shardProto(s)
	}
	return out
}

// AddShard implements triagev1.AdminServer. The new primary's schema is
// migrated before the map names it, so no enqueuer ever writes to a shard
// without tables.
func (a *Admin) AddShard(ctx context.Context, req *triagev1.AddShardRequest) (*triagev1.ShardChange, error) {
	r := a.r
	p := req.GetShard()
	switch {
	case p == nil:
		return nil, invalid("shard is required: {\"id\":N,\"home_region\":R,\"primary\":\"host:port\"}")
	case p.Id == 0:
		return nil, invalid("shard.id is required: a positive number not used by any shard, present or retired")
	case p.Primary == "":
		return nil, invalid("shard.primary is required: the primary's host:port")
	case p.Epoch != 0 || p.Fenced || p.Draining || p.DrainedAt != nil || (p.PrimaryRegion != "" && p.PrimaryRegion != p.HomeRegion):
		return nil, invalid("a new shard starts at epoch 0, unfenced, not draining, with its primary in its home region: leave epoch, fenced, draining, drained_at and primary_region out")
	case p.Weight > shardmap.MaxWeight:
		return nil, invalid("shard.weight %d: allowed 1 to %d (0 means 1)", p.Weight, shardmap.MaxWeight)
	}
	if m := r.cfg.Maps.Current(); !m.HasRegion(p.HomeRegion) {
		return nil, invalid("shard.home_region %q: allowed %v", p.HomeRegion, m.Regions)
	}
	s := shardmap.Shard{ID: p.Id, HomeRegion: p.HomeRegion, Primary: p.Primary, Database: p.Database,
		Replicas: p.Replicas, ReplicaRegions: p.ReplicaRegions, Weight: p.Weight}
	with, err := r.cfg.Maps.Current().WithNewShard(s)
	if err != nil {
		return nil, mapChangeError(err)
	}
	if err := MigrateShard(ctx, r.cfg.Pool, cmp.Or(r.cfg.Migrator, r.cfg.Pool), with, s.ID); err != nil {
		return nil, r.unusableShard(s, err)
	}
	next, err := r.changeMap(ctx, func(m *shardmap.Map) (*shardmap.Map, error) { return m.WithNewShard(s) })
	if err != nil {
		return nil, err
	}
	r.log.Info("shard added", "shard", s.ID, "home_region", s.HomeRegion, "primary", s.Primary, "version", next.Version)
	return changed(next, s.ID), nil
}

// unusableShard is AddShard's answer when MigrateShard failed on the
// primary the caller named. The server's answer goes to the node's log
// only: it is the driver's text, with the addresses dialed and the
// node's own (MariaDB's "Access denied for user 'app'@'10.0.0.3'"), and
// whatever a host that is not MariaDB sends back, and AddShard must not
// be a way to probe the network behind the node. The schema checks'
// refusals, read after logging in, are answered as they are: a server
// that is not MariaDB 10.11 or later (its VERSION()), an application
// account that could write through read_only (which privilege).
func (r *Router) unusableShard(s shardmap.Shard, err error) error {
	r.log.Warn("AddShard: the new shard's primary cannot be used; nothing was added", "shard", s.ID, "primary", s.Primary, "err", err)
	for _, kind := range []error{schema.ErrUnsupportedServer, schema.ErrPrivilegedAccount} {
		if errors.Is(err, kind) {
			return status.Errorf(codes.FailedPrecondition, "shard %d: %s (nothing was added)", s.ID, refusal(err, kind))
		}
	}
	var ae *accountError
	account, step := "application", "connect to"
	if errors.As(err, &ae) {
		account, step = ae.account, ae.step
	}
	code := codes.Unavailable
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		code = codes.DeadlineExceeded
	case errors.Is(err, context.Canceled):
		code = codes.Canceled
	case isAccessDenied(err):
		code = codes.FailedPrecondition
		if account == "admin" {
			return status.Errorf(code, "shard %d: its schema needs migrating and the primary refused this node's admin account "+
				"(node config \"admin\"): migrate the shard as an administrator first, then add it; nothing was added; see the node's log", s.ID)
		}
	}
	return status.Errorf(code, "shard %d: could not %s the shard's primary as this node's %s account; nothing was added; see the node's log", s.ID, step, account)
}

// refusal is the text of the error in err's chain that wraps kind: a
// schema check's refusal (what the server is, which privilege the account
// holds) without what wraps it, such as the primary's address.
func refusal(err, kind error) string {
	for e := err; e != nil; e = errors.Unwrap(e) {
		if errors.Unwrap(e) == kind {
			return e.Error()
		}
	}
	return kind.Error()
}

// accountError is MigrateShard failing at one step as one of the node's
// accounts, so that AddShard can say which without the driver's text.
type accountError struct {
	account, step string
	err           error
}

func (e *accountError) Error() string { return e.err.Error() }
func (e *accountError) Unwrap() error { return e.err }

// AddNamespaceShard implements triagev1.AdminServer.
func (a *Admin) AddNamespaceShard(ctx context.Context, req *triagev1.AddNamespaceShardRequest) (*triagev1.ShardChange, error) {
	r := a.r
	if err := checkName("namespace", req.Namespace); err != nil {
		return nil, err
	}
	if m := r.cfg.Maps.Current(); !m.HasRegion(req.Region) {
		return nil, invalid("region %q: allowed %v (the shard's home region)", req.Region, m.Regions)
	}
	next, err := r.changeMap(ctx, func(m *shardmap.Map) (*shardmap.Map, error) {
		return m.WithNamespaceShard(req.Namespace, req.Region, req.Shard)
	})
	if err != nil {
		return nil, err
	}
	return changed(next, req.Shard), nil
}

// SetShardWeight implements triagev1.AdminServer.
func (a *Admin) SetShardWeight(ctx context.Context, req *triagev1.SetShardWeightRequest) (*triagev1.ShardChange, error) {
	r := a.r
	if req.Weight < 1 || req.Weight > shardmap.MaxWeight {
		return nil, invalid("weight %d: allowed 1 to %d", req.Weight, shardmap.MaxWeight)
	}
	next, err := r.changeMap(ctx, func(m *shardmap.Map) (*shardmap.Map, error) { return m.WithWeight(req.Shard, req.Weight) })
	if err != nil {
		return nil, err
	}
	return changed(next, req.Shard), nil
}

// DrainShard implements triagev1.AdminServer (see shardmap.Map.WithDrain).
func (a *Admin) DrainShard(ctx context.Context, req *triagev1.DrainShardRequest) (*triagev1.ShardChange, error) {
	r := a.r
	next, err := r.changeMap(ctx, func(m *shardmap.Map) (*shardmap.Map, error) { return m.WithDrain(req.Shard, time.Now()) })
	if err != nil {
		return nil, err
	}
	r.log.Info("shard draining", "shard", req.Shard, "version", next.Version)
	return changed(next, req.Shard), nil
}

// RetireShard implements triagev1.AdminServer. A shard leaves the map only
// when nothing can reach it any more and it holds nothing: draining for
// DrainSettle (no router can still publish to it), its subject in the
// enqueue stream empty (every buffered batch inserted: the stream is a
// work queue, a message leaves it when its insert committed), and no
// items, dead letters, live dedup tombstones or refused items on it. The
// checks run again on the map the change is applied to.
func (a *Admin) RetireShard(ctx context.Context, req *triagev1.RetireShardRequest) (*triagev1.ShardChange, error) {
	r := a.r
	next, err := r.changeMap(ctx, func(m *shardmap.Map) (*shardmap.Map, error) {
		s, ok := m.Shard(req.Shard)
		if !ok {
			return nil, fmt.Errorf("%w %d: it is not in the shard map (retired: %v)", shardmap.ErrUnknownShard, req.Shard, m.Retired)
		}
		if !s.Draining {
			return nil, fmt.Errorf("%w: shard %d is not draining: drain it first (DrainShard), then retire it once it is empty", shardmap.ErrShardState, s.ID)
		}
		if left := time.Until(time.UnixMilli(s.DrainedAtMs).Add(shardmap.DrainSettle)); left > 0 {
			return nil, fmt.Errorf("%w: shard %d started draining %s ago; routers may publish to it for %s after a drain: retry in %s",
				shardmap.ErrShardState, s.ID, time.Since(time.UnixMilli(s.DrainedAtMs)).Round(time.Millisecond), shardmap.DrainSettle, left.Round(time.Millisecond))
		}
		n, err := r.buffered(ctx, s)
		if err != nil {
			return nil, errorf(ErrUnavailable, "reading shard %d's enqueue buffer: %v", s.ID, err)
		}
		if n > 0 {
			return nil, fmt.Errorf("%w: shard %d has %d message(s) in its enqueue buffer not yet inserted: retry once its enqueuer drained them", shardmap.ErrShardState, s.ID, n)
		}
		db, _, err := r.cfg.Pool.Primary(m, s.ID)
		if err != nil {
			return nil, errorf(ErrUnavailable, "shard %d: %v", s.ID, err)
		}
		c, err := store.New(db).ShardContentsCount(ctx, time.Now().UnixMicro())
		if err != nil {
			return nil, errorf(ErrUnavailable, "shard %d: counting what it holds: %v", s.ID, err)
		}
		if !c.Empty() {
			return nil, fmt.Errorf("%w: shard %d is not empty: %d item(s), %d dead letter(s) (redrive them, or delete them with DeleteDeadLetters: triage delete-deadletters TOPIC --all), %d live dedup tombstone(s) (they expire with the namespace's dedup_window), %d refused item(s): retry once they are gone",
				shardmap.ErrShardState, s.ID, c.Items, c.DeadLetters, c.Tombstones, c.Refused)
		}
		return m.WithoutShard(s.ID)
	})
	if err != nil {
		return nil, err
	}
	r.log.Info("shard retired", "shard", req.Shard, "version", next.Version)
	return changed(next, req.Shard), nil
}

// buffered counts the messages for shard s in its home region's enqueue
// stream: published and not yet inserted (or inserted and not yet acked).
func (r *Router) buffered(ctx context.Context, s shardmap.Shard) (uint64, error) {
	stream, err := r.cfg.JS.Stream(ctx, peer.EnqueueStream(s.HomeRegion))
	if err != nil {
		return 0, err
	}
	subject := peer.EnqueueSubject(s.HomeRegion, s.ID)
	info, err := stream.Info(ctx, jetstream.WithSubjectFilter(subject))
	if err != nil {
		return 0, err
	}
	return info.State.Subjects[subject], nil
}

// movedHolder looks a dedup key up on the drained shard its slot moved
// from (see shardmap.Namespace.SlotsFrom) and returns the key of the item
// there that holds it. The lookup is exact only once nothing can insert
// the key there any more, so it first waits until DrainSettle passed since
// the drain (no router publishes to the shard after that: they refuse
// enqueues with a map older than MaxStaleness) and the shard's buffer is
// empty (everything published before is inserted); a shard seen drained
// so is remembered.
func (r *Router) movedHolder(ctx context.Context, m *shardmap.Map, from uint32, namespace, topic, key string) (uint64, bool, error) {
	s, ok := m.Shard(from)
	if !ok {
		return 0, false, nil // retired: it was empty
	}
	if _, done := r.drained.Load(from); !done {
		if wait := time.Until(time.UnixMilli(s.DrainedAtMs).Add(shardmap.DrainSettle)); wait > 0 {
			select {
			case <-ctx.Done():
				return 0, false, errorf(ErrUnavailable, "dedup key %q moved off draining shard %d %s ago; it is looked up there once routers settled: %v", key, from, time.Since(time.UnixMilli(s.DrainedAtMs)).Round(time.Millisecond), ctx.Err())
			case <-time.After(wait):
			}
		}
		for {
			n, err := r.buffered(ctx, s)
			if err != nil {
				return 0, false, errorf(ErrUnavailable, "reading draining shard %d's enqueue buffer: %v", from, err)
			}
			if n == 0 {
				break
			}
			select {
			case <-ctx.Done():
				return 0, false, errorf(ErrUnavailable, "dedup key %q: draining shard %d still has %d buffered message(s) to insert", key, from, n)
			case <-time.After(50 * time.Millisecond):
			}
		}
		r.drained.Store(from, true)
	}
	db, _, err := r.cfg.Pool.Primary(m, from)
	if err != nil {
		return 0, false, err
	}
	retry := shardmap.DefaultDedupRetryWindow
	if ns, err := m.Namespace(namespace); err == nil {
		retry = ns.RetryWindow()
	}
	return store.New(db).DedupHolder(ctx, store.DedupHolderParams{Namespace: namespace, Topic: topic, DedupKey: key,
		NowUS: time.Now().UnixMicro(), RetryWindow: retry})
}

// MigrateShard brings shard id's schema up to date: it asks through app
// (the application account, which may read but not run DDL) whether
// migrations are pending and only then runs them through admin. So a
// shard an administrator migrated needs no admin account at all. First it
// checks that the server is one the queue's SQL runs on
// (schema.CheckServer), so that a node starting on such a shard, or a
// shard being added, is refused saying so.
func MigrateShard(ctx context.Context, app, admin *shardmap.Pool, m *shardmap.Map, id uint32) error {
	db, _, err := app.Primary(m, id)
	if err != nil {
		return &accountError{"application", "connect to", err}
	}
	if err := schema.CheckServer(ctx, db.DB); err != nil {
		if errors.Is(err, schema.ErrUnsupportedServer) {
			return err
		}
		return &accountError{"application", "connect to", err}
	}
	n, err := schema.Pending(ctx, db.DB)
	if err == nil && n == 0 {
		return nil
	}
	adb, _, err := admin.Primary(m, id)
	if err != nil {
		return &accountError{"admin", "connect to", err}
	}
	if _, err = schema.Migrate(ctx, adb.DB); isAccessDenied(err) {
		// A least-privilege node holds no admin password: say what to do
		// rather than only MariaDB's "Access denied for user 'root'".
		return &accountError{"admin", "migrate the schema on", fmt.Errorf("%d schema migration(s) pending and this node's admin account may not run them "+
			"(node config \"admin\"): migrate the shard as an administrator first (the compose bed's "+
			"bootstrap does for spare shards), then add it: %w", n, err)}
	} else if err != nil {
		return &accountError{"admin", "migrate the schema on", err}
	}
	return nil
}
