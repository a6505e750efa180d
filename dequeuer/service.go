package dequeuer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/triage-queue/triage/enqueuer"
	peerv1 "github.com/triage-queue/triage/proto/triage/peer/v1"
	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
	"github.com/triage-queue/triage/routing/itemid"
	"github.com/triage-queue/triage/shardmap"
)

// Config configures the dequeuer role.
type Config struct {
	// Region whose shards this dequeuer serves. Required.
	Region string
	// ID names this dequeuer in the ownership bucket and its request
	// subject. Default: region + "-" + a random NUID.
	ID string
	// Maps, Pool, NC, JS: shard map, shard connections, NATS. Required.
	Maps shardmap.Source
	Pool *shardmap.Pool
	NC   *nats.Conn
	JS   jetstream.JetStream
	// OwnerTTL is how long a shard ownership outlives its owner. A killed
	// dequeuer's shards are taken over after at most this long. Default 10s.
	OwnerTTL time.Duration
	// KVReplicas of the ownership bucket. Default 1.
	KVReplicas int
	// IdleRelease hands a topic's buffered leases back after this long
	// without a dequeue. Default 2s.
	IdleRelease time.Duration
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Now is the clock. Default time.Now.
	Now func() time.Time
}

// Service is the dequeuer role: it owns shards, prefetches their ready
// heads and answers ShardDequeue requests from routers.
type Service struct {
	cfg Config
	log *slog.Logger

	mu     sync.Mutex
	topics map[bufKey]*topicBuf
	wrr    map[[2]string]*wrr

	aging  *aging
	owner  *ownership
	subs   []*nats.Subscription
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// New validates cfg and returns a stopped dequeuer.
func New(cfg Config) (*Service, error) {
	if cfg.Region == "" || cfg.Maps == nil || cfg.Pool == nil || cfg.NC == nil || cfg.JS == nil {
		return nil, errors.New("dequeuer: Region, Maps, Pool, NC and JS are required")
	}
	if cfg.ID == "" {
		cfg.ID = cfg.Region + "-" + nuid.Next()
	}
	if cfg.OwnerTTL == 0 {
		cfg.OwnerTTL = 10 * time.Second
	}
	if cfg.IdleRelease == 0 {
		cfg.IdleRelease = 2 * time.Second
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	log := cfg.Logger.With("role", "dequeuer", "region", cfg.Region, "dequeuer", cfg.ID)
	return &Service{cfg: cfg, log: log, topics: map[bufKey]*topicBuf{}, wrr: map[[2]string]*wrr{}, aging: newAging()}, nil
}

// ID returns the dequeuer's ID.
func (s *Service) ID() string { return s.cfg.ID }

// RequestSubject is where dequeuer id takes ShardDequeue requests.
func RequestSubject(id string) string { return "triage.dq." + id }

// UnbufferSubject is where dequeuer id takes Unbuffer requests.
func UnbufferSubject(id string) string { return "triage.dqu." + id }

// Start claims shards and begins serving.
func (s *Service) Start(ctx context.Context) error {
	kv, err := OpenOwners(ctx, s.cfg.JS, s.cfg.OwnerTTL, s.cfg.KVReplicas)
	if err != nil {
		return err
	}
	ctx, s.cancel = context.WithCancel(ctx)
	s.owner = newOwnership(s, kv)
	s.owner.claim(ctx)
	// Requests and ItemsReady notices share one channel, read in the order
	// the connection received them: a router that announces a commit and
	// then forwards a dequeue is seen in that order, so the dequeue finds
	// the buffer already marked for a refill.
	inbox := make(chan *nats.Msg, 4096)
	for _, subj := range []string{RequestSubject(s.cfg.ID), UnbufferSubject(s.cfg.ID), enqueuer.ReadySubject("*")} {
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
				case RequestSubject(s.cfg.ID):
					go s.handleRequest(m)
				case UnbufferSubject(s.cfg.ID):
					go s.handleUnbuffer(m)
				default:
					s.handleReady(m)
				}
			}
		}
	}()
	s.loop(ctx, s.cfg.OwnerTTL/4, s.owner.claim)
	s.loop(ctx, 500*time.Millisecond, s.releaseIdle)
	s.loop(ctx, time.Second, s.sweepTTL)
	s.loop(ctx, 100*time.Millisecond, s.sweepAging)
	return nil
}

