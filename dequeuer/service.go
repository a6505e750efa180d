package dequeuer

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
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

// Config configures the dequeuer role.
type Config struct {
	// Region whose shards this dequeuer serves. Required.
	Region string
	// ID names this dequeuer in the ownership bucket and its request
	// subject. It always starts with Region + "-" (New prefixes one that
	// does not), which is how a dequeuer tells a claim of its own region
	// from one of another (ownership.takeOver). Default: region + "-" + a
	// random NUID.
	ID string
	// Maps, Pool, NC, JS: shard map, shard connections, NATS. Required.
	Maps shardmap.Source
	Pool *shardmap.Pool
	NC   *nats.Conn
	JS   jetstream.JetStream
	// OwnerTTL is how long a dequeuer's session outlives its last
	// refresh (every OwnerTTL/4): a killed dequeuer's shards are taken
	// over within a claim round of that. Default 10s.
	OwnerTTL time.Duration
	// KVReplicas of the ownership bucket. Default 1.
	KVReplicas int
	// IdleDrop empties a topic's buffers after this long without a
	// dequeue. Their rows were never hidden from anyone: this frees only
	// memory. Default 2s.
	IdleDrop time.Duration
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Now is the local clock, for what only this process times (waits,
	// idle buffers, sweep pacing). Default time.Now.
	Now func() time.Time
	// Clock tells a shard primary's time, the one every process uses for
	// lease arithmetic on that shard's rows (see "# Clocks" in doc.go).
	// Default: a Clock of this service's own.
	Clock *shardmap.Clock
	// Writes coalesces the serves of concurrent takes per shard into one
	// transaction, with whatever acks the process's router has for the
	// shard at the time (store.Batcher): a node gives its router and its
	// dequeuer one. Default: a Batcher of this service's own.
	Writes *store.Batcher
	// BeforeBuffer, when set, runs after a fetch read keys of a shard
	// (a take's own fetch or a background refill) and before they enter
	// the buffer. It is a seam for tests that
	// widen race windows (an update or delete landing mid-fetch).
	BeforeBuffer func(shard uint32, keys []uint64)
	// AfterServe, when set, runs when a serve's UPDATE on a shard has
	// answered; an error it returns stands for an answer lost after the
	// UPDATE committed (a dropped OK packet, a read timeout during a
	// replication wait). A seam for tests of settleServes.
	AfterServe func(shard uint32) error
	// Metrics records deliveries, attempts, enqueue-to-delivery latency,
	// lease expiries, dead letters and prefetch hits. Nil: none.
	Metrics *metrics.Set
	// Tracer traces each dequeue served ("dequeuer.dequeue"), a child of
	// the router's "dequeue.forward" (across NATS: the request's
	// traceparent header). Nil: no tracing.
	Tracer trace.TracerProvider
}

// Service is the dequeuer role: it owns shards, prefetches their ready
// heads and answers ShardDequeue requests from routers.
type Service struct {
	cfg    Config
	log    *slog.Logger
	tracer trace.Tracer

	mu     sync.Mutex
	topics map[bufKey]*topicBuf
	wrr    map[[2]string]*wrr

	// inflight bounds the dequeue requests served (parked long polls
	// included): one slot each, taken before any goroutine starts.
	inflight chan struct{}

	aging *aging
	owner *ownership
	// queueTotal is the number of shard queues of all buffers, as of the
	// last TTL sweep (see quietQueues).
	queueTotal atomic.Int64
	// ttlNext is when each owned shard's next TTL sweep is due (see
	// ttlSweepEvery); absent: at the next tick.
	ttlMu   sync.Mutex
	ttlNext map[uint32]time.Time
	// handBack returns served items nobody received to the ready set.
	handBack *handback.Returner

	// Background refills (startRefills) run on bgCtx, the context Start
	// was given, and halt waits for them; refillMu guards stopping and
	// the count's increments against that wait.
	bgCtx    context.Context
	refillMu sync.Mutex
	stopping bool
	refills  sync.WaitGroup

	subs   []*nats.Subscription
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// validID is what a dequeuer ID may be: the end of a NATS subject
// (peer.DequeueSubject) and of a KV key (peer.SessionKey).
var validID = regexp.MustCompile(`^[A-Za-z0-9_.-]+$`)

// New validates cfg and returns a stopped dequeuer.
func New(cfg Config) (*Service, error) {
	if cfg.Region == "" || cfg.Maps == nil || cfg.Pool == nil || cfg.NC == nil || cfg.JS == nil {
		return nil, errors.New("dequeuer: Region, Maps, Pool, NC and JS are required")
	}
	switch {
	case cfg.ID == "":
		cfg.ID = cfg.Region + "-" + nuid.Next()
	case !strings.HasPrefix(cfg.ID, cfg.Region+"-"):
		cfg.ID = cfg.Region + "-" + cfg.ID
	}
	if !validID.MatchString(cfg.ID) {
		return nil, fmt.Errorf("dequeuer: ID %q may hold only letters, digits, '_', '.' and '-' (it ends a KV key and a NATS subject)", cfg.ID)
	}
	if cfg.OwnerTTL == 0 {
		cfg.OwnerTTL = DefaultOwnerTTL
	}
	if cfg.IdleDrop == 0 {
		cfg.IdleDrop = 2 * time.Second
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Clock == nil {
		cfg.Clock = &shardmap.Clock{}
	}
	if cfg.Writes == nil {
		cfg.Writes = &store.Batcher{Now: cfg.Clock.Now}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	log := cfg.Logger.With("role", "dequeuer", "region", cfg.Region, "dequeuer", cfg.ID)
	return &Service{cfg: cfg, log: log, tracer: tracing.Tracer(cfg.Tracer), topics: map[bufKey]*topicBuf{}, wrr: map[[2]string]*wrr{}, aging: newAging(), ttlNext: map[uint32]time.Time{},
		inflight: make(chan struct{}, MaxInflight),
		handBack: handback.New(handback.Config{Maps: cfg.Maps, Pool: cfg.Pool, Clock: cfg.Clock, Log: log})}, nil
}

// shardNow is the time of a shard's primary (see Config.Clock), or the
// local clock when the map names none (the statement that follows fails
// the same way). It reads no epoch (Pool.Writer): it runs on the loop
// that takes every ready notice.
func (s *Service) shardNow(ctx context.Context, shard uint32) time.Time {
	db, _, err := s.cfg.Pool.Primary(s.cfg.Maps.Current(), shard)
	if err != nil {
		return s.cfg.Now()
	}
	return s.cfg.Clock.Now(ctx, db)
}

// ID returns the dequeuer's ID.
func (s *Service) ID() string { return s.cfg.ID }

// Start claims shards and begins serving.
func (s *Service) Start(ctx context.Context) error {
	kv, err := OpenOwners(ctx, s.cfg.JS, s.cfg.OwnerTTL, s.cfg.KVReplicas)
	if err != nil {
		return err
	}
	claims, err := OpenClaims(ctx, s.cfg.JS, s.cfg.KVReplicas)
	if err != nil {
		return err
	}
	ctx, s.cancel = context.WithCancel(ctx)
	s.refillMu.Lock()
	s.bgCtx = ctx
	s.refillMu.Unlock()
	s.owner = newOwnership(s, kv, claims)
	if view, err := WatchOwners(ctx, kv, claims); err == nil {
		s.owner.view = view
	} else {
		s.log.Warn("not watching the ownership buckets; every claim round asks them for every shard it does not own", "err", err)
	}
	s.owner.claim(ctx)
	// Requests and ItemsReady notices share one channel, read in the order
	// the connection received them: a router that announces a commit and
	// then forwards a dequeue is seen in that order, so the dequeue finds
	// the buffer already marked for a refill.
	//
	// The loop only dispatches, so the channel drains fast. Should it fill
	// anyway, the NATS client drops messages (counted, and logged by
	// watchDrops): a dropped request times out at its router, which answers
	// UNAVAILABLE; a dropped ItemsReady notice only delays, never loses,
	// items: an exhausted queue is read again after recheckEvery and parked
	// long polls look again at least that often.
	inbox := make(chan *nats.Msg, 4096)
	for _, subj := range []string{peer.DequeueSubject(s.cfg.ID), peer.UnbufferSubject(s.cfg.ID), peer.ReadySubject("*")} {
		sub, err := s.cfg.NC.ChanSubscribe(subj, inbox)
		if err != nil {
			return err
		}
		s.subs = append(s.subs, sub)
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			select {
			case <-ctx.Done():
				return
			case m := <-inbox:
				switch m.Subject {
				case peer.DequeueSubject(s.cfg.ID):
					if !s.acquire() {
						s.refuse(m)
						continue
					}
					go func() {
						defer s.release()
						s.handleRequest(m)
					}()
				case peer.UnbufferSubject(s.cfg.ID):
					go s.handleUnbuffer(m)
				default:
					s.handleReady(m)
				}
			}
		}
	}()
	s.claimLoop(ctx)
	s.loop(ctx, 5*time.Second, s.watchDrops)
	s.loop(ctx, 500*time.Millisecond, s.dropIdle)
	s.loop(ctx, ttlSweepEvery, s.sweepTTL)
	s.loop(ctx, 100*time.Millisecond, s.sweepAging)
	return nil
}

// Stop stops serving, drops the buffers and gives up ownership so another
// dequeuer takes the shards at once.
func (s *Service) Stop() {
	s.halt()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s.emptyBuffers(func(*topicBuf) bool { return true })
	if s.owner != nil {
		s.owner.resign(ctx)
	}
}

// Crash stops the dequeuer the way a killed process stops: no ownership
// is resigned, so other dequeuers wait for the ownership TTL. Its buffered
// items were never hidden: they are ready for the next owner at once.
// Drills use it.
func (s *Service) Crash() {
	s.halt()
	if s.owner != nil {
		s.owner.forget()
	}
}

// halt stops taking requests and notices and ends the background loops.
func (s *Service) halt() {
	for _, sub := range s.subs {
		_ = sub.Unsubscribe()
	}
	if s.cancel != nil {
		s.cancel()
	}
	s.refillMu.Lock()
	s.stopping = true
	s.refillMu.Unlock()
	s.refills.Wait()
	s.wg.Wait()
	s.handBack.Stop()
}

// MaxInflight bounds the dequeue requests one dequeuer serves at once,
// parked long polls included. Beyond it requests are refused at once
// (peer.ErrBusy) instead of piling up goroutines.
const MaxInflight = 4096

func (s *Service) acquire() bool {
	select {
	case s.inflight <- struct{}{}:
		return true
	default:
		return false
	}
}

func (s *Service) release() { <-s.inflight }

// Serving is how many dequeue requests this dequeuer is serving now,
// parked long polls included (what MaxInflight bounds).
func (s *Service) Serving() int { return len(s.inflight) }

// refuse answers a request the dequeuer has no room for.
func (s *Service) refuse(m *nats.Msg) {
	data, _ := proto.Marshal(&peerv1.ShardDequeueResponse{Code: 14, Error: peer.ErrBusy.Error()})
	_ = m.Respond(data)
}

// watchDrops logs messages the NATS client dropped because the inbox was
// full, so an overload is visible.
func (s *Service) watchDrops(context.Context) {
	for _, sub := range s.subs {
		if n, err := sub.Dropped(); err == nil && n > 0 {
			s.log.Warn("inbox overflowed: NATS messages dropped (requests time out at the router, ready notices only delay)",
				"subject", sub.Subject, "dropped", n)
		}
	}
}

// claimLoop runs ownership claims every OwnerTTL/4, at once when the
// shard map changes (a failover moves a shard's primary, and with it the
// shard's owner) or a dequeuer starts or resigns (the region's shards are
// balanced again), and every claimRetry while a shard this dequeuer wants
// is still held by the one handing it over or by a peer over its quota.
func (s *Service) claimLoop(ctx context.Context) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		// The first round comes soon: Start's own claim may have found a
		// shard still held elsewhere (pending), which a later round takes.
		t := time.NewTimer(claimRetry)
		defer t.Stop()
		changed, joined := s.mapChanged(), s.peersChanged()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			case <-changed:
			case <-joined:
				joined = s.peersChanged()
			}
			// Taken before the round reads the map, so that a map that
			// lands while the round runs wakes the next one at once; taken
			// after it, such a change would go unseen until the next tick,
			// and a failover's old owner would hand its shard over up to
			// OwnerTTL/4 late (or be taken over after handOverGrace) while
			// dequeues of the shard through the other regions' routers
			// waited.
			changed = s.mapChanged()
			next := s.cfg.OwnerTTL / 4
			if s.owner.claim(ctx) {
				next = min(next, claimRetry)
			}
			t.Reset(next)
		}
	}()
}

