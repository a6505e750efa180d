package routing

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/triage-queue/triage/dequeuer/handback"
	"github.com/triage-queue/triage/proto/triage/peer"
	peerv1 "github.com/triage-queue/triage/proto/triage/peer/v1"
	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
	"github.com/triage-queue/triage/schema/itemid"
	"github.com/triage-queue/triage/schema/metrics"
	"github.com/triage-queue/triage/schema/store"
	"github.com/triage-queue/triage/schema/tracing"
	"github.com/triage-queue/triage/shardmap"
)

// OwnerView is the router's view of shard ownership (the dequeuers'
// claims bucket, peer.ClaimsBucket).
type OwnerView interface {
	// Owner returns the dequeuer that owns shard.
	Owner(shard uint32) (string, bool)
	// Reload reads the owners of shards from the bucket itself, for when
	// the owner the view names does not answer.
	Reload(ctx context.Context, shards []uint32)
	// Changed returns a channel closed at the view's next change.
	Changed() <-chan struct{}
}

// Config configures a router.
type Config struct {
	// Region is the router's own region, used when a request names none.
	Region string
	// Maps, Pool, NC, JS: shard map, shard connections, NATS. Required.
	Maps shardmap.Source
	Pool *shardmap.Pool
	NC   *nats.Conn
	JS   jetstream.JetStream
	// Migrator reaches shard primaries as an account that may run the
	// schema's DDL, which Pool's application account may not: AddShard
	// migrates a new shard through it when the shard's schema is not
	// current. Default Pool.
	Migrator *shardmap.Pool
	// Owners tells which dequeuer owns which shard. Required.
	Owners OwnerView
	// Drills is the KV bucket of drills' progress (OpenDrills). Nil:
	// ReportDrill and ListDrills answer UNAVAILABLE.
	Drills jetstream.KeyValue
	// Publisher, when set, lets Admin calls change the shard map.
	Publisher MapPublisher
	// Local is an optional in-process dequeuer.
	Local LocalDequeuer
	// Dequeuers reaches the other dequeuers. Default: NATSDequeuers over
	// NC.
	Dequeuers Dequeuers
	// IDs allocates item keys; its node ID must be unique (ClaimNode).
	IDs *itemid.Generator
	// Claim, when set, is asked before minting IDs; an error (the node
	// number is not confirmed in NATS) answers the enqueue UNAVAILABLE.
	Claim interface{ Check(now time.Time) error }
	// FastCopies sends each envelope the enqueue stream acknowledged to
	// its shard's worker over core NATS as well, which saves a replicated
	// stream's consumer its quorum round trip (see package enqueuer, Fast
	// copies). Off by default; a node turns it on with the enqueuers'
	// FastCopies when streams are replicated.
	FastCopies bool
	// CommitTimeout bounds how long a COMMITTED enqueue waits for the
	// enqueuer when the client set no deadline. Default 10s.
	CommitTimeout time.Duration
	// Tracer traces what a request does beyond its RPC span (publishing
	// to the enqueue buffer). Nil: no tracing.
	Tracer trace.TracerProvider
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Now is the local clock: request validation, quotas. Default
	// time.Now.
	Now func() time.Time
	// Clock tells a shard primary's time, which nack, extend, update and
	// unserve use for lease arithmetic on its rows, as the dequeuer does
	// (see "# Clocks" in dequeuer/doc.go). Default: a Clock of the
	// router's own.
	Clock *shardmap.Clock
	// Writes coalesces the acks of concurrent calls per shard into one
	// transaction, with whatever serves the process's dequeuer has for
	// the shard at the time (store.Batcher): a node gives its router and
	// its dequeuer one. Default: a Batcher of the router's own, on Clock.
	Writes *store.Batcher
	// EnqueueConcurrency caps the Enqueue calls that run at once while
	// the process's CPU is saturated and consumers are being served (see
	// admission.go). 0: DefaultEnqueueConcurrency (32 per core);
	// negative: no cap ever.
	EnqueueConcurrency int
	// Metrics records enqueue, dequeue, ack and nack counts and latencies
	// and quota refusals. Nil: none.
	Metrics *metrics.Set
}

// Router implements the Queue service; its Admin serves the Admin service
// on the same state (the shard map, pools and controller requests).
type Router struct {
	triagev1.UnimplementedQueueServer

	cfg    Config
	log    *slog.Logger
	tracer trace.Tracer
	inbox  string
	sub    *nats.Subscription
	// rr counts each namespace's enqueues (*atomic.Uint64 by name), the
	// round-robin over its shards. One counter for every namespace put a
	// namespace whose enqueues alternate with another's on every other
	// shard only: two namespaces taking turns left half of each one's
	// shards empty.
	rr sync.Map
	dq Dequeuers

	mu      sync.Mutex
	waiting map[uint64]chan *peerv1.EnqueueCommitted

	quotas *quotas

	// drained holds the drained shards whose buffer was seen empty after
	// DrainSettle (movedHolder): nothing can be published to them again.
	drained sync.Map

	// admit holds Enqueue calls back while the CPU is saturated and
	// consumers are served (admission.go); nil: never.
	admit *admission

	// handBack returns served items no consumer received to the ready
	// set.
	handBack *handback.Returner

	pubMu      sync.Mutex
	publishers map[string]*shardPublisher
	pubWG      sync.WaitGroup
	stopping   chan struct{}
}

