package queuemodel

import (
	"bytes"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
	"github.com/triage-queue/triage/schema/itemid"
)

// Config describes the namespace under test and the tolerances the
// documentation allows.
type Config struct {
	// MaxAttempts of the namespace (deliveries before the DLQ). Required.
	MaxAttempts int
	// DefaultLease of the namespace, for items enqueued without one.
	DefaultLease time.Duration
	// Slack is how long after an item becomes ready a dequeue may still
	// miss it (the dequeuer rechecks an exhausted shard every 100 ms).
	// Default 300 ms.
	Slack time.Duration
	// SweepSlack is how long an item past its TTL may still be found (the
	// TTL sweep runs every second). Default 1.5 s.
	SweepSlack time.Duration
	// LeaseSlack is how far a served lease's expiry may differ from
	// now + lease (the dequeuer re-stamps only beyond 250 ms). Default 250 ms.
	LeaseSlack time.Duration
	// ClockSlack is how far the shard primary's clock, which stamps
	// leases, nacks and readiness (shardmap.Clock, measured to within half
	// a round trip), may be from the test's. Default 20 ms.
	ClockSlack time.Duration
	// Tolerate names known bugs whose checks are relaxed (see Known*).
	// Empty: strict.
	Tolerate map[string]bool
}

// Known bugs a run may tolerate while they are being fixed. The final test
// runs with none.
const (
	// KnownPrefetchAttempts: GetItem and UpdateItem report attempts + 1 for
	// an item sitting in a prefetch buffer.
	KnownPrefetchAttempts = "prefetch-attempts"
	// KnownResponseOrder: a dequeue that refills its buffer part way
	// appends what it found later after what it took first, so one
	// response is not always in (priority, deliver_after, id) order.
	KnownResponseOrder = "response-order"
	// KnownBufferedRecheck: a shard whose prefetch buffer holds items is
	// not read again until it drains (or idles 2 s), so an item that
	// becomes ready by time passing (a lapsed lease, a delay, a nack) waits
	// behind less urgent buffered ones; only announced items (enqueues,
	// updates, redrives) jump the buffer.
	KnownBufferedRecheck = "buffered-recheck"
	// KnownNackDeadMetadata: a nack that dead-letters the item drops the
	// nack's metadata instead of merging it.
	KnownNackDeadMetadata = "nack-dead-metadata"
	// KnownTTLShortAnswer: a buffered item whose TTL passed is taken in its
	// turn and then dropped from the answer with no replacement, so the
	// dequeue returns fewer items than it asked for while more are ready.
	KnownTTLShortAnswer = "ttl-short-answer"
)

// State is where an item is, as far as the model knows.
type State int

// Item states.
const (
	// InItems: in the items table (ready, delayed, or leased).
	InItems State = iota
	// Dead: in the dead-letter table.
	Dead
	// DeadOrGone: a not-found answer came while the item might have been
	// dead-lettered or expired; the next DLQ listing tells which.
	DeadOrGone
	// Gone: acked, deleted or expired.
	Gone
	// Phantom: a BUFFERED enqueue's ID whose dedup key was taken; it never
	// exists.
	Phantom
)

func (s State) String() string {
	return [...]string{"in-items", "dead", "dead-or-gone", "gone", "phantom"}[s]
}

// Span is when a call ran, on the client's clock (shared with the server).
type Span struct{ Start, End time.Time }

// Item is the model of one item.
type Item struct {
	ID       string
	Key      uint64 // the ID's key, for the id tie-break
	Topic    string
	Priority int32
	Payload  []byte
	Meta     map[string]string
	DedupKey string
	LeaseDur time.Duration // the item's own lease
	// TTL: the server's expires_at is in [ExpLo, ExpHi]; zero: no TTL.
	ExpLo, ExpHi time.Time
	State        State
	// The server's deliver_after is in [DALo, DAHi]. While a consumer holds
	// a lease, both are the lease's expiry (the server reports it exactly).
	DALo, DAHi time.Time
	// Attempts: deliveries that reached a consumer.
	Attempts int
	// Token of the last delivery, while it may still be the item's current
	// one; TokenMaybeStale once a dequeue of the topic ran after the lease
	// lapsed (the prefetch may have leased the item again).
	Token           string
	TokenMaybeStale bool
	// MaybeDead: out of attempts and its lease lapsed before a dequeue of
	// the topic, which may have moved it to the dead-letter table.
	MaybeDead bool
	// LastError: the error of the nack that dead-lettered the item.
	LastError string
	// Deliveries is every delivery's token, oldest first.
	Deliveries []string
	// Removed says why the item is Gone ("acked", "deleted", "expired").
	Removed string
	// Unsettled: a BUFFERED enqueue whose insert is not yet confirmed.
	Unsettled bool
	// Timed: the item became (or becomes) ready by time passing or by a
	// nack, with no announcement to the dequeuer.
	Timed bool
}

// Model is the reference model. It is not safe for concurrent use.
type Model struct {
	cfg     Config
	items   map[string]*Item
	order   []string // IDs in enqueue order, for deterministic iteration
	lastDeq map[string]time.Time
}

// New returns an empty model.
func New(cfg Config) *Model {
	if cfg.Slack == 0 {
		cfg.Slack = 300 * time.Millisecond
	}
	if cfg.SweepSlack == 0 {
		cfg.SweepSlack = 1500 * time.Millisecond
	}
	if cfg.LeaseSlack == 0 {
		cfg.LeaseSlack = 250 * time.Millisecond
	}
	if cfg.ClockSlack == 0 {
		cfg.ClockSlack = 20 * time.Millisecond
	}
	if cfg.DefaultLease == 0 {
		cfg.DefaultLease = 30 * time.Second
	}
	return &Model{cfg: cfg, items: map[string]*Item{}, lastDeq: map[string]time.Time{}}
}

// Violation is a disagreement between the system and the model.
type Violation struct{ Msg string }

func (v *Violation) Error() string { return "violation: " + v.Msg }

