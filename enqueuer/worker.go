package enqueuer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/proto"

	"github.com/triage-queue/triage/proto/triage/peer"
	peerv1 "github.com/triage-queue/triage/proto/triage/peer/v1"
	"github.com/triage-queue/triage/schema"
	"github.com/triage-queue/triage/schema/metrics"
	"github.com/triage-queue/triage/schema/store"
	"github.com/triage-queue/triage/schema/tracing"
	"github.com/triage-queue/triage/shardmap"
)

// Config configures the enqueuer role of one region.
type Config struct {
	// Region whose enqueue stream is drained. Required.
	Region string
	// Maps gives the current shard map. Required.
	Maps shardmap.Source
	// Pool connects to shard primaries. Required.
	Pool *shardmap.Pool
	// NC and JS reach NATS. Required.
	NC *nats.Conn
	JS jetstream.JetStream
	// Stream sizes the enqueue buffer (created if missing).
	Stream StreamConfig
	// MaxBatchMessages is how many buffered batches one transaction takes.
	// Default 512.
	MaxBatchMessages int
	// InFlight is the number of insert transactions in flight per shard.
	// Default 4.
	InFlight int
	// AckWait is how long JetStream waits for an ack before redelivering a
	// batch to another enqueuer. Default 30s.
	AckWait time.Duration
	// Presence, when set, is a KV bucket with a TTL where enqueuers
	// announce their region; a region with no enqueuer left has its
	// buffer drained by the others. Nil: only the region's own shards.
	Presence jetstream.KeyValue
	// BatchRetention is how long a shard remembers an applied batch
	// (enqueue_batches) to recognise a JetStream redelivery of it. It must
	// outlast any redelivery: a message is redelivered AckWait after a lost
	// ack, or when an enqueuer comes back after an outage. Default
	// store.KeyMemory, the time dedup keys are remembered for late
	// envelopes.
	BatchRetention time.Duration
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Metrics records inserts and the buffer's depth and age per shard.
	// Nil: none.
	Metrics *metrics.Set
	// PlaceLeaders moves the Raft leaders of the enqueue stream and of
	// the workers' consumers to this process's NATS server (see Leader
	// placement in leaders.go). Off by default, so that tests of leader
	// elections keep the leaders where they put them; a node turns it on.
	PlaceLeaders bool
	// FastCopies has workers take the fast copies of their shards'
	// envelopes that routers send once the stream acknowledged them (see
	// Fast copies in fast.go). Off by default; a node turns it on, as its
	// routers' FastCopies, when streams are replicated.
	FastCopies bool
	// Tracer traces each insert transaction ("enqueuer.insert"), in the
	// traces of the Enqueue requests whose batches it inserts (carried in
	// the messages' headers; schema/tracing). Nil: no tracing.
	Tracer trace.TracerProvider
}

// pruneEvery is how often a worker prunes its shard's enqueue_batches.
const pruneEvery = time.Minute

// AdoptAfter is how long a region must have shown no enqueuer before
// others drain its buffer.
const AdoptAfter = 3 * time.Second

// handOver is how long a worker goes on after its shard's primary left
// the region (see reconcile). A variable for tests.
var handOver = 10 * time.Second

// Service runs one worker per shard homed in the region.
type Service struct {
	cfg    Config
	tracer trace.Tracer

	mu      sync.Mutex
	workers map[uint32]context.CancelFunc
	leaving map[uint32]time.Time // workers no longer wanted, since (reconcile only)
	absent  map[string]time.Time // regions seen without enqueuers since (reconcile only)
	wg      sync.WaitGroup
	cancel  context.CancelFunc

	// streamMu serialises the moves of the region's stream leader, which
	// every worker of the region may ask for (leaders.go); streamMoved is
	// when it was last moved.
	streamMu    sync.Mutex
	streamMoved time.Time
}

