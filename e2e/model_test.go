package e2e

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/stretchr/testify/require"

	"github.com/triage-queue/triage/deploy/queuemodel"
	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
	"github.com/triage-queue/triage/schema/itemid"
)

var (
	modelSeed     = flag.Uint64("model.seed", 0, "seed of TestModelBased's operation sequence (0: pick one and print it)")
	modelDuration = flag.Duration("model.duration", 2*time.Minute, "how long TestModelBased generates operations before the final drain")
	modelSlack    = flag.Duration("model.slack", 300*time.Millisecond, "how long after an item is ready a dequeue may still miss it")
	modelKnown    = flag.String("model.known", "", "comma-separated known bugs to tolerate while they are being fixed ("+
		queuemodel.KnownPrefetchAttempts+", "+queuemodel.KnownResponseOrder+", "+queuemodel.KnownBufferedRecheck+", "+queuemodel.KnownNackDeadMetadata+", "+queuemodel.KnownTTLShortAnswer+", "+knownShortLease+"); empty is strict")
)

// knownShortLease: an item's own lease is also its prefetch lease, and a
// buffered item with less than 1 s left is dropped and released in the
// background: an item whose own lease is 1 s or less is never delivered, and
// one with a short lease that waited in the buffer is missed by the dequeue
// that dropped it. With it, items get long leases of their own (short
// leases still come from dequeue requests).
const knownShortLease = "short-lease"

// modelRun is one run of the model-based test: the bed, the model, the
// random source and the step log.
type modelRun struct {
	t     *testing.T
	b     *bed
	m     *queuemodel.Model
	rng   *rand.Rand
	known map[string]bool
	step  int
	log   []string // the last logKeep steps
	ns    string
	// nacks counts the nacks answered ok (or refused, for both flags) by
	// kind, so a run shows it exercised each.
	nacks map[string]int
}

const logKeep = 400

var modelTopics = []string{"t0", "t1"}

// TestModelBased runs random sequences of enqueue (both durabilities,
// dedup keys, delays, TTLs, short and long leases, priorities), dequeue,
// ack, nack (backoff, delay, dead_letter, release), extend, update, delete, get, dead-letter listing, redrive and
// plain waiting (so leases lapse) against a real node, and checks every
// answer against queuemodel's model of the documented semantics. At the
// end it drains everything and checks nothing acknowledged was lost.
//
// It runs -model.duration (2 minutes by default, as in make test). The seed
// is printed; -model.seed=N replays the same operation sequence (timing on
// a shared machine still varies, so a timing-dependent failure may need a
// few runs). A failure prints the last steps.
func TestModelBased(t *testing.T) {
	t.Parallel()
	seed := *modelSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("TestModelBased seed %d (replay: go test -run TestModelBased ./e2e/ -model.seed=%d)", seed, seed)
	known := map[string]bool{}
	for _, k := range strings.Split(*modelKnown, ",") {
		if k = strings.TrimSpace(k); k != "" {
			known[k] = true
		}
	}
	b := setup(t, bedOpts{})
	const maxAttempts = 3
	defaultLease := 2 * time.Second
	if known[knownShortLease] {
		defaultLease = 30 * time.Second
	}
	r := &modelRun{t: t, b: b, rng: rand.New(rand.NewPCG(seed, 0x7472696167)), known: known, ns: "model", nacks: map[string]int{},
		m: queuemodel.New(queuemodel.Config{MaxAttempts: maxAttempts, DefaultLease: defaultLease, Slack: *modelSlack, Tolerate: known})}
	// No dedup retry window: the model frees a key when its item leaves
	// (TestDedupRetryWindowAfterAck covers the window).
	putNamespace(t, b, &triagev1.Namespace{Name: r.ns, MaxAttempts: maxAttempts, DefaultLeaseDuration: durationpb.New(defaultLease),
		DedupRetryWindow: durationpb.New(0)})
	// The namespace is served once the router's map has it.
	require.Eventually(t, func() bool {
		_, err := b.queue.GetTopicStats(b.ctx(), &triagev1.GetTopicStatsRequest{Namespace: r.ns, Topic: "t0"})
		return err == nil
	}, 10*time.Second, 20*time.Millisecond)
	defer func() {
		if t.Failed() {
			t.Logf("seed %d; the last %d of %d steps:\n%s", seed, len(r.log), r.step, strings.Join(r.log, "\n"))
		}
	}()

	end := time.Now().Add(*modelDuration)
	for time.Now().Before(end) {
		r.randomOp()
	}
	r.drain()
	t.Logf("seed %d: %d steps, %d items; nacks by kind: %v", seed, r.step, len(r.m.Items()), r.nacks)
}

