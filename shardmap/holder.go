package shardmap

import (
	"errors"
	"fmt"
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
}

// NewHolder returns a holder serving m, fresh as of now.
func NewHolder(m *Map) *Holder {
	h := &Holder{now: time.Now}
	h.p.Store(m)
	h.Touch()
	return h
}

// Current returns the snapshot in force.
func (h *Holder) Current() *Map { return h.p.Load() }

// Touch records that the store was reached and holds no newer map.
func (h *Holder) Touch() { h.freshAt.Store(h.now().UnixNano()) }

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
			return true
		}
	}
}