// New validates cfg and returns a stopped service.
func New(cfg Config) (*Service, error) {
	if cfg.Region == "" || cfg.Maps == nil || cfg.Pool == nil || cfg.NC == nil || cfg.JS == nil {
		return nil, errors.New("enqueuer: Region, Maps, Pool, NC and JS are required")
	}
	if cfg.MaxBatchMessages == 0 {
		cfg.MaxBatchMessages = 512
	}
	if cfg.InFlight == 0 {
		cfg.InFlight = 4
	}
	if cfg.AckWait == 0 {
		cfg.AckWait = 30 * time.Second
	}
	if cfg.BatchRetention == 0 {
		cfg.BatchRetention = store.KeyMemory
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	cfg.Logger = cfg.Logger.With("role", "enqueuer", "region", cfg.Region)
	return &Service{cfg: cfg, tracer: tracing.Tracer(cfg.Tracer), workers: map[uint32]context.CancelFunc{},
		leaving: map[uint32]time.Time{}, absent: map[string]time.Time{}}, nil
}

// reconcileEvery paces the workers' reconciliation with the shard map
// between map changes (a var for tests).
var reconcileEvery = time.Second

// Start creates the stream and starts the workers. They follow the shard
// map: a shard added to the region gets a worker within a second, and at
// once on a map change.
func (s *Service) Start(ctx context.Context) error {
	if _, err := EnsureStream(ctx, s.cfg.JS, s.cfg.Region, s.cfg.Stream); err != nil {
		return err
	}
	ctx, s.cancel = context.WithCancel(ctx)
	// The change channel is taken before each reconcile reads the map, so
	// a map that lands during one wakes the next at once rather than at
	// the next tick (a failover's new primary region then waited up to a
	// second for its worker).
	changed := mapChanged(s.cfg.Maps)
	s.reconcile(ctx)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		t := time.NewTicker(reconcileEvery)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			case <-changed:
			}
			changed = mapChanged(s.cfg.Maps)
			s.reconcile(ctx)
		}
	}()
	return nil
}

// Stop stops pulling, lets in-flight transactions finish, naks what was
// pulled but not inserted (so another enqueuer takes it at once) and waits.
func (s *Service) Stop() {
	if s.cancel != nil {
		s.cancel()
	}
	s.wg.Wait()
}

func (s *Service) reconcile(ctx context.Context) {
	m := s.cfg.Maps.Current()
	adopt := func(string) bool { return false }
	if s.cfg.Presence != nil {
		// Announce this region's enqueuers; drain the buffers of regions
		// that have none left (region down), so their items still reach
		// their shards' primaries. The home region's enqueuers take over
		// again once they are back.
		_, _ = s.cfg.Presence.Put(ctx, peer.PresenceKey("enqueuers", s.cfg.Region), []byte("1"))
		adopt = func(region string) bool {
			_, err := s.cfg.Presence.Get(ctx, peer.PresenceKey("enqueuers", region))
			if !errors.Is(err, jetstream.ErrKeyNotFound) {
				delete(s.absent, region)
				return false
			}
			// Absent for a while, not just starting up.
			if s.absent[region].IsZero() {
				s.absent[region] = time.Now()
			}
			return time.Since(s.absent[region]) >= AdoptAfter
		}
	}
	want := drains(m, s.cfg.Region, adopt)
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	for id, cancel := range s.workers {
		if _, ok := want[id]; ok {
			delete(s.leaving, id)
			continue
		}
		// Handed over: the shard's primary moved to another region. The
		// worker goes on handOver longer: it holds the batches pulled
		// while the shard was fenced, and inserts them into the new
		// primary the moment the map names it, while the new region's
		// worker is still making its consumer across the WAN.
		if since, ok := s.leaving[id]; !ok {
			s.leaving[id] = now
			continue
		} else if now.Sub(since) < handOver {
			continue
		}
		cancel()
		delete(s.workers, id)
		delete(s.leaving, id)
	}
	for id, home := range want {
		if _, ok := s.workers[id]; ok {
			continue
		}
		if home != s.cfg.Region {
			s.cfg.Logger.Info("draining the enqueue buffer of a shard homed in another region (its primary runs here, "+
				"or its region has no enqueuers)", "shard", id, "home", home)
		}
		wctx, cancel := context.WithCancel(ctx)
		s.workers[id] = cancel
		w := &worker{svc: s, shard: id, home: home, log: s.cfg.Logger.With("shard", id)}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			w.run(wctx)
		}()
	}
}