// New validates cfg and returns a router. Call Start before serving.
func New(cfg Config) (*Router, error) {
	if cfg.Region == "" || cfg.Maps == nil || cfg.Pool == nil || cfg.NC == nil || cfg.JS == nil || cfg.Owners == nil || cfg.IDs == nil {
		return nil, errors.New("routing: Region, Maps, Pool, NC, JS, Owners and IDs are required")
	}
	cfg.CommitTimeout = cmp.Or(cfg.CommitTimeout, 10*time.Second)
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Clock == nil {
		cfg.Clock = &shardmap.Clock{}
	}
	r := &Router{
		cfg:        cfg,
		log:        cfg.Logger.With("role", "router", "region", cfg.Region),
		tracer:     tracing.Tracer(cfg.Tracer),
		inbox:      "triage.committed." + nuid.Next(),
		waiting:    map[uint64]chan *peerv1.EnqueueCommitted{},
		publishers: map[string]*shardPublisher{},
		quotas:     newQuotas(),
		stopping:   make(chan struct{}),
	}
	r.handBack = handback.New(handback.Config{Maps: cfg.Maps, Pool: cfg.Pool, Clock: cfg.Clock, Log: r.log})
	if r.cfg.Dequeuers == nil {
		r.cfg.Dequeuers = NATSDequeuers{NC: cfg.NC, Late: r.late}
	}
	r.dq = localFirst{local: cfg.Local, remote: r.cfg.Dequeuers}
	if r.cfg.Writes == nil {
		r.cfg.Writes = &store.Batcher{Now: cfg.Clock.Now}
	}
	if n := cmp.Or(cfg.EnqueueConcurrency, DefaultEnqueueConcurrency()); n > 0 {
		r.admit = &admission{cap: n, schedMean: newSchedLatency().mean}
	}
	return r, nil
}

// Start subscribes to the router's commit inbox.
func (r *Router) Start(context.Context) error {
	sub, err := r.cfg.NC.Subscribe(r.inbox, func(m *nats.Msg) {
		var c peerv1.EnqueueCommitted
		if proto.Unmarshal(m.Data, &c) != nil {
			return
		}
		r.mu.Lock()
		ch := r.waiting[c.BatchId]
		delete(r.waiting, c.BatchId)
		r.mu.Unlock()
		if ch != nil {
			ch <- &c
		}
	})
	if err != nil {
		return err
	}
	r.sub = sub
	if r.admit != nil {
		r.pubWG.Add(1)
		go func() {
			defer r.pubWG.Done()
			r.admit.run(r.stopping)
		}()
	}
	return nil
}

// Stop unsubscribes and stops the publishers. Call it after the servers
// have drained their requests.
func (r *Router) Stop() {
	if r.sub != nil {
		_ = r.sub.Unsubscribe()
	}
	close(r.stopping)
	r.pubWG.Wait()
	r.handBack.Stop()
}

func (r *Router) region(req string, m *shardmap.Map) (string, error) {
	if req == "" {
		return r.cfg.Region, nil
	}
	if !m.HasRegion(req) {
		return "", invalid("region %q: allowed %s, or empty for the router's own (%s)", req, strings.Join(m.Regions, ", "), r.cfg.Region)
	}
	return req, nil
}

// Enqueue implements triagev1.QueueServer.
func (r *Router) Enqueue(ctx context.Context, req *triagev1.EnqueueRequest) (*triagev1.EnqueueResponse, error) {
	start := time.Now()
	if r.admit != nil {
		if r.admit.gate.holding() {
			// Bad input is refused before it waits its turn.
			if _, _, _, _, err := r.checkEnqueue(req); err != nil {
				return nil, err
			}
		}
		held, err := r.admit.gate.acquire(ctx)
		if err != nil {
			return nil, errorf(err, "enqueue not started: it waited for one of the %d enqueues this router runs at once while its CPU is saturated and consumers are being served; nothing was done, retry",
				r.admit.cap)
		}
		if held {
			defer r.admit.gate.release()
		}
	}
	resp, err := r.enqueue(ctx, req)
	if err == nil {
		nm := r.cfg.Metrics.Namespace(req.Namespace)
		if req.Durability == triagev1.Durability_BUFFERED {
			nm.EnqueueBuffered.Observe(time.Since(start).Seconds())
		} else {
			nm.EnqueueCommitted.Observe(time.Since(start).Seconds())
		}
	}
	return resp, err
}

// checkEnqueue checks the request against the current map: its
// namespace, its items, its region. enqueue runs it first, and a call
// about to wait at the closed admission gate runs it before the wait.
func (r *Router) checkEnqueue(req *triagev1.EnqueueRequest) (m *shardmap.Map, ns *shardmap.Namespace, region string, now time.Time, err error) {
	m = r.cfg.Maps.Current()
	if ns, err = m.Namespace(req.Namespace); err != nil {
		return
	}
	now = r.cfg.Now()
	if err = validateEnqueue(req, ns, now); err != nil {
		return
	}
	region, err = r.region(req.Region, m)
	return
}

type shardBatch struct {
	shard uint32
	// home is the shard's home region: its batches go on that region's
	// enqueue stream, which that region's enqueuers drain. It is the
	// request's region (a region's shards and slot table name only shards
	// homed there).
	home  string
	idx   []int // positions in the request
	batch *peerv1.EnqueueBatch
}

// enqueueCall is what enqueue's steps share: the map and namespace the
// request was checked against, its region and time, and the shards open
// to new items there.
type enqueueCall struct {
	req     *triagev1.EnqueueRequest
	m       *shardmap.Map
	ns      *shardmap.Namespace
	region  string
	now     time.Time
	open    []uint32
	weights []uint32
	nm      *metrics.Namespace
}

// enqueue routes the request's items into per-shard batches, publishes
// them to the enqueue buffer and, for a committed enqueue, waits for
// their inserts.
func (r *Router) enqueue(ctx context.Context, req *triagev1.EnqueueRequest) (*triagev1.EnqueueResponse, error) {
	e, err := r.admitEnqueue(ctx, req)
	if err != nil {
		return nil, err
	}
	results := make([]*triagev1.EnqueueResult, len(req.Items))
	order, err := r.batchItems(ctx, e, results)
	if err != nil {
		return nil, err
	}
	if err := r.await(ctx, e, order, results); err != nil {
		return nil, err
	}
	tm := r.cfg.Metrics.Topic(req.Namespace, req.Topic)
	for _, it := range req.Items {
		tm.Enqueued[metrics.Band(it.Priority)].Inc()
	}
	return &triagev1.EnqueueResponse{Results: results}, nil
}