// Stop stops serving, hands buffered leases back and gives up ownership so
// another dequeuer takes the shards at once.
func (s *Service) Stop() {
	s.halt()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s.releaseAll(ctx, func(*topicBuf) bool { return true })
	if s.owner != nil {
		s.owner.resign(ctx)
	}
}

// Crash stops the dequeuer the way a killed process stops: no lease is
// handed back and no ownership is resigned, so other dequeuers wait for
// the ownership TTL and the prefetched items for their leases to lapse.
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
	s.wg.Wait()
}

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
	return Policy{MaxAttempts: n.MaxAttempts, AtMostOnce: n.Topic(topic).AtMostOnce}
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
	// Buffers of bands the new items may fall in; a topic nobody has asked
	// for here has none, and there is nothing to refresh.
	var bufs []*topicBuf
	s.mu.Lock()
	for k, b := range s.topics {
		if k.ns == r.Namespace && k.topic == r.Topic && r.MinPriority <= k.band.hi {
			bufs = append(bufs, b)
		}
	}
	s.mu.Unlock()
	for _, b := range bufs {
		b.mu.Lock()
		q := b.queue(r.Shard)
		// An empty or short-read queue must look again; a buffered queue
		// only when the new items may sort before what it holds.
		// Same priority sorts after the buffered ones (later deliver_after).
		if len(q.items) == 0 || r.MinPriority < q.items[len(q.items)-1].Priority {
			q.dirty = true
			q.notices++
		}
		b.mu.Unlock()
		b.wake(int(max(r.Count, 1)))
	}
}

func (s *Service) handleRequest(m *nats.Msg) {
	var req peerv1.ShardDequeue
	resp := &peerv1.ShardDequeueResponse{}
	if err := proto.Unmarshal(m.Data, &req); err != nil || req.Request == nil {
		resp.Code, resp.Error = 3, "malformed ShardDequeue"
	} else {
		ctx, cancel := context.WithTimeout(context.Background(), req.Request.GetWait().AsDuration()+10*time.Second)
		items, err := s.Dequeue(ctx, req.Request, req.Shards)
		cancel()
		resp.Items = items
		if err != nil {
			resp.Code, resp.Error = 14, err.Error()
			if errors.Is(err, ErrNotOwner) {
				resp.Code = 9 // FAILED_PRECONDITION: the router asks the new owner
			}
		}
	}
	data, _ := proto.Marshal(resp)
	_ = m.Respond(data)
}