// mapChanged returns a channel closed at the next shard-map change, or
// nil (never) for a map source that does not tell.
func (s *Service) mapChanged() <-chan struct{} {
	if c, ok := s.cfg.Maps.(interface{ Changed() <-chan struct{} }); ok {
		return c.Changed()
	}
	return nil
}

// peersChanged returns a channel closed when a dequeuer starts or
// resigns (Owners.Joined), or nil (never) without an ownership view.
func (s *Service) peersChanged() <-chan struct{} {
	if s.owner.view == nil {
		return nil
	}
	return s.owner.view.Joined()
}

// claimRetry paces claims of a shard another dequeuer is handing over.
const claimRetry = 100 * time.Millisecond

func (s *Service) loop(ctx context.Context, every time.Duration, fn func(context.Context)) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				fn(ctx)
			}
		}
	}()
}

func (s *Service) buf(k bufKey) *topicBuf {
	s.mu.Lock()
	defer s.mu.Unlock()
	b := s.topics[k]
	if b == nil {
		b = newTopicBuf(k)
		s.topics[k] = b
	}
	return b
}

// policy is the lease-path view of a topic's configuration.
func (s *Service) policy(m *shardmap.Map, ns, topic string) Policy {
	n, err := m.Namespace(ns)
	if err != nil {
		return Policy{}
	}
	maxAttempts, _ := n.Retry(topic)
	return Policy{MaxAttempts: maxAttempts, AtMostOnce: n.Topic(topic).AtMostOnce, DedupWindow: time.Duration(n.DedupWindow)}
}