func violation(format string, args ...any) error {
	return &Violation{Msg: fmt.Sprintf(format, args...)}
}

func lo(t time.Time) time.Time { return t.Truncate(time.Microsecond) }

// Item returns the model of id, or nil.
func (m *Model) Item(id string) *Item { return m.items[id] }

// Items returns every item in enqueue order.
func (m *Model) Items() []*Item {
	out := make([]*Item, 0, len(m.order))
	for _, id := range m.order {
		out = append(out, m.items[id])
	}
	return out
}

// Held returns items a consumer holds a token for (lapsed or not).
func (m *Model) Held() []*Item {
	var out []*Item
	for _, it := range m.Items() {
		if it.State == InItems && it.Token != "" {
			out = append(out, it)
		}
	}
	return out
}

// Live returns items in the items table (or possibly there).
func (m *Model) Live() []*Item {
	var out []*Item
	for _, it := range m.Items() {
		if it.State == InItems {
			out = append(out, it)
		}
	}
	return out
}

// ttl classifies an item's TTL over a span: alive for sure, maybe gone, or
// gone for sure.
func (m *Model) ttl(it *Item, sp Span) (maybe, surely bool) {
	if it.ExpLo.IsZero() {
		return false, false
	}
	if sp.Start.After(it.ExpHi.Add(m.cfg.SweepSlack)) {
		return true, true
	}
	return !sp.End.Before(it.ExpLo), false
}

// outcome of a per-item call.
type outcome int

const (
	ok outcome = iota
	stale
	notFound
	other
)

func (o outcome) String() string { return [...]string{"ok", "stale", "not-found", "other"}[o] }

type outcomes map[outcome]bool

func (os outcomes) String() string {
	var s []string
	for o := range os {
		s = append(s, o.String())
	}
	sort.Strings(s)
	return strings.Join(s, "|")
}

// expect returns the outcomes a token call (ack, nack, extend) on id with
// tok may have during sp.
func (m *Model) expect(id, tok string, sp Span) outcomes {
	it := m.items[id]
	if it == nil || it.State == Gone || it.State == Phantom || it.State == Dead || it.State == DeadOrGone {
		return outcomes{notFound: true}
	}
	maybeGone, surelyGone := m.ttl(it, sp)
	if surelyGone {
		return outcomes{notFound: true}
	}
	out := outcomes{}
	if maybeGone || it.MaybeDead {
		out[notFound] = true
	}
	switch {
	case tok != "" && tok == it.Token:
		out[ok] = true
		if it.TokenMaybeStale {
			out[stale] = true
		}
	default:
		out[stale] = true
	}
	return out
}

// gone records a not-found answer for an item that may have been gone.
func (m *Model) gone(it *Item, sp Span) {
	maybeTTL, _ := m.ttl(it, sp)
	switch {
	case it.MaybeDead && maybeTTL:
		it.State = DeadOrGone
	case it.MaybeDead:
		it.State = Dead
	default:
		it.State, it.Removed = Gone, "expired"
	}
	it.Token, it.MaybeDead = "", false
}

func classify(r *triagev1.ItemResult) outcome {
	switch {
	case r.Ok:
		return ok
	case strings.Contains(r.Error, "stale lease token"):
		return stale
	case strings.Contains(r.Error, "not found"):
		return notFound
	}
	return other
}

func classifyErr(err error) outcome {
	switch status.Code(err) {
	case codes.OK:
		return ok
	case codes.FailedPrecondition:
		return stale
	case codes.NotFound:
		return notFound
	}
	return other
}

// holder returns the item in the items table holding a dedup key, and
// whether it may be gone.
func (m *Model) holder(topic, key string, sp Span) (*Item, bool) {
	for _, it := range m.Items() {
		if it.State == InItems && it.Topic == topic && it.DedupKey == key && !it.Unsettled {
			maybe, surely := m.ttl(it, sp)
			if surely {
				continue
			}
			return it, maybe || it.MaybeDead
		}
	}
	return nil, false
}

// Enqueue checks an enqueue's answer and adds its items. BUFFERED items stay
// unsettled until Settle.
func (m *Model) Enqueue(sp Span, req *triagev1.EnqueueRequest, resp *triagev1.EnqueueResponse, err error) error {
	if err != nil {
		return violation("enqueue of %d items refused: %v", len(req.Items), err)
	}
	if len(resp.Results) != len(req.Items) {
		return violation("enqueue of %d items answered %d results", len(req.Items), len(resp.Results))
	}
	buffered := req.Durability == triagev1.Durability_BUFFERED
	for i, ni := range req.Items {
		r := resp.Results[i]
		if ni.DedupKey != "" && !buffered {
			h, maybe := m.holder(req.Topic, ni.DedupKey, sp)
			switch {
			case r.Duplicate && h != nil && r.Id == h.ID:
				continue
			case r.Duplicate:
				want := "a new item"
				if h != nil {
					want = "duplicate of " + h.ID
				}
				return violation("enqueue items[%d] dedup_key %q: answered duplicate of %s, want %s", i, ni.DedupKey, r.Id, want)
			case h != nil && !maybe:
				return violation("enqueue items[%d] dedup_key %q: answered new item %s, but live item %s holds the key (want duplicate: true)",
					i, ni.DedupKey, r.Id, h.ID)
			case h != nil:
				m.gone(h, sp) // the holder was gone after all
			}
		} else if r.Duplicate {
			return violation("enqueue items[%d] (no dedup key or BUFFERED): answered duplicate: true", i)
		}
		if m.items[r.Id] != nil {
			return violation("enqueue items[%d]: answered ID %s, which an earlier item has", i, r.Id)
		}
		id, perr := itemid.Parse(r.Id)
		if perr != nil {
			return violation("enqueue items[%d]: bad ID %q: %v", i, r.Id, perr)
		}
		it := &Item{
			ID: r.Id, Key: id.Key, Topic: req.Topic, Priority: ni.Priority, Payload: ni.Payload,
			Meta: maps.Clone(ni.Metadata), DedupKey: ni.DedupKey, LeaseDur: m.cfg.DefaultLease,
			DALo: lo(sp.Start), DAHi: sp.End, Unsettled: buffered,
		}
		if it.Meta == nil {
			it.Meta = map[string]string{}
		}
		if ni.LeaseDuration != nil && ni.LeaseDuration.AsDuration() > 0 {
			it.LeaseDur = ni.LeaseDuration.AsDuration()
		}
		if ni.DeliverAfter != nil {
			it.DALo = ni.DeliverAfter.AsTime()
			it.DAHi = it.DALo
			it.Timed = it.DALo.After(sp.Start)
		}
		if ni.Ttl != nil && ni.Ttl.AsDuration() > 0 {
			it.ExpLo, it.ExpHi = lo(sp.Start).Add(ni.Ttl.AsDuration()), sp.End.Add(ni.Ttl.AsDuration())
		}
		m.items[it.ID] = it
		m.order = append(m.order, it.ID)
	}
	return nil
}