type worker struct {
	svc   *Service
	shard uint32
	home  string // the shard's home region: whose stream it drains
	log   *slog.Logger
	fast  *fastState // nil without Config.FastCopies
}

func (w *worker) run(ctx context.Context) {
	cfg := w.svc.cfg
	go w.prune(ctx)
	go w.measure(ctx)
	if cfg.PlaceLeaders {
		go w.keepLeadersNear(ctx)
	}
	msgs := make(chan jetstream.Msg, cfg.MaxBatchMessages)
	if cfg.FastCopies {
		w.fast = &fastState{inflight: map[uint64]bool{}, done: map[uint64]time.Time{}}
		go w.listenFast(ctx, msgs)
	}
	// Several transactions in flight per shard: while one waits for its
	// fsync the next one is being built, and InnoDB's group commit folds
	// their fsyncs together.
	var wg sync.WaitGroup
	g := newGate()
	for i := 0; i < cfg.InFlight; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w.insertLoop(ctx, msgs, g)
		}()
	}
	quietUntil := time.Now().Add(pullQuiet)
	for pulled := false; ctx.Err() == nil; {
		consumed, err := w.pull(ctx, msgs)
		if ctx.Err() != nil {
			break
		}
		pulled = pulled || consumed
		if !pulled && time.Now().Before(quietUntil) {
			// Starting: the stream or the cluster's JetStream is not
			// there yet (a bed's or a cluster's first seconds).
			w.log.Info("enqueue buffer not reachable yet; pulling again", "err", err)
		} else {
			w.log.Warn("enqueue buffer pull lost; pulling again", "err", err)
		}
		schema.Sleep(ctx, pullRetry)
	}
	wg.Wait()
	// Hand back what was pulled but not inserted.
	for {
		select {
		case m := <-msgs:
			_ = m.Nak()
		default:
			return
		}
	}
}

// pullRetry is the pause before a lost pull is made again.
const pullRetry = 250 * time.Millisecond

// pullQuiet is how long a starting worker whose first pull cannot be
// made yet says so at Info, not Warn: at every start of a clustered bed
// JetStream answered the first consumer creates "no responders" while it
// elected its leaders, a warning that meant nothing and taught operators
// to read past the ones that do. A pull lost after one ran, or failing
// for longer, is a warning.
const pullQuiet = 10 * time.Second

// pull feeds the shard's buffered batches into msgs until ctx ends (nil)
// or the pull is lost (the error why). consumed says whether the pull
// ran at all.
func (w *worker) pull(ctx context.Context, msgs chan<- jetstream.Msg) (consumed bool, err error) {
	cons, err := w.consumer(ctx)
	if err != nil {
		return false, err
	}
	lost := make(chan error, 1)
	cc, err := cons.Consume(func(m jetstream.Msg) {
		if ctx.Err() != nil {
			_ = m.Nak() // stopping (and the channel may have room): hand it back
			return
		}
		select {
		case msgs <- m:
		case <-ctx.Done():
			_ = m.Nak()
		}
	}, jetstream.PullMaxMessages(w.svc.cfg.MaxBatchMessages), jetstream.PullExpiry(pullExpiry),
		jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
			if pullLost(err) {
				select {
				case lost <- err:
				default:
				}
			}
		}))
	if err != nil {
		return false, fmt.Errorf("consume: %w", err)
	}
	// Drain, not Stop: the client library may hold batches it received
	// but has not passed to the callback yet, and Stop drops them, so
	// they came back only when their ack wait ran out (30 s). Drained,
	// each goes through the callback: to the insert loops, or handed
	// back when stopping. run hands back what the channel still holds
	// only after this returns.
	defer func() {
		cc.Drain()
		select {
		case <-cc.Closed():
		case <-time.After(drainWait): // the insert loops are held (a failing shard): go on
		}
	}()
	select {
	case <-ctx.Done():
		return true, nil
	case err := <-lost:
		return true, err
	}
}