func (s *Service) handleReady(m *nats.Msg) {
	var r peerv1.ItemsReady
	if proto.Unmarshal(m.Data, &r) != nil {
		return
	}
	s.Ready(&r)
}

// Ready marks the buffers that new items of a topic may sort into for a
// refill and wakes waiters. A router in the same process calls it directly
// before answering a committed enqueue.
func (s *Service) Ready(r *peerv1.ItemsReady) {
	s.ttlSweepSoon(r.Shard)
	// Buffers of bands the new items may fall in; a topic nobody has asked
	// for here has none, and there is nothing to refresh.
	bufs := s.buffers(func(k *bufKey) bool {
		return k.ns == r.Namespace && k.topic == r.Topic && r.MinPriority <= k.band.hi
	})
	if len(bufs) == 0 {
		return
	}
	rows := s.handedRows(r)
	for _, b := range bufs {
		b.mu.Lock()
		q := b.queue(r.Shard)
		switch {
		case rows != nil:
			q.handIn(b, rows)
		case len(q.items) == 0 || mayPrecede(r, q.tail()):
			// An empty queue must look again; a buffered one when the
			// items may sort before what it holds.
			q.markDirty(noticeFrom(r))
			q.notices++
		default:
			q.leaveUnread()
		}
		b.mu.Unlock()
		b.wake(int(max(r.Count, 1)))
	}
}

// handedRows returns the rows a notice carries (peer.Handed) as buffer
// items, or nil when it carries none or any of them is not ready yet by
// the shard primary's clock (a delayed item, or the announcer's clock
// ahead of the primary's): such a notice is handled as one without rows.
func (s *Service) handedRows(r *peerv1.ItemsReady) []bufItem {
	if !peer.Handed(r) || !s.owner.owns(r.Shard) {
		return nil
	}
	// Ready runs on a committed enqueue's way back to its client: the
	// clock's rare refresh query may not hold it up for long.
	ctx, cancel := context.WithTimeout(context.Background(), 250*time.Millisecond)
	defer cancel()
	now := s.shardNow(ctx, r.Shard).UnixMicro()
	rows := make([]bufItem, len(r.Items))
	for i, it := range r.Items {
		if it.DeliverAfterUs > now {
			return nil
		}
		rows[i] = bufItem{shard: r.Shard, Item: store.Item{ID: it.Key, Priority: it.Priority, DeliverAfter: it.DeliverAfterUs,
			EnqueuedAt: r.EnqueuedAtUs, LeaseMS: it.LeaseMs, Payload: it.Payload, Metadata: it.Metadata, UpdatedAt: r.VersionUs}}
		if it.ExpiresAtUs != 0 {
			rows[i].ExpiresAt = sql.NullInt64{Int64: it.ExpiresAtUs, Valid: true}
		}
	}
	// By index: a comparator taking bufItems by value has frames that
	// grew the stack of every committed Enqueue's goroutine.
	sort.Slice(rows, func(i, j int) bool { return rows[i].Less(&rows[j].Item) })
	return rows
}

