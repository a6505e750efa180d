package client

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/types/known/durationpb"

	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
)

// WorkerConfig configures a Worker. Zero values take the defaults given.
type WorkerConfig struct {
	// Namespace to work. Required.
	Namespace string
	// Region whose shards are read. Default: the client's (WithRegion),
	// else the router's own.
	Region string
	// Lease asked for on every dequeue and extension. Default 30s. The
	// worker extends a held item's lease every Lease/3, so a handler may
	// run far longer than Lease (up to its topic's TopicOptions.Timeout)
	// while a crashed worker's items come back within Lease. The worker
	// asks for it explicitly rather than trusting each item's own lease
	// so the heartbeat needs no clock shared with the server.
	Lease time.Duration
	// Wait is the long poll of each dequeue. Default 5s.
	Wait time.Duration
	// MaxBatch is the most acks (or nacks) sent in one call. Default 100.
	MaxBatch int
	// ShutdownTimeout bounds Run's graceful stop. Default 30s.
	ShutdownTimeout time.Duration
	// Logger receives the worker's own failures (dequeue errors, refused
	// acks, lost leases). Default slog.Default().
	Logger *slog.Logger
	// TracerProvider starts each handler's span, "process TOPIC", linked
	// to the span that enqueued the item (Item.Traceparent), as
	// OpenTelemetry's messaging conventions have it; the handler's context
	// carries it. Default otel.GetTracerProvider(), a no-op until the
	// program installs one.
	TracerProvider trace.TracerProvider
}

func (c WorkerConfig) withDefaults() WorkerConfig {
	if c.Lease <= 0 {
		c.Lease = 30 * time.Second
	}
	if c.Wait <= 0 {
		c.Wait = 5 * time.Second
	}
	if c.MaxBatch <= 0 {
		c.MaxBatch = 100
	}
	if c.ShutdownTimeout <= 0 {
		c.ShutdownTimeout = 30 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.TracerProvider == nil {
		c.TracerProvider = otel.GetTracerProvider()
	}
	return c
}

// Worker leases items of the topics it has handlers for and runs them:
// see the package documentation. Handle and Use before Start.
type Worker struct {
	c      *Client
	cfg    WorkerConfig
	log    *slog.Logger
	tracer trace.Tracer

	topics map[string]*topic
	mws    []Middleware

	// mu guards held counts, started and the deliveries map.
	mu        sync.Mutex
	started   bool
	stopped   bool
	inflight  map[*delivery]struct{} // dequeued and not yet settled
	slotFree  chan struct{}          // a topic has room again (cap 1)
	fetchStop context.CancelFunc
	fetchDone chan struct{}
	stopping  chan struct{}           // runners take no new items
	hardStop  context.CancelCauseFunc // cancels handler contexts
	keepStop  context.CancelFunc      // stops lease extension
	handlerBG context.Context         // parent of handler contexts
	keepBG    context.Context         // parent of extension calls
	runners   sync.WaitGroup          // topic runners
	settlers  sync.WaitGroup          // ack and nack senders
	flush     chan struct{}           // runners are done: send what is left and exit
	acks      chan *delivery          // to settle
	nacks     chan nackReq            //
	settleCtx context.Context         // for ack and nack calls
	settleEnd context.CancelFunc      //
	gone      chan struct{}           // settlers exited: late results are dropped
	goneN     atomic.Int32            // settlers exited so far

	// carryMu guards carried, waiting and fetchGone: acks that the next
	// Dequeue carries (see carry).
	carryMu   sync.Mutex
	carried   []*delivery
	waiting   bool // the fetch loop is in a long poll or a retry's backoff
	fetchGone bool // the fetch loop has exited
}

type topic struct {
	name    string
	handler Handler
	cfg     TopicOptions // with defaults applied
	queue   chan *delivery
	held    int // guarded by Worker.mu
}

// delivery is one leased item inside the worker.
type delivery struct {
	item  *Item
	t     *topic
	done  chan struct{} // closed when the item is settled or handed back: stops its lease keeper
	lost  chan struct{} // closed when the lease is lost
	once  sync.Once
	mu    sync.Mutex
	abort context.CancelCauseFunc // the running handler's, once started
}

type nackReq struct {
	d *delivery
	n *triagev1.NackItem
}

// NewWorker makes a worker on c. c must stay open until the worker stops.
func NewWorker(c *Client, cfg WorkerConfig) (*Worker, error) {
	if cfg.Namespace == "" {
		return nil, fmt.Errorf("%w: worker namespace is required", ErrInvalid)
	}
	cfg = cfg.withDefaults()
	return &Worker{c: c, cfg: cfg, log: cfg.Logger.With("namespace", cfg.Namespace), topics: map[string]*topic{},
		tracer: cfg.TracerProvider.Tracer("github.com/triage-queue/triage/client")}, nil
}

// Handle registers h for topic with its options (TopicOptions{} for the
// defaults: one handler at a time, a one-minute timeout). Registering a
// topic twice replaces its handler. It panics after Start: the set of
// topics is what the worker dequeues.
func (w *Worker) Handle(topicName string, h Handler, opts TopicOptions) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.started {
		panic("client: Worker.Handle after Start")
	}
	w.topics[topicName] = &topic{name: topicName, handler: h, cfg: opts.withDefaults()}
}

