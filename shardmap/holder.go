package shardmap

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// MaxStaleness is how long a process keeps writing to a shard that can fail
// over (one with replicas) without hearing from the shard-map store. The
// failover controller waits longer than this after fencing a shard before
// it promotes a replica, so a writer cut off from the control plane (a
// partitioned region) has stopped writing to the old primary by then.
const MaxStaleness = 2 * time.Second

// ErrNotWritable means a shard must not be written now: it is being failed
// over, or this process has lost touch with the shard map.
var ErrNotWritable = errors.New("shard not writable")

// Source gives the current snapshot. Routing depends on this, not on how
// snapshots arrive.
type Source interface {
	Current() *Map
	// Writable says whether shard may be written now (see MaxStaleness).
	Writable(shard uint32) error
}

// Holder keeps the current snapshot and swaps it atomically. It also
// remembers when the store last confirmed the snapshot, for Writable.
type Holder struct {
	p       atomic.Pointer[Map]
	freshAt atomic.Int64 // unix nanos of the last contact with the store
	now     func() time.Time

	mu      sync.Mutex
	changed chan struct{} // closed (and replaced) when Offer installs a map

	confirmOnce sync.Once
	confirmed   chan struct{} // closed at the store's first confirmation
}

// NewHolder returns a holder serving m, fresh as of now.
func NewHolder(m *Map) *Holder {
	h := &Holder{now: time.Now, changed: make(chan struct{}), confirmed: make(chan struct{})}
	h.p.Store(m)
	h.Touch()
	return h
}

// Changed returns a channel that is closed when a newer map is installed
// after the call. A writer that holds work back because its shard is
// fenced or moving waits on it as well as on its backoff, so the work is
// retried the moment a failover's map arrives, not a backoff later.
func (h *Holder) Changed() <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.changed
}

// WaitConfirmed blocks until the store has confirmed the snapshot once
// (see Watch), or ctx ends. A process starts its writers only after this:
// a holder is fresh at creation, but a start-up that races a slow or
// leaderless map stream would otherwise begin with a map nobody checked
// and go stale MaxStaleness later with its writers already refusing.
func (h *Holder) WaitConfirmed(ctx context.Context) error {
	select {
	case <-h.confirmed:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("shard map never confirmed by the store (last contact %s ago): %w", h.Age().Round(time.Millisecond), ctx.Err())
	}
}

// confirm records a confirmation by the store at t (see Watch).
func (h *Holder) confirm(t time.Time) {
	h.touchAt(t)
	h.confirmOnce.Do(func() { close(h.confirmed) })
}

// Current returns the snapshot in force.
func (h *Holder) Current() *Map { return h.p.Load() }

// Touch records that the store was reached and holds no newer map.
func (h *Holder) Touch() { h.touchAt(h.now()) }

// touchAt records that the store held no newer map at t; it never moves
// the confirmation back in time.
func (h *Holder) touchAt(t time.Time) {
	for {
		old := h.freshAt.Load()
		if t.UnixNano() <= old || h.freshAt.CompareAndSwap(old, t.UnixNano()) {
			return
		}
	}
}

// Age is the time since the store last confirmed the snapshot.
func (h *Holder) Age() time.Duration { return h.now().Sub(time.Unix(0, h.freshAt.Load())) }

// Writable reports nil when shard may be written: it is not fenced, and,
// when it can fail over, the snapshot was confirmed within MaxStaleness.
func (h *Holder) Writable(shard uint32) error {
	s, ok := h.Current().Shard(shard)
	switch {
	case !ok:
		return fmt.Errorf("%w: shard %d is not in the shard map", ErrNotWritable, shard)
	case s.Fenced:
		return fmt.Errorf("%w: shard %d is failing over (epoch %d)", ErrNotWritable, shard, s.Epoch)
	case len(s.Replicas) > 0 && h.Age() > MaxStaleness:
		return fmt.Errorf("%w: shard map not confirmed for %s; shard %d may have failed over", ErrNotWritable, h.Age().Round(time.Millisecond), shard)
	}
	return nil
}

// Offer installs m when it is newer than the current snapshot and reports
// whether it did. Older or equal versions are ignored, so a late watcher
// event cannot roll the map back.
func (h *Holder) Offer(m *Map) bool {
	for {
		cur := h.p.Load()
		if cur != nil && m.Version <= cur.Version {
			return false
		}
		if h.p.CompareAndSwap(cur, m) {
			h.Touch()
			h.mu.Lock()
			close(h.changed)
			h.changed = make(chan struct{})
			h.mu.Unlock()
			return true
		}
	}
}

// Unconfirmed returns how long the store has not confirmed the snapshot,
// or 0 before its first confirmation (a holder nobody watches, as in
// unit tests, never counts as stale here). Routers refuse enqueues once it
// passes MaxStaleness, so a router that missed a drain stops publishing to
// the drained shard's buffer within MaxStaleness (see DrainSettle).
func (h *Holder) Unconfirmed() time.Duration {
	select {
	case <-h.confirmed:
		return h.Age()
	default:
		return 0
	}
}