// mayPrecede reports whether announced items may sort before tail, so
// that its queue must be read again before it serves. A more urgent
// priority does. At the tail's priority, items whose deliver_after is
// known to be later sort after it (a refill or the read that drains the
// queue finds them: shardQueue.leaveUnread); when the announcer cannot
// say (an item handed back by an unserve, nack, update or redrive keeps
// an old deliver_after), equal priority counts. Under a steady flood of
// enqueues into a backlog, a notice at the buffer's priority that sent
// the next take to the database would mostly find rows that sort after
// what it holds.
func mayPrecede(r *peerv1.ItemsReady, tail *store.Item) bool {
	if r.MinPriority != tail.Priority {
		return r.MinPriority < tail.Priority
	}
	return r.MinDeliverAfterUs == 0 || r.MinDeliverAfterUs <= tail.DeliverAfter
}

func (s *Service) handleRequest(m *nats.Msg) {
	var req peerv1.ShardDequeue
	resp := &peerv1.ShardDequeueResponse{}
	if err := proto.Unmarshal(m.Data, &req); err != nil || req.Request == nil {
		resp.Code, resp.Error = int32(codes.InvalidArgument), "malformed ShardDequeue"
	} else {
		ctx, cancel := context.WithTimeout(context.Background(), req.Request.GetWait().AsDuration()+peer.AnswerWithin)
		if parent := tracing.Extract(m.Header, 1)[0]; parent.IsValid() {
			ctx = trace.ContextWithRemoteSpanContext(ctx, parent)
		}
		// The reply must fit one NATS message: serve only what fits and
		// leave the rest buffered, uncounted.
		items, err := s.dequeue(ctx, req.Request, req.Shards, min(peer.MaxReplyBytes, int(s.cfg.NC.MaxPayload())-peer.ReplySlack))
		cancel()
		resp.Items = items
		if err != nil {
			resp.Code, resp.Error = int32(peer.ReplyCode(err)), err.Error()
		}
	}
	data, err := proto.Marshal(resp)
	if err == nil {
		err = m.Respond(data)
	}
	if err != nil && len(resp.Items) > 0 {
		// The items never reach anyone: hand them back as undelivered, or
		// the client's retries would burn their attempts.
		s.log.Warn("dequeue reply failed; its items are handed back", "items", len(resp.Items), "err", err)
		ns := req.GetRequest().GetNamespace()
		if _, err := s.handBack.Leased(ns, resp.Items, func(shard uint32, items []*triagev1.LeasedItem) {
			for _, it := range items {
				s.Ready(&peerv1.ItemsReady{Namespace: ns, Topic: it.Topic, Shard: shard, MinPriority: it.Priority, Count: 1})
			}
		}); err != nil {
			s.log.Warn("dequeue reply failed and its items could not be handed back; they return when their lease lapses", "err", err)
		}
	}
}

// Dequeue serves a validated request from shards this dequeuer owns:
// per topic, up to count items in (priority, deliver_after, id) order
// across the shards, each under a lease. With a wait it parks until items
// arrive or the wait ends.
func (s *Service) Dequeue(ctx context.Context, req *triagev1.DequeueRequest, shards []uint32) ([]*triagev1.LeasedItem, error) {
	if !s.acquire() {
		return nil, peer.ErrBusy
	}
	defer s.release()
	return s.dequeue(ctx, req, shards, peer.MaxReplyBytes)
}

// maxTakeRounds bounds how often one topic's take is repeated to replace
// taken items that could not be served. Every round removes what it took
// from the buffer, so rounds end on their own once the buffer yields
// nothing; the bound only stops churn. It is well above what stale copies
// need: buffered rows are not leased, so a copy goes stale whenever its
// row is acked under a lapsed lease, expires or changes, and a buffer
// can hold several at its head while a ready row waits behind them.
const maxTakeRounds = 32

// dequeue is Dequeue with the reply bounded to budget bytes: items that
// would not fit stay buffered, neither leased to anyone nor counted, for
// the next request.
func (s *Service) dequeue(ctx context.Context, req *triagev1.DequeueRequest, shards []uint32, budget int) (items []*triagev1.LeasedItem, err error) {
	ctx, span := s.tracer.Start(ctx, "dequeuer.dequeue", trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(attribute.String("triage.namespace", req.GetNamespace()), attribute.Int("triage.shards", len(shards))))
	defer func() { tracing.End(span, err, attribute.Int("triage.items", len(items))) }()
	return s.dequeueRounds(ctx, req, shards, budget)
}

// dequeueRounds is dequeue's work, inside its span: rounds of serving
// each topic of the request that is not paused from the buffers until
// one serves anything, fails, or the request's wait ends, parked between
// rounds until a buffer is woken or recheckEvery passes (each round reads
// the shard map again, so a topic resumed meanwhile is served).
func (s *Service) dequeueRounds(ctx context.Context, req *triagev1.DequeueRequest, shards []uint32, budget int) ([]*triagev1.LeasedItem, error) {
	deadline := s.cfg.Now().Add(req.GetWait().AsDuration())
	var lease time.Duration
	if req.LeaseDuration != nil {
		lease = req.LeaseDuration.AsDuration()
	}
	for {
		// Checked on every round, not once: a long poll outlives a hand-over
		// (a failover moves the shard to the new primary's region), and an
		// old owner that went on fetching would read rows into a buffer
		// nobody serves from, across the WAN, while the router's retry
		// would find the new owner at once.
		if err := s.checkOwned(shards); err != nil {
			return nil, err
		}
		var out []*triagev1.LeasedItem
		var firstErr error
		var bufs []*topicBuf
		m := s.cfg.Maps.Current()
		used := 0
		for _, tc := range req.Topics {
			if paused(m, req.Namespace, tc.Topic) {
				continue // the other topics are served; see paused
			}
			served, tbufs, err := s.serveTopic(ctx, m, req, tc, shards, lease, budget, &used)
			bufs = append(bufs, tbufs...)
			firstErr = cmp.Or(firstErr, err)
			maxAttempts := int32(s.policy(m, req.Namespace, tc.Topic).MaxAttempts)
			for _, it := range served {
				li := s.leased(tc.Topic, it)
				li.MaxAttempts = maxAttempts
				out = append(out, li)
			}
		}
		if len(out) > 0 {
			return out, nil
		}
		if firstErr != nil {
			return nil, firstErr
		}
		left := deadline.Sub(s.cfg.Now())
		if left <= 0 {
			return nil, nil
		}
		s.parkOn(ctx, bufs, min(left, recheckEvery))
		if ctx.Err() != nil {
			return nil, nil
		}
	}
}