// admitEnqueue checks the request and whether this router may take it
// now: a confirmed shard map, its node number held, and the namespace's
// rate and depth quotas.
func (r *Router) admitEnqueue(ctx context.Context, req *triagev1.EnqueueRequest) (*enqueueCall, error) {
	m, ns, region, now, err := r.checkEnqueue(req)
	if err != nil {
		return nil, err
	}
	shards, err := m.ShardsFor(req.Namespace, region)
	if err != nil {
		return nil, err
	}
	// Only draining shards' neighbours take new items, by weight.
	open, weights, err := m.EnqueueShards(req.Namespace, region)
	if err != nil {
		return nil, err
	}
	// A router that has not heard from the map store for MaxStaleness may
	// have missed a drain: it stops publishing, so a drained shard's
	// buffer is closed DrainSettle after the drain (see shardmap.DrainSettle).
	if u, ok := r.cfg.Maps.(interface{ Unconfirmed() time.Duration }); ok && u.Unconfirmed() > shardmap.MaxStaleness {
		return nil, errorf(ErrUnavailable, "shard map not confirmed by NATS for %s (over %s): refusing enqueues until it is, so none goes to a shard drained meanwhile",
			u.Unconfirmed().Round(time.Millisecond), shardmap.MaxStaleness)
	}
	if r.cfg.Claim != nil {
		// Only mint IDs while no other router can hold this node number.
		if err := r.cfg.Claim.Check(time.Now()); err != nil {
			return nil, err
		}
	}
	nm := r.cfg.Metrics.Namespace(req.Namespace)
	if err := r.quotas.admitRate(ns, len(req.Items), now); err != nil {
		if status.Code(err) == codes.ResourceExhausted {
			nm.QuotaRate.Inc() // not a batch over the burst: that is bad input
		}
		return nil, err
	}
	if err := r.quotas.admitDepth(ns, region, len(req.Items), now, func(ctx context.Context) (int64, error) {
		return r.countItems(ctx, m, req.Namespace, shards, ns.MaxDepth+1)
	}); err != nil {
		nm.QuotaDepth.Inc()
		return nil, err
	}
	return &enqueueCall{req: req, m: m, ns: ns, region: region, now: now, open: open, weights: weights, nm: nm}, nil
}

// nextPick is namespace's next round-robin number (see Router.rr).
func (r *Router) nextPick(namespace string) uint64 {
	c, ok := r.rr.Load(namespace)
	if !ok {
		c, _ = r.rr.LoadOrStore(namespace, new(atomic.Uint64))
	}
	return c.(*atomic.Uint64).Add(1)
}

// batchItems groups the request's items into batches per shard, in the
// order their shards first appear. Items with a dedup key go to the shard
// the slot table of the request's region gives the key, so that shard's
// unique index and tombstones see every copy enqueued with this region (a
// hash over the region's current shards would move a key when the shard
// list changes). Dedup is per region: the item is stored in the region
// the producer chose, and a copy enqueued with another region is another
// item (deduplicating across regions would need a cross-region lookup on
// every enqueue). The rest of the request goes to one of the region's
// shards chosen round-robin, so a request is usually one batch. A batch is
// closed when the next item would take it past what one JetStream message
// may carry; the shard's next batch goes on. An item found to be a
// duplicate of one on a draining shard gets its result here, and no batch.
func (r *Router) batchItems(ctx context.Context, e *enqueueCall, results []*triagev1.EnqueueResult) ([]*shardBatch, error) {
	req := e.req
	limit := r.batchLimit(req.Namespace, req.Topic)
	spread := shardmap.PickWeighted(e.open, e.weights, r.nextPick(req.Namespace))
	groups := map[uint32]*shardBatch{}
	sizes := map[uint32]int{}
	var order []*shardBatch
	for i, it := range req.Items {
		shard := spread
		if it.DedupKey != "" {
			var dup *triagev1.EnqueueResult
			var err error
			if shard, dup, err = r.dedupShard(ctx, e, it.DedupKey); err != nil {
				return nil, err
			}
			if dup != nil {
				results[i] = dup
				continue
			}
		}
		b := r.bufferedItem(it, e.ns, e.now)
		n := protowire.SizeBytes(proto.Size(b)) + 1
		if n > limit {
			return nil, invalid("items[%d] is %d bytes encoded (payload %d, metadata %d as stored); the enqueue buffer carries at most %d bytes per item (NATS max_payload %d): send a smaller payload",
				i, n, len(b.Payload), len(b.Metadata), limit, r.maxMsg())
		}
		g := groups[shard]
		if g == nil || sizes[shard]+n > limit {
			g = &shardBatch{shard: shard, home: e.homeOf(shard), batch: &peerv1.EnqueueBatch{
				Namespace: req.Namespace, Topic: req.Topic, Shard: shard, EnqueuedAtUs: e.now.UnixMicro(),
			}}
			groups[shard] = g
			sizes[shard] = 0
			order = append(order, g)
		}
		g.idx = append(g.idx, i)
		g.batch.Items = append(g.batch.Items, b)
		sizes[shard] += n
	}
	return order, nil
}

// homeOf is shard's home region, the request's region if the map does not
// know the shard.
func (e *enqueueCall) homeOf(shard uint32) string {
	if s, ok := e.m.Shard(shard); ok {
		return s.HomeRegion
	}
	return e.region
}

// dedupShard is the shard a dedup key's item goes to. A key whose slot
// moved off a draining shard is looked up there first (movedHolder):
// while that shard holds its item or tombstone, the enqueue is a
// duplicate of it, and dup is that item's result.
func (r *Router) dedupShard(ctx context.Context, e *enqueueCall, key string) (shard uint32, dup *triagev1.EnqueueResult, err error) {
	req := e.req
	shard, from, ok := e.ns.DedupRoute(e.region, req.Topic, key)
	if !ok {
		// New fills a region's table whenever the namespace has a shard
		// there, and ShardsFor found one.
		return 0, nil, fmt.Errorf("namespace %q has shards in region %q but no dedup slot table there", req.Namespace, e.region)
	}
	if from == 0 {
		return shard, nil, nil
	}
	held, found, err := r.movedHolder(ctx, e.m, from, req.Namespace, req.Topic, key)
	if err != nil || !found {
		return shard, nil, err
	}
	return shard, &triagev1.EnqueueResult{Id: itemid.ID{Shard: from, Key: held}.String(), Duplicate: true, Region: e.homeOf(from)}, nil
}