// drainWait bounds how long a lost or stopped pull waits for the
// batches the client library still held to go through the callback.
const drainWait = 2 * time.Second

// pullExpiry is how long one pull request of a worker lives. The client
// library pulls again when it expires, and when two heartbeats (half the
// expiry each) go missing, which is how it notices a pull request lost
// with a consumer leader's server; the default 30 s would leave a shard's
// buffer undrained for up to a minute.
const pullExpiry = 5 * time.Second

// pullLost tells the errors after which the client library sends no new
// pull request of its own: the consumer is gone, its leader's server
// shut down, or the pull found no consumer leader to take it (a
// replicated consumer between leaders).
func pullLost(err error) bool {
	return errors.Is(err, jetstream.ErrConsumerDeleted) || errors.Is(err, jetstream.ErrServerShutdown) ||
		errors.Is(err, jetstream.ErrBadRequest) || errors.Is(err, nats.ErrNoResponders)
}

// consumer makes (or finds) the shard's durable consumer and waits, up
// to leaderWait, for it to have a leader: a pull sent before then reaches
// no one.
func (w *worker) consumer(ctx context.Context) (jetstream.Consumer, error) {
	cfg := w.svc.cfg
	cons, err := cfg.JS.CreateOrUpdateConsumer(ctx, peer.EnqueueStream(w.home), jetstream.ConsumerConfig{
		Durable:       w.durable(),
		FilterSubject: peer.EnqueueSubject(w.home, w.shard),
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       cfg.AckWait,
		MaxAckPending: 20000,
		MaxDeliver:    -1,
	})
	if err != nil {
		return nil, fmt.Errorf("consumer: %w", err)
	}
	hasLeader := func(info *jetstream.ConsumerInfo) bool { return info.Cluster == nil || info.Cluster.Leader != "" }
	if info := cons.CachedInfo(); info != nil && hasLeader(info) {
		return cons, nil // the create's own answer says so: no second round trip
	}
	deadline := time.Now().Add(leaderWait)
	for {
		ictx, cancel := context.WithTimeout(ctx, time.Second)
		info, err := cons.Info(ictx)
		cancel()
		if err == nil && hasLeader(info) {
			return cons, nil
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			return cons, nil // pull anyway; the heartbeats catch a lost pull
		}
		schema.Sleep(ctx, 100*time.Millisecond)
	}
}

// durable names the shard's consumer.
// retryWindow is a namespace's dedup retry window in the current map; a
// namespace the map no longer has gets the default.
func (w *worker) retryWindow(namespace string) time.Duration {
	ns, err := w.svc.cfg.Maps.Current().Namespace(namespace)
	if err != nil {
		return shardmap.DefaultDedupRetryWindow
	}
	return ns.RetryWindow()
}

func (w *worker) durable() string { return fmt.Sprintf("enq-%d", w.shard) }

// consumerInfo reads a consumer's state.
func consumerInfo(ctx context.Context, js jetstream.JetStream, stream, durable string) (*jetstream.ConsumerInfo, error) {
	c, err := js.Consumer(ctx, stream, durable) // reads its info
	if err != nil {
		return nil, err
	}
	return c.CachedInfo(), nil
}

// leaderWait bounds how long consumer waits for a leader.
const leaderWait = 10 * time.Second

// prune deletes the shard's applied-batch records older than
// BatchRetention, in bounded statements, every pruneEvery.
func (w *worker) prune(ctx context.Context) {
	cfg := w.svc.cfg
	for {
		if db, err := cfg.Pool.Writer(cfg.Maps, w.shard); err == nil {
			before := time.Now().Add(-cfg.BatchRetention).UnixMicro()
			if _, err := store.New(db).EnqueueBatchPrune(ctx, store.EnqueueBatchPruneParams{BeforeUS: before, Limit: 1000}); err != nil && ctx.Err() == nil {
				w.log.Warn("pruning enqueue_batches failed; retrying later", "err", err)
			}
		}
		schema.Sleep(ctx, pruneEvery)
		if ctx.Err() != nil {
			return
		}
	}
}

