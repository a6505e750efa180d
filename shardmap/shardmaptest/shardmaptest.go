package shardmaptest

import (
	"sync"

	"github.com/triage-queue/triage/shardmap"
)

// LandsDuringRead is a map holder on which the map Arm is given is offered
// right after the first Current call that follows: a change that lands
// while a loop that read the map (a dequeuer's claim round, an enqueuer's
// reconcile) is still running on it. Loops that took the holder's change
// channel only after such a round missed the change until their next tick.
type LandsDuringRead struct {
	*shardmap.Holder
	mu   sync.Mutex
	next *shardmap.Map
}

// Arm makes next the map offered after the next Current call.
func (l *LandsDuringRead) Arm(next *shardmap.Map) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.next = next
}

// Current returns the holder's map, then offers the armed one, if any.
func (l *LandsDuringRead) Current() *shardmap.Map {
	m := l.Holder.Current()
	l.mu.Lock()
	next := l.next
	l.next = nil
	l.mu.Unlock()
	if next != nil {
		l.Holder.Offer(next)
	}
	return m
}