func (r *modelRun) logf(format string, args ...any) {
	line := fmt.Sprintf("%5d %s ", r.step, time.Now().Format("15:04:05.000")) + fmt.Sprintf(format, args...)
	r.log = append(r.log, line)
	if len(r.log) > logKeep {
		r.log = r.log[len(r.log)-logKeep:]
	}
}

// check fails the test on a violation, with the step that caused it.
func (r *modelRun) check(err error) {
	r.t.Helper()
	if err != nil {
		r.logf("FAILED: %v", err)
		r.dumpRows()
		r.t.Fatalf("step %d: %v", r.step, err)
	}
}

// dumpRows logs the namespace's rows as the shards hold them now, to tell
// what the system thought when a check failed.
func (r *modelRun) dumpRows() {
	for i, db := range r.b.shards {
		var rows []struct {
			ID           uint64 `db:"id"`
			Topic        string `db:"topic"`
			Priority     int32  `db:"priority"`
			DeliverAfter int64  `db:"deliver_after"`
			Attempts     int32  `db:"attempts"`
			Token        uint64 `db:"lease_token"`
			LeasedUntil  *int64 `db:"leased_until"`
		}
		if err := db.Select(&rows, "SELECT id, topic, priority, deliver_after, attempts, lease_token, leased_until FROM items WHERE namespace = ? ORDER BY topic, priority, deliver_after, id", r.ns); err != nil {
			r.t.Logf("dump shard %d: %v", i+1, err)
			continue
		}
		for _, row := range rows {
			until := "-"
			if row.LeasedUntil != nil {
				until = time.UnixMicro(*row.LeasedUntil).Format("05.000000")
			}
			r.logf("row %s %s p%d da %s a%d tok %016x until %s", itemid.ID{Shard: uint32(i + 1), Key: row.ID}, row.Topic, row.Priority,
				time.UnixMicro(row.DeliverAfter).Format("05.000000"), row.Attempts, row.Token, until)
		}
	}
}

func (r *modelRun) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 30*time.Second)
}

func (r *modelRun) span(call func()) queuemodel.Span {
	start := time.Now()
	call()
	return queuemodel.Span{Start: start, End: time.Now()}
}

func (r *modelRun) pick(weights ...int) int {
	total := 0
	for _, w := range weights {
		total += w
	}
	n := r.rng.IntN(total)
	for i, w := range weights {
		if n < w {
			return i
		}
		n -= w
	}
	return len(weights) - 1
}

func (r *modelRun) topic() string { return modelTopics[r.rng.IntN(len(modelTopics))] }

// lease returns a random lease: mostly short (0.5-3 s) so they lapse during
// the run, sometimes long.
func (r *modelRun) lease() time.Duration {
	if r.rng.IntN(6) == 0 {
		return time.Duration(20+r.rng.IntN(20)) * time.Second
	}
	return time.Duration(500+r.rng.IntN(2500)) * time.Millisecond
}

// itemLease is an item's own lease: like lease, unless the known bug of
// short own leases is tolerated.
func (r *modelRun) itemLease() time.Duration {
	if r.known[knownShortLease] {
		return time.Duration(20+r.rng.IntN(20)) * time.Second
	}
	return r.lease()
}

func (r *modelRun) randomOp() {
	r.step++
	switch r.pick(14, 22, 12, 7, 4, 6, 3, 4, 2, 6) {
	case 0:
		r.enqueue()
	case 1:
		r.dequeue(r.topic(), int32(1+r.rng.IntN(4)))
	case 2:
		r.ack()
	case 3:
		r.nack()
	case 4:
		r.extend()
	case 5:
		r.update()
	case 6:
		r.delete()
	case 7:
		r.get()
	case 8:
		r.redrive(r.topic())
	case 9:
		d := time.Duration(50+r.rng.IntN(1500)) * time.Millisecond
		r.logf("sleep %s", d)
		time.Sleep(d) // let leases lapse and delays pass: the semantics are about time
	}
}