// Settle records whether a BUFFERED item exists once its batch is
// inserted: it must unless a live item held its dedup key.
func (m *Model) Settle(sp Span, id string, found bool) error {
	it := m.items[id]
	if it == nil || !it.Unsettled {
		return fmt.Errorf("queuemodel: Settle(%s): not an unsettled item", id)
	}
	var h *Item
	maybe := false
	if it.DedupKey != "" {
		h, maybe = m.holder(it.Topic, it.DedupKey, sp)
	}
	it.Unsettled = false
	switch {
	case found && h != nil && !maybe:
		return violation("BUFFERED item %s with dedup_key %q was inserted although live item %s holds the key", id, it.DedupKey, h.ID)
	case found && h != nil:
		m.gone(h, sp)
	case !found && h == nil:
		return violation("BUFFERED item %s (dedup_key %q) acknowledged but never inserted: lost", id, it.DedupKey)
	case !found:
		it.State = Phantom
	}
	return nil
}

// before reports whether a must be delivered before b (b as reported,
// with deliver_after bDA), given what the model knows of a.
func before(a *Item, bPrio int32, bDA time.Time, bKey uint64) bool {
	if a.Priority != bPrio {
		return a.Priority < bPrio
	}
	if a.DAHi.Before(bDA) {
		return true
	}
	return a.DALo.Equal(a.DAHi) && a.DAHi.Equal(bDA) && a.Key < bKey
}

// available returns the items of topic that have surely been ready since
// at (ready for Slack, not leased, not out of attempts, not near their TTL),
// in delivery order as far as the model knows.
func (m *Model) available(topic string, at time.Time, until time.Time) []*Item {
	var out []*Item
	for _, it := range m.Items() {
		if it.State != InItems || it.Topic != topic || it.Unsettled || it.MaybeDead || it.Attempts >= m.cfg.MaxAttempts {
			continue
		}
		if it.Timed && m.cfg.Tolerate[KnownBufferedRecheck] {
			continue
		}
		if it.DAHi.Add(m.cfg.Slack).After(at) {
			continue
		}
		if !it.ExpLo.IsZero() && !it.ExpLo.After(until.Add(time.Second)) {
			continue
		}
		out = append(out, it)
	}
	sort.SliceStable(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.Priority != b.Priority {
			return a.Priority < b.Priority
		}
		if !a.DAHi.Equal(b.DAHi) {
			return a.DAHi.Before(b.DAHi)
		}
		return a.Key < b.Key
	})
	return out
}

// ttlLapsing reports whether an item of topic may have passed its TTL by
// the end of sp while still in the items table.
func (m *Model) ttlLapsing(topic string, sp Span) bool {
	for _, it := range m.Items() {
		if it.Topic == topic && it.State == InItems && !it.ExpLo.IsZero() && !it.ExpLo.After(sp.End) {
			return true
		}
	}
	return false
}

// Dequeue checks a dequeue's answer: what it delivered, in what order, with
// what attempts and lease, and that it delivered what was surely ready.
// The timely rules are checked against the state before this dequeue,
// then its possible side effects on lapsed leases are recorded, then each
// delivery is checked and applied.
func (m *Model) Dequeue(sp Span, req *triagev1.DequeueRequest, resp *triagev1.DequeueResponse, err error) error {
	if err != nil {
		return violation("dequeue refused: %v", err)
	}
	var reqLease time.Duration
	if req.LeaseDuration != nil {
		reqLease = req.LeaseDuration.AsDuration()
	}
	byTopic, err := deliveredByTopic(req, resp)
	if err != nil {
		return err
	}
	wait := req.GetWait().AsDuration()
	for _, tc := range req.Topics {
		if err := m.checkTimely(sp, tc, byTopic[tc.Topic], wait); err != nil {
			return err
		}
	}
	m.lapsedLeasesMayMove(sp, req.Topics)
	// Strict rules, per delivery.
	for _, li := range resp.Items {
		if err := m.deliver(sp, li, reqLease); err != nil {
			return err
		}
	}
	return nil
}

// deliveredByTopic groups a dequeue's items by topic, in the order the
// answer gives them; an item of a topic the request did not ask for is a
// violation.
func deliveredByTopic(req *triagev1.DequeueRequest, resp *triagev1.DequeueResponse) (map[string][]*triagev1.LeasedItem, error) {
	byTopic := map[string][]*triagev1.LeasedItem{}
	for _, li := range resp.Items {
		byTopic[li.Topic] = append(byTopic[li.Topic], li)
	}
	asked := map[string]bool{}
	for _, tc := range req.Topics {
		asked[tc.Topic] = true
	}
	for t := range byTopic {
		if !asked[t] {
			return nil, violation("dequeue delivered items of topic %q, which it did not ask for", t)
		}
	}
	return byTopic, nil
}

