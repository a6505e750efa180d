package enqueuer

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/triage-queue/triage/proto/triage/peer"
)

// fastState is a worker's side of fast copies (see "Fast copies" in the
// package doc): the batches a copy is inserting (inflight) and those a
// fast copy inserted lately (done, with when), so that the second copy of
// a batch does no database work.
type fastState struct {
	mu       sync.Mutex
	inflight map[uint64]bool
	done     map[uint64]time.Time
	prunedAt time.Time
}

// fastDoneFor bounds how long a batch inserted by one copy waits for the
// other: the stream's copy arrives within a replication round trip unless
// the message went to another worker (a hand-over), in which case the
// entry is only memory.
const fastDoneFor = 2 * time.Minute

// fastNakDelay is how long the stream's copy of a batch whose fast copy
// is being inserted waits before it is redelivered and looked at again.
// Nobody waits for it (the fast copy answers the router), so it is long
// enough that a shard whose inserts hang (a failover) does not have its
// stream copies redelivered many times a second.
const fastNakDelay = 500 * time.Millisecond

// claim registers a fast copy's ids as being inserted and reports whether
// it should go on: false when the stream's copy has them in flight, or a
// fast copy (sent twice by a publish retried) inserted them. A fast copy
// that is not claimed is dropped; the stream's copy decides by seen.
// Only fast copies are recorded as done, and the stream's copy forgets
// them, so done holds about a replication round trip of batches; a fast
// copy later than its stream copy's insert is inserted again, which
// enqueue_batches answers as applied.
func (f *fastState) claim(ids []uint64) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, id := range ids {
		if f.inflight[id] {
			return false
		}
		if _, ok := f.done[id]; ok {
			return false
		}
	}
	for _, id := range ids {
		f.inflight[id] = true
	}
	return true
}

// copyState is what the worker knows of a stream copy's batches.
type copyState int

const (
	copyNew      copyState = iota // insert it
	copyInserted                  // a fast copy inserted it: ack
	copyInFlight                  // a fast copy is inserting it: look again soon
)

// seen tells what to do with the stream's copy of ids; copyNew registers
// them as in flight, and copyInserted forgets them (the stream's copy was
// the last one).
func (f *fastState) seen(ids []uint64) copyState {
	f.mu.Lock()
	defer f.mu.Unlock()
	done := 0
	for _, id := range ids {
		if f.inflight[id] {
			return copyInFlight
		}
		if _, ok := f.done[id]; ok {
			done++
		}
	}
	if len(ids) > 0 && done == len(ids) {
		for _, id := range ids {
			delete(f.done, id)
		}
		return copyInserted
	}
	for _, id := range ids {
		f.inflight[id] = true
	}
	return copyNew
}

// settle ends the flight of ids; inserted records them as done.
func (f *fastState) settle(ids []uint64, inserted bool, now time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, id := range ids {
		delete(f.inflight, id)
		if inserted {
			f.done[id] = now
		}
	}
	if now.Sub(f.prunedAt) >= fastDoneFor {
		for id, at := range f.done {
			if now.Sub(at) >= fastDoneFor {
				delete(f.done, id)
			}
		}
		f.prunedAt = now
	}
}

// fastMsg is a fast copy in the worker's pipeline, where it goes like a
// stream message: acking it records its batches as inserted, and the
// rest does nothing, since only the stream's copy is redelivered.
type fastMsg struct {
	msg *nats.Msg
}

var errFastCopy = errors.New("enqueuer: a fast copy has no stream metadata")

func (m *fastMsg) Metadata() (*jetstream.MsgMetadata, error) { return nil, errFastCopy }
func (m *fastMsg) Data() []byte                              { return m.msg.Data }
func (m *fastMsg) Headers() nats.Header                      { return m.msg.Header }
func (m *fastMsg) Subject() string                           { return m.msg.Subject }
func (m *fastMsg) Reply() string                             { return "" }
func (m *fastMsg) Ack() error                                { return nil }
func (m *fastMsg) DoubleAck(context.Context) error           { return nil }
func (m *fastMsg) Nak() error                                { return nil }
func (m *fastMsg) NakWithDelay(time.Duration) error          { return nil }
func (m *fastMsg) InProgress() error                         { return nil }
func (m *fastMsg) Term() error                               { return nil }
func (m *fastMsg) TermWithReason(string) error               { return nil }

// listenFast feeds the fast copies of the shard's envelopes into msgs
// until ctx ends, dropping any that would wait for room (the stream's
// copy follows). One worker of the region gets each (a queue group).
func (w *worker) listenFast(ctx context.Context, msgs chan<- jetstream.Msg) {
	sub, err := w.svc.cfg.NC.QueueSubscribe(peer.EnqueueNowSubject(w.home, w.shard), "enqueuers", func(m *nats.Msg) {
		select {
		case msgs <- &fastMsg{msg: m}:
		default:
		}
	})
	if err != nil {
		w.log.Warn("fast copies not received; the stream's copies are inserted as they come", "err", err)
		return
	}
	<-ctx.Done()
	_ = sub.Unsubscribe()
}
