package handback

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/triage-queue/triage/proto/triage/peer"
	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
	"github.com/triage-queue/triage/schema"
	"github.com/triage-queue/triage/schema/itemid"
	"github.com/triage-queue/triage/schema/store"
	"github.com/triage-queue/triage/shardmap"
)

// Grace is how long past the items' leases a Returner keeps trying.
const Grace = time.Minute

// tryTimeout bounds one try, so a primary that hangs (paused, cut off)
// does not hold the loop past the point where another try would reach
// the new one.
const tryTimeout = 10 * time.Second

// Config says where items go back to.
type Config struct {
	Maps  shardmap.Source
	Pool  *shardmap.Pool
	Clock *shardmap.Clock
	Log   *slog.Logger
}

// Returner hands items back, each batch on its shard's current primary.
type Returner struct {
	cfg    Config
	ctx    context.Context
	cancel context.CancelFunc

	mu      sync.Mutex // guards stopped against wg.Add racing Stop's Wait
	stopped bool
	wg      sync.WaitGroup
}

// New returns a Returner; Stop ends its retries.
func New(cfg Config) *Returner {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.Clock == nil {
		cfg.Clock = &shardmap.Clock{}
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Returner{cfg: cfg, ctx: ctx, cancel: cancel}
}

// Return hands us, served on shard for namespace under leases that end
// by until, back to the ready set. The first try runs before Return
// returns, and Return reports whether it succeeded; if not, the tries go
// on in the background. ready runs once the items are ready again, so
// the caller can tell the buffers that serve them (they may have read
// past them meanwhile); it runs on whichever goroutine succeeded.
func (r *Returner) Return(namespace string, shard uint32, us []store.Undelivered, until time.Time, ready func()) bool {
	if len(us) == 0 || !r.add() {
		return len(us) == 0
	}
	err := r.try(namespace, shard, us)
	if err == nil {
		r.wg.Done()
		ready()
		return true
	}
	go r.retry(namespace, shard, us, until, ready, err)
	return false
}

// Go is Return with the first try in the background too.
func (r *Returner) Go(namespace string, shard uint32, us []store.Undelivered, until time.Time, ready func()) {
	if len(us) == 0 || !r.add() {
		return
	}
	go func() {
		err := r.try(namespace, shard, us)
		if err == nil {
			r.wg.Done()
			ready()
			return
		}
		r.retry(namespace, shard, us, until, ready, err)
	}()
}

// add counts one hand-back in, unless the Returner has stopped.
func (r *Returner) add() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopped {
		r.cfg.Log.Warn("served items not handed back while stopping; they return when their lease lapses")
		return false
	}
	r.wg.Add(1)
	return true
}

// retry repeats the hand-back after a failed first try (err) until it
// succeeds, the Returner stops or the leases lapsed Grace ago.
func (r *Returner) retry(namespace string, shard uint32, us []store.Undelivered, until time.Time, ready func(), err error) {
	defer r.wg.Done()
	giveUp := until.Add(Grace)
	for wait := 50 * time.Millisecond; ; wait = min(2*wait, 5*time.Second) {
		if !schema.Sleep(r.ctx, wait) || time.Now().After(giveUp) {
			r.cfg.Log.Warn("served items could not be handed back; they return when their lease lapses",
				"shard", shard, "items", len(us), "err", err)
			return
		}
		if err = r.try(namespace, shard, us); err == nil {
			r.cfg.Log.Info("served items handed back after a retry", "shard", shard, "items", len(us))
			ready()
			return
		}
	}
}

func (r *Returner) try(namespace string, shard uint32, us []store.Undelivered) error {
	ctx, cancel := context.WithTimeout(r.ctx, tryTimeout)
	defer cancel()
	db, err := r.cfg.Pool.Writer(r.cfg.Maps, shard)
	if err != nil {
		return err
	}
	return store.New(db).ItemUnserve(ctx, store.ItemUnserveParams{Namespace: namespace, Items: us,
		NowUS: r.cfg.Clock.Now(ctx, db).UnixMicro()})
}

// Leased is Return for items as a consumer would have got them, grouped
// by shard; ready runs per shard with that shard's items. It reports
// whether every shard's first try succeeded, and fails only for items
// that name no shard or token (nothing is handed back then).
func (r *Returner) Leased(namespace string, items []*triagev1.LeasedItem, ready func(shard uint32, items []*triagev1.LeasedItem)) (bool, error) {
	groups, err := peer.UndeliveredByShard(items)
	if err != nil {
		return false, err
	}
	byShard := map[uint32][]*triagev1.LeasedItem{}
	until := map[uint32]time.Time{}
	for _, it := range items {
		id, _ := itemid.Parse(it.Id) // parsed above
		byShard[id.Shard] = append(byShard[id.Shard], it)
		if t := it.GetLeaseExpiresAt().AsTime(); t.After(until[id.Shard]) {
			until[id.Shard] = t
		}
	}
	all := true
	for shard, us := range groups {
		all = r.Return(namespace, shard, us, until[shard], func() { ready(shard, byShard[shard]) }) && all
	}
	return all, nil
}

// Stop ends the background tries and waits for them.
func (r *Returner) Stop() {
	r.mu.Lock()
	r.stopped = true
	r.mu.Unlock()
	r.cancel()
	r.wg.Wait()
}
