package bench

import (
	"fmt"
	"slices"
	"sync"
	"time"

	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
)

// steadyLease is the delivery lease triage-steady's consumers ask for:
// an item's serve time is its lease expiry less this.
const steadyLease = 30 * time.Second

// trails follows triage-steady's and triage-mixed's items from their send
// to the Dequeue answer that delivered them, to say where a slow item
// waited. Every
// stamp is taken on this box: the send and the answers here, enqueued_at
// by the router, the serve by the dequeuer on its estimate of the shard
// primary's clock (a local server, so the estimate is within a fraction
// of a millisecond).
type trails struct {
	mu       sync.Mutex
	answered map[string]time.Time // item id -> its Enqueue's answer
	got      []trail
}

// trail is one delivered item's stamps.
type trail struct {
	id                       string
	sent, enq, served, recvd time.Time
}

func newTrails() *trails { return &trails{answered: map[string]time.Time{}} }

// answer records when the Enqueue that stored ids answered.
func (t *trails) answer(ids []string, at time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, id := range ids {
		t.answered[id] = at
	}
}

// deliver records an item delivered at recvd, sent at sent.
func (t *trails) deliver(it *triagev1.LeasedItem, sent, recvd time.Time) {
	tr := trail{id: it.Id, sent: sent, recvd: recvd, enq: it.EnqueuedAt.AsTime(),
		served: it.LeaseExpiresAt.AsTime().Add(-steadyLease)}
	t.mu.Lock()
	t.got = append(t.got, tr)
	t.mu.Unlock()
}

// legs are the parts of an item's end-to-end time, one after another:
// router (sent to the router's stamp: gRPC in and admission), commit (to
// its Enqueue's answer or its serve, whichever came first: publish,
// gather, insert, commit), queued (to its serve: the notice, the buffer,
// waiting for a consumer's Dequeue) and answer (the serve's commit and the
// reply). A leg the clocks put below zero counts as zero.
var legs = []string{"router", "commit", "queued", "answer"}

func (tr trail) legs(answered time.Time) []time.Duration {
	stored := tr.served
	if !answered.IsZero() && answered.Before(stored) {
		stored = answered
	}
	pts := []time.Time{tr.sent, tr.enq, stored, tr.served, tr.recvd}
	out := make([]time.Duration, len(legs))
	for i := range out {
		out[i] = max(pts[i+1].Sub(pts[i]), 0)
	}
	return out
}

// breakdown is the median of each leg over the slowest 1% of the items
// delivered inside w and over all of them, and the end-to-end time from
// which an item counts as slow.
type breakdown struct {
	slowFrom    time.Duration
	slow, all   []time.Duration // by legs
	slowN, allN int
}

func (t *trails) breakdown(w window) (breakdown, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	type row struct {
		e2e  time.Duration
		legs []time.Duration
	}
	var rows []row
	for _, tr := range t.got {
		if w.has(tr.recvd) {
			rows = append(rows, row{tr.recvd.Sub(tr.sent), tr.legs(t.answered[tr.id])})
		}
	}
	if len(rows) < 100 {
		return breakdown{}, false
	}
	slices.SortFunc(rows, func(a, b row) int { return int(a.e2e - b.e2e) })
	cut := len(rows) * 99 / 100
	median := func(rs []row) []time.Duration {
		out := make([]time.Duration, len(legs))
		for i := range legs {
			v := make([]time.Duration, len(rs))
			for j, r := range rs {
				v[j] = r.legs[i]
			}
			slices.Sort(v)
			out[i] = v[len(v)/2]
		}
		return out
	}
	return breakdown{slowFrom: rows[cut].e2e, slow: median(rows[cut:]), all: median(rows),
		slowN: len(rows) - cut, allN: len(rows)}, true
}

// note says the breakdown in a scenario's notes.
func (b breakdown) note() string {
	f := func(ds []time.Duration) string {
		s := ""
		for i, d := range ds {
			if i > 0 {
				s += ", "
			}
			s += fmt.Sprintf("%s %.1f", legs[i], ms(d))
		}
		return s + " ms"
	}
	return fmt.Sprintf("where an item waited (median of each leg): the slowest 1%% (%d items, end to end >= %.1f ms): %s; all %d: %s",
		b.slowN, ms(b.slowFrom), f(b.slow), b.allN, f(b.all))
}

// metrics adds the breakdown to m under prefix p.
func (b breakdown) metrics(m map[string]float64, p string) {
	for i, l := range legs {
		m[p+"slow_"+l+"_ms"] = ms(b.slow[i])
		m[p+"all_"+l+"_ms"] = ms(b.all[i])
	}
}
