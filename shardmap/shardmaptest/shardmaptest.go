package shardmaptest

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/nats-io/nats.go/jetstream"

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

// LaggingKV is a shard-map bucket whose Get of the map answers from
// revision Lag when Lag is set, as a direct get answered by a NATS server
// that has not caught up does (one back from a partition). Everything
// else, writes included, goes to the bucket.
type LaggingKV struct {
	jetstream.KeyValue
	Lag atomic.Uint64
}

// Get reads key, the map from revision Lag when that is set.
func (k *LaggingKV) Get(ctx context.Context, key string) (jetstream.KeyValueEntry, error) {
	if rev := k.Lag.Load(); rev != 0 && key == shardmap.Key {
		return k.KeyValue.GetRevision(ctx, key, rev)
	}
	return k.KeyValue.Get(ctx, key)
}