// Use adds middleware around every handler; the first is outermost.
func (w *Worker) Use(mw ...Middleware) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.started {
		panic("client: Worker.Use after Start")
	}
	w.mws = append(w.mws, mw...)
}

// Start begins dequeuing and handling. ctx bounds nothing but Start
// itself: stop the worker with Stop (or use Run).
func (w *Worker) Start(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.started {
		return errors.New("client: worker already started")
	}
	if len(w.topics) == 0 {
		return fmt.Errorf("%w: worker has no handlers; call Handle first", ErrInvalid)
	}
	w.started = true
	capacity := 0
	for _, t := range w.topics {
		h := recoverHandler(t.handler)
		for i := len(w.mws) - 1; i >= 0; i-- {
			h = w.mws[i](h)
		}
		t.handler = h
		t.queue = make(chan *delivery, t.cfg.Concurrency+t.cfg.Prefetch)
		capacity += t.cfg.Concurrency + t.cfg.Prefetch
	}
	w.inflight = map[*delivery]struct{}{}
	w.slotFree = make(chan struct{}, 1)
	w.stopping = make(chan struct{})
	w.flush = make(chan struct{})
	w.gone = make(chan struct{})
	w.fetchDone = make(chan struct{})
	w.acks = make(chan *delivery, capacity)
	w.nacks = make(chan nackReq, capacity)
	bg := context.WithoutCancel(ctx)
	var fetchCtx context.Context
	fetchCtx, w.fetchStop = context.WithCancel(bg)
	w.handlerBG, w.hardStop = context.WithCancelCause(bg)
	w.keepBG, w.keepStop = context.WithCancel(bg)
	w.settleCtx, w.settleEnd = context.WithCancel(bg)

	w.settlers.Add(2)
	go w.settleAcks()
	go w.settleNacks()
	for _, t := range w.topics {
		for range t.cfg.Concurrency {
			w.runners.Add(1)
			go w.run(t)
		}
	}
	go w.fetch(fetchCtx)
	return nil
}

// Run starts the worker, works until ctx is done, then stops it
// gracefully within ShutdownTimeout. It returns Stop's error.
func (w *Worker) Run(ctx context.Context) error {
	if err := w.Start(ctx); err != nil {
		return err
	}
	<-ctx.Done()
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), w.cfg.ShutdownTimeout)
	defer cancel()
	return w.Stop(sctx)
}