// await publishes the batches and, for a committed enqueue, waits for
// each batch's insert (bounded by CommitTimeout when the call has no
// deadline), then fills in the results of their items.
func (r *Router) await(ctx context.Context, e *enqueueCall, order []*shardBatch, results []*triagev1.EnqueueResult) error {
	committed := e.req.Durability != triagev1.Durability_BUFFERED
	waitCtx := ctx
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		waitCtx, cancel = context.WithTimeout(ctx, r.cfg.CommitTimeout)
		defer cancel()
	}
	chans := make([]chan *peerv1.EnqueueCommitted, len(order))
	for i, g := range order {
		g.batch.BatchId = g.batch.Items[0].Key
		if committed {
			g.batch.ReplySubject = r.inbox
			chans[i] = make(chan *peerv1.EnqueueCommitted, 1)
			r.mu.Lock()
			r.waiting[g.batch.BatchId] = chans[i]
			r.mu.Unlock()
			defer r.forget(g.batch.BatchId)
		}
	}
	if len(order) > 0 {
		if err := r.publish(waitCtx, order); err != nil {
			if errors.Is(err, ErrBufferFull) {
				e.nm.QuotaBufferFull.Inc()
			}
			return err
		}
	}
	for i, g := range order {
		var c *peerv1.EnqueueCommitted
		if committed {
			select {
			case c = <-chans[i]:
			case <-waitCtx.Done():
				// Said once here with what the 504 does not carry: where
				// the batch went (a lost reply crosses regions on a
				// direct NATS route; a slow insert is in the enqueuer's
				// log as such).
				r.log.Warn("enqueue not confirmed committed in time", "namespace", e.req.Namespace, "topic", e.req.Topic,
					"shard", g.shard, "home", g.home, "batch", g.batch.BatchId, "items", len(g.batch.Items))
				return ErrNotCommitted
			}
			if c.Error != "" {
				return fmt.Errorf("%w: shard %d: %s", ErrInvalid, g.shard, c.Error)
			}
			// Tell dequeuers before the client hears back, so a dequeue the
			// client sends next sees the new items (see announceBatch).
			r.announceBatch(g.batch, c)
		}
		g.fillResults(c, results)
	}
	return nil
}

// fillResults sets the result of each of g's items: its new ID, or the ID
// of the item it duplicates as c reports it.
func (g *shardBatch) fillResults(c *peerv1.EnqueueCommitted, results []*triagev1.EnqueueResult) {
	for j, pos := range g.idx {
		res := &triagev1.EnqueueResult{Id: itemid.ID{Shard: g.shard, Key: g.batch.Items[j].Key}.String(), Region: g.home}
		if c != nil && j < len(c.DuplicateOf) && c.DuplicateOf[j] != 0 {
			res.Id = itemid.ID{Shard: g.shard, Key: c.DuplicateOf[j]}.String()
			res.Duplicate = true
		}
		results[pos] = res
	}
}

// announceBatch tells the dequeuers of a committed batch, with its rows
// when c says its insert stored them (peer.CommittedReady): the local one
// directly, the others over NATS on the connection the router's next
// forwarded dequeue will use, which they read in order.
func (r *Router) announceBatch(b *peerv1.EnqueueBatch, c *peerv1.EnqueueCommitted) {
	ready := peer.CommittedReady(b, c)
	if r.cfg.Local != nil {
		r.cfg.Local.Ready(ready)
		if owner, ok := r.cfg.Owners.Owner(b.Shard); ok && owner == r.cfg.Local.ID() {
			return // the shard's owner is the one just told; no NATS round trip
		}
	}
	if data, err := proto.Marshal(ready); err == nil {
		_ = r.cfg.NC.Publish(peer.ReadySubject(b.Namespace), data)
	}
}

func (r *Router) forget(batch uint64) {
	r.mu.Lock()
	delete(r.waiting, batch)
	r.mu.Unlock()
}

func (r *Router) bufferedItem(it *triagev1.NewItem, ns *shardmap.Namespace, now time.Time) *peerv1.BufferedItem {
	b := &peerv1.BufferedItem{
		Key:            r.cfg.IDs.Next(),
		Payload:        it.Payload,
		Priority:       it.Priority,
		DeliverAfterUs: now.UnixMicro(),
		LeaseMs:        uint32(time.Duration(ns.DefaultLeaseDuration).Milliseconds()),
		DedupKey:       it.DedupKey,
	}
	if it.DeliverAfter != nil {
		b.DeliverAfterUs = it.DeliverAfter.AsTime().UnixMicro()
	}
	if d := it.LeaseDuration.AsDuration(); it.LeaseDuration != nil && d > 0 {
		b.LeaseMs = uint32(d.Milliseconds())
	}
	ttl := time.Duration(ns.DefaultTTL)
	if it.Ttl != nil && it.Ttl.AsDuration() > 0 {
		ttl = it.Ttl.AsDuration()
	}
	if ttl > 0 {
		b.ExpiresAtUs = now.Add(ttl).UnixMicro()
	}
	if len(it.Metadata) > 0 {
		b.Metadata, _ = MarshalMetadata(it.Metadata)
	}
	return b
}

// MaxDequeueTotal bounds the items one dequeue asks for across its topics,
// so one request's work (leases, reply size) is bounded whatever its topic
// count.
const MaxDequeueTotal = 1000

// Dequeue implements triagev1.QueueServer: it forwards to the dequeuers
// that own the region's shards and merges their answers.
func (r *Router) Dequeue(ctx context.Context, req *triagev1.DequeueRequest) (*triagev1.DequeueResponse, error) {
	r.draining()
	start := time.Now()
	acked, err := r.ackWithDequeue(ctx, req)
	if err != nil {
		return nil, err
	}
	items, err := r.dequeueFollowingOwners(ctx, req)
	ackResults := acked()
	if err == nil {
		// A caller that has gone (cancelled, or past its deadline) never
		// receives the answer: its items go back rather than stay hidden
		// for their lease with an attempt counted.
		err = ctx.Err()
	}
	if err != nil {
		if len(items) > 0 {
			r.late(req.Namespace, items)
		}
		return nil, err
	}
	r.cfg.Metrics.Namespace(req.Namespace).Dequeue.Observe(time.Since(start).Seconds())
	return &triagev1.DequeueResponse{Items: items, AckResults: ackResults}, nil
}

