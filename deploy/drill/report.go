package drill

import (
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/grpc/codes"
)

// Report is what a drill found. Lost, EarlyDeliveries,
// ResurrectedAfterAck, NacksUndone and the isolated side's writes must be
// zero.
type Report struct {
	Scenario string `json:"scenario"`
	Fault    string `json:"fault"`
	// Routers are the regions whose routers the workload used; every one
	// had producers and consumers.
	Routers []string `json:"routers"`
	// Shards are the faulted shards: those whose primary the fault kills
	// or pauses for primary-kill and mariadb-pause (the named shard and
	// those sharing its server), every shard homed in the region
	// otherwise.
	Shards []uint32 `json:"shards"`
	// FaultAt is when the fault took effect (Injection.At, or when the
	// bed's Inject returned), HealedAt when it was healed. Every figure in
	// milliseconds counts from FaultAt.
	FaultAt  time.Time `json:"fault_at"`
	HealedAt time.Time `json:"healed_at"`
	// InjectMS is how long the bed took to inject the fault; calls sent
	// before it took effect count for no RTO.
	InjectMS int64 `json:"inject_ms"`
	// HealError: the bed could not heal the fault (the drill drained
	// anyway; the figures after it mean less).
	HealError string `json:"heal_error,omitempty"`
	// FailoverMS: from the fault until a surviving router's shard map
	// showed a new, unfenced primary for every faulted shard; -1 if that
	// never happened during the fault.
	FailoverMS int64 `json:"failover_published_ms"`
	// RTO of the faulted shards, from the fault to the answer of the first
	// successful call sent after the fault, per router (RTOByRouter) and
	// for the routers that survive the fault (DequeueRTOMS, EnqueueRTOMS:
	// the slowest of them, so every surviving client was served again; -1
	// if one never was). An enqueue counts when it was acknowledged with an
	// item on a faulted shard; a dequeue when it returned an item of a
	// faulted shard whose ack or nack was then answered ok: an item served
	// from a stale prefetch buffer whose ack fails is not a recovery. The
	// faulted region's router does not survive region-down, partition and
	// nats-kill.
	DequeueRTOMS int64          `json:"dequeue_rto_ms"`
	EnqueueRTOMS int64          `json:"enqueue_rto_ms"`
	RTOByRouter  map[string]RTO `json:"rto_by_router"`
	Acknowledged int            `json:"acknowledged"`
	Delivered    int            `json:"delivered"`
	// AcksOK and NacksOK: acks and nacks answered ok.
	AcksOK  int `json:"acks_ok"`
	NacksOK int `json:"nacks_ok"`
	// Lost: acknowledged enqueues never delivered. Must be 0.
	Lost    int      `json:"lost"`
	LostIDs []string `json:"lost_ids,omitempty"`
	// LostState says, per lost item, what a router answered for it after
	// the drain: still stored (a delivery that is stuck, not a loss) or not
	// found (the row is gone).
	LostState map[string]string `json:"lost_state,omitempty"`
	// ResurrectedAfterAck: deliveries asked for after an ack of the same
	// item had been answered ok (the ack was undone). Must be 0.
	ResurrectedAfterAck int      `json:"resurrected_after_ack"`
	ResurrectedItems    int      `json:"resurrected_items"`
	ResurrectedExamples []string `json:"resurrected_examples,omitempty"`
	// KeysDeliveredAgain: deliveries of a dedup key under another item ID
	// asked for after an ack of the key's item had been answered ok: an
	// enqueue retried with the same key was inserted twice. Must be 0.
	KeysDeliveredAgain         int      `json:"keys_delivered_again"`
	KeysDeliveredAgainExamples []string `json:"keys_delivered_again_examples,omitempty"`
	// UnknownIDs: items delivered under an ID that no enqueue answered
	// ok: an attempt answered with an error that was inserted anyway (its
	// retry was then a duplicate of it, or a second item).
	UnknownIDs        int      `json:"unknown_ids"`
	UnknownIDExamples []string `json:"unknown_id_examples,omitempty"`
	// NacksUndone: deliveries asked for after a nack of the same item had
	// been answered ok that do not carry the nack's drill_nack metadata:
	// the nack was undone, the item came back as it was before it. Must
	// be 0.
	NacksUndone         int      `json:"nacks_undone"`
	NacksUndoneExamples []string `json:"nacks_undone_examples,omitempty"`
	// Isolated: partition only, what the cut-off region's router
	// acknowledged while it could reach only the old primary.
	Isolated *IsolatedWrites `json:"isolated_writes,omitempty"`
	// Duplicates: deliveries after the first, by cause.
	Duplicates map[string]int `json:"duplicates"`
	// EarlyDeliveries: delivered before their deliver_after, or before the
	// delay of a nack answered ok. Must be 0.
	EarlyDeliveries int      `json:"early_deliveries"`
	EarlyExamples   []string `json:"early_examples,omitempty"`
	// PriorityInversions: deliveries made while a more urgent item had been
	// ready (and acknowledged) for at least 5 ms and was not yet delivered.
	PriorityInversions int            `json:"priority_inversions"`
	EnqueueErrors      map[string]int `json:"enqueue_errors"`
	DequeueErrors      map[string]int `json:"dequeue_errors"`
	// FailoverSteps are the controller leader's steps on the faulted
	// shards between the fault and the heal (Admin.ListFailoverEvents),
	// each at its time from the fault: where the time to publication
	// went. The controller's clock is the drill's (one machine).
	FailoverSteps []Step `json:"failover_steps,omitempty"`
	// FailoverStepsError: the steps could not be read.
	FailoverStepsError string `json:"failover_steps_error,omitempty"`
	// OldPrimary is what became of the faulted shard's primary.
	OldPrimary string `json:"old_primary,omitempty"`
	MapBefore  string `json:"map_before,omitempty"`
	MapAfter   string `json:"map_after,omitempty"`
	// Violations lists broken invariants; empty means the drill passed.
	Violations []string `json:"violations"`
}