// checkOwned fails with peer.ErrNotOwner unless this dequeuer owns every
// one of shards.
func (s *Service) checkOwned(shards []uint32) error {
	for _, id := range shards {
		if !s.owner.owns(id) {
			return fmt.Errorf("%w %d", peer.ErrNotOwner, id)
		}
	}
	return nil
}

// serveTopic takes up to tc.Count items of a topic from its buffers and
// serves them, within what is left of the reply's budget (used counts
// what the reply holds already). It returns them in delivery order, the
// buffers it took from (to park on), and the first error. Taken items
// that cannot be served (TTL passed while buffered, or a stale copy
// whose row changed since the fetch) are replaced from the buffer, so
// the answer is short only when the topic has nothing more ready.
func (s *Service) serveTopic(ctx context.Context, m *shardmap.Map, req *triagev1.DequeueRequest, tc *triagev1.TopicCount,
	shards []uint32, lease time.Duration, budget int, used *int) ([]bufItem, []*topicBuf, error) {
	var served []bufItem
	var bufs []*topicBuf
	var firstErr error
	for round := 0; round < maxTakeRounds && len(served) < int(tc.Count); round++ {
		want := &triagev1.TopicCount{Topic: tc.Topic, Count: tc.Count - int32(len(served))}
		items, tbufs, err := s.takeTopic(ctx, m, req, want, shards)
		if round == 0 {
			bufs = tbufs
		}
		firstErr = cmp.Or(firstErr, err)
		if len(items) == 0 {
			break
		}
		items = s.dropExpired(ctx, items)
		slices.SortStableFunc(items, func(a, b bufItem) int { return a.Compare(&b.Item) })
		full := false
		if budget > 0 {
			var fit int
			fit, *used = s.fitting(tc.Topic, items, budget, *used)
			if fit == 0 && len(items) > 0 && *used == 0 && firstErr == nil {
				firstErr = fmt.Errorf("item %d of topic %s is larger than a dequeue reply may be (%d bytes)", items[0].ID, tc.Topic, budget)
			}
			putBack(items[fit:])
			full = fit < len(items)
			items = items[:fit]
		}
		got, err := s.serve(ctx, items, lease)
		firstErr = cmp.Or(firstErr, err)
		served = append(served, got...)
		if full || err != nil {
			break // the reply is full, or the serve failed
		}
	}
	// One response lists a topic's items in delivery order, even
	// when a refill during the take brought items more urgent than
	// ones taken before it (a delayed item or lapsed lease turned
	// ready, which no notice announces).
	slices.SortStableFunc(served, func(a, b bufItem) int { return a.Compare(&b.Item) })
	return served, bufs, firstErr
}

// dropExpired settles and leaves out the taken items whose TTL passed
// while they waited in the buffer, by their primaries' clocks: they are
// not served (store.ItemServe checks the same for the rows it touches),
// and the sweep deletes them.
func (s *Service) dropExpired(ctx context.Context, items []bufItem) []bufItem {
	nowUS := map[uint32]int64{} // per shard, its primary's time
	var expired []bufItem
	items = slices.DeleteFunc(items, func(it bufItem) bool {
		if !it.ExpiresAt.Valid {
			return false
		}
		if _, ok := nowUS[it.shard]; !ok {
			nowUS[it.shard] = s.shardNow(ctx, it.shard).UnixMicro()
		}
		if it.ExpiresAt.Int64 <= nowUS[it.shard] {
			expired = append(expired, it)
			return true
		}
		return false
	})
	settle(expired)
	return items
}

// parkOn waits on bufs (see park) for at most d.
func (s *Service) parkOn(ctx context.Context, bufs []*topicBuf, d time.Duration) {
	waits := make([]chan struct{}, len(bufs))
	for i, b := range bufs {
		b.mu.Lock()
		waits[i] = b.wait()
		b.mu.Unlock()
	}
	s.park(ctx, waits, d)
	for i, b := range bufs {
		b.unwait(waits[i])
	}
}

// park waits until one of waits is woken, d passes or ctx ends. Only park
// itself reads the timer: a helper that took its one tick would leave park
// blocked until ctx ended, long past the request's wait.
func (s *Service) park(ctx context.Context, waits []chan struct{}, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	woken := make(chan struct{}, 1)
	done := make(chan struct{})
	defer close(done) // releases the helpers
	for _, w := range waits {
		go func() {
			select {
			case <-w:
				select {
				case woken <- struct{}{}:
				default:
				}
			case <-done:
			}
		}()
	}
	select {
	case <-woken:
	case <-t.C:
	case <-ctx.Done():
	}
}

// fitting returns how many of items fit in a reply of budget bytes of
// which used are taken, and the bytes used with them.
func (s *Service) fitting(topic string, items []bufItem, budget, used int) (int, int) {
	for i := range items {
		// The size before serving; the served token and expiry have the
		// same encoded size give or take a few bytes, and the field's tag
		// and length prefix take at most 6.
		n := proto.Size(s.leased(topic, items[i])) + 16
		if used+n > budget {
			return i, used
		}
		used += n
	}
	return len(items), used
}