// ackWithDequeue starts the acks a Dequeue carries (req.Acks), beside its
// leases: on a shard where both land while another of its transactions
// commits, they share the next (store.Batcher). The request is checked
// first, its acks and its topics, so one it refuses acks nothing. The
// returned func waits for the acks and gives each ref's result; a shard
// that could not be written gives its refs its reason, and the items are
// delivered all the same.
func (r *Router) ackWithDequeue(ctx context.Context, req *triagev1.DequeueRequest) (func() []*triagev1.ItemResult, error) {
	if len(req.Acks) == 0 {
		return func() []*triagev1.ItemResult { return nil }, nil
	}
	p, err := r.planAcks(req.Namespace, req.Acks)
	if err != nil {
		return nil, err
	}
	if _, _, err := r.checkDequeue(req); err != nil {
		return nil, err
	}
	done := make(chan []error, 1)
	go func() {
		errs, _ := r.runAcks(ctx, p, true) // with perRef, every error is a ref's
		done <- errs
	}()
	return func() []*triagev1.ItemResult { return itemResults(p.ids, <-done) }, nil
}

// HandOverWait bounds how long a Dequeue waits for a shard's ownership to
// move, within the caller's deadline, when the owner it asked handed the
// shard over or is gone, or no dequeuer owns it yet: after a failover the
// old owner hands over when it sees the new map and the new one claims at
// once, a few hundred milliseconds in all, and an UNAVAILABLE answer would
// cost the client an error round and its retry backoff on top (drills:
// the dequeue RTO's tail after the map was published).
const HandOverWait = 2 * time.Second

// ownerMoved tells the errors of a Dequeue that the shard's next owner
// will answer: its owner handed it over or is gone, none holds it, or
// another claimed it while the call waited (askWhileOwner).
func ownerMoved(err error) bool {
	return errors.Is(err, peer.ErrNotOwner) || errors.Is(err, nats.ErrNoResponders) || errors.Is(err, errNoOwner) ||
		errors.Is(err, errOwnerChanged)
}

// errNoOwner: no dequeuer holds a shard's claim.
var errNoOwner = errors.New("no dequeuer owns the shards yet")

// dequeueFollowingOwners is dequeue, following the shards' owners (see
// followOwners).
func (r *Router) dequeueFollowingOwners(ctx context.Context, req *triagev1.DequeueRequest) ([]*triagev1.LeasedItem, error) {
	return followOwners(ctx, r.cfg.Owners, req, r.dequeue)
}

// followOwners calls ask, and asks again when the ownership view changes
// (or every reloadPace, as the view's watch can lag) while the answer is
// an ownerMoved error with no items, for up to HandOverWait. A long
// poll's wait counts from the first ask: each new ask waits for what is
// left of it.
func followOwners(ctx context.Context, owners OwnerView, req *triagev1.DequeueRequest,
	ask func(context.Context, *triagev1.DequeueRequest) ([]*triagev1.LeasedItem, error)) ([]*triagev1.LeasedItem, error) {
	const reloadPace = 100 * time.Millisecond
	start := time.Now()
	wait := req.GetWait().AsDuration()
	for {
		changed := owners.Changed()
		items, err := ask(ctx, req)
		if err == nil || len(items) > 0 || !ownerMoved(err) || time.Since(start) >= HandOverWait {
			return items, err
		}
		t := time.NewTimer(reloadPace)
		select {
		case <-changed:
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, err
		}
		t.Stop()
		if wait > 0 {
			req = proto.CloneOf(req)
			req.Wait = durationpb.New(max(wait-time.Since(start), 0))
		}
	}
}

// dequeue asks the owners of the region's shards for items: one owner
// serves the whole request; several are asked at once and merged.
func (r *Router) dequeue(ctx context.Context, req *triagev1.DequeueRequest) ([]*triagev1.LeasedItem, error) {
	shards, region, err := r.checkDequeue(req)
	if err != nil {
		return nil, err
	}
	byOwner, orphans := r.ownersOf(ctx, shards)
	if len(byOwner) == 0 {
		return nil, fmt.Errorf("%w: %w: shards %v of region %s; retry shortly", ErrUnavailable, errNoOwner, orphans, region)
	}
	if len(byOwner) == 1 {
		for owner, ids := range byOwner {
			return r.forward(ctx, owner, req, ids)
		}
	}
	return r.dequeueMerged(ctx, req, byOwner)
}

// checkDequeue checks the request and returns the shards of the
// namespace in its region.
func (r *Router) checkDequeue(req *triagev1.DequeueRequest) (shards []uint32, region string, err error) {
	m := r.cfg.Maps.Current()
	if _, err := m.Namespace(req.Namespace); err != nil {
		return nil, "", err
	}
	if err := validateDequeue(req); err != nil {
		return nil, "", err
	}
	total := 0
	for _, tc := range req.Topics {
		total += int(tc.Count)
	}
	if total > MaxDequeueTotal {
		return nil, "", invalid("counts add up to %d items in one dequeue; at most %d allowed across all topics", total, MaxDequeueTotal)
	}
	if region, err = r.region(req.Region, m); err != nil {
		return nil, "", err
	}
	shards, err = m.ShardsFor(req.Namespace, region)
	return shards, region, err
}

// ownersOf groups shards by the dequeuer that owns each; orphans have
// none. The view may have missed a claim (its watch sees nothing while
// the bucket's stream elects a leader, or a reload fell between a
// hand-over and the claim), so shards without an owner are read from the
// bucket itself once; Reload paces its reads per shard.
func (r *Router) ownersOf(ctx context.Context, shards []uint32) (byOwner map[string][]uint32, orphans []uint32) {
	byOwner = map[string][]uint32{}
	for _, id := range shards {
		if o, ok := r.cfg.Owners.Owner(id); ok {
			byOwner[o] = append(byOwner[o], id)
		} else {
			orphans = append(orphans, id)
		}
	}
	if len(orphans) == 0 {
		return byOwner, nil
	}
	r.cfg.Owners.Reload(ctx, orphans)
	still := orphans[:0]
	for _, id := range orphans {
		if o, ok := r.cfg.Owners.Owner(id); ok {
			byOwner[o] = append(byOwner[o], id)
		} else {
			still = append(still, id)
		}
	}
	return byOwner, still
}