// retryCap bounds the backoff of a failing shard's inserts. It is what a
// failover adds to the enqueue RTO after the new primary is published
// (the batches come back after the delay they were nacked with), so it is
// short: a retry against a shard that is still fenced is refused by the
// local map without touching MySQL, and costs nothing.
//
// Variables (with retryFloor, the first backoff) only so a test can make
// them long enough to tell a wake-up by a new map from the backoff
// running out.
var retryCap, retryFloor = 250 * time.Millisecond, 50 * time.Millisecond

// insertLoop takes the batches g gathers (up to MaxBatchMessages; see
// Gathering) and inserts them in one transaction.
func (w *worker) insertLoop(ctx context.Context, msgs <-chan jetstream.Msg, g *gate) {
	cfg := w.svc.cfg
	backoff := time.Duration(0)
	batch := make([]jetstream.Msg, 0, cfg.MaxBatchMessages)
	for {
		var ok bool
		batch, ok = g.gather(ctx, msgs, batch[:0], cfg.MaxBatchMessages)
		if !ok {
			for _, m := range batch {
				_ = m.Nak() // stopping: hand them back at once
			}
			return
		}
		inserted := w.insertRetrying(ctx, batch, &backoff)
		g.done()
		if !inserted {
			return
		}
	}
}

// insertRetrying inserts batch, trying again while the shard fails (see
// below); false when ctx ended first, with the batches handed back.
func (w *worker) insertRetrying(ctx context.Context, batch []jetstream.Msg, backoff *time.Duration) bool {
	for {
		changed := mapChanged(w.svc.cfg.Maps) // before the try, so no new map is missed
		err := w.process(ctx, batch)
		if err == nil {
			*backoff = 0
			return true
		}
		// Circuit breaker: the shard is failing; hold the batches (they
		// stay unacknowledged in the buffer) and try again after the
		// backoff, or at once when a new shard map arrives: that is
		// what a failover's publication looks like from here, and
		// the batches then go to the new primary without waiting out
		// a backoff (or a redelivery delay, had they been nacked).
		*backoff = min(max(2**backoff, retryFloor), retryCap)
		w.log.Warn("insert failed; batches stay buffered", "err", err, "batches", len(batch), "retry_in", *backoff)
		for _, m := range batch {
			_ = m.InProgress() // held, not lost: reset the ack wait
		}
		if !waitRetry(ctx, *backoff, changed) {
			for _, m := range batch {
				_ = m.Nak() // stopping: hand them back at once
			}
			return false
		}
	}
}

// mapChanged returns a channel closed when src installs a newer map, or
// nil (never ready) when src cannot tell.
func mapChanged(src shardmap.Source) <-chan struct{} {
	if c, ok := src.(interface{ Changed() <-chan struct{} }); ok {
		return c.Changed()
	}
	return nil
}

// waitRetry waits d, or until changed is closed; false when ctx ended.
func waitRetry(ctx context.Context, d time.Duration, changed <-chan struct{}) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
	case <-changed:
	}
	return true
}

// process inserts the batches of a pull's messages into the shard, in
// one transaction traced as "enqueuer.insert".
func (w *worker) process(ctx context.Context, msgs []jetstream.Msg) (err error) {
	u := w.unpack(msgs)
	if w.fast != nil {
		defer func() {
			now := time.Now()
			w.fast.settle(u.fastIDs, err == nil, now)
			w.fast.settle(u.streamIDs, false, now)
		}()
	}
	if len(u.batches) == 0 {
		return nil
	}
	items := 0
	for _, b := range u.batches {
		items += len(b.Items)
	}
	ctx, end := tracing.StartLinked(ctx, w.svc.tracer, "enqueuer.insert", u.parents, trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(attribute.Int64("triage.shard", int64(w.shard)), attribute.Int("triage.batches", len(u.batches)),
			attribute.Int("triage.items", items), attribute.Int("triage.messages", len(u.kept)), attribute.String("db.system", "mysql")))
	defer func() { end(err) }()
	return w.insert(ctx, u.batches, tracing.Formats(u.parents), u.kept, items)
}

