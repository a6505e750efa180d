package drill

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
)

// clock gives the tests times in milliseconds from a fixed fault.
type clock struct{ t0 time.Time }

func (c clock) at(ms int) time.Time { return c.t0.Add(time.Duration(ms) * time.Millisecond) }

func itemID(shard uint32, n int) string { return fmt.Sprintf("%d-%016x", shard, n) }

// setup returns a clock, an empty history and the facts of a fault at
// t=0 of shard 1, seen through routers us-east (faulted, not a survivor),
// eu-west and ap-south.
func setup() (clock, *history, facts) {
	c := clock{t0: time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)}
	h := newHistory()
	f := facts{faultAt: c.at(0), healAt: c.at(20_000), shards: map[uint32]bool{1: true},
		routers:   []string{"us-east", "eu-west", "ap-south"},
		survivors: map[string]bool{"eu-west": true, "ap-south": true}, published: map[uint32]time.Time{}}
	return c, &h, f
}

// TestAnalyze: the report counts losses, early deliveries, duplicates by
// cause and priority inversions from what the workload recorded, and
// flags the broken invariants.
func TestAnalyze(t *testing.T) {
	t.Parallel()
	c, h, f := setup()
	a, b, cc, lost := itemID(1, 1), itemID(1, 2), itemID(1, 3), itemID(1, 4)
	h.sent = map[string]*sent{
		a:    {id: a, priority: 0, readyAt: c.at(0), ackedAt: c.at(0)},
		b:    {id: b, priority: 2, readyAt: c.at(0), ackedAt: c.at(0)},
		cc:   {id: cc, priority: 1, readyAt: c.at(500), ackedAt: c.at(0)}, // delayed
		lost: {id: lost, priority: 1, readyAt: c.at(0), ackedAt: c.at(0)},
	}
	d := func(id string, prio int32, ms int, action string, failed bool) delivery {
		return delivery{id: id, router: "eu-west", priority: prio, reqStart: c.at(ms - 1), at: c.at(ms), action: action, ackErr: failed}
	}
	h.deliveries = []delivery{
		d(b, 2, 10, "nack", false), // "a" was ready and more urgent: inversion
		d(a, 0, 20, "crash", false),
		d(b, 2, 30, "ack", false),
		d(a, 0, 40, "ack", true),
		d(a, 0, 50, "ack", false),
		d(cc, 1, 100, "ack", false), // early
	}
	r := &Report{}
	analyze(r, h, f)
	require.Equal(t, 4, r.Acknowledged)
	require.Equal(t, 3, r.Delivered)
	require.Equal(t, 1, r.Lost)
	require.Equal(t, []string{lost}, r.LostIDs)
	require.Equal(t, 1, r.EarlyDeliveries)
	require.Equal(t, map[string]int{"nack": 1, "lease expiry (consumer crashed holding the lease)": 1,
		"lease expiry (ack or nack failed during the fault)": 1}, r.Duplicates)
	require.Equal(t, 1, r.PriorityInversions)
	require.Zero(t, r.ResurrectedAfterAck)
	require.Nil(t, r.Isolated, "isolated writes are counted for partitions only")
	require.Len(t, r.Violations, 2)
	var out bytes.Buffer
	r.Print(&out)
	require.Contains(t, out.String(), "FAIL: 1 acknowledged items lost")
}

// TestAnalyzeResurrectedAfterAck: a delivery is resurrected when the
// Dequeue that returned it was sent after an ack of the item had been
// answered ok; one that overlapped the ack, or followed a failed ack, is
// not.
func TestAnalyzeResurrectedAfterAck(t *testing.T) {
	t.Parallel()
	c, _, _ := setup()
	tests := []struct {
		name        string
		ack         *settle // nil: no ack answered ok
		reqStart    int
		resurrected int
	}{
		{name: "sent after the ack was answered", ack: &settle{start: c.at(100), end: c.at(110)}, reqStart: 111, resurrected: 1},
		{name: "sent while the ack was in flight", ack: &settle{start: c.at(100), end: c.at(110)}, reqStart: 105},
		{name: "sent as the ack was answered", ack: &settle{start: c.at(100), end: c.at(110)}, reqStart: 110},
		{name: "the ack failed", reqStart: 200},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c, h, f := setup()
			id := itemID(1, 1)
			h.sent[id] = &sent{id: id, readyAt: c.at(0), ackedAt: c.at(0)}
			h.deliveries = []delivery{
				{id: id, router: "us-east", reqStart: c.at(40), at: c.at(50), action: "ack", ackErr: tt.ack == nil},
				{id: id, router: "eu-west", reqStart: c.at(tt.reqStart), at: c.at(tt.reqStart + 300), action: "ack"},
			}
			if tt.ack != nil {
				a := *tt.ack
				a.id, a.router = id, "us-east"
				h.acks = []settle{a}
			}
			r := &Report{}
			analyze(r, h, f)
			require.Equal(t, tt.resurrected, r.ResurrectedAfterAck)
			require.Equal(t, tt.resurrected, r.ResurrectedItems)
			require.Len(t, r.ResurrectedExamples, tt.resurrected)
			if tt.resurrected > 0 {
				require.Equal(t, 1, r.Duplicates["resurrected after ack"])
				require.Contains(t, r.Violations, "1 deliveries of 1 items resurrected after ack")
				require.Contains(t, r.ResurrectedExamples[0], "acked ok via us-east at +0.110s, delivered again via eu-west at +0.411s")
			} else {
				require.Empty(t, r.Violations)
			}
		})
	}
}