// dequeueMerged asks each owner for the full counts, keeps the most
// urgent, and hands the surplus back at once, as never delivered: no
// attempt counted and its old place in the order kept (a nack would count
// the attempt, so an item that kept landing in the surplus would
// dead-letter undelivered, and would move it behind younger items).
func (r *Router) dequeueMerged(ctx context.Context, req *triagev1.DequeueRequest, byOwner map[string][]uint32) ([]*triagev1.LeasedItem, error) {
	type answer struct {
		items []*triagev1.LeasedItem
		err   error
	}
	answers := make(chan answer, len(byOwner))
	for owner, ids := range byOwner {
		go func() {
			items, err := r.forward(ctx, owner, req, ids)
			answers <- answer{items, err}
		}()
	}
	var all []*triagev1.LeasedItem
	var firstErr error
	for range byOwner {
		a := <-answers
		all = append(all, a.items...)
		firstErr = cmp.Or(firstErr, a.err)
	}
	if len(all) == 0 {
		return nil, firstErr
	}
	out, surplus := mostUrgent(req, all)
	if err := r.undeliver(req.Namespace, surplus); err != nil {
		r.log.Warn("surplus items could not be handed back; they come back when their lease lapses", "err", err)
	}
	return out, nil
}

// mostUrgent keeps, of the items several owners served, the request's
// counts of the most urgent. Each owner bounded its own reply; together
// they may not fit one gRPC message (clients refuse over 4 MiB by
// default), so the merged reply keeps to the same bound and the rest is
// surplus.
func mostUrgent(req *triagev1.DequeueRequest, all []*triagev1.LeasedItem) (out, surplus []*triagev1.LeasedItem) {
	slices.SortStableFunc(all, compareLeased)
	want := map[string]int32{}
	for _, tc := range req.Topics {
		want[tc.Topic] = tc.Count
	}
	size := 0
	for _, it := range all {
		n := proto.Size(it) + 16 // the field's tag and length prefix, with room
		if want[it.Topic] > 0 && size+n <= peer.MaxReplyBytes {
			want[it.Topic]--
			size += n
			out = append(out, it)
		} else {
			surplus = append(surplus, it)
		}
	}
	return out, surplus
}

// late hands back items served for a caller that will never get them:
// it has gone, or its answer is an error.
func (r *Router) late(ns string, items []*triagev1.LeasedItem) {
	if err := r.undeliver(ns, items); err != nil {
		r.log.Warn("items served after their caller had gone could not be handed back; they come back when their lease lapses",
			"namespace", ns, "items", len(items), "err", err)
		return
	}
	r.log.Info("items served after their caller had gone are handed back", "namespace", ns, "items", len(items))
}

// undeliver hands items a dequeuer served but no consumer will get back
// to the ready set (handback), and tells their owners.
func (r *Router) undeliver(ns string, items []*triagev1.LeasedItem) error {
	if len(items) == 0 {
		return nil
	}
	_, err := r.handBack.Leased(ns, items, func(shard uint32, items []*triagev1.LeasedItem) {
		// The owners' buffers do not know the items are ready again.
		seen := map[string]bool{}
		for _, it := range items {
			if !seen[it.Topic] {
				seen[it.Topic] = true
				r.announce(ns, it.Topic, shard, 1)
			}
		}
	})
	return err
}

func compareLeased(a, b *triagev1.LeasedItem) int {
	if c := cmp.Compare(a.Priority, b.Priority); c != 0 {
		return c
	}
	if c := a.DeliverAfter.AsTime().Compare(b.DeliverAfter.AsTime()); c != 0 {
		return c
	}
	ia, _ := itemid.Parse(a.Id)
	ib, _ := itemid.Parse(b.Id)
	return cmp.Compare(ia.Key, ib.Key)
}

// afterWrite checks, after a write committed, that the shard is still
// writable: a commit that waited out a semi-sync timeout on a primary
// being deposed must not be reported as done, since the write may be lost
// with that primary. The outcome is unknown; the client retries.
func (r *Router) afterWrite(shard uint32) error {
	if err := r.cfg.Maps.Writable(shard); err != nil {
		return fmt.Errorf("%w; the outcome of this write is unknown, retry it", err)
	}
	return nil
}

// unbuffer asks the dequeuer that owns an item's shard to drop the item
// from its buffers before the router updates or deletes it. A buffered
// copy could not be served (a serve compares the row's version), but it
// would hold a place in the merge until a take found it stale. No owner,
// or an owner that is gone, holds no buffer.
func (r *Router) unbuffer(ctx context.Context, ns string, id itemid.ID) error {
	owner, ok := r.cfg.Owners.Owner(id.Shard)
	if !ok {
		return nil
	}
	err := r.dq.Unbuffer(ctx, owner, ns, id.Shard, []uint64{id.Key})
	switch {
	case errors.Is(err, nats.ErrNoResponders):
		return nil
	case err != nil:
		return errorf(ErrUnavailable, "dequeuer %s: %v", owner, err)
	}
	return nil
}

// byShard groups request positions by the shard their ID names, after
// checking every ID parses and names a shard of the map. Nothing is done
// when any ID is bad.
func byShard(m *shardmap.Map, ids []string) (map[uint32][]int, []itemid.ID, error) {
	if len(ids) == 0 {
		return nil, nil, invalid("no items given: send 1 to %d", MaxRefsPerCall)
	}
	if len(ids) > MaxRefsPerCall {
		return nil, nil, invalid("%d items in one call; at most %d allowed", len(ids), MaxRefsPerCall)
	}
	parsed := make([]itemid.ID, len(ids))
	groups := map[uint32][]int{}
	for i, s := range ids {
		id, err := itemid.Parse(s)
		if err != nil {
			return nil, nil, err
		}
		if _, ok := m.Shard(id.Shard); !ok {
			return nil, nil, fmt.Errorf("%w %q: shard %d does not exist", itemid.ErrInvalid, s, id.Shard)
		}
		parsed[i] = id
		groups[id.Shard] = append(groups[id.Shard], i)
	}
	return groups, parsed, nil
}