// serve hands buffered items to a consumer: each gets its own lease token
// and the request's lease duration (or the item's own) from now, and
// counts an attempt, in one UPDATE per shard that applies only to rows
// unchanged since they were read (store.ItemServe). An item deleted,
// updated, served elsewhere or expired since it was read fails that
// condition and is not delivered; its queue reads again (spend).
func (s *Service) serve(ctx context.Context, items []bufItem, lease time.Duration) ([]bufItem, error) {
	if len(items) == 0 {
		return nil, nil
	}
	shards := s.shardsAt(ctx, items)
	p := planServes(items, shards, lease)
	held, unknown, err := s.runServes(ctx, p.groups, shards)
	if len(unknown) > 0 {
		s.settleServes(items, p.dls, func(i int) bool { return unknown[serveGroup{items[i].shard, p.round[i]}] })
	}
	// Every version a serve ran on is spent, served or found changed:
	// copies of it (a read racing the serve buffered the row again) leave
	// the buffers, and reads still in flight will not add them back.
	s.spend(items, func(i int) (ran, ok bool) {
		h, ran := held[serveGroup{items[i].shard, p.round[i]}]
		return ran, h[items[i].ID]
	})
	out := items[:0]
	for i, it := range items {
		if !held[serveGroup{it.shard, p.round[i]}][it.ID] {
			continue
		}
		dl := p.dls[i]
		it.token, it.untilUS = dl.Token, dl.UntilUS
		it.Attempts++
		out = append(out, it)
		s.count(&it, shards[it.shard].now)
	}
	return out, err
}

// shardAt is a shard's writable primary and its time, which stamps the
// shard's leases, or why there is none.
type shardAt struct {
	db  *sqlx.DB
	now time.Time
	err error
}

// shardsAt returns the primary and its time of each shard items are of.
func (s *Service) shardsAt(ctx context.Context, items []bufItem) map[uint32]*shardAt {
	shards := map[uint32]*shardAt{}
	for i := range items {
		id := items[i].shard
		if shards[id] == nil {
			a := &shardAt{}
			a.db, a.err = s.cfg.Pool.Writer(s.cfg.Maps, id)
			if a.err == nil {
				a.now = s.cfg.Clock.Now(ctx, a.db)
			}
			shards[id] = a
		}
	}
	return shards
}

// serveGroup names one serve call: a shard's deliveries of one round.
type serveGroup struct {
	shard uint32
	round int
}

// servePlan is the deliveries of a serve: dls[i] is items[i]'s, in the
// call of group {shard, round[i]}.
type servePlan struct {
	groups map[serveGroup][]store.Delivery
	round  []int
	dls    []store.Delivery
}

// planServes gives each item its delivery (a new token, and the lease
// from its primary's now) and groups them into one call per shard,
// whatever reads the items came from (each delivery names the version it
// was read at), through the shard's Batcher (Config.Writes), so concurrent takes
// share a statement. A row can be taken twice (buffered by two
// overlapping bands' buffers); only the copy at the row's current
// version is served, so a second copy goes in a call of its own (round),
// never beside the first.
func planServes(items []bufItem, shards map[uint32]*shardAt, lease time.Duration) servePlan {
	p := servePlan{groups: map[serveGroup][]store.Delivery{}, round: make([]int, len(items)), dls: make([]store.Delivery, len(items))}
	seen := map[[2]uint64]int{} // (shard, id) -> copies so far
	for i := range items {
		it := &items[i]
		now := shards[it.shard].now
		d := lease
		if d == 0 {
			d = time.Duration(it.LeaseMS) * time.Millisecond
		}
		dl := store.Delivery{ID: it.ID, Token: store.NewToken(), UntilUS: now.Add(d).UnixMicro(), Version: it.UpdatedAt}
		k := [2]uint64{uint64(it.shard), it.ID}
		p.round[i] = seen[k]
		seen[k]++
		g := serveGroup{it.shard, p.round[i]}
		p.groups[g] = append(p.groups[g], dl)
		p.dls[i] = dl
	}
	return p
}

// runServes runs the serve calls, the shards' at once: each waits for a
// commit on its own primary, and one after another a Dequeue over two
// shards would take two commits' time. held has, per call that
// answered, the ids it served; unknown the calls that failed, which may
// have committed.
func (s *Service) runServes(ctx context.Context, groups map[serveGroup][]store.Delivery, shards map[uint32]*shardAt) (
	held map[serveGroup]map[uint64]bool, unknown map[serveGroup]bool, err error) {
	held, unknown = map[serveGroup]map[uint64]bool{}, map[serveGroup]bool{}
	var errs []error
	var mu sync.Mutex
	var wg sync.WaitGroup
	for g, ds := range groups {
		a := shards[g.shard]
		if a.err != nil {
			mu.Lock() // serves started in earlier rounds of this loop append too
			errs = append(errs, a.err)
			mu.Unlock()
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			ok, err := s.cfg.Writes.Serve(ctx, a.db, store.ItemServeParams{Deliveries: ds, NowUS: a.now.UnixMicro()})
			if err == nil && s.cfg.AfterServe != nil {
				err = s.cfg.AfterServe(g.shard)
			}
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				unknown[g] = true
				return
			}
			held[g] = ok
		}()
	}
	wg.Wait()
	return held, unknown, errors.Join(errs...)
}