func (r *modelRun) enqueue() {
	req := &triagev1.EnqueueRequest{Namespace: r.ns, Topic: r.topic()}
	if r.rng.IntN(4) == 0 {
		req.Durability = triagev1.Durability_BUFFERED
	}
	now := time.Now()
	for range 1 + r.rng.IntN(4) {
		it := &triagev1.NewItem{Priority: int32(r.rng.IntN(5)) - 1, Payload: fmt.Appendf(nil, "p%d-%d", r.step, len(req.Items))}
		if r.rng.IntN(3) == 0 {
			it.DedupKey = fmt.Sprintf("k%d", r.rng.IntN(6))
		}
		if r.rng.IntN(4) == 0 {
			it.DeliverAfter = timestamppb.New(now.Add(time.Duration(r.rng.IntN(2500)) * time.Millisecond).Truncate(time.Microsecond))
		}
		if r.rng.IntN(2) == 0 {
			it.LeaseDuration = durationpb.New(r.itemLease())
		}
		if r.rng.IntN(10) == 0 {
			it.Ttl = durationpb.New(time.Duration(2000+r.rng.IntN(4000)) * time.Millisecond)
		}
		if r.rng.IntN(3) == 0 {
			it.Metadata = map[string]string{"a": fmt.Sprint(r.rng.IntN(3)), "b": "x"}
		}
		req.Items = append(req.Items, it)
	}
	ctx, cancel := r.ctx()
	defer cancel()
	var resp *triagev1.EnqueueResponse
	var err error
	sp := r.span(func() { resp, err = r.b.queue.Enqueue(ctx, req) })
	r.logf("enqueue %s %s %s -> %s %v", req.Topic, req.Durability, fmtNewItems(req.Items), fmtResults(resp), err)
	r.check(r.m.Enqueue(sp, req, resp, err))
	if req.Durability == triagev1.Durability_BUFFERED {
		r.settle(resp)
	}
}

// settle waits until the buffered batches of resp are inserted (their
// batch IDs recorded on the shard), then tells the model which items exist.
func (r *modelRun) settle(resp *triagev1.EnqueueResponse) {
	batches := map[uint32]uint64{} // shard -> batch ID: the first key of the shard's group
	for _, res := range resp.Results {
		id, err := itemid.Parse(res.Id)
		require.NoError(r.t, err)
		if k, ok := batches[id.Shard]; !ok || id.Key < k {
			batches[id.Shard] = id.Key
		}
	}
	for shard, batch := range batches {
		require.Eventually(r.t, func() bool {
			var n int
			require.NoError(r.t, r.b.shards[shard-1].Get(&n, "SELECT COUNT(*) FROM enqueue_batches WHERE batch_id = ?", batch))
			return n == 1
		}, 10*time.Second, 5*time.Millisecond, "buffered batch %d on shard %d never inserted", batch, shard)
	}
	for _, res := range resp.Results {
		ctx, cancel := r.ctx()
		var err error
		sp := r.span(func() { _, err = r.b.queue.GetItem(ctx, &triagev1.GetItemRequest{Namespace: r.ns, Id: res.Id}) })
		cancel()
		found := err == nil
		if err != nil && !strings.Contains(err.Error(), "not found") {
			r.check(fmt.Errorf("get %s after its buffered insert: %v", res.Id, err))
		}
		r.logf("settle %s found=%v", res.Id, found)
		r.check(r.m.Settle(sp, res.Id, found))
	}
}

func (r *modelRun) dequeue(topic string, count int32) []*triagev1.LeasedItem {
	req := &triagev1.DequeueRequest{Namespace: r.ns, Topics: []*triagev1.TopicCount{{Topic: topic, Count: count}}}
	if r.rng.IntN(5) == 0 {
		other := modelTopics[(slices.Index(modelTopics, topic)+1)%len(modelTopics)]
		req.Topics = append(req.Topics, &triagev1.TopicCount{Topic: other, Count: count})
	}
	if r.rng.IntN(2) == 0 {
		req.LeaseDuration = durationpb.New(r.lease())
	}
	if r.rng.IntN(5) == 0 {
		req.Wait = durationpb.New(time.Duration(100+r.rng.IntN(400)) * time.Millisecond)
	}
	return r.doDequeue(req)
}