// perShard runs fn for every shard group concurrently.
func (r *Router) perShard(ctx context.Context, m *shardmap.Map, groups map[uint32][]int, fn func(ctx context.Context, shard uint32, idx []int) error) error {
	errs := make(chan error, len(groups))
	for shard, idx := range groups {
		go func() { errs <- fn(ctx, shard, idx) }()
	}
	var all []error
	for range groups {
		all = append(all, <-errs)
	}
	return errors.Join(all...)
}

func itemResults(ids []string, errs []error) []*triagev1.ItemResult {
	out := make([]*triagev1.ItemResult, len(ids))
	for i, id := range ids {
		out[i] = &triagev1.ItemResult{Id: id, Ok: errs[i] == nil}
		if errs[i] != nil {
			out[i].Error = errs[i].Error()
		}
	}
	return out
}

// Ack implements triagev1.QueueServer.
func (r *Router) Ack(ctx context.Context, req *triagev1.AckRequest) (*triagev1.AckResponse, error) {
	r.draining()
	start := time.Now()
	p, err := r.planAcks(req.Namespace, req.Acks)
	if err != nil {
		return nil, err
	}
	errs, err := r.runAcks(ctx, p, false)
	if err != nil {
		return nil, err
	}
	r.cfg.Metrics.Namespace(req.Namespace).Ack.Observe(time.Since(start).Seconds())
	return &triagev1.AckResponse{Results: itemResults(p.ids, errs)}, nil
}

// ackPlan is a validated list of acks: each ref's shard, key and token.
type ackPlan struct {
	m      *shardmap.Map
	ns     *shardmap.Namespace
	name   string
	ids    []string
	groups map[uint32][]int
	parsed []itemid.ID
	tokens []uint64
}

// planAcks checks refs (the namespace, each id and token) and groups them
// by shard; it writes nothing, so a request it refuses changes nothing.
func (r *Router) planAcks(namespace string, refs []*triagev1.LeaseRef) (*ackPlan, error) {
	m := r.cfg.Maps.Current()
	ns, err := m.Namespace(namespace)
	if err != nil {
		return nil, err
	}
	p := &ackPlan{m: m, ns: ns, name: namespace, ids: make([]string, len(refs)), tokens: make([]uint64, len(refs))}
	for i, a := range refs {
		p.ids[i] = a.Id
	}
	if p.groups, p.parsed, err = byShard(m, p.ids); err != nil {
		return nil, err
	}
	for i, a := range refs {
		if p.tokens[i], err = store.ParseToken(a.LeaseToken); err != nil {
			return nil, fmt.Errorf("acks[%d]: %w", i, err)
		}
	}
	return p, nil
}