// Dequeue serves a validated request from shards this dequeuer owns:
// per topic, up to count items in (priority, deliver_after, id) order
// across the shards, each under a lease. With a wait it parks until items
// arrive or the wait ends.
func (s *Service) Dequeue(ctx context.Context, req *triagev1.DequeueRequest, shards []uint32) ([]*triagev1.LeasedItem, error) {
	for _, id := range shards {
		if !s.owner.owns(id) {
			return nil, fmt.Errorf("%w %d", ErrNotOwner, id)
		}
	}
	deadline := s.cfg.Now().Add(req.GetWait().AsDuration())
	var lease time.Duration
	if req.LeaseDuration != nil {
		lease = req.LeaseDuration.AsDuration()
	}
	for {
		var out []*triagev1.LeasedItem
		var firstErr error
		var bufs []*topicBuf
		m := s.cfg.Maps.Current()
		for _, tc := range req.Topics {
			items, tbufs, err := s.takeTopic(ctx, m, req, tc, shards)
			if err != nil && firstErr == nil {
				firstErr = err
			}
			served, err := s.serve(ctx, items, lease)
			if err != nil && firstErr == nil {
				firstErr = err
			}
			for _, it := range served {
				out = append(out, s.leased(tc.Topic, it))
			}
			bufs = append(bufs, tbufs...)
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
		waits := make([]chan struct{}, len(bufs))
		for i, b := range bufs {
			b.mu.Lock()
			waits[i] = b.wait()
			b.mu.Unlock()
		}
		s.park(ctx, waits, min(left, recheckEvery))
		for i, b := range bufs {
			b.unwait(waits[i])
		}
		if ctx.Err() != nil {
			return nil, nil
		}
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

// serve gives items their final lease: the request's lease duration, or the
// item's own counted from now. Items whose stamped expiry is already close
// to that are served as they are; the rest get one UPDATE per lease batch.
func (s *Service) serve(ctx context.Context, items []bufItem, lease time.Duration) ([]bufItem, error) {
	if len(items) == 0 {
		return nil, nil
	}
	now := s.cfg.Now()
	// A row whose TTL passed while it waited in the buffer is not served
	// (restamp checks the same for the rows it touches); the sweep deletes
	// it.
	items = slices.DeleteFunc(items, func(it bufItem) bool {
		return it.ExpiresAt.Valid && it.ExpiresAt.Int64 <= now.UnixMicro()
	})
	type group struct {
		shard   uint32
		token   uint64
		untilUS int64
	}
	const slack = 250 * time.Millisecond
	groups := map[group][]uint64{}
	for i := range items {
		it := &items[i]
		d := lease
		if d == 0 {
			d = time.Duration(it.LeaseMS) * time.Millisecond
		}
		want := now.Add(d).UnixMicro()
		if diff := want - it.untilUS; diff > slack.Microseconds() || diff < -slack.Microseconds() {
			g := group{it.shard, it.token, want}
			groups[g] = append(groups[g], it.ID)
		}
	}
	if len(groups) == 0 {
		return items, nil
	}
	lost := map[uint64]bool{}
	newUntil := map[uint64]int64{}
	for g, ids := range groups {
		db, err := s.cfg.Pool.Writer(s.cfg.Maps, g.shard)
		if err != nil {
			return nil, err
		}
		ok, err := restamp(ctx, db, ids, g.token, g.untilUS, now.UnixMicro())
		if err != nil {
			// The items stay leased under the prefetch lease; they come
			// back when it expires.
			return nil, err
		}
		for _, id := range ids {
			if ok[id] {
				newUntil[id] = g.untilUS
			} else {
				lost[id] = true
			}
		}
	}
	out := items[:0]
	for _, it := range items {
		if lost[it.ID] {
			continue
		}
		if u, ok := newUntil[it.ID]; ok {
			it.untilUS = u
		}
		out = append(out, it)
	}
	return out, nil
}

func (s *Service) leased(topic string, it bufItem) *triagev1.LeasedItem {
	li := &triagev1.LeasedItem{
		Id:             itemid.ID{Shard: it.shard, Key: it.ID}.String(),
		Topic:          topic,
		Priority:       it.Priority,
		Payload:        it.Payload,
		Attempts:       it.Attempts,
		LeaseToken:     FormatToken(it.token),
		LeaseExpiresAt: timestamppb.New(time.UnixMicro(it.untilUS)),
		EnqueuedAt:     timestamppb.New(time.UnixMicro(it.EnqueuedAt)),
		DeliverAfter:   timestamppb.New(time.UnixMicro(it.DeliverAfter)),
	}
	if len(it.Metadata) > 0 {
		_ = json.Unmarshal(it.Metadata, &li.Metadata)
	}
	return li
}

// releaseIdle hands back the leases of buffers nobody has dequeued from
// lately, so their items are not held until the lease lapses.
func (s *Service) releaseIdle(ctx context.Context) {
	cutoff := s.cfg.Now().Add(-s.cfg.IdleRelease)
	s.releaseAll(ctx, func(b *topicBuf) bool { return b.lastUsed.Before(cutoff) })
}

func (s *Service) releaseAll(ctx context.Context, pick func(*topicBuf) bool) {
	s.mu.Lock()
	bufs := make([]*topicBuf, 0, len(s.topics))
	for _, b := range s.topics {
		bufs = append(bufs, b)
	}
	s.mu.Unlock()
	for _, b := range bufs {
		b.mu.Lock()
		if !pick(b) {
			b.mu.Unlock()
			continue
		}
		var items []bufItem
		for _, q := range b.queues {
			if q.fetching != nil {
				continue
			}
			items = append(items, q.items...)
			q.items = nil
			q.exhausted = false
		}
		b.mu.Unlock()
		s.releaseItems(ctx, items)
	}
}

func (s *Service) releaseItems(ctx context.Context, items []bufItem) {
	if err := s.releaseItemsErr(ctx, items); err != nil {
		s.log.Warn("release of prefetched items failed; they return when their lease lapses", "err", err)
	}
}

func (s *Service) releaseItemsErr(ctx context.Context, items []bufItem) error {
	type group struct {
		shard uint32
		token uint64
	}
	groups := map[group][]Row{}
	for _, it := range items {
		g := group{it.shard, it.token}
		groups[g] = append(groups[g], it.Row)
	}
	now := s.cfg.Now().UnixMicro()
	var errs []error
	for g, rows := range groups {
		db, err := s.cfg.Pool.Writer(s.cfg.Maps, g.shard)
		if err == nil {
			err = release(ctx, db, rows, g.token, now)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("shard %d: %w", g.shard, err))
		}
	}
	return errors.Join(errs...)
}

func (s *Service) handleUnbuffer(m *nats.Msg) {
	var req peerv1.Unbuffer
	resp := &peerv1.UnbufferResponse{}
	if err := proto.Unmarshal(m.Data, &req); err != nil {
		resp.Error = "malformed Unbuffer"
	} else {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if err := s.Unbuffer(ctx, req.Namespace, req.Shard, req.Keys); err != nil {
			resp.Error = err.Error()
		}
		cancel()
	}
	data, _ := proto.Marshal(resp)
	_ = m.Respond(data)
}

// Unbuffer takes keys of a shard out of the namespace's prefetch buffers
// and hands their prefetch leases back, so a router can update or delete
// them without a stale copy being served. Keys not buffered are ignored.
func (s *Service) Unbuffer(ctx context.Context, ns string, shard uint32, keys []uint64) error {
	want := make(map[uint64]bool, len(keys))
	for _, k := range keys {
		want[k] = true
	}
	s.mu.Lock()
	var bufs []*topicBuf
	for k, b := range s.topics {
		if k.ns == ns {
			bufs = append(bufs, b)
		}
	}
	s.mu.Unlock()
	var taken []bufItem
	for _, b := range bufs {
		b.mu.Lock()
		if q := b.queues[shard]; q != nil {
			kept := q.items[:0]
			for _, it := range q.items {
				if want[it.ID] {
					taken = append(taken, it)
				} else {
					kept = append(kept, it)
				}
			}
			// Not marked dirty: the router announces the item once its
			// update is committed, and a refill before that could buffer
			// the old version again.
			q.items = kept
		}
		b.mu.Unlock()
	}
	return s.releaseItemsErr(ctx, taken)
}

// dropShard forgets the buffered items of a shard this dequeuer lost, and
// hands their leases back.
func (s *Service) dropShard(ctx context.Context, shard uint32) {
	s.mu.Lock()
	bufs := make([]*topicBuf, 0, len(s.topics))
	for _, b := range s.topics {
		bufs = append(bufs, b)
	}
	s.mu.Unlock()
	var items []bufItem
	for _, b := range bufs {
		b.mu.Lock()
		if q := b.queues[shard]; q != nil {
			items = append(items, q.items...)
			q.items = nil
		}
		b.mu.Unlock()
	}
	s.releaseItems(ctx, items)
}

func (s *Service) sweepTTL(ctx context.Context) {
	for _, id := range s.owner.owned() {
		db, err := s.cfg.Pool.Writer(s.cfg.Maps, id)
		if err != nil {
			continue
		}
		for {
			n, err := sweepExpired(ctx, db, s.cfg.Now().UnixMicro(), 1000)
			if err != nil {
				s.log.Warn("ttl sweep failed", "shard", id, "err", err)
			}
			if n < 1000 {
				break
			}
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	// Forget topic buffers that are idle and empty, so the map stays small.
	for k, b := range s.topics {
		b.mu.Lock()
		empty := slices.IndexFunc(mapsValues(b.queues), func(q *shardQueue) bool { return len(q.items) > 0 || q.fetching != nil }) < 0
		idle := s.cfg.Now().Sub(b.lastUsed) > time.Minute && len(b.waiters) == 0
		b.mu.Unlock()
		if empty && idle {
			delete(s.topics, k)
		}
	}
}

func mapsValues[K comparable, V any](m map[K]V) []V {
	out := make([]V, 0, len(m))
	for _, v := range m {
		out = append(out, v)
	}
	return out
}