// TestAnalyzeNackUndone: a delivery asked for after a nack was answered
// ok must carry that nack's drill_nack sequence (or a later one) and
// come after its delay.
func TestAnalyzeNackUndone(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		reqStart int // of the delivery after the nack (nack answered at 110)
		at       int
		nackSeq  int64
		undone   int
		early    int
	}{
		{name: "carries the nack", reqStart: 700, at: 710, nackSeq: 7},
		{name: "carries a later nack", reqStart: 700, at: 710, nackSeq: 9},
		{name: "nack undone: no drill_nack", reqStart: 5_000, at: 5_010, undone: 1},
		{name: "nack undone: an older drill_nack", reqStart: 5_000, at: 5_010, nackSeq: 3, undone: 1},
		{name: "asked for while the nack was in flight", reqStart: 105, at: 120, nackSeq: 3},
		{name: "before the nack's delay", reqStart: 300, at: 310, nackSeq: 7, early: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c, h, f := setup()
			id := itemID(1, 1)
			h.sent[id] = &sent{id: id, readyAt: c.at(0), ackedAt: c.at(0)}
			h.deliveries = []delivery{
				{id: id, router: "eu-west", reqStart: c.at(40), at: c.at(50), action: "nack", nackSeq: 3},
				{id: id, router: "ap-south", reqStart: c.at(tt.reqStart), at: c.at(tt.at), action: "ack", nackSeq: tt.nackSeq},
			}
			// Sent at 100 with a 500 ms delay: not ready before 600.
			h.nacks = []settle{{id: id, router: "eu-west", start: c.at(100), end: c.at(110), nackSeq: 7, delay: 500 * time.Millisecond}}
			r := &Report{}
			analyze(r, h, f)
			require.Equal(t, tt.undone, r.NacksUndone)
			require.Len(t, r.NacksUndoneExamples, tt.undone)
			require.Equal(t, tt.early, r.EarlyDeliveries)
			require.Len(t, r.EarlyExamples, tt.early)
			require.Equal(t, tt.undone+tt.early, len(r.Violations), "violations: %v", r.Violations)
		})
	}
}