// runAcks acks p's refs, each shard's through Config.Writes, and returns
// each ref's result. A shard that could not be written fails the call,
// or, with perRef, becomes the result of each of its refs only: the other
// shards' acks may have committed, and their refs say so.
func (r *Router) runAcks(ctx context.Context, p *ackPlan, perRef bool) ([]error, error) {
	errs := make([]error, len(p.ids))
	err := r.perShard(ctx, p.m, p.groups, func(ctx context.Context, shard uint32, idx []int) error {
		res, err := r.ackShard(ctx, p, shard, idx)
		if err != nil {
			if !perRef {
				return err
			}
			res = make([]error, len(idx))
			for j := range res {
				res[j] = err
			}
		}
		for j, i := range idx {
			errs[i] = res[j]
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	nm := r.cfg.Metrics.Namespace(p.name)
	countResults(errs, nm.AckOK, nm.AckRefused)
	return errs, nil
}

// ackShard acks the refs of p at idx, all on shard, and returns each
// one's result, or the reason the shard could not be written.
func (r *Router) ackShard(ctx context.Context, p *ackPlan, shard uint32, idx []int) ([]error, error) {
	db, err := r.cfg.Pool.Writer(r.cfg.Maps, shard)
	if err != nil {
		return nil, err
	}
	refs := make([]store.LeaseRef, len(idx))
	for j, i := range idx {
		refs[j] = store.LeaseRef{Key: p.parsed[i].Key, Token: p.tokens[i]}
	}
	// The tombstones' window runs on the shard primary's clock
	// (Config.Writes.Now). Concurrent acks of the shard share one
	// transaction, with the process's serves of it (store.Batcher).
	res, err := r.cfg.Writes.Ack(ctx, db, store.ItemAckParams{Namespace: p.name, Refs: refs,
		DedupWindow: time.Duration(p.ns.DedupWindow)})
	if err == nil {
		err = r.afterWrite(shard)
	}
	if err != nil {
		return nil, writeOutcome(err, shard, retryAck)
	}
	return res, nil
}

// countResults adds a batch's per-item outcomes to ok and refused.
func countResults(errs []error, ok, refused prometheus.Counter) {
	n := 0
	for _, err := range errs {
		if err != nil {
			n++
		}
	}
	ok.Add(float64(len(errs) - n))
	refused.Add(float64(n))
}

// Nack implements triagev1.QueueServer.
func (r *Router) Nack(ctx context.Context, req *triagev1.NackRequest) (*triagev1.NackResponse, error) {
	r.draining()
	resp, err := r.nack(ctx, req)
	return resp, err
}

func (r *Router) nack(ctx context.Context, req *triagev1.NackRequest) (*triagev1.NackResponse, error) {
	start := time.Now()
	m := r.cfg.Maps.Current()
	ns, err := m.Namespace(req.Namespace)
	if err != nil {
		return nil, err
	}
	ids := make([]string, len(req.Nacks))
	for i, n := range req.Nacks {
		ids[i] = n.Id
	}
	groups, parsed, err := byShard(m, ids)
	if err != nil {
		return nil, err
	}
	nacks, err := parseNacks(req, parsed)
	if err != nil {
		return nil, err
	}
	if len(groups) > 1 {
		// Each shard's batch is one transaction that a too-large metadata
		// merge refuses whole; across shards, check first so a bad nack
		// changes nothing anywhere (a race with an update is refused by
		// the transaction, on its shard only).
		if err := r.checkNackMetadata(ctx, req.Namespace, parsed, nacks); err != nil {
			return nil, err
		}
	}
	errs := make([]error, len(ids))
	err = r.perShard(ctx, m, groups, func(ctx context.Context, shard uint32, idx []int) error {
		db, err := r.cfg.Pool.Writer(r.cfg.Maps, shard)
		if err != nil {
			return err
		}
		batch := make([]store.Nack, len(idx))
		for j, i := range idx {
			batch[j] = nacks[i]
		}
		res, readyNow, err := store.New(db).ItemNack(ctx, store.ItemNackParams{Namespace: req.Namespace, Nacks: batch,
			OnDeadLetter: func(topic string) { r.cfg.Metrics.Topic(req.Namespace, topic).DeadLettered.Inc() },
			Retry:        retryPolicy(ns), DedupWindow: time.Duration(ns.DedupWindow), NowUS: r.cfg.Clock.Now(ctx, db).UnixMicro()})
		if err == nil {
			err = r.afterWrite(shard)
		}
		if err != nil {
			return writeOutcome(err, shard, retryNack)
		}
		for j, i := range idx {
			errs[i] = res[j]
		}
		r.announceReady(req.Namespace, shard, readyNow)
		return nil
	})
	if err != nil {
		return nil, err
	}
	nm := r.cfg.Metrics.Namespace(req.Namespace)
	countResults(errs, nm.NackOK, nm.NackRefused)
	nm.Nack.Observe(time.Since(start).Seconds())
	return &triagev1.NackResponse{Results: itemResults(ids, errs)}, nil
}

// retryPolicy is the nack's view of ns's topics' retry policies.
func retryPolicy(ns *shardmap.Namespace) func(topic string) store.RetryPolicy {
	return func(topic string) store.RetryPolicy {
		n, b := ns.Retry(topic)
		return store.RetryPolicy{MaxAttempts: n, Backoff: b.Delay}
	}
}

// parseNacks checks each nack of the request and turns it into the
// store's form, with its item's key from parsed.
func parseNacks(req *triagev1.NackRequest, parsed []itemid.ID) ([]store.Nack, error) {
	nacks := make([]store.Nack, len(req.Nacks))
	for i, n := range req.Nacks {
		tok, err := store.ParseToken(n.LeaseToken)
		if err != nil {
			return nil, fmt.Errorf("nacks[%d]: %w", i, err)
		}
		if n.Delay != nil {
			if err := n.Delay.CheckValid(); err != nil || n.Delay.AsDuration() < 0 || n.Delay.AsDuration() > MaxNackDelay {
				return nil, invalid("nacks[%d].delay must be between 0s and %s", i, MaxNackDelay)
			}
		}
		if len(n.Error) > MaxErrorBytes {
			return nil, invalid("nacks[%d].error is %d bytes; at most %d allowed", i, len(n.Error), MaxErrorBytes)
		}
		if err := checkMetadata(n.Metadata); err != nil {
			return nil, err
		}
		if n.DeadLetter && n.Release {
			return nil, invalid("nacks[%d]: dead_letter and release exclude each other: dead_letter ends the item, release hands it back uncounted", i)
		}
		nacks[i] = store.Nack{LeaseRef: store.LeaseRef{Key: parsed[i].Key, Token: tok},
			Delay: n.Delay.AsDuration(), Backoff: n.Delay == nil, Error: n.Error, Metadata: n.Metadata,
			DeadLetter: n.DeadLetter, Release: n.Release}
	}
	return nacks, nil
}

// announceReady tells the shard's owner of items ready again at once, by
// topic: its buffer may hold less urgent ones and would not look until
// its next recheck.
func (r *Router) announceReady(ns string, shard uint32, topics []string) {
	counts := map[string]int32{}
	for _, topic := range topics {
		if topic != "" {
			counts[topic]++
		}
	}
	for topic, n := range counts {
		r.announce(ns, topic, shard, n)
	}
}

// checkNackMetadata refuses nacks whose metadata patch, merged with the
// item's stored metadata, would not fit (store.ErrMetadataTooLarge).
func (r *Router) checkNackMetadata(ctx context.Context, ns string, ids []itemid.ID, nacks []store.Nack) error {
	for i, n := range nacks {
		if len(n.Metadata) == 0 {
			continue
		}
		db, err := r.cfg.Pool.Writer(r.cfg.Maps, ids[i].Shard)
		if err != nil {
			return err
		}
		row, err := store.New(db).ItemGet(ctx, store.ItemGetParams{Namespace: ns, ID: ids[i].Key})
		if errors.Is(err, store.ErrNotFound) {
			continue // reported per item by the nack itself
		}
		if err != nil {
			return err
		}
		if _, err := store.MergeMetadata(row.Metadata, n.Metadata); err != nil {
			return fmt.Errorf("nacks[%d]: %w", i, err)
		}
	}
	return nil
}

// ExtendLease implements triagev1.QueueServer.
func (r *Router) ExtendLease(ctx context.Context, req *triagev1.ExtendLeaseRequest) (*triagev1.ExtendLeaseResponse, error) {
	r.draining()
	m := r.cfg.Maps.Current()
	if _, err := m.Namespace(req.Namespace); err != nil {
		return nil, err
	}
	id, db, err := r.itemShard(m, req.Id, true)
	if err != nil {
		return nil, err
	}
	tok, err := store.ParseToken(req.LeaseToken)
	if err != nil {
		return nil, err
	}
	if err := checkLease("lease_duration", req.LeaseDuration, true); err != nil {
		return nil, err
	}
	until, err := store.New(db).ItemExtend(ctx, store.ItemExtendParams{Namespace: req.Namespace, Ref: store.LeaseRef{Key: id.Key, Token: tok},
		Lease: req.LeaseDuration.AsDuration(), Now: r.cfg.Clock.Now(ctx, db)})
	if err == nil {
		err = r.afterWrite(id.Shard)
	}
	if err != nil {
		return nil, writeOutcome(err, id.Shard, retryExtend)
	}
	return &triagev1.ExtendLeaseResponse{LeaseExpiresAt: timestamppb.New(until)}, nil
}

// Owner returns the dequeuer that owns shard, as this router sees it.
func (r *Router) Owner(shard uint32) (string, bool) { return r.cfg.Owners.Owner(shard) }

// draining notes a consumer's call for enqueue admission.
func (r *Router) draining() {
	if r.admit != nil {
		r.admit.draining()
	}
}