func (r *modelRun) doDequeue(req *triagev1.DequeueRequest) []*triagev1.LeasedItem {
	ctx, cancel := r.ctx()
	defer cancel()
	var resp *triagev1.DequeueResponse
	var err error
	sp := r.span(func() { resp, err = r.b.queue.Dequeue(ctx, req) })
	var got []string
	for _, li := range resp.GetItems() {
		got = append(got, fmt.Sprintf("%s[%s p%d a%d da %s until %s tok %s]", li.Id, li.Topic, li.Priority, li.Attempts,
			li.DeliverAfter.AsTime().Format("05.000000"), li.LeaseExpiresAt.AsTime().Format("05.000000"), li.LeaseToken))
	}
	var asked []string
	for _, tc := range req.Topics {
		asked = append(asked, fmt.Sprintf("%s:%d", tc.Topic, tc.Count))
	}
	r.logf("dequeue %v lease %v wait %v (%s..%s) -> %v %v", asked, req.LeaseDuration.AsDuration(), req.Wait.AsDuration(),
		sp.Start.Format("05.000"), sp.End.Format("05.000"), got, err)
	r.check(r.m.Dequeue(sp, req, resp, err))
	return resp.GetItems()
}

// held picks a random item a consumer holds a token for, or nil; with
// stale, sometimes one of its earlier tokens.
func (r *modelRun) held() (*queuemodel.Item, string) {
	h := r.m.Held()
	if len(h) == 0 {
		// An item with an old token, or gone: the answer must be stale or
		// not found.
		all := r.m.Items()
		for range 5 {
			if len(all) == 0 {
				break
			}
			it := all[r.rng.IntN(len(all))]
			if len(it.Deliveries) > 0 {
				return it, it.Deliveries[r.rng.IntN(len(it.Deliveries))]
			}
		}
		return nil, ""
	}
	it := h[r.rng.IntN(len(h))]
	tok := it.Token
	if r.rng.IntN(8) == 0 && len(it.Deliveries) > 1 {
		tok = it.Deliveries[r.rng.IntN(len(it.Deliveries)-1)]
	}
	return it, tok
}

func (r *modelRun) ack() {
	req := &triagev1.AckRequest{Namespace: r.ns}
	for range 1 + r.rng.IntN(3) {
		if it, tok := r.held(); it != nil {
			req.Acks = append(req.Acks, &triagev1.LeaseRef{Id: it.ID, LeaseToken: tok})
		}
	}
	if len(req.Acks) == 0 {
		return
	}
	ctx, cancel := r.ctx()
	defer cancel()
	var resp *triagev1.AckResponse
	var err error
	sp := r.span(func() { resp, err = r.b.queue.Ack(ctx, req) })
	r.logf("ack %s -> %s %v", fmtRefs(req.Acks), fmtItemResults(resp.GetResults()), err)
	r.check(r.m.Ack(sp, req, resp, err))
}