// checkTimely checks what a dequeue delivered of one topic (got) against
// what the model knows was surely ready: no more than asked, no fewer
// than were surely ready, nothing delivered while a more urgent item
// waited, and the answer in delivery order. A long poll (wait) that came
// back empty waited the whole span, so readiness counts up to its end.
func (m *Model) checkTimely(sp Span, tc *triagev1.TopicCount, got []*triagev1.LeasedItem, wait time.Duration) error {
	if len(got) > int(tc.Count) {
		return violation("dequeue of %d from %q delivered %d", tc.Count, tc.Topic, len(got))
	}
	at := sp.Start
	if len(got) == 0 && wait > 0 {
		at = sp.End
	}
	avail := m.available(tc.Topic, at, sp.End)
	delivered := map[string]bool{}
	for _, li := range got {
		delivered[li.Id] = true
	}
	if err := m.checkEnough(sp, tc, got, avail, delivered); err != nil {
		return err
	}
	if err := m.checkNoInversion(tc.Topic, got, avail, delivered); err != nil {
		return err
	}
	return m.checkResponseOrder(tc.Topic, got)
}

// checkEnough fails when a dequeue delivered fewer items of a topic than
// it asked for while more were surely ready (avail), naming the ones it
// left. A lapsing TTL excuses a short answer while KnownTTLShortAnswer is
// tolerated.
func (m *Model) checkEnough(sp Span, tc *triagev1.TopicCount, got []*triagev1.LeasedItem, avail []*Item, delivered map[string]bool) error {
	want := min(int(tc.Count), len(avail))
	if len(got) >= want || (m.cfg.Tolerate[KnownTTLShortAnswer] && m.ttlLapsing(tc.Topic, sp)) {
		return nil
	}
	var missed []string
	for _, a := range avail {
		if !delivered[a.ID] {
			missed = append(missed, m.describe(a))
		}
	}
	return violation("dequeue of %d from %q delivered %d, but %d items were surely ready (ready for more than %s, not leased); not delivered: %s",
		tc.Count, tc.Topic, len(got), len(avail), m.cfg.Slack, strings.Join(missed, ", "))
}

// checkNoInversion fails when a dequeue delivered an item of topic while
// a surely ready one it left (in avail, not delivered) came before it in
// delivery order.
func (m *Model) checkNoInversion(topic string, got []*triagev1.LeasedItem, avail []*Item, delivered map[string]bool) error {
	for _, a := range avail {
		if delivered[a.ID] {
			continue
		}
		for _, li := range got {
			key, _ := itemid.Parse(li.Id)
			if before(a, li.Priority, li.DeliverAfter.AsTime(), key.Key) {
				return violation("priority inversion in %q: delivered %s (priority %d, deliver_after %s) while %s had been ready for more than %s",
					topic, li.Id, li.Priority, fmtT(li.DeliverAfter.AsTime()), m.describe(a), m.cfg.Slack)
			}
		}
	}
	return nil
}

// checkResponseOrder fails when one answer's items of topic are not in
// (priority, deliver_after, id) order, unless KnownResponseOrder is
// tolerated.
func (m *Model) checkResponseOrder(topic string, got []*triagev1.LeasedItem) error {
	for i := 1; i < len(got) && !m.cfg.Tolerate[KnownResponseOrder]; i++ {
		if compareLeased(got[i-1], got[i]) > 0 {
			return violation("dequeue answer out of order in %q: %s (priority %d, deliver_after %s) before %s (priority %d, deliver_after %s)",
				topic, got[i-1].Id, got[i-1].Priority, fmtT(got[i-1].DeliverAfter.AsTime()), got[i].Id, got[i].Priority, fmtT(got[i].DeliverAfter.AsTime()))
		}
	}
	return nil
}

// lapsedLeasesMayMove records what a dequeue of topics may have done
// unseen: an item of these topics whose lease lapsed may have been
// prefetched (its token may be stale) or, out of attempts, dead-lettered.
// It also notes when the topics were last dequeued.
func (m *Model) lapsedLeasesMayMove(sp Span, topics []*triagev1.TopicCount) {
	for _, tc := range topics {
		for _, it := range m.Items() {
			if it.State != InItems || it.Topic != tc.Topic || it.DALo.After(sp.End) {
				continue
			}
			if it.Attempts >= m.cfg.MaxAttempts {
				it.MaybeDead = true
			} else if it.Token != "" {
				it.TokenMaybeStale = true
			}
		}
		if sp.End.After(m.lastDeq[tc.Topic]) {
			m.lastDeq[tc.Topic] = sp.End
		}
	}
}