// Step is one failover step of the controller, AtMS from the fault.
type Step struct {
	AtMS    int64  `json:"at_ms"`
	Shard   uint32 `json:"shard"`
	Step    string `json:"step"`
	Details string `json:"details,omitempty"`
}

// RTO is one router's recovery: milliseconds from the fault to its first
// successful enqueue and dequeue of a faulted shard; -1: none. ServedMS is
// the first dequeue that returned an item of a faulted shard, whether or
// not its ack or nack then succeeded: a gap between it and DequeueMS is
// time lost to acks, not to serving.
type RTO struct {
	EnqueueMS int64 `json:"enqueue_ms"`
	DequeueMS int64 `json:"dequeue_ms"`
	ServedMS  int64 `json:"served_ms"`
}

// IsolatedWrites counts the writes the partitioned region's router
// answered ok after a new primary of the item's shard was published and
// before the heal was asked for. In that window every cross-region link is
// cut, so that router can reach only the old primary: each such answer
// acknowledges a write the failover discards. All must be 0.
type IsolatedWrites struct {
	Region string `json:"region"`
	// PublishedMS: from the fault until the first faulted shard's new
	// primary was seen published; -1: never, and nothing was checked.
	PublishedMS int64 `json:"published_ms"`
	// HealMS: from the fault until the heal was asked for.
	HealMS   int64    `json:"heal_ms"`
	Enqueues int      `json:"enqueues"`
	Acks     int      `json:"acks"`
	Nacks    int      `json:"nacks"`
	Examples []string `json:"examples,omitempty"`
	// Deliveries the isolated router made in the same window: not writes
	// the client was told are durable, but items leased on the old primary.
	Deliveries int `json:"deliveries"`
	// SentAfterCut: writes the isolated router answered ok that were sent
	// after the cut was in place and answered before the heal, whether or
	// not a new primary was published yet. Informational: with semi-sync
	// that never falls back to async the old primary cannot complete such
	// a commit, so this is 0 too; when it is not, the acks among them are
	// what comes back as resurrected after ack.
	SentAfterCut         WriteCounts `json:"sent_after_cut"`
	SentAfterCutExamples []string    `json:"sent_after_cut_examples,omitempty"`
}