func (r *modelRun) nack() {
	it, tok := r.held()
	if it == nil {
		return
	}
	n := &triagev1.NackItem{Id: it.ID, LeaseToken: tok}
	switch r.pick(3, 4, 1) {
	case 0:
		n.Delay = durationpb.New(0)
	case 1:
		n.Delay = durationpb.New(time.Duration(r.rng.IntN(1500)) * time.Millisecond)
	} // else the default backoff
	if r.rng.IntN(2) == 0 {
		n.Error = fmt.Sprintf("err-%d", r.step)
	}
	if r.rng.IntN(3) == 0 {
		n.Metadata = map[string]string{"a": "", "n": fmt.Sprint(r.step)}
	}
	// Mostly failures; some permanent ones (dead letters at once), some
	// releases (uncounted, ready at once without a delay) and, rarely,
	// both, which the router must refuse whole.
	switch r.pick(12, 2, 5, 1) {
	case 1:
		n.DeadLetter = true
	case 2:
		n.Release = true
	case 3:
		n.DeadLetter, n.Release = true, true
	}
	req := &triagev1.NackRequest{Namespace: r.ns, Nacks: []*triagev1.NackItem{n}}
	ctx, cancel := r.ctx()
	defer cancel()
	var resp *triagev1.NackResponse
	var err error
	sp := r.span(func() { resp, err = r.b.queue.Nack(ctx, req) })
	r.logf("nack %s tok %s delay %v err %q meta %v dead_letter %t release %t -> %s %v", n.Id, n.LeaseToken, fmtDur(n.Delay), n.Error, n.Metadata,
		n.DeadLetter, n.Release, fmtItemResults(resp.GetResults()), err)
	r.check(r.m.Nack(sp, req, resp, err))
	kind := "plain"
	switch {
	case n.DeadLetter && n.Release:
		kind = "both (refused)"
	case n.DeadLetter:
		kind = "dead_letter"
	case n.Release:
		kind = "release"
	}
	if err != nil || resp.GetResults()[0].GetOk() {
		r.nacks[kind]++
	}
}

func (r *modelRun) extend() {
	it, tok := r.held()
	if it == nil {
		return
	}
	req := &triagev1.ExtendLeaseRequest{Namespace: r.ns, Id: it.ID, LeaseToken: tok}
	if r.rng.IntN(2) == 0 {
		req.LeaseDuration = durationpb.New(r.lease())
	}
	ctx, cancel := r.ctx()
	defer cancel()
	var resp *triagev1.ExtendLeaseResponse
	var err error
	sp := r.span(func() { resp, err = r.b.queue.ExtendLease(ctx, req) })
	r.logf("extend %s tok %s lease %v -> %v %v", req.Id, tok, fmtDur(req.LeaseDuration), fmtTime(resp.GetLeaseExpiresAt()), err)
	r.check(r.m.Extend(sp, req, resp, err))
}

// anyItem picks a random item: mostly live ones, sometimes any.
func (r *modelRun) anyItem() *queuemodel.Item {
	items := r.m.Live()
	if len(items) == 0 || r.rng.IntN(6) == 0 {
		items = r.m.Items()
	}
	if len(items) == 0 {
		return nil
	}
	return items[r.rng.IntN(len(items))]
}

func (r *modelRun) update() {
	it := r.anyItem()
	if it == nil {
		return
	}
	req := &triagev1.UpdateItemRequest{Namespace: r.ns, Id: it.ID, UpdatedBy: "model"}
	for req.Priority == nil && req.DeliverAfter == nil && req.Metadata == nil {
		if r.rng.IntN(2) == 0 {
			p := int32(r.rng.IntN(5)) - 1
			req.Priority = &p
		}
		if r.rng.IntN(3) == 0 {
			req.DeliverAfter = timestamppb.New(time.Now().Add(time.Duration(r.rng.IntN(2000)-500) * time.Millisecond).Truncate(time.Microsecond))
		}
		if r.rng.IntN(3) == 0 {
			req.Metadata = map[string]string{"b": "", "u": fmt.Sprint(r.step)}
		}
	}
	ctx, cancel := r.ctx()
	defer cancel()
	var resp *triagev1.Item
	var err error
	sp := r.span(func() { resp, err = r.b.queue.UpdateItem(ctx, req) })
	r.logf("update %s prio %v da %v meta %v -> %v %v", req.Id, fmtP(req.Priority), fmtTime(req.DeliverAfter), req.Metadata, fmtItem(resp), err)
	r.check(r.m.Update(sp, req, resp, err))
}

func (r *modelRun) delete() {
	it := r.anyItem()
	if it == nil {
		return
	}
	req := &triagev1.DeleteItemRequest{Namespace: r.ns, Id: it.ID}
	ctx, cancel := r.ctx()
	defer cancel()
	var err error
	sp := r.span(func() { _, err = r.b.queue.DeleteItem(ctx, req) })
	r.logf("delete %s -> %v", req.Id, err)
	r.check(r.m.Delete(sp, req, err))
}