// TestAnalyzeIsolatedWrites: in a partition, the writes the cut-off
// region's router answered ok between the publication of the shard's new
// primary and the heal are counted; those before, after, through other
// routers, failed, or on a shard that did not fail over are not.
func TestAnalyzeIsolatedWrites(t *testing.T) {
	t.Parallel()
	c, h, f := setup()
	f.isolated = "us-east"
	f.shards[2] = true
	f.published[1] = c.at(10_000) // shard 2 never failed over
	f.cutAt, f.healAt = c.at(100), c.at(20_000)
	ok := func(router string, id string, end int) call {
		return call{router: router, start: c.at(end - 50), end: c.at(end), ok: true, id: id}
	}
	h.enqueues = []call{
		ok("us-east", itemID(1, 1), 9_999),                          // before publication
		ok("us-east", itemID(1, 2), 10_001),                         // counted
		ok("us-east", itemID(1, 3), 19_000),                         // counted
		ok("us-east", itemID(1, 4), 20_001),                         // after the heal was asked for
		ok("eu-west", itemID(1, 5), 12_000),                         // another router
		ok("us-east", itemID(2, 6), 12_000),                         // shard 2: not failed over
		{router: "us-east", start: c.at(12_000), end: c.at(12_100)}, // refused
	}
	st := func(router, id string, end int) settle {
		return settle{id: id, router: router, start: c.at(end - 20), end: c.at(end)}
	}
	h.acks = []settle{st("us-east", itemID(1, 7), 15_000), st("us-east", itemID(1, 8), 5_000), st("ap-south", itemID(1, 9), 15_000)}
	h.nacks = []settle{st("us-east", itemID(1, 10), 11_000), st("us-east", itemID(1, 11), 11_500)}
	h.deliveries = []delivery{{id: itemID(1, 12), router: "us-east", reqStart: c.at(13_000), at: c.at(13_010), action: "crash"}}
	r := &Report{}
	analyze(r, h, f)
	require.NotNil(t, r.Isolated)
	iw := *r.Isolated
	require.Equal(t, "us-east", iw.Region)
	require.EqualValues(t, 10_000, iw.PublishedMS)
	require.EqualValues(t, 20_000, iw.HealMS)
	require.Equal(t, 2, iw.Enqueues)
	require.Equal(t, 1, iw.Acks)
	require.Equal(t, 2, iw.Nacks)
	require.Equal(t, 5, iw.Total())
	require.Equal(t, 1, iw.Deliveries)
	require.Len(t, iw.Examples, 5)
	require.Contains(t, iw.Examples[0], "enqueue of "+itemID(1, 2)+" answered ok at +10.001s (new primary published at +10.000s)")
	// Sent after the cut and answered before the heal, published or not,
	// on any shard.
	require.Equal(t, WriteCounts{Enqueues: 4, Acks: 2, Nacks: 2}, iw.SentAfterCut)
	require.Len(t, iw.SentAfterCutExamples, 8)
	require.Contains(t, r.Violations, "the isolated region us-east acknowledged 5 writes after the new primary was published (2 enqueues, 1 acks, 2 nacks)")

	// No publication seen: nothing counted, and the report says so.
	_, h2, f2 := setup()
	f2.isolated = "us-east"
	h2.enqueues = h.enqueues
	r2 := &Report{}
	analyze(r2, h2, f2)
	require.EqualValues(t, -1, r2.Isolated.PublishedMS)
	require.Zero(t, r2.Isolated.Total())
	var out bytes.Buffer
	r2.Print(&out)
	require.Contains(t, out.String(), "not checked: no new primary was published during the fault")
}

// TestAnalyzeRTO: per router, the RTO is the answer of the first call sent
// after the fault that succeeded on a faulted shard; a dequeue counts
// only if its item's ack or nack was answered ok (first served: any). The headline is the
// slowest surviving router, -1 if one never recovered.
func TestAnalyzeRTO(t *testing.T) {
	t.Parallel()
	c, h, f := setup()
	enq := func(router string, shard uint32, start, end int, ok bool) call {
		return call{router: router, start: c.at(start), end: c.at(end), ok: ok, id: itemID(shard, start+100_000)}
	}
	h.enqueues = []call{
		enq("eu-west", 1, -10, 5, true),     // sent before the fault
		enq("eu-west", 1, 100, 4_000, true), // eu-west: 4 s
		enq("eu-west", 1, 200, 3_000, false),
		enq("eu-west", 1, 4_500, 4_600, true),
		enq("eu-west", 2, 50, 60, true),     // another shard
		enq("ap-south", 1, 10, 6_500, true), // ap-south: 6.5 s
		enq("us-east", 1, 10, 20, true),     // not a survivor
	}
	deq := func(router string, shard uint32, start, end int, action string, failed bool) delivery {
		return delivery{id: itemID(shard, start+100_000), router: router, reqStart: c.at(start), at: c.at(end), action: action, ackErr: failed}
	}
	h.deliveries = []delivery{
		deq("eu-west", 1, -5, 100, "ack", false),    // sent before the fault
		deq("eu-west", 1, 200, 300, "ack", true),    // stale buffer: the ack failed
		deq("eu-west", 1, 250, 350, "crash", false), // never settled
		deq("eu-west", 2, 260, 360, "ack", false),   // another shard
		deq("eu-west", 1, 5_000, 5_200, "nack", false),
		deq("eu-west", 1, 6_000, 6_100, "ack", false),
		deq("ap-south", 1, 7_000, 7_300, "ack", false),
	}
	r := &Report{}
	analyze(r, h, f)
	require.Equal(t, map[string]RTO{
		"eu-west":  {EnqueueMS: 4_000, DequeueMS: 5_200, ServedMS: 300}, // served at once from a stale buffer
		"ap-south": {EnqueueMS: 6_500, DequeueMS: 7_300, ServedMS: 7_300},
		"us-east":  {EnqueueMS: 20, DequeueMS: -1, ServedMS: -1},
	}, r.RTOByRouter)
	require.EqualValues(t, 6_500, r.EnqueueRTOMS)
	require.EqualValues(t, 7_300, r.DequeueRTOMS)

	// A surviving router that never recovered: no headline figure.
	f.survivors["us-east"] = true
	r = &Report{}
	analyze(r, h, f)
	require.EqualValues(t, 6_500, r.EnqueueRTOMS)
	require.EqualValues(t, -1, r.DequeueRTOMS)
}