// deliver checks one delivered item against what the model knows of it
// (the strict rules) and records the delivery: one more attempt, its
// token, and its lease. reqLease is the request's lease (0: the item's
// own).
func (m *Model) deliver(sp Span, li *triagev1.LeasedItem, reqLease time.Duration) error {
	it := m.items[li.Id]
	if it == nil {
		return violation("delivered %s, which was never enqueued (unexpected)", li.Id)
	}
	switch it.State {
	case Gone:
		return violation("delivered %s after it was %s (duplicate after removal)", li.Id, it.Removed)
	case Dead, DeadOrGone:
		return violation("delivered %s, which is in the dead-letter table", li.Id)
	case Phantom:
		return violation("delivered %s, the ID a BUFFERED duplicate enqueue got; it must never exist", li.Id)
	}
	if it.Unsettled {
		return fmt.Errorf("queuemodel: delivery of unsettled item %s", li.Id)
	}
	if _, surely := m.ttl(it, sp); surely || (!it.ExpHi.IsZero() && !sp.Start.Add(-m.cfg.ClockSlack).Before(it.ExpHi)) {
		return violation("delivered %s after its TTL (expires_at at most %s, dequeue began %s)", li.Id, fmtT(it.ExpHi), fmtT(sp.Start))
	}
	if it.Attempts >= m.cfg.MaxAttempts {
		return violation("delivered %s for the %d. time; max_attempts is %d, so it belongs in the dead-letter table", li.Id, it.Attempts+1, m.cfg.MaxAttempts)
	}
	if it.DALo.After(sp.End.Add(m.cfg.ClockSlack)) {
		what := "deliver_after"
		if it.Token != "" && !it.TokenMaybeStale && it.DALo.Equal(it.DAHi) {
			what = "the expiry of the lease it was under (duplicate delivery)"
		}
		return violation("delivered %s early: %s is %s, the dequeue ended %s", li.Id, what, fmtT(it.DALo), fmtT(sp.End))
	}
	if li.Priority != it.Priority {
		return violation("delivered %s with priority %d, want %d", li.Id, li.Priority, it.Priority)
	}
	if !bytes.Equal(li.Payload, it.Payload) {
		return violation("delivered %s with payload %q, want %q", li.Id, li.Payload, it.Payload)
	}
	if !metaEqual(li.Metadata, it.Meta) {
		return violation("delivered %s with metadata %v, want %v", li.Id, li.Metadata, it.Meta)
	}
	if int(li.Attempts) != it.Attempts+1 {
		return violation("delivered %s with attempts %d; it reached a consumer %d times before, so want %d", li.Id, li.Attempts, it.Attempts, it.Attempts+1)
	}
	da := li.DeliverAfter.AsTime()
	if da.Before(it.DALo) || da.After(it.DAHi) {
		return violation("delivered %s with deliver_after %s, want within [%s, %s]", li.Id, fmtT(da), fmtT(it.DALo), fmtT(it.DAHi))
	}
	if li.LeaseToken == "" || slices.Contains(it.Deliveries, li.LeaseToken) {
		return violation("delivered %s with lease token %q, which is empty or an earlier delivery's", li.Id, li.LeaseToken)
	}
	lease := reqLease
	if lease == 0 {
		lease = it.LeaseDur
	}
	until := li.LeaseExpiresAt.AsTime()
	if until.Before(lo(sp.Start).Add(lease-m.cfg.LeaseSlack)) || until.After(sp.End.Add(lease+m.cfg.LeaseSlack)) {
		return violation("delivered %s with lease_expires_at %s; want now + %s (dequeue %s..%s)", li.Id, fmtT(until), lease, fmtT(sp.Start), fmtT(sp.End))
	}
	it.Attempts++
	it.Token = li.LeaseToken
	it.Deliveries = append(it.Deliveries, li.LeaseToken)
	it.TokenMaybeStale, it.MaybeDead, it.Timed = false, false, true
	it.DALo, it.DAHi = until, until
	return nil
}

// compareLeased orders delivered items by (priority, deliver_after, id key).
func compareLeased(a, b *triagev1.LeasedItem) int {
	if a.Priority != b.Priority {
		if a.Priority < b.Priority {
			return -1
		}
		return 1
	}
	if c := a.DeliverAfter.AsTime().Compare(b.DeliverAfter.AsTime()); c != 0 {
		return c
	}
	ia, _ := itemid.Parse(a.Id)
	ib, _ := itemid.Parse(b.Id)
	switch {
	case ia.Key < ib.Key:
		return -1
	case ia.Key > ib.Key:
		return 1
	}
	return 0
}

// Ack checks an ack's per-item answers and applies them.
func (m *Model) Ack(sp Span, req *triagev1.AckRequest, resp *triagev1.AckResponse, err error) error {
	if err != nil {
		return violation("ack refused: %v", err)
	}
	if len(resp.Results) != len(req.Acks) {
		return violation("ack of %d answered %d results", len(req.Acks), len(resp.Results))
	}
	for i, ref := range req.Acks {
		r := resp.Results[i]
		if r.Id != ref.Id {
			return violation("ack results[%d] is for %s, want %s", i, r.Id, ref.Id)
		}
		want := m.expect(ref.Id, ref.LeaseToken, sp)
		got := classify(r)
		if !want[got] {
			return violation("ack %s token %s: got %s (%q), want %s%s", ref.Id, ref.LeaseToken, got, r.Error, want, m.why(ref.Id))
		}
		it := m.items[ref.Id]
		switch got {
		case ok:
			it.State, it.Removed, it.Token = Gone, "acked", ""
		case notFound:
			if it != nil && it.State == InItems {
				m.gone(it, sp)
			}
		case stale:
			if it != nil && ref.LeaseToken == it.Token {
				it.Token, it.TokenMaybeStale = "", false
			}
		}
	}
	return nil
}

// NackBackoff is the documented default backoff range after n deliveries.
func NackBackoff(n int) (time.Duration, time.Duration) {
	d := 15 * time.Minute
	if n >= 1 && n <= 10 {
		d = min(d, time.Second<<(n-1))
	} else if n < 1 {
		d = time.Second
	}
	return d / 2, d
}

// Nack checks a nack's answers and applies them: back to the queue after
// the delay, or to the dead-letter table when out of attempts or asked to
// (dead_letter). A release nack takes back the attempt its delivery counted
// and never dead-letters; without a delay its item is ready at once (the
// backoff is for failures). A request with a nack that asks for both is
// refused whole (InvalidArgument) and changes nothing.
func (m *Model) Nack(sp Span, req *triagev1.NackRequest, resp *triagev1.NackResponse, err error) error {
	for i, n := range req.Nacks {
		if !n.DeadLetter || !n.Release {
			continue
		}
		if status.Code(err) != codes.InvalidArgument {
			return violation("nack %s with dead_letter and release: got %v, want the request refused (InvalidArgument)", req.Nacks[i].Id, err)
		}
		return nil
	}
	if err != nil {
		return violation("nack refused: %v", err)
	}
	if len(resp.Results) != len(req.Nacks) {
		return violation("nack of %d answered %d results", len(req.Nacks), len(resp.Results))
	}
	for i, n := range req.Nacks {
		r := resp.Results[i]
		want := m.expect(n.Id, n.LeaseToken, sp)
		got := classify(r)
		if !want[got] {
			return violation("nack %s token %s: got %s (%q), want %s%s", n.Id, n.LeaseToken, got, r.Error, want, m.why(n.Id))
		}
		it := m.items[n.Id]
		switch got {
		case notFound:
			if it != nil && it.State == InItems {
				m.gone(it, sp)
			}
			continue
		case stale:
			if it != nil && n.LeaseToken == it.Token {
				it.Token, it.TokenMaybeStale = "", false
			}
			continue
		}
		it.Token, it.TokenMaybeStale, it.MaybeDead = "", false, false
		it.LastError = n.Error // checked against the dead letter's when it dies of this nack
		if n.DeadLetter && n.Error == "" {
			// The server names the reason when the consumer gave none.
			it.LastError = fmt.Sprintf("dead-lettered by the consumer after %d deliveries", it.Attempts)
		}
		if n.Release {
			// The delivery does not count, so it cannot exhaust attempts.
			it.Attempts = max(it.Attempts-1, 0)
		}
		if !n.Release && (n.DeadLetter || it.Attempts >= m.cfg.MaxAttempts) {
			if !m.cfg.Tolerate[KnownNackDeadMetadata] {
				mergeMeta(it.Meta, n.Metadata)
			}
			it.State = Dead
			continue
		}
		mergeMeta(it.Meta, n.Metadata)
		it.LastError, it.Timed = "", true
		dlo, dhi := n.Delay.AsDuration(), n.Delay.AsDuration()
		if n.Delay == nil && !n.Release {
			dlo, dhi = NackBackoff(it.Attempts)
		}
		it.DALo, it.DAHi = lo(sp.Start).Add(dlo-m.cfg.ClockSlack).Add(-time.Microsecond), sp.End.Add(dhi+m.cfg.ClockSlack)
	}
	return nil
}