func (r *modelRun) get() {
	it := r.anyItem()
	if it == nil {
		return
	}
	req := &triagev1.GetItemRequest{Namespace: r.ns, Id: it.ID}
	ctx, cancel := r.ctx()
	defer cancel()
	var resp *triagev1.Item
	var err error
	sp := r.span(func() { resp, err = r.b.queue.GetItem(ctx, req) })
	r.logf("get %s -> %v %v", req.Id, fmtItem(resp), err)
	r.check(r.m.Get(sp, req, resp, err))
}

// deadLetters lists a topic's whole dead-letter table.
func (r *modelRun) deadLetters(topic string) []*triagev1.DeadLetter {
	var all []*triagev1.DeadLetter
	req := &triagev1.ListDeadLettersRequest{Namespace: r.ns, Topic: topic, PageSize: int32(1 + r.rng.IntN(5))}
	for {
		ctx, cancel := r.ctx()
		resp, err := r.b.queue.ListDeadLetters(ctx, req)
		cancel()
		require.NoError(r.t, err)
		all = append(all, resp.DeadLetters...)
		if resp.NextPageToken == "" {
			break
		}
		req.PageToken = resp.NextPageToken
	}
	var ids []string
	for _, d := range all {
		ids = append(ids, fmt.Sprintf("%s(a%d %q)", d.Id, d.Attempts, d.LastError))
	}
	r.logf("deadletters %s -> %v", topic, ids)
	return all
}

func (r *modelRun) redrive(topic string) {
	before := r.deadLetters(topic)
	r.check(r.m.DeadLetters(queuemodel.Span{Start: time.Now(), End: time.Now()}, topic, before))
	req := &triagev1.RedriveDeadLettersRequest{Namespace: r.ns, Topic: topic}
	if len(before) > 0 && r.rng.IntN(2) == 0 {
		for _, d := range before {
			if r.rng.IntN(2) == 0 {
				req.Ids = append(req.Ids, d.Id)
			}
		}
		if it := r.anyItem(); it != nil && it.Topic == topic && r.rng.IntN(3) == 0 {
			req.Ids = append(req.Ids, it.ID) // not a dead letter: ignored
		}
	}
	ctx, cancel := r.ctx()
	defer cancel()
	var resp *triagev1.RedriveDeadLettersResponse
	var err error
	sp := r.span(func() { resp, err = r.b.queue.RedriveDeadLetters(ctx, req) })
	r.logf("redrive %s ids %v -> %d %v", topic, req.Ids, resp.GetRedriven(), err)
	after := r.deadLetters(topic)
	// What became of the items a read may have dead-lettered unseen (see
	// queuemodel's Redrive).
	seen := map[string]*triagev1.Item{}
	for _, it := range r.m.MaybeDeadOf(topic) {
		ctx, cancel := r.ctx()
		got, gerr := r.b.queue.GetItem(ctx, &triagev1.GetItemRequest{Namespace: r.ns, Id: it.ID})
		cancel()
		if status.Code(gerr) != codes.NotFound {
			require.NoError(r.t, gerr)
		}
		seen[it.ID] = got
		r.logf("redrive: maybe dead %s now %v", it.ID, fmtItem(got))
	}
	r.check(r.m.Redrive(sp, req, resp, err, after, seen))
}