// settleServes hands back the items whose serve failed (failed(i)): a
// serve that answers an error may still have committed (its OK packet
// lost, a read timeout while the commit waited for a replica), and left
// as it is such an item would stay leased to nobody, an attempt counted,
// until its lease lapses; repeated, it could reach max_attempts without
// ever reaching a consumer. ItemUnserve changes only rows still under
// the failed serve's own tokens, so a serve that did not commit, or an
// item served, acked or changed since, is left alone. It runs in the
// background, on the shard's current primary, and retries until it
// succeeds, the service stops, or the leases have long lapsed (an
// unserve after the lapse still takes the attempt back while nobody
// leased the item again).
func (s *Service) settleServes(items []bufItem, dls []store.Delivery, failed func(int) bool) {
	type key struct {
		shard uint32
		ns    string
	}
	groups := map[key][]store.Undelivered{}
	notices := map[key][]*peerv1.ItemsReady{}
	var lastUS int64
	for i := range items {
		if !failed(i) {
			continue
		}
		it := &items[i]
		k := key{it.shard, it.buf.ns}
		groups[k] = append(groups[k], store.Undelivered{LeaseRef: store.LeaseRef{Key: it.ID, Token: dls[i].Token},
			DeliverAfterUS: it.DeliverAfter})
		notices[k] = append(notices[k], &peerv1.ItemsReady{Namespace: it.buf.ns, Topic: it.buf.topic, Shard: it.shard,
			MinPriority: it.Priority, Count: 1})
		lastUS = max(lastUS, dls[i].UntilUS)
	}
	for k, us := range groups {
		s.handBack.Go(k.ns, k.shard, us, time.UnixMicro(lastUS), func() {
			for _, n := range notices[k] {
				s.Ready(n) // the buffers may have read past them meanwhile
			}
			s.log.Info("a failed serve was settled: its items are ready again", "shard", k.shard, "items", len(us))
		})
	}
}

// spend settles the serve of items taken from their queues. A version
// served is spent (shardQueue.markServed): buffered copies at it leave the
// queue (a read racing the serve buffered the row again), and reads still
// in flight will not add them back. A copy whose serve ran and failed
// leaves too, but its version is not marked spent, since the serve may
// have failed on a row that did not change (its TTL, say), and a spent
// version is kept out of every read for seconds. An item not served
// leaves a hole: its row, if still ready, sorts somewhere the queue
// cannot tell (changed since the read) or where it was, and the queue's
// reads left it out while it was taken. So the queue is marked dirty and
// read again before the next take serves past that place; without it a
// handed-back or redriven item could be passed over for seconds (the
// model-based test's inversion check).
//
// Each buffer is locked once, and each of its queues scanned once for the
// copies to drop, not once per item (a queue holds up to maxFetch).
func (s *Service) spend(items []bufItem, served func(int) (ran, ok bool)) {
	now := s.cfg.Now()
	type version struct {
		id uint64
		at int64
	}
	ran, ok := make([]bool, len(items)), make([]bool, len(items))
	byBuf := map[*topicBuf][]int{}
	for i := range items {
		ran[i], ok[i] = served(i)
		byBuf[items[i].buf] = append(byBuf[items[i].buf], i)
	}
	for b, idx := range byBuf {
		drop := map[*shardQueue]map[version]bool{}
		b.mu.Lock()
		for _, i := range idx {
			it := &items[i]
			q := b.queue(it.shard)
			delete(q.inflight, it.ID)
			if ran[i] {
				if drop[q] == nil {
					drop[q] = map[version]bool{}
				}
				drop[q][version{it.ID, it.UpdatedAt}] = true
			}
			if ok[i] {
				q.markServed(it.ID, it.UpdatedAt, now)
			} else {
				q.markAllDirty()
				q.notices++ // a read in flight left the row out too
			}
		}
		for q, vs := range drop {
			q.items = slices.DeleteFunc(q.items, func(o bufItem) bool { return vs[version{o.ID, o.UpdatedAt}] })
		}
		b.mu.Unlock()
	}
}

// count records one delivery of it at now (its primary's time).
func (s *Service) count(it *bufItem, now time.Time) {
	m := s.cfg.Metrics
	m.Topic(it.buf.ns, it.buf.topic).Dequeued[metrics.Band(it.Priority)].Inc()
	nm := m.Namespace(it.buf.ns)
	nm.Attempts.Observe(float64(it.Attempts))
	if it.Attempts == 1 {
		nm.EnqueueToDelivery.Observe(max(now.Sub(time.UnixMicro(it.EnqueuedAt)).Seconds(), 0))
	}
}

func (s *Service) leased(topic string, it bufItem) *triagev1.LeasedItem {
	li := &triagev1.LeasedItem{
		Id:             itemid.ID{Shard: it.shard, Key: it.ID}.String(),
		Topic:          topic,
		Priority:       it.Priority,
		Payload:        it.Payload,
		Attempts:       it.Attempts,
		LeaseToken:     store.FormatToken(it.token),
		LeaseExpiresAt: timestamppb.New(time.UnixMicro(it.untilUS)),
		EnqueuedAt:     timestamppb.New(time.UnixMicro(it.EnqueuedAt)),
		DeliverAfter:   timestamppb.New(time.UnixMicro(it.DeliverAfter)),
		LastError:      it.LastError.String,
		Traceparent:    it.Traceparent.String,
	}
	if len(it.Metadata) > 0 {
		_ = json.Unmarshal(it.Metadata, &li.Metadata)
	}
	return li
}

// dropIdle empties the buffers nobody has dequeued from for IdleDrop.
// Their rows were never hidden; this only frees the memory.
func (s *Service) dropIdle(context.Context) {
	cutoff := s.cfg.Now().Add(-s.cfg.IdleDrop)
	s.emptyBuffers(func(b *topicBuf) bool { return b.lastUsed.Before(cutoff) })
}

// emptyBuffers empties the queues of the buffers pick chooses; the next
// take reads them again.
func (s *Service) emptyBuffers(pick func(*topicBuf) bool) {
	s.eachBuf(func(*bufKey) bool { return true }, func(b *topicBuf) {
		if pick(b) {
			for _, q := range b.queues {
				if len(q.items) > 0 {
					q.items = nil
					q.exhausted = false
					q.markAllDirty()
					q.notices++ // a read in flight left the dropped rows out
				}
			}
		}
	})
}