// Stop shuts the worker down: it stops dequeuing, hands back prefetched
// items that no handler started (ready again at once, no attempt
// counted), lets running handlers finish until ctx is done and sends
// their acks and nacks. If ctx ends first, the handlers' contexts are
// cancelled with ErrWorkerStopped and Stop returns ctx's error without
// waiting for handlers that ignore it; their leases are no longer
// extended, so their items come back when the lease lapses. Handlers
// abandoned at their topic's timeout are not waited for: their items are
// nacked already.
func (w *Worker) Stop(ctx context.Context) error {
	w.mu.Lock()
	if !w.started || w.stopped {
		w.mu.Unlock()
		return errors.New("client: worker not running")
	}
	w.stopped = true
	w.mu.Unlock()

	w.fetchStop()
	<-w.fetchDone
	close(w.stopping)
	for _, t := range w.topics {
		w.drain(t)
	}
	runnersDone := make(chan struct{})
	go func() { w.runners.Wait(); close(runnersDone) }()
	var err error
	select {
	case <-runnersDone:
	case <-ctx.Done():
		err = ctx.Err()
		w.hardStop(ErrWorkerStopped)
		// Handlers that honour their context return promptly; their
		// results still count. The others are abandoned.
		select {
		case <-runnersDone:
		case <-time.After(time.Second):
		}
	}
	// A runner may have picked an item while stopping was being closed.
	for _, t := range w.topics {
		w.drain(t)
	}
	w.keepStop()
	close(w.flush)
	settled := make(chan struct{})
	go func() { w.settlers.Wait(); close(settled) }()
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	select {
	case <-settled:
	case <-fctx.Done():
		w.settleEnd()
		<-settled
		err = cmpErr(err, fmt.Errorf("client: acks and nacks not all sent before shutdown: %w", fctx.Err()))
	}
	w.settleEnd()
	w.hardStop(ErrWorkerStopped)
	return err
}

func cmpErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// drain hands back every item waiting in t's queue.
func (w *Worker) drain(t *topic) {
	for {
		select {
		case d := <-t.queue:
			w.release(d)
		default:
			return
		}
	}
}

// release hands an unstarted item back: ready at once, attempt not
// counted, so another consumer gets it without waiting for the lease.
func (w *Worker) release(d *delivery) {
	w.settle(d, nil, &triagev1.NackItem{Id: d.item.ID, LeaseToken: d.item.token, Release: true, Delay: durationpb.New(0)})
}

// wants lists the topics with room and how many items each can take.
func (w *Worker) wants() []*triagev1.TopicCount {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []*triagev1.TopicCount
	for _, t := range w.topics {
		if free := t.cfg.Concurrency + t.cfg.Prefetch - t.held; free > 0 {
			out = append(out, &triagev1.TopicCount{Topic: t.name, Count: int32(free)})
		}
	}
	// A stable order keeps requests comparable in logs; the server's
	// policy, not this order, decides among topics.
	sort.Slice(out, func(i, j int) bool { return out[i].Topic < out[j].Topic })
	return out
}

// fetch is the dequeue loop: one long-polling Dequeue at a time, for every
// topic with room, so a worker with several topics makes one call, not
// one per topic.
func (w *Worker) fetch(ctx context.Context) {
	defer close(w.fetchDone)
	defer w.endCarrying()
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		want := w.wants()
		if len(want) == 0 {
			select {
			case <-w.slotFree:
			case <-ctx.Done():
			}
			continue
		}
		req := &triagev1.DequeueRequest{Namespace: w.cfg.Namespace, Topics: want, Region: w.cfg.Region,
			LeaseDuration: durationpb.New(w.cfg.Lease), Wait: durationpb.New(w.cfg.Wait)}
		acks := w.takeCarried(req)
		sent := time.Now()
		callCtx := ctx
		if len(acks) > 0 {
			// A Stop does not cancel acks under way: the call does not
			// wait, and Stop waits for it.
			callCtx = context.WithoutCancel(ctx)
		}
		rctx, cancel := context.WithTimeout(callCtx, w.cfg.Wait+15*time.Second)
		resp, err := w.c.Queue.Dequeue(rctx, req)
		cancel()
		w.setWaiting(false)
		if err != nil {
			// The acks may or may not have landed: acked again by
			// themselves, a landed one answers not found, which is what
			// it asks for.
			w.sendSeparately(acks)
			if ctx.Err() != nil {
				return
			}
			w.log.Warn("triage worker: dequeue failed", "err", err, "retry_in", backoff)
			w.setWaiting(true)
			_ = sleepCtx(ctx, jitter(backoff))
			w.setWaiting(false)
			backoff = min(2*backoff, 5*time.Second)
			continue
		}
		backoff = 100 * time.Millisecond
		w.ackResults(resp.GetAckResults())
		for _, li := range resp.GetItems() {
			w.accept(li, sent)
		}
	}
}