// TestSurvives: the faulted region's router counts for the headline RTO
// unless the fault takes it down or cuts it off.
func TestSurvives(t *testing.T) {
	t.Parallel()
	for _, s := range Scenarios {
		require.True(t, survives(s, "us-east", "eu-west"), s)
	}
	require.True(t, survives("primary-kill", "us-east", "us-east"))
	require.True(t, survives("dequeuer-kill", "us-east", "us-east"))
	require.False(t, survives("partition", "us-east", "us-east"))
	require.False(t, survives("region-down", "us-east", "us-east"))
	require.False(t, survives("nats-kill", "us-east", "us-east"))
}

// TestAnalyzeKeysDeliveredAgain: the workload's producer retried a key
// after an error; the retry's item was delivered and acked, and then the
// first attempt's item, with the same key and an ID no enqueue answered,
// was delivered too: a violation, and an unknown ID. A delivery of the
// key under another ID while its ack was in flight is neither.
func TestAnalyzeKeysDeliveredAgain(t *testing.T) {
	t.Parallel()
	c, h, f := setup()
	retry, late, other, otherLate := itemID(1, 20), itemID(1, 21), itemID(1, 30), itemID(1, 31)
	h.sent[retry] = &sent{id: retry, key: "k1", readyAt: c.at(0), ackedAt: c.at(0)}
	h.sent[other] = &sent{id: other, key: "k2", readyAt: c.at(0), ackedAt: c.at(0)}
	h.deliveries = []delivery{
		{id: retry, key: "k1", router: "eu-west", reqStart: c.at(100), at: c.at(101), action: "ack"},
		{id: late, key: "k1", router: "ap-south", reqStart: c.at(5_000), at: c.at(5_001), action: "ack", attempts: 1},
		{id: other, key: "k2", router: "eu-west", reqStart: c.at(100), at: c.at(101), action: "ack"},
		{id: otherLate, key: "k2", router: "eu-west", reqStart: c.at(105), at: c.at(106), action: "ack"},
	}
	h.acks = []settle{
		{id: retry, key: "k1", router: "eu-west", start: c.at(102), end: c.at(110)},
		{id: late, key: "k1", router: "ap-south", start: c.at(5_002), end: c.at(5_010)},
		{id: other, key: "k2", router: "eu-west", start: c.at(102), end: c.at(110)},
	}
	r := &Report{}
	analyze(r, h, f)
	require.Equal(t, 1, r.KeysDeliveredAgain)
	require.Len(t, r.KeysDeliveredAgainExamples, 1)
	require.Contains(t, r.KeysDeliveredAgainExamples[0], "key k1")
	require.Equal(t, 2, r.UnknownIDs)
	require.Zero(t, r.ResurrectedAfterAck, "each ID was delivered once")
	require.Contains(t, r.Verdict(), "under another ID after its item was acked")
}

// TestKeyStoryTellsEveryAttemptAndDelivery: a lost item's report lists
// each enqueue attempt of its key, with what it was answered, and each
// delivery of the key under any ID, timed from the fault.
func TestKeyStoryTellsEveryAttemptAndDelivery(t *testing.T) {
	t.Parallel()
	fault := time.Unix(1000, 0)
	h := newHistory()
	h.sent["1-b"] = &sent{id: "1-b", key: "k", router: "ap-south"}
	h.enqueues = []call{
		{router: "ap-south", start: fault, end: fault.Add(5 * time.Second), key: "k", code: codes.DeadlineExceeded},
		{router: "ap-south", start: fault.Add(5100 * time.Millisecond), end: fault.Add(6 * time.Second), ok: true, id: "1-b", key: "k"},
		{router: "eu-west", start: fault, end: fault.Add(time.Second), ok: true, id: "1-c", key: "other"},
	}
	h.deliveries = []delivery{{id: "1-a", key: "k", router: "eu-west", at: fault.Add(6080 * time.Millisecond), attempts: 1, action: "ack"}}
	story := keyStory(&h, "1-b", fault)
	require.Equal(t, "enqueue via ap-south +0.000s..+5.000s: DeadlineExceeded; enqueue via ap-south +5.100s..+6.000s: ok 1-b; "+
		"delivered 1-a via eu-west at +6.080s (attempt 1, ack)", story)
	require.Empty(t, keyStory(&h, "1-unknown", fault), "an ID no enqueue was answered with has no story")
}