// buffers lists the buffers whose key match accepts, under Service.mu.
func (s *Service) buffers(match func(*bufKey) bool) []*topicBuf {
	s.mu.Lock()
	defer s.mu.Unlock()
	var bufs []*topicBuf
	for k, b := range s.topics {
		if match(&k) {
			bufs = append(bufs, b)
		}
	}
	return bufs
}

// eachBuf calls fn, under the buffer's lock, for each buffer whose key
// match accepts: listed first (buffers), then locked one at a time, so
// Service.mu is not held while a buffer is.
func (s *Service) eachBuf(match func(*bufKey) bool, fn func(*topicBuf)) {
	for _, b := range s.buffers(match) {
		b.mu.Lock()
		fn(b)
		b.mu.Unlock()
	}
}

func (s *Service) handleUnbuffer(m *nats.Msg) {
	var req peerv1.Unbuffer
	resp := &peerv1.UnbufferResponse{}
	if err := proto.Unmarshal(m.Data, &req); err != nil {
		resp.Error = "malformed Unbuffer"
	} else if err := s.Unbuffer(context.Background(), req.Namespace, req.Shard, req.Keys); err != nil {
		resp.Error = err.Error()
	}
	data, _ := proto.Marshal(resp)
	_ = m.Respond(data)
}

// Unbuffer takes keys of a shard out of the namespace's buffers before a
// router updates or deletes them. A stale copy could not be served anyway
// (a serve compares the row's version); dropping it keeps it from holding
// a place in the merge. Keys not buffered are ignored.
func (s *Service) Unbuffer(_ context.Context, ns string, shard uint32, keys []uint64) error {
	want := make(map[uint64]bool, len(keys))
	for _, k := range keys {
		want[k] = true
	}
	s.eachBuf(func(k *bufKey) bool { return k.ns == ns }, func(b *topicBuf) {
		if q := b.queues[shard]; q != nil {
			n := len(q.items)
			q.items = slices.DeleteFunc(q.items, func(it bufItem) bool { return want[it.ID] })
			if len(q.items) < n {
				// The row is ready still, unless the router's change
				// makes it otherwise, and the router announces only some
				// changes (a metadata update of a lapsed lease, none):
				// read again before serving past its place.
				q.markAllDirty()
				q.notices++
			}
		}
	})
	return nil
}

// dropShard forgets the buffered items of a shard this dequeuer lost.
func (s *Service) dropShard(_ context.Context, shard uint32) {
	s.eachBuf(func(*bufKey) bool { return true }, func(b *topicBuf) {
		if q := b.queues[shard]; q != nil {
			q.items = nil
		}
	})
}

// ttlSweepEvery is the TTL sweep's tick, ttlSweepMax the longest a shard
// waits between two sweeps. After a sweep the next is due at the shard's
// earliest TTL (store.ItemNextExpiry), so a thousand idle shards cost a
// few sweeps a second rather than a thousand, and an item still leaves
// within about ttlSweepEvery of its TTL; a shard with new items
// (an ItemsReady notice) is swept at the next tick, as their TTLs may
// come first. An expired item is never served whether or not it was
// swept (the head read and the serve check expires_at); the sweep frees
// its row and starts its dedup key's window.
const (
	ttlSweepEvery = time.Second
	ttlSweepMax   = 30 * time.Second
)

// ttlSweepDue reports whether shard's next TTL sweep is due.
func (s *Service) ttlSweepDue(shard uint32) bool {
	s.ttlMu.Lock()
	defer s.ttlMu.Unlock()
	return !time.Now().Before(s.ttlNext[shard])
}

// ttlSweepSoon makes shard's next TTL sweep due at the next tick.
func (s *Service) ttlSweepSoon(shard uint32) {
	s.ttlMu.Lock()
	delete(s.ttlNext, shard)
	s.ttlMu.Unlock()
}

func (s *Service) sweepTTL(ctx context.Context) {
	m := s.cfg.Maps.Current()
	window := func(ns string) time.Duration {
		if n, err := m.Namespace(ns); err == nil {
			return time.Duration(n.DedupWindow)
		}
		return 0
	}
	for _, id := range s.owner.owned() {
		if !s.ttlSweepDue(id) {
			continue
		}
		db, err := s.cfg.Pool.Writer(s.cfg.Maps, id)
		if err != nil {
			continue
		}
		st := store.New(db)
		now := s.cfg.Clock.Now(ctx, db)
		for {
			n, err := st.ItemSweepExpired(ctx, store.ItemSweepExpiredParams{NowUS: now.UnixMicro(), Limit: 1000, Window: window})
			if err != nil {
				s.log.Warn("ttl sweep failed", "shard", id, "err", err)
			}
			if n < 1000 {
				break
			}
			now = s.cfg.Clock.Now(ctx, db)
		}
		wait := ttlSweepMax
		if next, ok, err := st.ItemNextExpiry(ctx); err != nil || ok {
			// An error: sweep again soon, as when an item expires soon.
			wait = time.Duration(next-now.UnixMicro()) * time.Microsecond
		}
		s.ttlMu.Lock()
		s.ttlNext[id] = time.Now().Add(min(max(wait, 0), ttlSweepMax))
		s.ttlMu.Unlock()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	// Forget topic buffers that are idle and empty, so the map stays small.
	var queues int64
	for k, b := range s.topics {
		b.mu.Lock()
		queues += int64(len(b.queues))
		empty := slices.IndexFunc(mapsValues(b.queues), func(q *shardQueue) bool { return len(q.items) > 0 || q.fetching != nil || q.refilling != nil }) < 0
		idle := s.cfg.Now().Sub(b.lastUsed) > time.Minute && len(b.waiters) == 0
		b.mu.Unlock()
		if empty && idle {
			delete(s.topics, k)
		}
	}
	s.queueTotal.Store(queues)
}

func mapsValues[K comparable, V any](m map[K]V) []V {
	out := make([]V, 0, len(m))
	for _, v := range m {
		out = append(out, v)
	}
	return out
}