// unpacked is what process inserts of the messages it was given: their
// batches, with each batch's trace parent, and the messages they came in
// (kept), to ack once the batches are committed. fastIDs and streamIDs
// are the batch ids in flight here, of fast copies and of the stream's:
// a fast copy's are recorded as inserted when the insert succeeds, for
// its stream copy to find; the stream's copy is the last, so only its
// flight ends.
type unpacked struct {
	batches            []*peerv1.EnqueueBatch
	parents            []trace.SpanContext
	kept               []jetstream.Msg
	fastIDs, streamIDs []uint64
}

// unpack decodes msgs and keeps those to insert: a malformed message is
// terminated, and of a batch's fast copy and its stream copy only the
// first to arrive is inserted (see Config.FastCopies).
func (w *worker) unpack(msgs []jetstream.Msg) *unpacked {
	u := &unpacked{kept: msgs[:0:0]}
	for _, m := range msgs {
		env := &peerv1.EnqueueEnvelope{}
		err := proto.Unmarshal(m.Data(), env)
		if err == nil {
			err = w.check(env)
		}
		if err != nil {
			// Nothing can ever insert it; keep it out of the way.
			w.log.Error("terminating malformed enqueue message", "err", err)
			_ = m.Term()
			continue
		}
		if w.fast != nil && !w.firstCopy(u, m, env) {
			continue
		}
		u.batches = append(u.batches, env.Batches...)
		u.parents = append(u.parents, tracing.Extract(m.Headers(), len(env.Batches))...)
		u.kept = append(u.kept, m)
	}
	return u
}

// firstCopy reports whether m is the first copy of its batches to be
// inserted, and counts them in flight; a stream copy whose fast copy was
// inserted is acked, and one whose fast copy is in flight comes back
// later.
func (w *worker) firstCopy(u *unpacked, m jetstream.Msg, env *peerv1.EnqueueEnvelope) bool {
	ids := make([]uint64, len(env.Batches))
	for i, b := range env.Batches {
		ids[i] = b.BatchId
	}
	if _, isFast := m.(*fastMsg); isFast {
		if !w.fast.claim(ids) {
			return false // the stream's copy is ahead of it
		}
		u.fastIDs = append(u.fastIDs, ids...)
		return true
	}
	switch w.fast.seen(ids) {
	case copyInserted:
		_ = m.Ack()
		return false
	case copyInFlight:
		_ = m.NakWithDelay(fastNakDelay)
		return false
	}
	u.streamIDs = append(u.streamIDs, ids...)
	return true
}

// insert inserts batches, of items items, into the shard in one
// transaction and acks the messages they came in (kept); permanent
// failures are isolated batch by batch (isolate).
func (w *worker) insert(ctx context.Context, batches []*peerv1.EnqueueBatch, traceparents []string, kept []jetstream.Msg, items int) error {
	cfg := w.svc.cfg
	db, err := cfg.Pool.Writer(cfg.Maps, w.shard)
	if err != nil {
		return err
	}
	start := time.Now()
	results, err := store.New(db).ItemInsertBatch(ctx, store.ItemInsertBatchParams{Batches: batches, NowUS: start.UnixMicro(),
		RetryWindow: w.retryWindow, Traceparents: traceparents})
	if store.IsPermanent(err) {
		return w.isolate(ctx, kept)
	}
	if err != nil {
		return err
	}
	if err := cfg.Maps.Writable(w.shard); err != nil {
		// The commit may have landed on a primary that was deposed while
		// we waited: do not ack; the batch is redelivered and inserted on
		// the new primary (idempotently, should it have replicated).
		return err
	}
	for _, m := range kept {
		_ = m.Ack()
	}
	took := time.Since(start)
	if took >= slowInsert {
		// A commit this slow is most often the semi-sync wait for a
		// replica's acknowledgement; the callers of these batches are
		// answered "not confirmed in time" past their deadline.
		w.log.Warn("slow insert", "took", took.Round(time.Millisecond), "batches", len(batches), "items", items)
	}
	sm := cfg.Metrics.Shard(w.shard)
	sm.InsertSeconds.Observe(took.Seconds())
	sm.Inserted.Add(float64(items))
	w.announce(batches, results)
	return nil
}