// WriteCounts counts writes answered ok.
type WriteCounts struct {
	Enqueues int `json:"enqueues"`
	Acks     int `json:"acks"`
	Nacks    int `json:"nacks"`
}

// Total is the sum.
func (w WriteCounts) Total() int { return w.Enqueues + w.Acks + w.Nacks }

// Total is every write acknowledged in the window.
func (i *IsolatedWrites) Total() int { return i.Enqueues + i.Acks + i.Nacks }

// facts are what the drill knows about the fault, beside the history.
type facts struct {
	faultAt time.Time
	// cutAt is when the fault was in place (its injection answered);
	// healAt when the heal was asked for.
	cutAt, healAt time.Time
	// shards are the faulted shards.
	shards map[uint32]bool
	// routers are the regions of the routers used; survivors those whose
	// clients count for the headline RTO.
	routers   []string
	survivors map[string]bool
	// isolated is the partitioned region ("" for other scenarios).
	isolated string
	// published: per faulted shard, when a new primary was first seen.
	published map[uint32]time.Time
}

const maxExamples = 10

// analyze fills the report's counts from the history the workload
// recorded. It is pure, so the classification is unit tested.
func analyze(r *Report, h *history, f facts) {
	at := func(t time.Time) string { return fmt.Sprintf("%+.3fs", t.Sub(f.faultAt).Seconds()) }
	r.Acknowledged = len(h.sent)
	r.AcksOK, r.NacksOK = len(h.acks), len(h.nacks)
	byID, first := deliveriesByID(h)
	r.Delivered = len(first)
	redeliveries(r, byID, newSettlements(h), at)
	lostAndEarly(r, h, first, at)
	keys(r, h, first, at)
	r.PriorityInversions = inversions(h, first)
	r.EnqueueErrors = codeCounts(h.enqErrs)
	r.DequeueErrors = codeCounts(h.deqErrs)
	rto(r, h, f)
	isolated(r, h, f, at)
	violations(r)
}

// deliveriesByID groups the history's deliveries by item, each item's in
// the order they were answered, and returns them with each item's first.
func deliveriesByID(h *history) (byID map[string][]delivery, first map[string]delivery) {
	byID = map[string][]delivery{}
	for _, d := range h.deliveries {
		byID[d.id] = append(byID[d.id], d)
	}
	for _, ds := range byID {
		sort.SliceStable(ds, func(i, j int) bool { return ds[i].at.Before(ds[j].at) })
	}
	first = map[string]delivery{}
	for id, ds := range byID {
		first[id] = ds[0]
	}
	return byID, first
}

// settlements are the acks and nacks answered ok, by item: what a later
// delivery of the item is checked against.
type settlements struct {
	// acked is each item's first ack answered ok: any delivery asked for
	// after it was answered is an undone ack.
	acked   map[string]settle
	nacksOf map[string][]settle
}

func newSettlements(h *history) settlements {
	s := settlements{acked: map[string]settle{}, nacksOf: map[string][]settle{}}
	for _, a := range h.acks {
		if p, ok := s.acked[a.id]; !ok || a.end.Before(p.end) {
			s.acked[a.id] = a
		}
	}
	for _, n := range h.nacks {
		s.nacksOf[n.id] = append(s.nacksOf[n.id], n)
	}
	return s
}

// resurrected returns the ack d came after, if d was asked for after an
// ack of its item had been answered ok.
func (s settlements) resurrected(d delivery) (settle, bool) {
	a, ok := s.acked[d.id]
	return a, ok && d.reqStart.After(a.end)
}