// carry queues ack for the next Dequeue of the fetch loop when that loop is
// about to make one: the item's slot has just freed, so the loop wakes,
// and one call acks and leases where an Ack and a Dequeue were two (and
// on the server, a shard's acks share the next lease's commit). While a
// long poll or a retry's backoff is under way, or once the loop has
// exited, the ack goes by itself (it reports false): carried, it would
// wait for them, its lease no longer extended.
func (w *Worker) carry(ack *delivery) bool {
	w.carryMu.Lock()
	defer w.carryMu.Unlock()
	if w.waiting || w.fetchGone {
		return false
	}
	w.carried = append(w.carried, ack)
	return true
}

// takeCarried moves up to MaxBatch carried acks into req, which then does
// not wait: its ack results come back at once, and a Stop does not cancel
// acks in a long poll. A request without acks long-polls, and acks
// settled meanwhile go by themselves (carry).
func (w *Worker) takeCarried(req *triagev1.DequeueRequest) []*delivery {
	w.carryMu.Lock()
	defer w.carryMu.Unlock()
	n := min(len(w.carried), w.cfg.MaxBatch)
	acks := slices.Clone(w.carried[:n])
	w.carried = slices.Delete(w.carried, 0, n)
	for _, d := range acks {
		req.Acks = append(req.Acks, &triagev1.LeaseRef{Id: d.item.ID, LeaseToken: d.item.token})
	}
	if len(acks) > 0 {
		req.Wait = durationpb.New(0)
	}
	w.waiting = len(acks) == 0 && w.cfg.Wait > 0
	return acks
}

func (w *Worker) setWaiting(v bool) {
	w.carryMu.Lock()
	w.waiting = v
	w.carryMu.Unlock()
}

// endCarrying is the fetch loop's exit: what it was to carry goes to the
// ack sender.
func (w *Worker) endCarrying() {
	w.carryMu.Lock()
	acks := w.carried
	w.carried, w.fetchGone = nil, true
	w.carryMu.Unlock()
	w.sendSeparately(acks)
}

// sendSeparately hands acks to the ack sender.
func (w *Worker) sendSeparately(acks []*delivery) {
	for _, d := range acks {
		select {
		case w.acks <- d:
		case <-w.gone:
			w.log.Warn("triage worker: ack after shutdown dropped; the item comes back when its lease lapses", "id", d.item.ID)
		}
	}
}

// accept takes a dequeued item into the worker: counted against its
// topic, its lease kept, queued for a runner.
func (w *Worker) accept(li *triagev1.LeasedItem, sent time.Time) {
	it := newItem(w.cfg.Namespace, li)
	w.mu.Lock()
	t := w.topics[it.Topic]
	if t == nil {
		w.mu.Unlock()
		// Not asked for; hand it straight back.
		w.log.Warn("triage worker: dequeued an item of a topic it has no handler for", "topic", it.Topic, "id", it.ID)
		d := &delivery{item: it, done: make(chan struct{}), lost: make(chan struct{})}
		w.release(d)
		return
	}
	t.held++
	d := &delivery{item: it, t: t, done: make(chan struct{}), lost: make(chan struct{})}
	w.inflight[d] = struct{}{}
	w.mu.Unlock()
	go w.keep(d, sent.Add(w.cfg.Lease))
	t.queue <- d // never blocks: held <= capacity
}

// run is one of a topic's Concurrency runners.
func (w *Worker) run(t *topic) {
	defer w.runners.Done()
	for {
		select {
		case <-w.stopping:
			return
		case d := <-t.queue:
			select {
			case <-w.stopping:
				w.release(d)
				return
			default:
			}
			w.handle(d)
		}
	}
}

