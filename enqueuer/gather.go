package enqueuer

import (
	"context"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Gathering. At the rates a queue runs at in steady state (single-item
// producers, a few hundred batches a second per shard), a shard's insert
// goroutines (Config.InFlight) would each find a batch alone if they took
// whatever was waiting the moment they were free, and a shard's database
// would spend its CPU on commits (START, a dedup SELECT, two INSERTs and
// a COMMIT per batch), not on rows. So one goroutine gathers at a time,
// and it starts its transaction when no other is in flight, when one
// finishes, when minGather batches are waiting, or gatherLinger after its
// first batch, whichever comes first: batches that arrive while a commit
// is under way share the next one, as InnoDB's group commit shares an
// fsync. The linger bounds what a batch can wait for company where a
// commit is long (a semi-sync acknowledgement across the WAN takes a
// round trip); where commits are short, a finishing one starts the next
// sooner.
//
// gatherLinger is a variable only so a test can make it long enough to
// tell a start by a finishing transaction from one by the linger.
var gatherLinger = 2 * time.Millisecond

// minGather is how many batches start a transaction beside others in
// flight: enough to make one worth its commit.
const minGather = 64

// gate lets one insert goroutine gather at a time and counts the
// transactions in flight.
type gate struct {
	turn sync.Mutex // held by the goroutine gathering

	mu       sync.Mutex
	inflight int
	finished chan struct{} // closed when a transaction ends, then replaced
}

func newGate() *gate { return &gate{finished: make(chan struct{})} }

// gather appends to batch the first batch to arrive on msgs and then what
// joins it (see Gathering), up to max, and counts the transaction it is
// for as in flight: the caller calls done when it ends. It returns false
// when ctx ended, with batch holding what it had taken (to hand back).
func (g *gate) gather(ctx context.Context, msgs <-chan jetstream.Msg, batch []jetstream.Msg, max int) ([]jetstream.Msg, bool) {
	g.turn.Lock()
	defer g.turn.Unlock()
	select {
	case <-ctx.Done():
		return batch, false
	case m := <-msgs:
		batch = append(batch, m)
	}
	var linger <-chan time.Time
wait:
	for {
	drain:
		for len(batch) < max {
			select {
			case m := <-msgs:
				batch = append(batch, m)
			default:
				break drain
			}
		}
		// Only the gatherer adds to inflight, so what it reads here can
		// only shrink before it counts its own transaction below.
		g.mu.Lock()
		busy, finished := g.inflight > 0, g.finished
		g.mu.Unlock()
		if !busy || len(batch) >= min(max, minGather) {
			break
		}
		if linger == nil {
			t := time.NewTimer(gatherLinger)
			defer t.Stop()
			linger = t.C
		}
		select {
		case <-ctx.Done():
			return batch, false
		case m := <-msgs:
			batch = append(batch, m)
		case <-finished:
			break wait
		case <-linger:
			break wait
		}
	}
	g.mu.Lock()
	g.inflight++
	g.mu.Unlock()
	return batch, true
}

// done ends a transaction counted by gather.
func (g *gate) done() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.inflight--
	close(g.finished)
	g.finished = make(chan struct{})
}
