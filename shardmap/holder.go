package shardmap

import "sync/atomic"

// Source gives the current snapshot. Routing depends on this, not on how
// snapshots arrive.
type Source interface {
	Current() *Map
}

// Holder keeps the current snapshot and swaps it atomically.
type Holder struct {
	p atomic.Pointer[Map]
}

// NewHolder returns a holder serving m.
func NewHolder(m *Map) *Holder {
	h := &Holder{}
	h.p.Store(m)
	return h
}

// Current returns the snapshot in force.
func (h *Holder) Current() *Map { return h.p.Load() }

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
			return true
		}
	}
}