// staleBuffer is the age of the buffer's oldest unacknowledged batch
// from which measure logs it, at most once per staleBuffer.
const staleBuffer = 5 * time.Second

// slowInsert is the insert time from which an insert is logged.
const slowInsert = 2 * time.Second

// measureEvery is how often a worker reads its buffer's depth and age.
const measureEvery = 2 * time.Second

// measure keeps the shard's buffer gauges: envelopes pending or
// unacknowledged on the consumer, and the age of the oldest
// unacknowledged one (the first message of the shard's subject after the
// ack floor, a direct read of one message).
func (w *worker) measure(ctx context.Context) {
	sm := w.svc.cfg.Metrics.Shard(w.shard)
	stream, durable := peer.EnqueueStream(w.home), w.durable()
	var warned time.Time
	t := time.NewTimer(w.svc.measurePeriod())
	defer t.Stop()
	for {
		ictx, cancel := context.WithTimeout(ctx, time.Second)
		if info, err := consumerInfo(ictx, w.svc.cfg.JS, stream, durable); err == nil {
			pending := info.NumPending + uint64(info.NumAckPending)
			sm.BufferMessages.Set(float64(pending))
			age := 0.0
			if pending > 0 {
				if st, err := w.svc.cfg.JS.Stream(ictx, info.Stream); err == nil {
					if msg, err := st.GetMsg(ictx, info.AckFloor.Stream+1, jetstream.WithGetMsgSubject(info.Config.FilterSubject)); err == nil {
						age = max(time.Since(msg.Time).Seconds(), 0)
					}
				}
			}
			sm.BufferAge.Set(age)
			if age >= staleBuffer.Seconds() && time.Since(warned) >= staleBuffer {
				// Batches wait in the buffer with nothing inserted (a slow
				// insert says so on its own): the answer to "was the
				// enqueue lost or its confirmation", when a caller got
				// "not confirmed in time".
				warned = time.Now()
				w.log.Warn("enqueue buffer not drained", "oldest_age", time.Duration(age*float64(time.Second)).Round(time.Millisecond),
					"pending", info.NumPending, "ack_pending", info.NumAckPending, "delivered", info.Delivered.Stream, "ack_floor", info.AckFloor.Stream)
			}
		}
		cancel()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			t.Reset(w.svc.measurePeriod())
		}
	}
}

// measurePeriod is how often each worker reads its consumer's state:
// measureEvery, or longer with many workers, so that the region's
// enqueuer asks JetStream at most measureRate times a second in all (at a
// thousand shards, a consumer info every 2 s per shard was a quarter of an
// idle enqueuer's CPU and as much of the NATS server's). The buffer
// gauges and the not-drained warning follow a stuck shard that much later.
func (s *Service) measurePeriod() time.Duration {
	s.mu.Lock()
	n := len(s.workers)
	s.mu.Unlock()
	return max(measureEvery, time.Duration(n)*time.Second/measureRate)
}

// measureRate bounds the region's consumer reads a second (measurePeriod).
const measureRate = 25

// announce tells dequeuers about committed BUFFERED batches and answers
// the routers waiting on COMMITTED ones.
func (w *worker) announce(batches []*peerv1.EnqueueBatch, results []*peerv1.EnqueueCommitted) {
	cfg := w.svc.cfg
	// Announce BUFFERED batches' items to dequeuers. A router waiting on a
	// COMMITTED batch announces it itself, before it answers its client,
	// on the connection its next dequeue goes out on (see routing).
	// A batch whose rows travel with its notice (peer.CommittedReady)
	// goes alone; the others of a topic share one notice.
	type topicKey struct{ ns, topic string }
	ready := map[topicKey]*peerv1.ItemsReady{}
	var handed []*peerv1.ItemsReady
	for i, b := range batches {
		if b.ReplySubject != "" {
			continue
		}
		n := peer.CommittedReady(b, results[i])
		if peer.Handed(n) {
			handed = append(handed, n)
			continue
		}
		k := topicKey{b.Namespace, b.Topic}
		if r := ready[k]; r != nil {
			peer.MergeReady(r, n)
		} else {
			ready[k] = n
		}
	}
	for _, r := range append(handed, slices.Collect(maps.Values(ready))...) {
		if data, err := proto.Marshal(r); err == nil {
			_ = cfg.NC.Publish(peer.ReadySubject(r.Namespace), data)
		}
	}
	for i, b := range batches {
		if b.ReplySubject != "" {
			if data, err := proto.Marshal(results[i]); err == nil {
				_ = cfg.NC.Publish(b.ReplySubject, data)
			}
		}
	}
}