// Extend checks an ExtendLease answer.
func (m *Model) Extend(sp Span, req *triagev1.ExtendLeaseRequest, resp *triagev1.ExtendLeaseResponse, err error) error {
	want := m.expect(req.Id, req.LeaseToken, sp)
	got := classifyErr(err)
	if !want[got] {
		return violation("extend %s token %s: got %s (%v), want %s%s", req.Id, req.LeaseToken, got, err, want, m.why(req.Id))
	}
	it := m.items[req.Id]
	switch got {
	case notFound:
		if it != nil && it.State == InItems {
			m.gone(it, sp)
		}
		return nil
	case stale:
		if it != nil && req.LeaseToken == it.Token {
			it.Token, it.TokenMaybeStale = "", false
		}
		return nil
	}
	lease := req.LeaseDuration.AsDuration()
	if lease == 0 {
		lease = it.LeaseDur
	}
	until := resp.LeaseExpiresAt.AsTime()
	if until.Before(lo(sp.Start).Add(lease-m.cfg.ClockSlack)) || until.After(sp.End.Add(lease+m.cfg.ClockSlack)) {
		return violation("extend %s: lease_expires_at %s, want now + %s (call %s..%s)", req.Id, fmtT(until), lease, fmtT(sp.Start), fmtT(sp.End))
	}
	it.TokenMaybeStale, it.MaybeDead, it.Timed = false, false, true
	it.DALo, it.DAHi = until, until
	return nil
}

// Update checks an UpdateItem answer. deliver_after may change only while
// no consumer holds an unexpired lease.
func (m *Model) Update(sp Span, req *triagev1.UpdateItemRequest, resp *triagev1.Item, err error) error {
	it := m.items[req.Id]
	want := outcomes{}
	if it == nil || it.State != InItems {
		want[notFound] = true
	} else {
		maybeGone, surelyGone := m.ttl(it, sp)
		if maybeGone || it.MaybeDead {
			want[notFound] = true
		}
		if !surelyGone {
			want[ok] = true
			if req.DeliverAfter != nil && it.Token != "" && it.DALo.Equal(it.DAHi) && it.DAHi.After(sp.Start) {
				// A consumer's lease that may still run refuses it.
				want[stale] = true
				if it.DAHi.After(sp.End.Add(m.cfg.ClockSlack)) && !it.TokenMaybeStale {
					delete(want, ok)
				}
			}
		}
	}
	got := classifyErr(err)
	if !want[got] {
		return violation("update %s (priority %v, deliver_after %v, metadata %v): got %s (%v), want %s%s",
			req.Id, fmtPrio(req.Priority), fmtTS(req), req.Metadata, got, err, want, m.why(req.Id))
	}
	switch got {
	case notFound:
		if it != nil && it.State == InItems {
			m.gone(it, sp)
		}
		return nil
	case stale:
		return nil
	}
	if req.Priority != nil {
		it.Priority = *req.Priority
	}
	mergeMeta(it.Meta, req.Metadata)
	if it.Token != "" && it.DALo.Equal(it.DAHi) {
		// An update ends a lease that lapsed, so the consumer's token no
		// longer holds the row: surely when the lease had lapsed before
		// the update was sent, maybe when it lapsed while it ran. An
		// accepted deliver_after means it had lapsed (a live lease
		// refuses it).
		switch {
		case req.DeliverAfter != nil, it.DAHi.Before(lo(sp.Start).Add(-m.cfg.ClockSlack)):
			it.Token, it.TokenMaybeStale = "", false
		case !it.DAHi.After(sp.End.Add(m.cfg.ClockSlack)):
			it.TokenMaybeStale = true
		}
	}
	if req.DeliverAfter != nil {
		it.DALo = req.DeliverAfter.AsTime()
		it.DAHi = it.DALo
		it.MaybeDead = false
		it.Timed = it.DALo.After(sp.Start)
	} else if req.Priority != nil && it.DAHi.Before(sp.Start) && it.Token == "" {
		it.Timed = false // the update is announced and the buffer reads again
	}
	return m.checkItem(resp, it, sp, "update")
}

// Delete checks a DeleteItem answer.
func (m *Model) Delete(sp Span, req *triagev1.DeleteItemRequest, err error) error {
	it := m.items[req.Id]
	want := outcomes{notFound: true}
	if it != nil && it.State == InItems {
		maybeGone, surelyGone := m.ttl(it, sp)
		want = outcomes{ok: !surelyGone, notFound: maybeGone || it.MaybeDead}
	}
	got := classifyErr(err)
	if !want[got] {
		return violation("delete %s: got %s (%v), want %s%s", req.Id, got, err, want, m.why(req.Id))
	}
	if it == nil || it.State != InItems {
		return nil
	}
	if got == ok {
		it.State, it.Removed, it.Token = Gone, "deleted", ""
	} else {
		m.gone(it, sp)
	}
	return nil
}