// handle runs the handler on d and settles the item from its result, or
// at the topic's timeout. The handler runs on its own goroutine so that
// the runner can give up on it at the timeout: a handler that ignores its
// context must not hold the item's lease, nor the topic's slot, forever.
func (w *Worker) handle(d *delivery) {
	ctx, cancel := context.WithCancelCause(w.handlerBG)
	defer cancel(nil)
	if !w.begin(d, cancel) {
		return
	}
	var expired <-chan time.Time
	if to := d.t.cfg.Timeout; to > 0 {
		// The context's deadline tells the handler (and the calls it
		// makes) its limit; the timer is the runner's own, which it keeps
		// even when the context is cancelled earlier for another reason.
		var stop context.CancelFunc
		ctx, stop = context.WithTimeoutCause(ctx, to, ErrHandlerTimeout)
		defer stop()
		timer := time.NewTimer(to)
		defer timer.Stop()
		expired = timer.C
	}
	res := make(chan error, 1) // buffered: an abandoned handler never blocks on it
	var abandoned atomic.Bool
	go func() {
		err := w.call(ctx, d)
		res <- err
		if abandoned.Load() {
			w.log.Warn("triage worker: handler returned after its timeout; result ignored", "topic", d.item.Topic, "id", d.item.ID, "result", err)
		}
	}()
	select {
	case err := <-res:
		w.finish(ctx, d, err)
		return
	case <-expired:
	}
	select {
	case err := <-res: // returned as the timer fired
		w.finish(ctx, d, err)
	default:
		abandoned.Store(true)
		cancel(ErrHandlerTimeout)
		w.expire(d)
	}
}

// begin records the handler's cancel on d, for the lease keeper, unless
// the lease was lost before the handler started (then d is forgotten).
func (w *Worker) begin(d *delivery, cancel context.CancelCauseFunc) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	select {
	case <-d.lost:
		w.log.Warn("triage worker: lease lost before the handler started", "topic", d.item.Topic, "id", d.item.ID)
		w.forget(d)
		return false
	default:
	}
	d.abort = cancel
	return true
}