// isolate handles a group the database refused for its data: it places
// each batch of each message alone (store.ItemInsertBatch with Isolate), which inserts what
// the shard takes and moves each refused item to the dead letters with the
// database's reason. Nothing acknowledged is dropped (a BUFFERED batch was
// acknowledged when JetStream stored it), and one bad item holds back
// nothing else. A router waiting on a COMMITTED batch hears which items
// were refused.
func (w *worker) isolate(ctx context.Context, msgs []jetstream.Msg) error {
	cfg := w.svc.cfg
	db, err := cfg.Pool.Writer(cfg.Maps, w.shard)
	if err != nil {
		return err
	}
	var good []*peerv1.EnqueueBatch
	var results []*peerv1.EnqueueCommitted
	var done []jetstream.Msg
	for _, m := range msgs {
		env := &peerv1.EnqueueEnvelope{}
		if err := proto.Unmarshal(m.Data(), env); err != nil {
			_ = m.Term() // process checked it; cannot happen
			continue
		}
		parents := tracing.Formats(tracing.Extract(m.Headers(), len(env.Batches)))
		for i, b := range env.Batches {
			out, err := store.New(db).ItemInsertBatch(ctx, store.ItemInsertBatchParams{Batches: []*peerv1.EnqueueBatch{b},
				NowUS: time.Now().UnixMicro(), Isolate: true, RetryWindow: w.retryWindow, Traceparents: parents[i : i+1]})
			if err != nil {
				return err // transient: everything is retried; placing is idempotent
			}
			res := out[0]
			if res.Error != "" {
				w.log.Error("the shard refused enqueued items; they are in the dead letters", "batch", b.BatchId, "topic", b.Topic, "err", res.Error)
			}
			good = append(good, b)
			results = append(results, res)
		}
		done = append(done, m)
	}
	if err := cfg.Maps.Writable(w.shard); err != nil {
		return err // as in process: redelivered, placed again idempotently
	}
	for _, m := range done {
		_ = m.Ack()
	}
	w.announce(good, results)
	return nil
}

// check rejects an envelope no insert can ever succeed with.
func (w *worker) check(env *peerv1.EnqueueEnvelope) error {
	if len(env.Batches) == 0 {
		return errors.New("empty envelope")
	}
	for _, b := range env.Batches {
		if b.Shard != w.shard {
			return fmt.Errorf("batch for shard %d on shard %d's subject", b.Shard, w.shard)
		}
		if len(b.Items) == 0 {
			return errors.New("batch without items")
		}
	}
	return nil
}

// drains returns the shards whose enqueue buffers region's enqueuers
// drain, each with its home region (whose stream holds the buffer): the
// shards whose primary runs in region (Map.ServedIn), so that each
// insert's round trips stay within it after a failover moved a primary,
// and those served in a region adopt says has no enqueuers left.
func drains(m *shardmap.Map, region string, adopt func(region string) bool) map[uint32]string {
	want := map[uint32]string{}
	add := func(ids []uint32) {
		for _, id := range ids {
			sh, _ := m.Shard(id)
			want[id] = sh.HomeRegion
		}
	}
	add(m.ServedIn(region))
	for _, r := range m.Regions {
		if r != region && adopt(r) {
			add(m.ServedIn(r))
		}
	}
	return want
}