// drain ends the run: it acks what consumers hold, waits out every delay,
// then redrives and dequeues (acking everything) until the model owes
// nothing, and checks the system holds nothing either.
func (r *modelRun) drain() {
	r.logf("drain")
	deadline := time.Now().Add(60 * time.Second)
	for {
		r.step++
		out := r.m.Outstanding(time.Now())
		if len(out) == 0 {
			break
		}
		if time.Now().After(deadline) {
			var s []string
			for _, it := range out {
				s = append(s, r.m.Describe(it))
			}
			r.check(fmt.Errorf("lost: the drain never delivered %d items the model still owes: %v", len(out), s))
		}
		for _, tp := range modelTopics {
			r.redrive(tp)
		}
		if held := r.m.Held(); len(held) > 0 {
			req := &triagev1.AckRequest{Namespace: r.ns}
			for _, it := range held {
				req.Acks = append(req.Acks, &triagev1.LeaseRef{Id: it.ID, LeaseToken: it.Token})
			}
			ctx, cancel := r.ctx()
			var resp *triagev1.AckResponse
			var err error
			sp := r.span(func() { resp, err = r.b.queue.Ack(ctx, req) })
			cancel()
			r.logf("drain ack %s -> %s %v", fmtRefs(req.Acks), fmtItemResults(resp.GetResults()), err)
			r.check(r.m.Ack(sp, req, resp, err))
		}
		req := &triagev1.DequeueRequest{Namespace: r.ns, LeaseDuration: durationpb.New(time.Minute),
			Wait: durationpb.New(200 * time.Millisecond)}
		for _, tp := range modelTopics {
			req.Topics = append(req.Topics, &triagev1.TopicCount{Topic: tp, Count: 50})
		}
		if got := r.doDequeue(req); len(got) > 0 {
			ack := &triagev1.AckRequest{Namespace: r.ns}
			for _, li := range got {
				ack.Acks = append(ack.Acks, &triagev1.LeaseRef{Id: li.Id, LeaseToken: li.LeaseToken})
			}
			ctx, cancel := r.ctx()
			var resp *triagev1.AckResponse
			var err error
			sp := r.span(func() { resp, err = r.b.queue.Ack(ctx, ack) })
			cancel()
			r.logf("drain ack %s -> %s %v", fmtRefs(ack.Acks), fmtItemResults(resp.GetResults()), err)
			r.check(r.m.Ack(sp, ack, resp, err))
		}
	}
	// The system agrees: nothing left in either table.
	for _, tp := range modelTopics {
		ctx, cancel := r.ctx()
		st, err := r.b.queue.GetTopicStats(ctx, &triagev1.GetTopicStatsRequest{Namespace: r.ns, Topic: tp})
		cancel()
		require.NoError(r.t, err)
		if st.Total != 0 || st.DeadLetters != 0 {
			r.check(fmt.Errorf("unexpected: after the drain topic %s still holds %d items and %d dead letters the model does not know of", tp, st.Total, st.DeadLetters))
		}
	}
}

func fmtNewItems(items []*triagev1.NewItem) string {
	var s []string
	for _, it := range items {
		x := fmt.Sprintf("{p%d", it.Priority)
		if it.DedupKey != "" {
			x += " key " + it.DedupKey
		}
		if it.DeliverAfter != nil {
			x += " da " + it.DeliverAfter.AsTime().Format("05.000000")
		}
		if it.LeaseDuration != nil {
			x += " lease " + it.LeaseDuration.AsDuration().String()
		}
		if it.Ttl != nil {
			x += " ttl " + it.Ttl.AsDuration().String()
		}
		s = append(s, x+"}")
	}
	return strings.Join(s, " ")
}

func fmtResults(resp *triagev1.EnqueueResponse) string {
	var s []string
	for _, r := range resp.GetResults() {
		x := r.Id
		if r.Duplicate {
			x += "(dup)"
		}
		s = append(s, x)
	}
	return fmt.Sprint(s)
}

func fmtRefs(refs []*triagev1.LeaseRef) string {
	var s []string
	for _, r := range refs {
		s = append(s, r.Id+":"+r.LeaseToken)
	}
	return fmt.Sprint(s)
}

func fmtItemResults(res []*triagev1.ItemResult) string {
	var s []string
	for _, r := range res {
		if r.Ok {
			s = append(s, "ok")
		} else {
			s = append(s, r.Error)
		}
	}
	return fmt.Sprint(s)
}

func fmtItem(it *triagev1.Item) string {
	if it == nil {
		return "-"
	}
	return fmt.Sprintf("{%s p%d a%d %s da %s meta %v}", it.Id, it.Priority, it.Attempts, it.State, it.DeliverAfter.AsTime().Format("05.000000"), it.Metadata)
}

func fmtDur(d *durationpb.Duration) string {
	if d == nil {
		return "default"
	}
	return d.AsDuration().String()
}

func fmtTime(t *timestamppb.Timestamp) string {
	if t == nil {
		return "-"
	}
	return t.AsTime().Format("15:04:05.000000")
}

func fmtP(p *int32) string {
	if p == nil {
		return "-"
	}
	return fmt.Sprint(*p)
}