// call runs d's handler (with the middleware), turning a panic in the
// middleware into a *PanicError as recoverHandler does for the handler.
func (w *Worker) call(ctx context.Context, d *delivery) (err error) {
	ctx, span := w.startSpan(ctx, d.item)
	defer func() {
		if r := recover(); r != nil {
			err = &PanicError{Value: r, Stack: debug.Stack()}
		}
		if err != nil {
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
	}()
	return d.t.handler(ctx, d.item)
}

// startSpan starts the handler span of it: a consumer span of its own trace,
// linked to the enqueue's (a delivery is one of possibly many of the
// item, so the producer's trace is a link, not the parent).
func (w *Worker) startSpan(ctx context.Context, it *Item) (context.Context, trace.Span) {
	opts := []trace.SpanStartOption{
		trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(
			attribute.String("messaging.system", "triage"),
			attribute.String("messaging.operation.name", "process"),
			attribute.String("messaging.operation.type", "process"),
			attribute.String("messaging.destination.name", it.Topic),
			attribute.String("messaging.message.id", it.ID),
			attribute.String("triage.namespace", it.Namespace),
			attribute.Int("triage.attempts", it.Attempts)),
	}
	if it.Traceparent != "" {
		producer := propagation.TraceContext{}.Extract(context.Background(), propagation.MapCarrier{"traceparent": it.Traceparent})
		if sc := trace.SpanContextFromContext(producer); sc.IsValid() {
			opts = append(opts, trace.WithLinks(trace.Link{SpanContext: sc}))
		}
	}
	return w.tracer.Start(ctx, "process "+it.Topic, opts...)
}

// finish settles d from its handler's result err; ctx is the handler's.
func (w *Worker) finish(ctx context.Context, d *delivery, err error) {
	select {
	case <-d.lost:
		// Someone else may hold the item now: an ack or nack would be
		// refused, and must not be tried with a stale view anyway.
		w.log.Warn("triage worker: lease lost while handling; result dropped", "topic", d.item.Topic, "id", d.item.ID, "result", err)
		w.forget(d)
		return
	default:
	}
	var snooze *snoozeError
	switch {
	case err == nil:
		w.settle(d, d, nil)
	case errors.Is(context.Cause(ctx), ErrHandlerTimeout):
		// The handler gave up because its time was up: the timeout, not
		// its error, is what last_error should say.
		w.expire(d)
	case errors.As(err, &snooze):
		w.settle(d, nil, &triagev1.NackItem{Id: d.item.ID, LeaseToken: d.item.token, Release: true, Delay: durationpb.New(snooze.d)})
	case IsPermanent(err):
		w.settle(d, nil, &triagev1.NackItem{Id: d.item.ID, LeaseToken: d.item.token, DeadLetter: true, Error: truncateError(err.Error())})
	default:
		// No delay: the server applies the namespace's backoff.
		w.settle(d, nil, &triagev1.NackItem{Id: d.item.ID, LeaseToken: d.item.token, Error: truncateError(err.Error())})
	}
}

// expire settles d whose handler ran out of time: a nack without a delay
// (the server's backoff; the attempt counts) whose error says so. settle
// stops the lease keeper, so the lease is extended no more. A lost lease
// is only forgotten: another consumer may hold the item.
func (w *Worker) expire(d *delivery) {
	select {
	case <-d.lost:
		w.log.Warn("triage worker: handler timed out after its lease was lost", "topic", d.item.Topic, "id", d.item.ID)
		w.forget(d)
		return
	default:
	}
	w.log.Warn("triage worker: handler timed out; item nacked", "topic", d.item.Topic, "id", d.item.ID, "timeout", d.t.cfg.Timeout)
	msg := fmt.Sprintf("handler timed out after %s", d.t.cfg.Timeout)
	w.settle(d, nil, &triagev1.NackItem{Id: d.item.ID, LeaseToken: d.item.token, Error: msg})
}

// settle stops d's lease keeper, frees its slot and queues its ack (ack
// set) or nack.
func (w *Worker) settle(d *delivery, ack *delivery, n *triagev1.NackItem) {
	// Queued before the slot frees, so that the fetch loop the free slot
	// wakes finds the ack to carry.
	carried := ack != nil && w.carry(ack)
	w.forget(d)
	if carried {
		return
	}
	if ack != nil {
		select {
		case w.acks <- ack:
		case <-w.gone:
			w.log.Warn("triage worker: ack after shutdown dropped; the item comes back when its lease lapses", "id", d.item.ID)
		}
		return
	}
	select {
	case w.nacks <- nackReq{d, n}:
	case <-w.gone:
		w.log.Warn("triage worker: nack after shutdown dropped; the item comes back when its lease lapses", "id", d.item.ID)
	}
}

// forget stops d's lease keeper and frees its topic slot.
func (w *Worker) forget(d *delivery) {
	d.once.Do(func() { close(d.done) })
	w.mu.Lock()
	if _, ok := w.inflight[d]; ok {
		delete(w.inflight, d)
		d.t.held--
	}
	w.mu.Unlock()
	select {
	case w.slotFree <- struct{}{}:
	default:
	}
}

// keep extends d's lease every Lease/3 until d is settled. A refusal
// (stale token, item gone) means another consumer may hold it: the
// handler's context is cancelled with ErrLeaseLost. Transient failures
// are retried more often until the lease would have lapsed by the local
// clock (expires, counted from when the dequeue or extension was sent).
func (w *Worker) keep(d *delivery, expires time.Time) {
	lease := w.cfg.Lease
	next := lease / 3
	for {
		t := time.NewTimer(next)
		select {
		case <-d.done:
			t.Stop()
			return
		case <-w.keepBG.Done():
			t.Stop()
			return
		case <-t.C:
		}
		select {
		case <-d.done: // settled as the timer fired: extend no more
			return
		default:
		}
		sent := time.Now()
		ctx, cancel := context.WithTimeout(w.keepBG, lease/3)
		_, err := w.c.Queue.ExtendLease(ctx, &triagev1.ExtendLeaseRequest{Namespace: w.cfg.Namespace, Id: d.item.ID,
			LeaseToken: d.item.token, LeaseDuration: durationpb.New(lease)})
		cancel()
		switch {
		case err == nil:
			expires = sent.Add(lease)
			next = lease / 3
			continue
		case w.keepBG.Err() != nil:
			return
		case errors.Is(err, ErrStaleLease), errors.Is(err, ErrNotFound):
			w.loseLease(d, err)
			return
		}
		select {
		case <-d.done:
			return
		default:
		}
		if time.Until(expires) <= 0 {
			w.loseLease(d, err)
			return
		}
		w.log.Warn("triage worker: extend lease failed; retrying", "id", d.item.ID, "err", err)
		next = max(min(lease/10, time.Until(expires)/2), 10*time.Millisecond)
	}
}

func (w *Worker) loseLease(d *delivery, err error) {
	select {
	case <-d.done:
		return // settled meanwhile: the refusal is the ack's doing
	default:
	}
	w.log.Warn("triage worker: lease lost", "topic", d.item.Topic, "id", d.item.ID, "err", err)
	d.mu.Lock()
	close(d.lost)
	if d.abort != nil {
		d.abort(ErrLeaseLost)
	}
	d.mu.Unlock()
}

// settleAcks sends acks in batches: whatever queued up while the last
// call was in flight goes in the next, so batches grow with load and an
// idle worker acks at once.
func (w *Worker) settleAcks() {
	defer w.settlers.Done()
	for {
		var batch []*delivery
		select {
		case d := <-w.acks:
			batch = append(batch, d)
		case <-w.flush:
			for {
				batch = batch[:0]
				w.collectAcks(&batch)
				if len(batch) == 0 {
					w.closeGone()
					return
				}
				w.sendAcks(batch)
			}
		}
		w.collectAcks(&batch)
		w.sendAcks(batch)
	}
}

func (w *Worker) collectAcks(batch *[]*delivery) {
	for len(*batch) < w.cfg.MaxBatch {
		select {
		case d := <-w.acks:
			*batch = append(*batch, d)
		default:
			return
		}
	}
}

func (w *Worker) sendAcks(batch []*delivery) {
	req := &triagev1.AckRequest{Namespace: w.cfg.Namespace}
	for _, d := range batch {
		req.Acks = append(req.Acks, &triagev1.LeaseRef{Id: d.item.ID, LeaseToken: d.item.token})
	}
	resp, err := w.c.Queue.Ack(w.settleCtx, req)
	if err != nil {
		w.log.Error("triage worker: ack failed; the items come back when their leases lapse", "items", len(batch), "err", err)
		return
	}
	w.ackResults(resp.GetResults())
}

// ackResults logs the acks an Ack or a Dequeue carrying acks refused.
func (w *Worker) ackResults(results []*triagev1.ItemResult) {
	for _, r := range results {
		switch {
		case r.GetOk():
		case errors.Is(&ItemError{ID: r.GetId(), Reason: r.GetError()}, ErrNotFound):
			// The item is gone, which is what the ack asks for: most
			// often this ack's own first try took effect and its answer
			// was lost (the client retried UNAVAILABLE with the same
			// token), or the item was deleted meanwhile.
			w.log.Debug("triage worker: acked item already gone", "id", r.GetId())
		default:
			w.log.Warn("triage worker: ack refused", "id", r.GetId(), "reason", r.GetError())
		}
	}
}

// settleNacks is settleAcks for nacks.
func (w *Worker) settleNacks() {
	defer w.settlers.Done()
	for {
		var batch []nackReq
		select {
		case n := <-w.nacks:
			batch = append(batch, n)
		case <-w.flush:
			for {
				batch = batch[:0]
				w.collectNacks(&batch)
				if len(batch) == 0 {
					w.closeGone()
					return
				}
				w.sendNacks(batch)
			}
		}
		w.collectNacks(&batch)
		w.sendNacks(batch)
	}
}

func (w *Worker) collectNacks(batch *[]nackReq) {
	for len(*batch) < w.cfg.MaxBatch {
		select {
		case n := <-w.nacks:
			*batch = append(*batch, n)
		default:
			return
		}
	}
}

func (w *Worker) sendNacks(batch []nackReq) {
	req := &triagev1.NackRequest{Namespace: w.cfg.Namespace}
	for _, n := range batch {
		req.Nacks = append(req.Nacks, n.n)
	}
	resp, err := w.c.Queue.Nack(w.settleCtx, req)
	if err != nil {
		w.log.Error("triage worker: nack failed; the items come back when their leases lapse", "items", len(batch), "err", err)
		return
	}
	for _, r := range resp.GetResults() {
		if !r.GetOk() {
			w.log.Warn("triage worker: nack refused", "id", r.GetId(), "reason", r.GetError())
		}
	}
}

// closeGone closes gone once both settlers have exited.
func (w *Worker) closeGone() {
	if w.goneN.Add(1) == 2 {
		close(w.gone)
	}
}