// Get checks a GetItem answer.
func (m *Model) Get(sp Span, req *triagev1.GetItemRequest, resp *triagev1.Item, err error) error {
	it := m.items[req.Id]
	want := outcomes{notFound: true}
	if it != nil && it.State == InItems {
		maybeGone, surelyGone := m.ttl(it, sp)
		want = outcomes{ok: !surelyGone, notFound: maybeGone || it.MaybeDead}
	}
	got := classifyErr(err)
	if !want[got] {
		return violation("get %s: got %s (%v), want %s%s", req.Id, got, err, want, m.why(req.Id))
	}
	if it == nil || it.State != InItems {
		return nil
	}
	if got == notFound {
		m.gone(it, sp)
		return nil
	}
	if it.Token != "" && !it.TokenMaybeStale && it.DALo.After(sp.End.Add(m.cfg.ClockSlack)) && resp.State != triagev1.ItemState_LEASED {
		return violation("get %s: state %s while a consumer's lease runs until %s", req.Id, resp.State, fmtT(it.DALo))
	}
	if resp.State == triagev1.ItemState_DELAYED && it.DAHi.Before(sp.Start.Add(-m.cfg.ClockSlack)) {
		return violation("get %s: state DELAYED, but its deliver_after (at most %s) has passed", req.Id, fmtT(it.DAHi))
	}
	return m.checkItem(resp, it, sp, "get")
}

func (m *Model) checkItem(resp *triagev1.Item, it *Item, sp Span, op string) error {
	switch {
	case resp.Id != it.ID || resp.Topic != it.Topic:
		return violation("%s %s: answered item %s of topic %s", op, it.ID, resp.Id, resp.Topic)
	case resp.Priority != it.Priority:
		return violation("%s %s: priority %d, want %d", op, it.ID, resp.Priority, it.Priority)
	case !bytes.Equal(resp.Payload, it.Payload):
		return violation("%s %s: payload %q, want %q", op, it.ID, resp.Payload, it.Payload)
	case !metaEqual(resp.Metadata, it.Meta):
		return violation("%s %s: metadata %v, want %v", op, it.ID, resp.Metadata, it.Meta)
	case resp.DedupKey != it.DedupKey:
		return violation("%s %s: dedup_key %q, want %q", op, it.ID, resp.DedupKey, it.DedupKey)
	}
	if int(resp.Attempts) != it.Attempts {
		// A ready item may sit leased in a prefetch buffer; with the known
		// bug that shows as one more attempt.
		prefetched := (it.Token == "" || it.TokenMaybeStale) && !it.DALo.After(m.lastDeq[it.Topic])
		if !(m.cfg.Tolerate[KnownPrefetchAttempts] && prefetched && int(resp.Attempts) == it.Attempts+1) {
			return violation("%s %s: attempts %d, but it reached a consumer %d times", op, it.ID, resp.Attempts, it.Attempts)
		}
	}
	return nil
}

// DeadLetters checks a full listing of a topic's dead-letter table and
// resolves items that may have been dead-lettered.
func (m *Model) DeadLetters(sp Span, topic string, list []*triagev1.DeadLetter) error {
	listed := map[string]*triagev1.DeadLetter{}
	for _, d := range list {
		if listed[d.Id] != nil {
			return violation("dead letters of %q list %s twice", topic, d.Id)
		}
		listed[d.Id] = d
		it := m.items[d.Id]
		if it == nil || it.Topic != topic {
			return violation("dead letters of %q list %s, which was never enqueued there", topic, d.Id)
		}
		switch {
		case it.State == Dead, it.State == DeadOrGone, it.State == InItems && it.MaybeDead:
			it.State, it.Token, it.MaybeDead = Dead, "", false
		default:
			return violation("dead letters of %q list %s, which is %s (attempts %d of %d)", topic, d.Id, it.State, it.Attempts, m.cfg.MaxAttempts)
		}
		if int(d.Attempts) != it.Attempts {
			return violation("dead letter %s: attempts %d, but it reached a consumer %d times", d.Id, d.Attempts, it.Attempts)
		}
		if !bytes.Equal(d.Payload, it.Payload) || d.Priority != it.Priority || !metaEqual(d.Metadata, it.Meta) {
			return violation("dead letter %s: payload %q priority %d metadata %v, want %q %d %v", d.Id, d.Payload, d.Priority, d.Metadata, it.Payload, it.Priority, it.Meta)
		}
		if it.LastError != "" && d.LastError != it.LastError {
			return violation("dead letter %s: last_error %q, want the last nack's %q", d.Id, d.LastError, it.LastError)
		}
	}
	for _, it := range m.Items() {
		if it.Topic != topic || listed[it.ID] != nil {
			continue
		}
		switch it.State {
		case Dead:
			return violation("dead letter %s of %q is missing from the listing (lost)", it.ID, topic)
		case DeadOrGone:
			it.State, it.Removed = Gone, "expired"
		}
	}
	return nil
}