// redeliveries checks every delivery, item by item in ID order, against
// the item's acks and nacks answered ok before it was asked for (acks
// undone, nacks undone or not waited out), and counts every delivery
// after an item's first by its cause.
func redeliveries(r *Report, byID map[string][]delivery, s settlements, at func(time.Time) string) {
	ids := make([]string, 0, len(byID))
	for id := range byID {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	r.Duplicates = map[string]int{}
	for _, id := range ids {
		ds := byID[id]
		itemResurrected := false
		for i, d := range ds {
			if a, ok := s.resurrected(d); ok {
				r.ResurrectedAfterAck++
				itemResurrected = true
				if len(r.ResurrectedExamples) < maxExamples {
					r.ResurrectedExamples = append(r.ResurrectedExamples, fmt.Sprintf(
						"%s acked ok via %s at %s, delivered again via %s at %s (attempt %d)",
						id, a.router, at(a.end), d.router, at(d.at), d.attempts))
				}
			}
			afterNacks(r, d, s.nacksOf[id], at)
			if i > 0 {
				r.Duplicates[duplicateCause(ds[i-1], d, s)]++
			}
		}
		if itemResurrected {
			r.ResurrectedItems++
		}
	}
}

// afterNacks checks delivery d against nacks, its item's nacks answered
// ok: it must carry the drill_nack of the last one answered before it
// was asked for, and respect the delay of each.
func afterNacks(r *Report, d delivery, nacks []settle, at func(time.Time) string) {
	var last settle
	for _, n := range nacks {
		if !d.reqStart.After(n.end) {
			continue
		}
		if n.nackSeq > last.nackSeq {
			last = n
		}
		// The server set deliver_after to its now + delay, and its now is
		// after the nack was sent.
		if ready := n.start.Add(n.delay); d.at.Before(ready.Add(-time.Millisecond)) {
			r.EarlyDeliveries++
			if len(r.EarlyExamples) < maxExamples {
				r.EarlyExamples = append(r.EarlyExamples, fmt.Sprintf(
					"%s nacked ok via %s with delay %s (ready at %s), delivered via %s at %s (asked at %s)",
					d.id, n.router, n.delay, at(ready), d.router, at(d.at), at(d.reqStart)))
			}
		}
	}
	if last.nackSeq > 0 && d.nackSeq < last.nackSeq {
		r.NacksUndone++
		if len(r.NacksUndoneExamples) < maxExamples {
			r.NacksUndoneExamples = append(r.NacksUndoneExamples, fmt.Sprintf(
				"%s nacked ok (drill_nack %d) via %s at %s, delivered via %s at %s with drill_nack %d (attempt %d)",
				d.id, last.nackSeq, last.router, at(last.end), d.router, at(d.at), d.nackSeq, d.attempts))
		}
	}
}

// duplicateCause says why d, a delivery after its item's first, came
// after prev, the one before it.
func duplicateCause(prev, d delivery, s settlements) string {
	switch {
	case func() bool { _, ok := s.resurrected(d); return ok }():
		return "resurrected after ack"
	case prev.action == "nack" && !prev.ackErr:
		return "nack"
	case prev.action == "crash":
		return "lease expiry (consumer crashed holding the lease)"
	case prev.ackErr:
		return "lease expiry (ack or nack failed during the fault)"
	}
	return "lease expiry"
}

// lostAndEarly checks every acknowledged enqueue, in ID order, against
// its item's first delivery: never delivered is lost; delivered before
// its deliver_after is early.
func lostAndEarly(r *Report, h *history, first map[string]delivery, at func(time.Time) string) {
	sentIDs := make([]string, 0, len(h.sent))
	for id := range h.sent {
		sentIDs = append(sentIDs, id)
	}
	sort.Strings(sentIDs)
	for _, id := range sentIDs {
		s := h.sent[id]
		d, ok := first[id]
		if !ok {
			r.Lost++
			if len(r.LostIDs) < 20 {
				r.LostIDs = append(r.LostIDs, id)
			}
			continue
		}
		// Clock granularity and the two timestamps' sources: allow 1 ms.
		if d.at.Before(s.readyAt.Add(-time.Millisecond)) {
			r.EarlyDeliveries++
			if len(r.EarlyExamples) < maxExamples {
				r.EarlyExamples = append(r.EarlyExamples, fmt.Sprintf(
					"%s enqueued via %s for %s, delivered via %s at %s (asked at %s)",
					id, s.router, at(s.readyAt), d.router, at(d.at), at(d.reqStart)))
			}
		}
	}
}

// codeCounts are errs by the gRPC code's name.
func codeCounts(errs map[codes.Code]int) map[string]int {
	out := map[string]int{}
	for c, n := range errs {
		out[c.String()] = n
	}
	return out
}

// violations lists the invariants the report's counts break.
func violations(r *Report) {
	if r.Lost > 0 {
		r.Violations = append(r.Violations, fmt.Sprintf("%d acknowledged items lost", r.Lost))
	}
	if r.EarlyDeliveries > 0 {
		r.Violations = append(r.Violations, fmt.Sprintf("%d items delivered before their deliver_after", r.EarlyDeliveries))
	}
	if r.ResurrectedAfterAck > 0 {
		r.Violations = append(r.Violations, fmt.Sprintf("%d deliveries of %d items resurrected after ack", r.ResurrectedAfterAck, r.ResurrectedItems))
	}
	if r.KeysDeliveredAgain > 0 {
		r.Violations = append(r.Violations, fmt.Sprintf("%d deliveries of a dedup key under another ID after its item was acked (an enqueue inserted twice)", r.KeysDeliveredAgain))
	}
	if r.NacksUndone > 0 {
		r.Violations = append(r.Violations, fmt.Sprintf("%d deliveries after a nack answered ok without its effect (nack undone)", r.NacksUndone))
	}
	if i := r.Isolated; i != nil && i.Total() > 0 {
		r.Violations = append(r.Violations, fmt.Sprintf(
			"the isolated region %s acknowledged %d writes after the new primary was published (%d enqueues, %d acks, %d nacks)",
			i.Region, i.Total(), i.Enqueues, i.Acks, i.Nacks))
	}
}

// keys follows the items by dedup key, where analyze follows them by ID:
// a retried enqueue whose first attempt was inserted too shows as a key
// delivered under two IDs, each delivered once and acked once.
func keys(r *Report, h *history, first map[string]delivery, at func(time.Time) string) {
	acked := map[string]settle{} // the first ack answered ok, per key
	for _, a := range h.acks {
		if p, ok := acked[a.key]; a.key != "" && (!ok || a.end.Before(p.end)) {
			acked[a.key] = a
		}
	}
	for _, d := range h.deliveries {
		a, ok := acked[d.key]
		if !ok || d.id == a.id || !d.reqStart.After(a.end) {
			continue
		}
		r.KeysDeliveredAgain++
		if len(r.KeysDeliveredAgainExamples) < maxExamples {
			r.KeysDeliveredAgainExamples = append(r.KeysDeliveredAgainExamples, fmt.Sprintf(
				"key %s: %s acked ok via %s at %s, delivered again as %s via %s at %s (attempt %d)",
				d.key, a.id, a.router, at(a.end), d.id, d.router, at(d.at), d.attempts))
		}
	}
	ids := make([]string, 0, len(first))
	for id := range first {
		if _, ok := h.sent[id]; !ok {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	r.UnknownIDs = len(ids)
	for _, id := range ids[:min(len(ids), maxExamples)] {
		d := first[id]
		r.UnknownIDExamples = append(r.UnknownIDExamples, fmt.Sprintf("%s (key %s) first delivered via %s at %s", id, d.key, d.router, at(d.at)))
	}
}

// inversions: for each first delivery, any more urgent item that had been
// ready and acknowledged for 5 ms and was delivered only more than 5 ms
// later.
func inversions(h *history, first map[string]delivery) int {
	type ev struct {
		at       time.Time
		priority int32
	}
	var evs []ev
	for _, d := range first {
		evs = append(evs, ev{d.at, d.priority})
	}
	sort.Slice(evs, func(i, j int) bool { return evs[i].at.Before(evs[j].at) })
	const slack = 5 * time.Millisecond
	n := 0
	for id, s := range h.sent {
		d, ok := first[id]
		if !ok {
			continue
		}
		since := s.readyAt
		if s.ackedAt.After(since) {
			since = s.ackedAt
		}
		since = since.Add(slack)
		until := d.at.Add(-slack)
		lo := sort.Search(len(evs), func(i int) bool { return !evs[i].at.Before(since) })
		for i := lo; i < len(evs) && evs[i].at.Before(until); i++ {
			if evs[i].priority > s.priority {
				n++
			}
		}
	}
	return n
}

// rto computes the recovery times (see Report.DequeueRTOMS): per router,
// the first call sent after the fault that succeeded on a faulted shard.
func rto(r *Report, h *history, f facts) {
	firstEnq := map[string]time.Time{}
	for _, c := range h.enqueues {
		if c.ok && !c.start.Before(f.faultAt) && f.shards[shardOf(c.id)] {
			if t, ok := firstEnq[c.router]; !ok || c.end.Before(t) {
				firstEnq[c.router] = c.end
			}
		}
	}
	firstDeq, firstServed := map[string]time.Time{}, map[string]time.Time{}
	for _, d := range h.deliveries {
		if !d.reqStart.Before(f.faultAt) && f.shards[shardOf(d.id)] {
			if t, seen := firstServed[d.router]; !seen || d.at.Before(t) {
				firstServed[d.router] = d.at
			}
		}
		// ackErr is false for an ack or nack only when it was answered ok.
		if d.reqStart.Before(f.faultAt) || !f.shards[shardOf(d.id)] || d.ackErr || d.action == "crash" {
			continue
		}
		if t, seen := firstDeq[d.router]; !seen || d.at.Before(t) {
			firstDeq[d.router] = d.at
		}
	}
	ms := func(m map[string]time.Time, router string) int64 {
		t, ok := m[router]
		if !ok {
			return -1
		}
		return t.Sub(f.faultAt).Milliseconds()
	}
	r.RTOByRouter = map[string]RTO{}
	var enq, deq []int64
	for _, router := range f.routers {
		x := RTO{EnqueueMS: ms(firstEnq, router), DequeueMS: ms(firstDeq, router), ServedMS: ms(firstServed, router)}
		r.RTOByRouter[router] = x
		if f.survivors[router] {
			enq, deq = append(enq, x.EnqueueMS), append(deq, x.DequeueMS)
		}
	}
	r.EnqueueRTOMS, r.DequeueRTOMS = slowest(enq), slowest(deq)
}

// slowest is the largest RTO, or -1 if one router never recovered or
// there is none.
func slowest(v []int64) int64 {
	if len(v) == 0 || slices.Contains(v, -1) {
		return -1
	}
	return slices.Max(v)
}

// isolated counts what the partitioned region's router acknowledged
// between the publication of a new primary and the heal.
func isolated(r *Report, h *history, f facts, at func(time.Time) string) {
	if f.isolated == "" {
		return
	}
	iw := &IsolatedWrites{Region: f.isolated, PublishedMS: -1, HealMS: f.healAt.Sub(f.faultAt).Milliseconds()}
	r.Isolated = iw
	for _, t := range f.published {
		if ms := t.Sub(f.faultAt).Milliseconds(); iw.PublishedMS < 0 || ms < iw.PublishedMS {
			iw.PublishedMS = ms
		}
	}
	in := func(router, id string, end time.Time) bool {
		p, ok := f.published[shardOf(id)]
		return router == f.isolated && ok && end.After(p) && !end.After(f.healAt)
	}
	afterCut := func(router string, start, end time.Time) bool {
		return router == f.isolated && start.After(f.cutAt) && !end.After(f.healAt)
	}
	cutExample := func(what, id string, start, end time.Time) {
		if len(iw.SentAfterCutExamples) < maxExamples {
			iw.SentAfterCutExamples = append(iw.SentAfterCutExamples, fmt.Sprintf("%s of %s sent at %s, answered ok at %s",
				what, id, at(start), at(end)))
		}
	}
	for _, c := range h.enqueues {
		if c.ok && afterCut(c.router, c.start, c.end) {
			iw.SentAfterCut.Enqueues++
			cutExample("enqueue", c.id, c.start, c.end)
		}
	}
	for _, a := range h.acks {
		if afterCut(a.router, a.start, a.end) {
			iw.SentAfterCut.Acks++
			cutExample("ack", a.id, a.start, a.end)
		}
	}
	for _, n := range h.nacks {
		if afterCut(n.router, n.start, n.end) {
			iw.SentAfterCut.Nacks++
			cutExample("nack", n.id, n.start, n.end)
		}
	}
	example := func(what, id string, end time.Time) {
		if len(iw.Examples) < maxExamples {
			iw.Examples = append(iw.Examples, fmt.Sprintf("%s of %s answered ok at %s (new primary published at %s)",
				what, id, at(end), at(f.published[shardOf(id)])))
		}
	}
	for _, c := range h.enqueues {
		if c.ok && in(c.router, c.id, c.end) {
			iw.Enqueues++
			example("enqueue", c.id, c.end)
		}
	}
	for _, a := range h.acks {
		if in(a.router, a.id, a.end) {
			iw.Acks++
			example("ack", a.id, a.end)
		}
	}
	for _, n := range h.nacks {
		if in(n.router, n.id, n.end) {
			iw.Nacks++
			example("nack", n.id, n.end)
		}
	}
	for _, d := range h.deliveries {
		if in(d.router, d.id, d.at) {
			iw.Deliveries++
		}
	}
}

// Print writes the report for people.
func (r *Report) Print(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	row := func(k string, v any) { fmt.Fprintf(tw, "  %s\t%v\n", k, v) }
	fmt.Fprintf(tw, "drill %s: %s\n", r.Scenario, r.Fault)
	row("routers with clients", strings.Join(r.Routers, ", "))
	row("faulted shards", shortList(r.Shards))
	row("fault injected in", fmtMS(r.InjectMS))
	r.printRecovery(row)
	r.printChecks(row)
	r.printIsolated(row)
	row("early deliveries (must be 0)", r.EarlyDeliveries)
	printExamples(row, r.EarlyExamples)
	row("duplicates", fmtCounts(r.Duplicates))
	row("priority inversions (ready >= 5 ms)", r.PriorityInversions)
	row("enqueue errors during the fault", fmtCounts(r.EnqueueErrors))
	row("dequeue errors during the fault", fmtCounts(r.DequeueErrors))
	r.printFailover(row)
	row("result", r.Verdict())
	tw.Flush()
}

// printRecovery writes when the new primary was published and the RTOs,
// for the surviving routers and per router.
func (r *Report) printRecovery(row func(string, any)) {
	if r.FailoverMS < 0 {
		row("new primary published", "not during the fault")
	} else {
		row("new primary published", fmtMS(r.FailoverMS))
	}
	row("dequeue RTO (surviving routers)", fmtMS(r.DequeueRTOMS))
	row("enqueue RTO (surviving routers)", fmtMS(r.EnqueueRTOMS))
	routers := make([]string, 0, len(r.RTOByRouter))
	for k := range r.RTOByRouter {
		routers = append(routers, k)
	}
	sort.Strings(routers)
	for _, k := range routers {
		x := r.RTOByRouter[k]
		row("  via "+k, fmt.Sprintf("dequeue %s (first served %s), enqueue %s", fmtMS(x.DequeueMS), fmtMS(x.ServedMS), fmtMS(x.EnqueueMS)))
	}
}

// printChecks writes the counts of the workload's items and the checks
// of acks, nacks and keys, with their examples.
func (r *Report) printChecks(row func(string, any)) {
	row("acknowledged enqueues", r.Acknowledged)
	row("delivered (distinct)", r.Delivered)
	row("acks / nacks answered ok", fmt.Sprintf("%d / %d", r.AcksOK, r.NacksOK))
	row("lost (must be 0)", r.Lost)
	for _, id := range sortedKeys(r.LostState) {
		row("", id+": "+r.LostState[id])
	}
	row("resurrected after ack (must be 0)", fmt.Sprintf("%d deliveries of %d items", r.ResurrectedAfterAck, r.ResurrectedItems))
	printExamples(row, r.ResurrectedExamples)
	row("keys delivered again after their ack (must be 0)", r.KeysDeliveredAgain)
	printExamples(row, r.KeysDeliveredAgainExamples)
	row("delivered IDs no enqueue was answered with", r.UnknownIDs)
	printExamples(row, r.UnknownIDExamples)
	row("nacks undone (must be 0)", r.NacksUndone)
	printExamples(row, r.NacksUndoneExamples)
}

// printIsolated writes, for a partition, the writes the isolated
// region's router acknowledged.
func (r *Report) printIsolated(row func(string, any)) {
	i := r.Isolated
	if i == nil {
		return
	}
	if i.PublishedMS < 0 {
		row("writes acked by isolated "+i.Region, "not checked: no new primary was published during the fault")
	} else {
		row("writes acked by isolated "+i.Region+" (must be 0)", fmt.Sprintf(
			"%d (enqueues %d, acks %d, nacks %d) between publication at %s and heal at %s; %d deliveries there",
			i.Total(), i.Enqueues, i.Acks, i.Nacks, fmtMS(i.PublishedMS), fmtMS(i.HealMS), i.Deliveries))
	}
	printExamples(row, i.Examples)
	c := i.SentAfterCut
	row("writes sent to isolated "+i.Region+" after the cut, acked ok", fmt.Sprintf(
		"%d (enqueues %d, acks %d, nacks %d): with semi-sync that never falls back to async, 0", c.Total(), c.Enqueues, c.Acks, c.Nacks))
	printExamples(row, i.SentAfterCutExamples)
}

// printFailover writes the shard map before and after, the controller's
// failover steps, the old primary's fate and a failed heal.
func (r *Report) printFailover(row func(string, any)) {
	if r.MapBefore != "" {
		row("shard map before", r.MapBefore)
		row("shard map after", r.MapAfter)
	}
	for i, st := range r.FailoverSteps {
		k := ""
		if i == 0 {
			k = "failover steps (from the fault)"
		}
		row(k, fmt.Sprintf("%s shard %d %s: %s", fmtMS(st.AtMS), st.Shard, st.Step, st.Details))
	}
	if r.FailoverStepsError != "" {
		row("failover steps", "unavailable: "+r.FailoverStepsError)
	}
	if r.OldPrimary != "" {
		row("old primary", r.OldPrimary)
	}
	if r.HealError != "" {
		row("heal", "FAILED: "+r.HealError)
	}
}

// printExamples writes examples, one a row, under the row they are of.
func printExamples(row func(string, any), examples []string) {
	for _, e := range examples {
		row("", e)
	}
}

// Verdict is "PASS", or "FAIL: " and the violations.
func (r *Report) Verdict() string {
	if len(r.Violations) == 0 {
		return "PASS"
	}
	return "FAIL: " + strings.Join(r.Violations, "; ")
}

func fmtMS(ms int64) string {
	if ms < 0 {
		return "never"
	}
	return (time.Duration(ms) * time.Millisecond).String()
}

// sortedKeys returns m's keys in order, so a report prints the same way
// every time.
func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func fmtCounts(m map[string]int) string {
	if len(m) == 0 {
		return "none"
	}
	var parts []string
	for k, v := range m {
		parts = append(parts, fmt.Sprintf("%s: %d", k, v))
	}
	sort.Strings(parts)
	return strings.Join(parts, ", ")
}

// shortList prints ids, the first ten and a count when there are more.
func shortList(ids []uint32) string {
	if len(ids) <= 10 {
		return fmt.Sprint(ids)
	}
	return fmt.Sprintf("%v ... (%d)", ids[:10], len(ids))
}