// Redrive checks a redrive: before and after are full listings of the
// topic's dead letters around it. Every listed item whose dedup key no live
// item holds comes back, ready now, attempts reset; the count says how many.
//
// A read may move an item the model holds as MaybeDead (out of attempts,
// its lease lapsed) to the dead-letter table at any moment, also between
// the listing before a redrive and the redrive, which then brings it back
// and counts it: the model cannot see that from the listings. seen holds
// what GetItem answered, after the redrive, for each such item
// (MaybeDeadOf; nil: not found). One back in the items table with no
// attempt counted was dead-lettered and redriven meanwhile, since
// nothing else takes its attempts back; any other answer leaves it maybe
// dead, for the next listing to settle.
func (m *Model) Redrive(sp Span, req *triagev1.RedriveDeadLettersRequest, resp *triagev1.RedriveDeadLettersResponse, err error, after []*triagev1.DeadLetter, seen map[string]*triagev1.Item) error {
	if err != nil {
		return violation("redrive of %q refused: %v", req.Topic, err)
	}
	chosen := map[string]bool{}
	for _, id := range req.Ids {
		chosen[id] = true
	}
	still := map[string]bool{}
	for _, d := range after {
		still[d.Id] = true
	}
	var redriven, kept []*Item
	for _, it := range m.Items() {
		if it.Topic == req.Topic && it.State == InItems && it.MaybeDead && !still[it.ID] &&
			(len(chosen) == 0 || chosen[it.ID]) && seen[it.ID] != nil && seen[it.ID].Attempts == 0 {
			redriven = append(redriven, it) // dead-lettered and redriven meanwhile
			continue
		}
		if it.Topic != req.Topic || it.State != Dead {
			continue
		}
		switch {
		case still[it.ID]:
			if len(chosen) == 0 || chosen[it.ID] {
				kept = append(kept, it)
			}
		case len(chosen) > 0 && !chosen[it.ID]:
			return violation("redrive of %v moved %s, which it did not name", req.Ids, it.ID)
		default:
			redriven = append(redriven, it)
		}
	}
	keys := map[string]string{}
	for _, it := range redriven {
		if it.DedupKey == "" {
			continue
		}
		if other, dup := keys[it.DedupKey]; dup {
			return violation("redrive of %q brought back both %s and %s with dedup key %q", req.Topic, other, it.ID, it.DedupKey)
		}
		keys[it.DedupKey] = it.ID
		switch h, maybe := m.holder(it.Topic, it.DedupKey, sp); {
		case h != nil && !maybe:
			return violation("redrive of %q brought %s back although live item %s holds its dedup key %q", req.Topic, it.ID, h.ID, it.DedupKey)
		case h != nil:
			m.gone(h, sp)
		}
	}
	for _, it := range redriven {
		it.State, it.Attempts, it.Token, it.TokenMaybeStale, it.LastError, it.Timed = InItems, 0, "", false, "", false
		it.MaybeDead = false
		it.DALo, it.DAHi = lo(sp.Start).Add(-m.cfg.ClockSlack), sp.End.Add(m.cfg.ClockSlack)
		it.ExpLo, it.ExpHi = time.Time{}, time.Time{} // dead letters keep no TTL
	}
	for _, it := range kept {
		if it.DedupKey == "" {
			return violation("redrive of %q left %s in the dead-letter table; it has no dedup key that could conflict", req.Topic, it.ID)
		}
		if h, _ := m.holder(it.Topic, it.DedupKey, sp); h == nil {
			return violation("redrive of %q left %s in the dead-letter table; no live item holds its dedup key %q", req.Topic, it.ID, it.DedupKey)
		}
	}
	n := int64(len(redriven))
	if resp.Redriven != n {
		return violation("redrive of %q answered redriven %d, but %d left the dead-letter table", req.Topic, resp.Redriven, n)
	}
	return m.DeadLetters(sp, req.Topic, after)
}

// MaybeDeadOf returns the items of topic that a read may have moved to
// the dead-letter table unseen (MaybeDead), for Redrive's seen.
func (m *Model) MaybeDeadOf(topic string) []*Item {
	var out []*Item
	for _, it := range m.Items() {
		if it.Topic == topic && it.State == InItems && it.MaybeDead {
			out = append(out, it)
		}
	}
	return out
}

// Outstanding returns items the system still owes at now: in the items
// table or the dead-letter table (or possibly there), for the final drain.
// Items surely past their TTL are gone.
func (m *Model) Outstanding(now time.Time) []*Item {
	var out []*Item
	for _, it := range m.Items() {
		if _, surely := m.ttl(it, Span{Start: now, End: now}); surely && it.State == InItems {
			it.State, it.Removed, it.Token, it.MaybeDead = Gone, "expired", "", false
		}
		if it.State == InItems || it.State == Dead || it.State == DeadOrGone {
			out = append(out, it)
		}
	}
	return out
}

// LatestReady is the latest time any item in the items table becomes
// ready, for the final drain.
func (m *Model) LatestReady() time.Time {
	var t time.Time
	for _, it := range m.Live() {
		if it.DAHi.After(t) {
			t = it.DAHi
		}
	}
	return t
}

// Describe says what the model knows of an item, for failure reports.
func (m *Model) Describe(it *Item) string { return m.describe(it) }

func (m *Model) why(id string) string {
	it := m.items[id]
	if it == nil {
		return " (never enqueued)"
	}
	return " (" + m.describe(it) + ")"
}

func (m *Model) describe(it *Item) string {
	s := fmt.Sprintf("%s [%s prio %d attempts %d deliver_after %s..%s", it.ID, it.State, it.Priority, it.Attempts, fmtT(it.DALo), fmtT(it.DAHi))
	if it.Token != "" {
		s += " token " + it.Token
		if it.TokenMaybeStale {
			s += " (maybe stale)"
		}
	}
	if it.MaybeDead {
		s += " maybe-dead"
	}
	if !it.ExpLo.IsZero() {
		s += " ttl " + fmtT(it.ExpLo) + ".." + fmtT(it.ExpHi)
	}
	if it.DedupKey != "" {
		s += " dedup " + it.DedupKey
	}
	if it.Removed != "" {
		s += " " + it.Removed
	}
	return s + "]"
}

func mergeMeta(m, patch map[string]string) {
	for k, v := range patch {
		if v == "" {
			delete(m, k)
		} else {
			m[k] = v
		}
	}
}

func metaEqual(a, b map[string]string) bool {
	return len(a) == len(b) && maps.Equal(a, b)
}

func fmtT(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.Format("15:04:05.000000")
}

func fmtPrio(p *int32) string {
	if p == nil {
		return "-"
	}
	return fmt.Sprint(*p)
}

func fmtTS(req *triagev1.UpdateItemRequest) string {
	if req.DeliverAfter == nil {
		return "-"
	}
	return fmtT(req.DeliverAfter.AsTime())
}
