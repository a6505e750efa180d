package e2e

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
	"github.com/triage-queue/triage/schema/itemid"
	"github.com/triage-queue/triage/schema/store"
)

// getItem reads an item of namespace "default" that must exist.
func getItem(t *testing.T, b *bed, id string) *triagev1.Item {
	t.Helper()
	it, err := b.queue.GetItem(b.ctx(), &triagev1.GetItemRequest{Namespace: "default", Id: id})
	require.NoError(t, err)
	return it
}

// requireCode asserts a gRPC error's code and that its message contains
// each of contains.
func requireCode(t *testing.T, err error, code codes.Code, contains ...string) {
	t.Helper()
	require.Error(t, err)
	st, ok := status.FromError(err)
	require.True(t, ok, "not a gRPC status: %v", err)
	require.Equal(t, code, st.Code(), "message: %s", st.Message())
	for _, c := range contains {
		require.Contains(t, st.Message(), c)
	}
}

// dequeueWait long-polls up to wait. It uses assert, not require, so it
// can run inside require.Eventually and require.Never conditions.
func dequeueWait(t *testing.T, b *bed, topic string, n int32, wait, lease time.Duration) []*triagev1.LeasedItem {
	req := &triagev1.DequeueRequest{Namespace: "default", Topics: []*triagev1.TopicCount{{Topic: topic, Count: n}}}
	if wait > 0 {
		req.Wait = durationpb.New(wait)
	}
	if lease > 0 {
		req.LeaseDuration = durationpb.New(lease)
	}
	resp, err := b.queue.Dequeue(b.ctx(), req)
	assert.NoError(t, err)
	return resp.GetItems()
}

func nackOne(t *testing.T, b *bed, it *triagev1.LeasedItem, delay *durationpb.Duration, errText string, meta map[string]string) *triagev1.ItemResult {
	t.Helper()
	resp, err := b.queue.Nack(b.ctx(), &triagev1.NackRequest{Namespace: "default", Nacks: []*triagev1.NackItem{
		{Id: it.Id, LeaseToken: it.LeaseToken, Delay: delay, Error: errText, Metadata: meta}}})
	require.NoError(t, err)
	require.Len(t, resp.Results, 1)
	return resp.Results[0]
}

// during calls fn over and over for d, in the test goroutine, and returns
// the sum of what it returned. It observes that something does not happen
// for a while, which require.Never cannot do with a blocking condition.
func during(d time.Duration, fn func() int) int {
	n := 0
	for end := time.Now().Add(d); time.Now().Before(end); {
		n += fn()
	}
	return n
}

func ids(items []*triagev1.LeasedItem) []string {
	out := make([]string, len(items))
	for i, it := range items {
		out[i] = it.Id
	}
	return out
}

func TestNackDelaysMergesMetadataAndRecordsError(t *testing.T) {
	t.Parallel()
	b := setup(t, bedOpts{})
	res := enqueue(t, b, "nk", &triagev1.NewItem{Payload: []byte("job"), Metadata: map[string]string{"a": "1", "b": "2", "keep": "k"}})
	id := res[0].Id
	first := dequeue(t, b, "nk", 1, 0)
	require.Len(t, first, 1)
	require.Equal(t, int32(1), first[0].Attempts)

	before := time.Now()
	r := nackOne(t, b, first[0], durationpb.New(1500*time.Millisecond), "boom: upstream 503", map[string]string{"a": "10", "b": "", "new": "n"})
	require.True(t, r.Ok, r.Error)
	require.Equal(t, id, r.Id)
	item := getItem(t, b, id)
	require.Equal(t, triagev1.ItemState_DELAYED, item.State)
	require.Equal(t, "boom: upstream 503", item.LastError)
	require.Equal(t, map[string]string{"a": "10", "keep": "k", "new": "n"}, item.Metadata, "nack metadata merged; an empty value deletes its key")
	require.Equal(t, int32(1), item.Attempts)
	require.Nil(t, item.LeaseExpiresAt, "a nacked item is not leased")
	require.WithinRange(t, item.DeliverAfter.AsTime(), before.Add(1500*time.Millisecond-clockSlack), time.Now().Add(1500*time.Millisecond+clockSlack))

	// The nack ended the lease: its token no longer acks.
	stale := ack(t, b, first[0])
	require.False(t, stale[0].Ok)
	require.Contains(t, stale[0].Error, "stale lease token")

	var again *triagev1.LeasedItem
	var gotAt time.Time
	require.Eventually(t, func() bool {
		items := dequeueWait(t, b, "nk", 1, 300*time.Millisecond, 0)
		if len(items) == 0 {
			return false
		}
		again, gotAt = items[0], time.Now()
		return true
	}, 10*time.Second, time.Millisecond)
	require.Equal(t, id, again.Id)
	require.False(t, gotAt.Before(item.DeliverAfter.AsTime()), "redelivered %s before its delay ended", item.DeliverAfter.AsTime().Sub(gotAt))
	require.Equal(t, int32(2), again.Attempts)
	require.Equal(t, map[string]string{"a": "10", "keep": "k", "new": "n"}, again.Metadata)

	// "0s" makes it ready at once; a nack without an error keeps the last.
	r = nackOne(t, b, again, durationpb.New(0), "", nil)
	require.True(t, r.Ok, r.Error)
	item = getItem(t, b, id)
	require.Equal(t, triagev1.ItemState_READY, item.State)
	require.Equal(t, "boom: upstream 503", item.LastError)
	// Nacks are not announced to the dequeuer, which finds the item on its
	// next recheck of the shard (within 100ms): long-poll for it.
	third := dequeueWait(t, b, "nk", 1, 2*time.Second, 0)
	require.Len(t, third, 1)
	require.Equal(t, int32(3), third[0].Attempts)
	require.True(t, ack(t, b, third...)[0].Ok)
	require.Equal(t, 0, b.rowCount("items"))
}

// clockSlack is how far a lease expiry may sit from the test's own clock:
// leases are stamped in the shard primary's time as the node estimates it
// (shardmap.Clock), whose error is up to half a round trip of its last
// reading, more than a millisecond on a loaded machine.
const clockSlack = 100 * time.Millisecond

func TestExtendLease(t *testing.T) {
	t.Parallel()
	b := setup(t, bedOpts{})
	enqueue(t, b, "ext", &triagev1.NewItem{Payload: []byte("long job"), LeaseDuration: durationpb.New(3 * time.Second)})
	before := time.Now()
	got := dequeue(t, b, "ext", 1, time.Second)
	require.Len(t, got, 1)
	it := got[0]
	orig := it.LeaseExpiresAt.AsTime()
	require.WithinRange(t, orig, before.Add(time.Second-clockSlack), time.Now().Add(time.Second+clockSlack))

	before = time.Now()
	ext, err := b.queue.ExtendLease(b.ctx(), &triagev1.ExtendLeaseRequest{Namespace: "default", Id: it.Id, LeaseToken: it.LeaseToken,
		LeaseDuration: durationpb.New(6 * time.Second)})
	require.NoError(t, err)
	until := ext.LeaseExpiresAt.AsTime()
	require.WithinRange(t, until, before.Add(6*time.Second-clockSlack), time.Now().Add(6*time.Second+clockSlack))
	require.True(t, until.After(orig.Add(4*time.Second)), "extended to %s, was %s", until, orig)
	item := getItem(t, b, it.Id)
	require.Equal(t, triagev1.ItemState_LEASED, item.State)
	require.True(t, item.LeaseExpiresAt.AsTime().Equal(until), "GetItem shows the new expiry")

	// Past the original expiry, nobody else gets the item.
	stolen := during(time.Until(orig.Add(time.Second)), func() int {
		return len(dequeueWait(t, b, "ext", 1, 200*time.Millisecond, 0))
	})
	require.Zero(t, stolen, "delivered again while its extended lease runs")
	require.True(t, time.Now().After(orig.Add(time.Second)), "the check ran past the original expiry")
	require.True(t, time.Now().Before(until), "and ended before the extended one")
	item = getItem(t, b, it.Id)
	require.Equal(t, triagev1.ItemState_LEASED, item.State)
	require.Equal(t, int32(1), item.Attempts, "not delivered again")

	// Without a duration the item's own lease (3s) counts from now.
	before = time.Now()
	ext2, err := b.queue.ExtendLease(b.ctx(), &triagev1.ExtendLeaseRequest{Namespace: "default", Id: it.Id, LeaseToken: it.LeaseToken})
	require.NoError(t, err)
	require.WithinRange(t, ext2.LeaseExpiresAt.AsTime(), before.Add(3*time.Second-clockSlack), time.Now().Add(3*time.Second+clockSlack))
	require.True(t, ack(t, b, it)[0].Ok, "the token survives extensions")
	require.Equal(t, 0, b.rowCount("items"))
}

func TestGetItemStates(t *testing.T) {
	t.Parallel()
	b := setup(t, bedOpts{})
	t0 := time.Now()
	ready := enqueue(t, b, "st-ready", &triagev1.NewItem{Payload: []byte("r"), Priority: 4, DedupKey: "dk-1",
		Metadata: map[string]string{"m": "v"}})[0].Id
	later := time.Now().Add(time.Hour).Truncate(time.Microsecond)
	delayed := enqueue(t, b, "st-delayed", &triagev1.NewItem{Payload: []byte("d"), DeliverAfter: timestamppb.New(later)})[0].Id
	leasedID := enqueue(t, b, "st-leased", &triagev1.NewItem{Payload: []byte("l")})[0].Id
	t1 := time.Now()

	it := getItem(t, b, ready)
	require.Equal(t, triagev1.ItemState_READY, it.State)
	require.Equal(t, ready, it.Id)
	require.Equal(t, "default", it.Namespace)
	require.Equal(t, "st-ready", it.Topic)
	require.Equal(t, int32(4), it.Priority)
	require.Equal(t, "r", string(it.Payload))
	require.Equal(t, map[string]string{"m": "v"}, it.Metadata)
	require.Equal(t, "dk-1", it.DedupKey)
	require.Equal(t, "us-east", it.Region)
	require.Zero(t, it.Attempts)
	require.Nil(t, it.LeaseExpiresAt)
	require.Nil(t, it.ExpiresAt, "no TTL by default")
	require.Equal(t, 30*time.Second, it.LeaseDuration.AsDuration(), "the namespace's default lease")
	require.WithinRange(t, it.EnqueuedAt.AsTime(), t0.Add(-time.Millisecond), t1)

	it = getItem(t, b, delayed)
	require.Equal(t, triagev1.ItemState_DELAYED, it.State)
	require.True(t, it.DeliverAfter.AsTime().Equal(later), "deliver_after %s, want %s", it.DeliverAfter.AsTime(), later)
	require.Empty(t, dequeue(t, b, "st-delayed", 1, 0), "a delayed item is not delivered")

	got := dequeue(t, b, "st-leased", 1, 700*time.Millisecond)
	require.Len(t, got, 1)
	it = getItem(t, b, leasedID)
	require.Equal(t, triagev1.ItemState_LEASED, it.State)
	require.True(t, it.LeaseExpiresAt.AsTime().Equal(got[0].LeaseExpiresAt.AsTime()))
	require.Equal(t, int32(1), it.Attempts)
	// When the lease lapses the item is ready again.
	require.Eventually(t, func() bool {
		it, err := b.queue.GetItem(b.ctx(), &triagev1.GetItemRequest{Namespace: "default", Id: leasedID})
		return err == nil && it.State == triagev1.ItemState_READY && it.LeaseExpiresAt == nil
	}, 5*time.Second, 20*time.Millisecond)
}

func TestUpdateItem(t *testing.T) {
	t.Parallel()
	b := setup(t, bedOpts{})
	const topic = "upd"
	var id []string
	for _, name := range []string{"a", "b", "c", "d", "e"} {
		id = append(id, enqueue(t, b, topic, &triagev1.NewItem{Payload: []byte(name), Priority: 5})[0].Id)
	}
	f := enqueue(t, b, topic, &triagev1.NewItem{Payload: []byte("f"), Priority: 5, DeliverAfter: timestamppb.New(time.Now().Add(time.Hour))})[0].Id
	a, bb, c, d, e := id[0], id[1], id[2], id[3], id[4]

	p0 := int32(0)
	up, err := b.queue.UpdateItem(b.ctx(), &triagev1.UpdateItemRequest{Namespace: "default", Id: e, Priority: &p0, UpdatedBy: "oncall"})
	require.NoError(t, err)
	require.Equal(t, int32(0), up.Priority)
	require.Equal(t, int32(5), up.OriginalPriority)
	require.Equal(t, "oncall", up.PriorityChangedBy)
	require.NotNil(t, up.PriorityChangedAt)

	up, err = b.queue.UpdateItem(b.ctx(), &triagev1.UpdateItemRequest{Namespace: "default", Id: bb, DeliverAfter: timestamppb.New(time.Now().Add(time.Hour))})
	require.NoError(t, err)
	require.Equal(t, triagev1.ItemState_DELAYED, up.State)
	up, err = b.queue.UpdateItem(b.ctx(), &triagev1.UpdateItemRequest{Namespace: "default", Id: f, DeliverAfter: timestamppb.Now()})
	require.NoError(t, err)
	// Ready from now on: the answer judges it by the shard primary's clock
	// as the router estimates it, which may trail the test's by part of a
	// round trip (clockSlack), so it may still say DELAYED.
	require.Contains(t, []triagev1.ItemState{triagev1.ItemState_READY, triagev1.ItemState_DELAYED}, up.State)
	require.Eventually(t, func() bool { return getItem(t, b, f).State == triagev1.ItemState_READY }, clockSlack+time.Second, 10*time.Millisecond)
	up, err = b.queue.UpdateItem(b.ctx(), &triagev1.UpdateItemRequest{Namespace: "default", Id: c, Metadata: map[string]string{"x": "1"}})
	require.NoError(t, err)
	require.Equal(t, map[string]string{"x": "1"}, up.Metadata)
	require.Equal(t, map[string]string{"x": "1"}, getItem(t, b, c).Metadata)

	got := dequeue(t, b, topic, 10, 0)
	require.Equal(t, []string{e, a, c, d, f}, ids(got), "escalated e first; b moved out; f moved in, last by its new deliver_after")
	require.Equal(t, triagev1.ItemState_DELAYED, getItem(t, b, bb).State)

	// deliver_after of a leased item is its lease expiry: refused.
	before := getItem(t, b, a)
	_, err = b.queue.UpdateItem(b.ctx(), &triagev1.UpdateItemRequest{Namespace: "default", Id: a, DeliverAfter: timestamppb.Now()})
	requireCode(t, err, codes.FailedPrecondition, "leased until")
	after := getItem(t, b, a)
	require.True(t, proto.Equal(before, after), "a refused update changes nothing:\n%v\n%v", before, after)
	// Its priority may still change.
	p1 := int32(1)
	up, err = b.queue.UpdateItem(b.ctx(), &triagev1.UpdateItemRequest{Namespace: "default", Id: a, Priority: &p1})
	require.NoError(t, err)
	require.Equal(t, triagev1.ItemState_LEASED, up.State)
	require.Equal(t, int32(1), up.Priority)
	require.True(t, ack(t, b, got[1])[0].Ok)
}

// TestStaleTokenAfterUpdateChangesNothing: once an item's lease lapsed,
// an update ends it, so the old consumer's token can no longer extend,
// nack or ack the item and undo what the update wrote.
func TestStaleTokenAfterUpdateChangesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t, bedOpts{})
	const topic = "stale-after-update"
	enqueue(t, b, topic, &triagev1.NewItem{Payload: []byte("x")}, &triagev1.NewItem{Payload: []byte("y")}, &triagev1.NewItem{Payload: []byte("z")})
	got := dequeue(t, b, topic, 3, time.Second)
	require.Len(t, got, 3)
	time.Sleep(time.Second + clockSlack + 200*time.Millisecond) // every lease lapses
	later := timestamppb.New(time.Now().Add(time.Hour).Truncate(time.Microsecond))
	for _, it := range got {
		_, err := b.queue.UpdateItem(b.ctx(), &triagev1.UpdateItemRequest{Namespace: "default", Id: it.Id, DeliverAfter: later})
		require.NoError(t, err)
	}

	_, err := b.queue.ExtendLease(b.ctx(), &triagev1.ExtendLeaseRequest{Namespace: "default", Id: got[0].Id, LeaseToken: got[0].LeaseToken})
	requireCode(t, err, codes.FailedPrecondition)
	res := nackOne(t, b, got[1], durationpb.New(0), "", nil)
	require.False(t, res.Ok, "a nack with the lapsed token after the update: %v", res)
	acked := ack(t, b, got[2])
	require.False(t, acked[0].Ok, "an ack with the lapsed token after the update: %v", acked[0])

	for _, it := range got {
		after := getItem(t, b, it.Id)
		require.Equal(t, triagev1.ItemState_DELAYED, after.State, "item %s", it.Id)
		require.True(t, after.DeliverAfter.AsTime().Equal(later.AsTime()), "item %s: deliver_after %v, updated to %v", it.Id, after.DeliverAfter.AsTime(), later.AsTime())
	}
}

// TestUpdateItemEscalatesInBusyTopic: a consumer is working the topic (so
// the dequeuer holds a prefetch buffer of it) when an item is escalated;
// the next dequeue delivers the escalated item.
func TestUpdateItemEscalatesInBusyTopic(t *testing.T) {
	t.Parallel()
	b := setup(t, bedOpts{})
	const topic = "busy-upd"
	var items []*triagev1.NewItem
	for i := range 40 {
		items = append(items, &triagev1.NewItem{Payload: []byte(fmt.Sprint(i)), Priority: 5})
	}
	res := enqueue(t, b, topic, items...)
	first := dequeue(t, b, topic, 1, 0)
	require.Len(t, first, 1)
	require.Equal(t, res[0].Id, first[0].Id)
	for round, idx := range []int{39, 3, 20} {
		p := int32(-round)
		_, err := b.queue.UpdateItem(b.ctx(), &triagev1.UpdateItemRequest{Namespace: "default", Id: res[idx].Id, Priority: &p})
		require.NoError(t, err)
		got := dequeue(t, b, topic, 1, 0)
		require.Len(t, got, 1)
		require.Equal(t, res[idx].Id, got[0].Id, "escalated item %d comes next, not %s (priority %d)", idx, got[0].Payload, got[0].Priority)
		require.Equal(t, p, got[0].Priority)
	}
}

func TestDeleteItem(t *testing.T) {
	t.Parallel()
	b := setup(t, bedOpts{})
	res := enqueue(t, b, "del", &triagev1.NewItem{Payload: []byte("x")}, &triagev1.NewItem{Payload: []byte("y")})
	_, err := b.queue.DeleteItem(b.ctx(), &triagev1.DeleteItemRequest{Namespace: "default", Id: res[0].Id})
	require.NoError(t, err)
	_, err = b.queue.GetItem(b.ctx(), &triagev1.GetItemRequest{Namespace: "default", Id: res[0].Id})
	requireCode(t, err, codes.NotFound, "not found")
	_, err = b.queue.DeleteItem(b.ctx(), &triagev1.DeleteItemRequest{Namespace: "default", Id: res[0].Id})
	requireCode(t, err, codes.NotFound, "not found")
	require.Equal(t, 1, b.rowCount("items"))

	// A leased item can be deleted too; its holder's ack then finds nothing.
	got := dequeue(t, b, "del", 5, 0)
	require.Equal(t, []string{res[1].Id}, ids(got), "the deleted item is not delivered")
	_, err = b.queue.DeleteItem(b.ctx(), &triagev1.DeleteItemRequest{Namespace: "default", Id: res[1].Id})
	require.NoError(t, err)
	r := ack(t, b, got...)
	require.False(t, r[0].Ok)
	require.Contains(t, r[0].Error, "not found")
	require.Equal(t, 0, b.rowCount("items"))
}

// TestDeletedItemIsNotDelivered deletes items of a topic a consumer is
// working, so some of them may already be in the dequeuer's prefetch
// buffer, and checks that none of them is delivered.
func TestDeletedItemIsNotDelivered(t *testing.T) {
	t.Parallel()
	b := setup(t, bedOpts{})
	var items []*triagev1.NewItem
	for i := range 20 {
		items = append(items, &triagev1.NewItem{Payload: []byte(fmt.Sprint(i))})
	}
	res := enqueue(t, b, "del-busy", items...)
	first := dequeue(t, b, "del-busy", 1, 0)
	require.Equal(t, res[0].Id, first[0].Id)
	deleted := map[string]bool{}
	for _, i := range []int{1, 2, 5, 19} {
		_, err := b.queue.DeleteItem(b.ctx(), &triagev1.DeleteItemRequest{Namespace: "default", Id: res[i].Id})
		require.NoError(t, err)
		deleted[res[i].Id] = true
	}
	var got []*triagev1.LeasedItem
	for range 20 {
		batch := dequeue(t, b, "del-busy", 1, 0)
		if len(batch) == 0 {
			break
		}
		require.False(t, deleted[batch[0].Id], "deleted item %s delivered", batch[0].Id)
		got = append(got, batch...)
	}
	require.Len(t, got, 15)
	for _, r := range ack(t, b, append(got, first...)...) {
		require.True(t, r.Ok, r.Error)
	}
	require.Equal(t, 0, b.rowCount("items"))
}

func TestDeliverAfterNeverEarly(t *testing.T) {
	t.Parallel()
	b := setup(t, bedOpts{})
	const n = 50
	due := map[string]time.Time{}
	base := time.Now().Add(time.Second)
	for r := range n / 5 {
		var items []*triagev1.NewItem
		for i := range 5 {
			at := base.Add(time.Duration(r*5+i) * 20 * time.Millisecond).Truncate(time.Microsecond)
			items = append(items, &triagev1.NewItem{Payload: []byte("later"), DeliverAfter: timestamppb.New(at), Priority: int32(i % 2)})
		}
		for i, res := range enqueue(t, b, "later", items...) {
			due[res.Id] = items[i].DeliverAfter.AsTime()
		}
	}
	require.Equal(t, triagev1.ItemState_DELAYED, getItem(t, b, firstKey(due)).State)

	early := 0
	got := map[string]bool{}
	require.Eventually(t, func() bool {
		items := dequeueWait(t, b, "later", n, 500*time.Millisecond, 0)
		at := time.Now()
		for _, it := range items {
			assert.False(t, got[it.Id], "delivered twice: %s", it.Id)
			got[it.Id] = true
			if at.Before(due[it.Id]) {
				early++
				t.Errorf("item %s delivered %s early", it.Id, due[it.Id].Sub(at))
			}
			assert.True(t, it.DeliverAfter.AsTime().Equal(due[it.Id]), "LeasedItem.deliver_after is the requested time")
		}
		return len(got) == n
	}, 15*time.Second, time.Millisecond)
	require.Zero(t, early)
	require.True(t, time.Now().After(base.Add(time.Duration(n-1)*20*time.Millisecond)))
}

func firstKey[V any](m map[string]V) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys[0]
}

func TestLongPoll(t *testing.T) {
	t.Parallel()
	b := setup(t, bedOpts{})

	// Nothing arrives: the poll returns empty after about its wait, every
	// time.
	for range 4 {
		start := time.Now()
		require.Empty(t, dequeueWait(t, b, "lp", 1, 600*time.Millisecond, 0))
		// Not before its wait; well before a hang (the request's ctx is 30s).
		require.WithinRange(t, time.Now(), start.Add(600*time.Millisecond), start.Add(6*time.Second))
	}

	// An item enqueued during the wait is returned at once.
	type result struct {
		items []*triagev1.LeasedItem
		at    time.Time
	}
	polls := make(chan result, 2)
	var wg sync.WaitGroup
	start := time.Now()
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			items := dequeueWait(t, b, "lp", 1, 4*time.Second, 0)
			polls <- result{items, time.Now()}
		}()
	}
	<-time.After(500 * time.Millisecond) // both polls are parked by now
	res := enqueue(t, b, "lp", &triagev1.NewItem{Payload: []byte("wake")})
	enqueued := time.Now()
	first := <-polls
	require.Len(t, first.items, 1, "one poll gets the item")
	require.Equal(t, res[0].Id, first.items[0].Id)
	require.Less(t, first.at.Sub(enqueued), 2*time.Second, "the poll returned soon after the enqueue, not at the end of its wait")
	second := <-polls
	require.Empty(t, second.items, "one item wakes one poll; the other runs out its wait")
	require.GreaterOrEqual(t, second.at.Sub(start), 4*time.Second)
	wg.Wait()
}

func TestTopicStats(t *testing.T) {
	t.Parallel()
	b := setup(t, bedOpts{})
	const topic = "stats"
	// Two items leased first, so no prefetch holds the ones enqueued later.
	enqueue(t, b, topic, &triagev1.NewItem{Payload: []byte("l1"), Priority: 7}, &triagev1.NewItem{Payload: []byte("l2"), Priority: 7})
	require.Len(t, dequeue(t, b, topic, 2, 0), 2)
	tenAgo := time.Now().Add(-10 * time.Second)
	enqueue(t, b, topic, &triagev1.NewItem{Payload: []byte("r1"), Priority: 1})
	enqueue(t, b, topic, &triagev1.NewItem{Payload: []byte("r2"), Priority: 1}, &triagev1.NewItem{Payload: []byte("r3"), Priority: 3, DeliverAfter: timestamppb.New(tenAgo)})
	enqueue(t, b, topic, &triagev1.NewItem{Payload: []byte("d1"), DeliverAfter: timestamppb.New(time.Now().Add(time.Hour))})
	enqueue(t, b, topic, &triagev1.NewItem{Payload: []byte("d2"), Priority: -1, DeliverAfter: timestamppb.New(time.Now().Add(time.Minute))})
	enqueue(t, b, "elsewhere", &triagev1.NewItem{Payload: []byte("other topic")})

	asked := time.Now()
	st, err := b.queue.GetTopicStats(b.ctx(), &triagev1.GetTopicStatsRequest{Namespace: "default", Topic: topic})
	require.NoError(t, err)
	require.Equal(t, "default", st.Namespace)
	require.Equal(t, topic, st.Topic)
	require.Equal(t, int64(3), st.Ready)
	require.Equal(t, int64(2), st.Leased)
	require.Equal(t, int64(2), st.Delayed)
	require.Equal(t, int64(7), st.Total)
	require.Zero(t, st.DeadLetters)
	var byPrio [][2]int64
	for _, p := range st.ReadyByPriority {
		byPrio = append(byPrio, [2]int64{int64(p.Priority), p.Ready})
	}
	require.Equal(t, [][2]int64{{1, 2}, {3, 1}}, byPrio, "ready by priority, most urgent first")
	age := st.OldestReadyAge.AsDuration()
	require.GreaterOrEqual(t, age, 10*time.Second)
	require.LessOrEqual(t, age, time.Since(tenAgo)+time.Since(asked))

	empty, err := b.queue.GetTopicStats(b.ctx(), &triagev1.GetTopicStatsRequest{Namespace: "default", Topic: "never-used"})
	require.NoError(t, err)
	require.Zero(t, empty.Total)
	require.Empty(t, empty.ReadyByPriority)
	require.Nil(t, empty.OldestReadyAge)
}

func TestListTopicsPaging(t *testing.T) {
	t.Parallel()
	b := setup(t, bedOpts{})
	names := []string{"lt-c", "lt-a", "lt-e", "lt-b", "lt-d"}
	counts := map[string]int64{"lt-a": 1, "lt-b": 2, "lt-c": 3, "lt-d": 4, "lt-e": 5}
	for _, name := range names {
		// One item per request, so round-robin spreads a topic over shards.
		for range counts[name] {
			enqueue(t, b, name, &triagev1.NewItem{Payload: []byte(name)})
		}
	}
	_, err := b.queue.Enqueue(b.ctx(), &triagev1.EnqueueRequest{Namespace: "other", Topic: "lt-other", Items: []*triagev1.NewItem{{Payload: []byte("x")}}})
	require.NoError(t, err)

	var pages [][]string
	got := map[string]int64{}
	token := ""
	for range 5 {
		resp, err := b.queue.ListTopics(b.ctx(), &triagev1.ListTopicsRequest{Namespace: "default", PageSize: 2, PageToken: token})
		require.NoError(t, err)
		var page []string
		for _, tp := range resp.Topics {
			page = append(page, tp.Topic)
			got[tp.Topic] = tp.Items
		}
		pages = append(pages, page)
		token = resp.NextPageToken
		if token == "" {
			break
		}
	}
	require.Equal(t, [][]string{{"lt-a", "lt-b"}, {"lt-c", "lt-d"}, {"lt-e"}}, pages)
	require.Equal(t, counts, got, "item counts summed over shards")

	all, err := b.queue.ListTopics(b.ctx(), &triagev1.ListTopicsRequest{Namespace: "default"})
	require.NoError(t, err)
	require.Len(t, all.Topics, 5, "default page size holds them all")
	require.Empty(t, all.NextPageToken)
	other, err := b.queue.ListTopics(b.ctx(), &triagev1.ListTopicsRequest{Namespace: "other"})
	require.NoError(t, err)
	require.Len(t, other.Topics, 1)
	require.Equal(t, "lt-other", other.Topics[0].Topic)
}

func TestDedupKey(t *testing.T) {
	t.Parallel()
	b := setup(t, bedOpts{})
	r1 := enqueue(t, b, "dd", &triagev1.NewItem{Payload: []byte("first"), DedupKey: "order-1"})[0]
	require.False(t, r1.Duplicate)
	r2 := enqueue(t, b, "dd", &triagev1.NewItem{Payload: []byte("second"), DedupKey: "order-1"})[0]
	require.True(t, r2.Duplicate)
	require.Equal(t, r1.Id, r2.Id)
	require.Equal(t, 1, b.rowCount("items"))
	it := getItem(t, b, r1.Id)
	require.Equal(t, "first", string(it.Payload), "the first copy wins")
	require.Equal(t, "order-1", it.DedupKey)

	// Two copies in one request.
	rs := enqueue(t, b, "dd", &triagev1.NewItem{Payload: []byte("a"), DedupKey: "order-2"}, &triagev1.NewItem{Payload: []byte("b"), DedupKey: "order-2"},
		&triagev1.NewItem{Payload: []byte("no key")})
	require.False(t, rs[0].Duplicate)
	require.True(t, rs[1].Duplicate)
	require.Equal(t, rs[0].Id, rs[1].Id)
	require.False(t, rs[2].Duplicate)
	require.Equal(t, 3, b.rowCount("items"))

	// The key is per topic.
	other := enqueue(t, b, "dd-other", &triagev1.NewItem{Payload: []byte("c"), DedupKey: "order-1"})[0]
	require.False(t, other.Duplicate)
	require.NotEqual(t, r1.Id, other.Id)

	// Once the item is gone (no dedup window), its key stays taken for
	// the namespace's retry window after its enqueue (5m by default): a
	// retry is still the acked item.
	got := dequeue(t, b, "dd", 10, 0)
	require.Len(t, got, 3)
	for _, r := range ack(t, b, got...) {
		require.True(t, r.Ok, r.Error)
	}
	r3 := enqueue(t, b, "dd", &triagev1.NewItem{Payload: []byte("third"), DedupKey: "order-1"})[0]
	require.True(t, r3.Duplicate)
	require.Equal(t, r1.Id, r3.Id)
	require.Equal(t, 1, b.rowCount("items"), "only dd-other's item")
}

func TestBufferedDurability(t *testing.T) {
	t.Parallel()
	b := setup(t, bedOpts{})
	var items []*triagev1.NewItem
	for i := range 20 {
		items = append(items, &triagev1.NewItem{Payload: []byte(fmt.Sprint(i)), Priority: int32(i % 3)})
	}
	resp, err := b.queue.Enqueue(b.ctx(), &triagev1.EnqueueRequest{Namespace: "default", Topic: "buf", Items: items, Durability: triagev1.Durability_BUFFERED})
	require.NoError(t, err)
	require.Len(t, resp.Results, 20)
	want := map[string]bool{}
	for _, r := range resp.Results {
		_, err := itemid.Parse(r.Id)
		require.NoError(t, err)
		require.False(t, r.Duplicate)
		require.Equal(t, "us-east", r.Region)
		want[r.Id] = true
	}
	require.Len(t, want, 20, "distinct IDs")
	require.Eventually(t, func() bool { return b.rowCount("items") == 20 }, 10*time.Second, 10*time.Millisecond)
	for id := range want {
		require.Equal(t, triagev1.ItemState_READY, getItem(t, b, id).State)
	}
	var got []*triagev1.LeasedItem
	require.Eventually(t, func() bool {
		got = append(got, dequeueWait(t, b, "buf", 20, 200*time.Millisecond, 0)...)
		return len(got) >= 20
	}, 10*time.Second, time.Millisecond)
	require.Len(t, got, 20)
	for _, it := range got {
		require.True(t, want[it.Id])
	}
}

func TestNamespaceIsolation(t *testing.T) {
	t.Parallel()
	b := setup(t, bedOpts{})
	res := enqueue(t, b, "iso", &triagev1.NewItem{Payload: []byte("mine")})
	got := dequeue(t, b, "iso", 1, time.Minute)
	require.Len(t, got, 1)
	it := got[0]
	spare := enqueue(t, b, "iso", &triagev1.NewItem{Payload: []byte("spare")})[0].Id
	before := getItem(t, b, it.Id)
	ctx := b.ctx()
	const other = "other"

	_, err := b.queue.GetItem(ctx, &triagev1.GetItemRequest{Namespace: other, Id: res[0].Id})
	requireCode(t, err, codes.NotFound)
	ar, err := b.queue.Ack(ctx, &triagev1.AckRequest{Namespace: other, Acks: []*triagev1.LeaseRef{{Id: it.Id, LeaseToken: it.LeaseToken}}})
	require.NoError(t, err)
	require.False(t, ar.Results[0].Ok, "another namespace cannot ack the item, even with its token")
	require.Contains(t, ar.Results[0].Error, "not found")
	nr, err := b.queue.Nack(ctx, &triagev1.NackRequest{Namespace: other, Nacks: []*triagev1.NackItem{{Id: it.Id, LeaseToken: it.LeaseToken}}})
	require.NoError(t, err)
	require.False(t, nr.Results[0].Ok)
	_, err = b.queue.ExtendLease(ctx, &triagev1.ExtendLeaseRequest{Namespace: other, Id: it.Id, LeaseToken: it.LeaseToken})
	requireCode(t, err, codes.NotFound)
	p := int32(-5)
	_, err = b.queue.UpdateItem(ctx, &triagev1.UpdateItemRequest{Namespace: other, Id: spare, Priority: &p})
	requireCode(t, err, codes.NotFound)
	_, err = b.queue.DeleteItem(ctx, &triagev1.DeleteItemRequest{Namespace: other, Id: spare})
	requireCode(t, err, codes.NotFound)
	dr, err := b.queue.Dequeue(ctx, &triagev1.DequeueRequest{Namespace: other, Topics: []*triagev1.TopicCount{{Topic: "iso", Count: 10}}})
	require.NoError(t, err)
	require.Empty(t, dr.Items, "another namespace's dequeue does not see the topic")
	st, err := b.queue.GetTopicStats(ctx, &triagev1.GetTopicStatsRequest{Namespace: other, Topic: "iso"})
	require.NoError(t, err)
	require.Zero(t, st.Total)

	after := getItem(t, b, it.Id)
	require.True(t, proto.Equal(before, after), "nothing changed:\n%v\n%v", before, after)
	sp := getItem(t, b, spare)
	require.Equal(t, int32(0), sp.Priority)
	require.Equal(t, triagev1.ItemState_READY, sp.State)
	require.Equal(t, 2, b.rowCount("items"))
	require.True(t, ack(t, b, it)[0].Ok, "the owner's ack still works")
}

func TestTTL(t *testing.T) {
	t.Parallel()
	b := setup(t, bedOpts{})
	t0 := time.Now()
	// Delayed past its TTL: never ready while it exists.
	never := enqueue(t, b, "ttl", &triagev1.NewItem{Payload: []byte("never"), Ttl: durationpb.New(time.Second),
		DeliverAfter: timestamppb.New(t0.Add(1500 * time.Millisecond))})[0].Id
	// Ready at once, but leases of 100ms keep lapsing until it expires.
	churn := enqueue(t, b, "ttl", &triagev1.NewItem{Payload: []byte("churn"), Ttl: durationpb.New(time.Second)})[0].Id
	keep := enqueue(t, b, "ttl-keep", &triagev1.NewItem{Payload: []byte("no ttl")})[0].Id
	expires := getItem(t, b, churn).ExpiresAt.AsTime()
	require.WithinRange(t, expires, t0.Add(time.Second), time.Now().Add(time.Second))
	require.NotNil(t, getItem(t, b, never).ExpiresAt)

	deliveries := 0
	gone := func(id string) bool {
		_, err := b.queue.GetItem(b.ctx(), &triagev1.GetItemRequest{Namespace: "default", Id: id})
		return status.Code(err) == codes.NotFound
	}
	var goneAt time.Time
	require.Eventually(t, func() bool {
		for _, it := range dequeueWait(t, b, "ttl", 10, 50*time.Millisecond, 100*time.Millisecond) {
			assert.Equal(t, churn, it.Id, "an item delayed past its TTL is never delivered")
			// The lease was stamped lease_duration before its expiry.
			leasedAt := it.LeaseExpiresAt.AsTime().Add(-100 * time.Millisecond)
			assert.True(t, leasedAt.Before(expires), "delivered %s after its TTL", leasedAt.Sub(expires))
			deliveries++
		}
		if gone(churn) && gone(never) {
			goneAt = time.Now()
			return true
		}
		return false
	}, 5*time.Second, time.Millisecond)
	require.Positive(t, deliveries, "delivered while alive")
	require.Less(t, goneAt.Sub(expires), 3*time.Second)
	// And nothing after.
	require.Zero(t, during(time.Second, func() int { return len(dequeueWait(t, b, "ttl", 10, 100*time.Millisecond, 0)) }))
	require.Equal(t, triagev1.ItemState_READY, getItem(t, b, keep).State, "items without a TTL stay")
	require.Equal(t, 1, b.rowCount("items"))
}

// TestTTLExpiresInPrefetchBuffer: an item whose TTL passes while it waits
// in the dequeuer's prefetch buffer (a consumer is working its topic) is
// not delivered.
func TestTTLExpiresInPrefetchBuffer(t *testing.T) {
	t.Parallel()
	b := setup(t, bedOpts{})
	res := enqueue(t, b, "ttl-buf", &triagev1.NewItem{Payload: []byte("a")},
		&triagev1.NewItem{Payload: []byte("short-lived"), Priority: 1, Ttl: durationpb.New(time.Second)},
		&triagev1.NewItem{Payload: []byte("b"), Priority: 2})
	first := dequeue(t, b, "ttl-buf", 1, 0)
	require.Equal(t, []string{res[0].Id}, ids(first), "the others are prefetched now")
	expires := getItem(t, b, res[1].Id).ExpiresAt.AsTime()
	require.Eventually(t, func() bool { return time.Now().After(expires) }, 5*time.Second, time.Millisecond)
	got := dequeue(t, b, "ttl-buf", 5, 0)
	require.Equal(t, []string{res[2].Id}, ids(got), "the expired item is not delivered")
	require.Eventually(t, func() bool {
		_, err := b.queue.GetItem(b.ctx(), &triagev1.GetItemRequest{Namespace: "default", Id: res[1].Id})
		return status.Code(err) == codes.NotFound
	}, 5*time.Second, 10*time.Millisecond)
}

// httpJSON sends a JSON request to the gateway and decodes the reply.
func httpJSON(t *testing.T, method, url, body string) (int, map[string]any) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	require.NoError(t, err)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Contains(t, resp.Header.Get("Content-Type"), "application/json", "body: %s", data)
	var out map[string]any
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	require.NoError(t, dec.Decode(&out), "body: %s", data)
	return resp.StatusCode, out
}

func TestGatewayEndToEnd(t *testing.T) {
	t.Parallel()
	b := setup(t, bedOpts{})
	base := b.http + "/v1/namespaces/default"

	code, body := httpJSON(t, "POST", base+"/topics/t/items", `{"items":[{"payload":"aGVsbG8=","priority":1,"metadata":{"k":"v"}}]}`)
	require.Equal(t, http.StatusOK, code, "%v", body)
	results := body["results"].([]any)
	require.Len(t, results, 1)
	res := results[0].(map[string]any)
	id := res["id"].(string)
	_, err := itemid.Parse(id)
	require.NoError(t, err)
	require.Equal(t, false, res["duplicate"], "unpopulated fields are emitted")
	require.Equal(t, "us-east", res["region"])
	require.Equal(t, 1, b.rowCount("items"))

	before := time.Now()
	code, body = httpJSON(t, "POST", base+":dequeue", `{"topics":[{"topic":"t","count":1}]}`)
	after := time.Now()
	require.Equal(t, http.StatusOK, code, "%v", body)
	items := body["items"].([]any)
	require.Len(t, items, 1)
	it := items[0].(map[string]any)
	require.Equal(t, id, it["id"])
	require.Equal(t, "t", it["topic"])
	require.Equal(t, base64.StdEncoding.EncodeToString([]byte("hello")), it["payload"])
	require.Equal(t, json.Number("1"), it["priority"])
	require.Equal(t, json.Number("1"), it["attempts"])
	require.Equal(t, map[string]any{"k": "v"}, it["metadata"])
	token, _ := it["lease_token"].(string)
	require.Len(t, token, 16, "proto field names: lease_token")
	expiry, err := time.Parse(time.RFC3339Nano, it["lease_expires_at"].(string))
	require.NoError(t, err)
	require.WithinRange(t, expiry, before.Add(30*time.Second-time.Millisecond), after.Add(30*time.Second), "the namespace's 30s lease")
	for _, f := range []string{"enqueued_at", "deliver_after"} {
		require.Contains(t, it, f)
	}

	code, body = httpJSON(t, "GET", base+"/items/"+id, "")
	require.Equal(t, http.StatusOK, code, "%v", body)
	require.Equal(t, "LEASED", body["state"])
	require.Equal(t, "default", body["namespace"])
	require.Equal(t, "", body["last_error"], "unpopulated fields are emitted")
	require.Equal(t, "", body["priority_changed_by"])
	require.Contains(t, body, "expires_at", "an unset message field is emitted as null")
	require.Nil(t, body["expires_at"])

	code, body = httpJSON(t, "PATCH", base+"/items/"+id, `{"priority":0,"metadata":{"k2":"v2"}}`)
	require.Equal(t, http.StatusOK, code, "%v", body)
	require.Equal(t, json.Number("0"), body["priority"])
	require.Equal(t, map[string]any{"k": "v", "k2": "v2"}, body["metadata"])

	code, body = httpJSON(t, "GET", base+"/topics/t/stats", "")
	require.Equal(t, http.StatusOK, code, "%v", body)
	require.Equal(t, "t", body["topic"])
	require.Equal(t, "1", body["leased"], "int64 as a JSON string")
	require.Equal(t, "1", body["total"])
	require.Equal(t, "0", body["ready"])
	require.Equal(t, []any{}, body["ready_by_priority"])

	code, body = httpJSON(t, "GET", base+"/topics", "")
	require.Equal(t, http.StatusOK, code, "%v", body)
	require.Equal(t, []any{map[string]any{"topic": "t", "items": "1", "dead_letters": "0", "paused": false}}, body["topics"])
	require.Equal(t, "", body["next_page_token"])

	code, body = httpJSON(t, "POST", base+":ack", fmt.Sprintf(`{"acks":[{"id":%q,"lease_token":%q}]}`, id, token))
	require.Equal(t, http.StatusOK, code, "%v", body)
	ackRes := body["results"].([]any)[0].(map[string]any)
	require.Equal(t, true, ackRes["ok"])
	require.Equal(t, id, ackRes["id"])
	require.Equal(t, "", ackRes["error"])
	require.Equal(t, 0, b.rowCount("items"))

	code, body = httpJSON(t, "GET", base+"/items/"+id, "")
	require.Equal(t, http.StatusNotFound, code, "%v", body)
	require.Equal(t, json.Number("5"), body["code"])
	require.Contains(t, body["message"], "not found")

	code, body = httpJSON(t, "GET", b.http+"/v1/shardmap", "")
	require.Equal(t, http.StatusOK, code, "%v", body)
	require.Equal(t, "1", body["version"])
	require.Equal(t, []any{"us-east"}, body["regions"])
	shards := body["shards"].([]any)
	require.Len(t, shards, 2)
	for i, s := range shards {
		s := s.(map[string]any)
		require.Equal(t, json.Number(fmt.Sprint(i+1)), s["id"])
		require.Equal(t, "us-east", s["home_region"])
		require.NotEmpty(t, s["primary"])
		require.NotContains(t, s["primary"], "@", "no credentials")
	}
	var nsNames []string
	for _, n := range body["namespaces"].([]any) {
		n := n.(map[string]any)
		nsNames = append(nsNames, n["namespace"].(string))
		require.Equal(t, "us-east", n["region"])
		require.Len(t, n["shards"], 2)
	}
	require.ElementsMatch(t, []string{"default", "other"}, nsNames)
}

// TestDequeueCarriesAcks: a Dequeue acks the refs it carries and leases
// new items in one call, answering each ref (a stale token is refused,
// the rest acked); a malformed ref or topic refuses the whole call, which
// then acks and leases nothing.
func TestDequeueCarriesAcks(t *testing.T) {
	t.Parallel()
	b := setup(t, bedOpts{})
	for i := range 4 {
		enqueue(t, b, "carry", &triagev1.NewItem{Payload: []byte{byte(i)}, Priority: int32(i)})
	}
	got := dequeue(t, b, "carry", 2, 0)
	require.Len(t, got, 2)
	refs := func(items ...*triagev1.LeasedItem) []*triagev1.LeaseRef {
		var out []*triagev1.LeaseRef
		for _, it := range items {
			out = append(out, &triagev1.LeaseRef{Id: it.Id, LeaseToken: it.LeaseToken})
		}
		return out
	}
	req := func(n int32, acks []*triagev1.LeaseRef) *triagev1.DequeueRequest {
		return &triagev1.DequeueRequest{Namespace: "default", Topics: []*triagev1.TopicCount{{Topic: "carry", Count: n}}, Acks: acks}
	}

	// Refused whole: a malformed token, a topic with no count.
	bad := refs(got...)
	bad[1] = &triagev1.LeaseRef{Id: got[1].Id, LeaseToken: "not-a-token"}
	_, err := b.queue.Dequeue(b.ctx(), req(1, bad))
	requireCode(t, err, codes.InvalidArgument, "acks[1]")
	_, err = b.queue.Dequeue(b.ctx(), req(0, refs(got...)))
	requireCode(t, err, codes.InvalidArgument)
	for _, it := range got {
		require.Equal(t, triagev1.ItemState_LEASED, getItem(t, b, it.Id).State, "a refused call acked nothing")
	}
	require.Equal(t, 4, b.rowCount("items"))

	// The first ref acked, the second stale, one item leased.
	stale := refs(got...)
	stale[1].LeaseToken = store.FormatToken(1)
	resp, err := b.queue.Dequeue(b.ctx(), req(1, stale))
	require.NoError(t, err)
	require.Len(t, resp.Items, 1)
	require.Len(t, resp.AckResults, 2)
	require.Equal(t, got[0].Id, resp.AckResults[0].Id)
	require.True(t, resp.AckResults[0].Ok, resp.AckResults[0].Error)
	require.False(t, resp.AckResults[1].Ok)
	require.Contains(t, resp.AckResults[1].Error, "stale lease token")
	require.Equal(t, 3, b.rowCount("items"))
	require.Equal(t, triagev1.ItemState_LEASED, getItem(t, b, got[1].Id).State)

	// The rest acked as the last items are taken; the gateway carries
	// them too.
	status, body := httpJSON(t, "POST", b.http+"/v1/namespaces/default:dequeue",
		fmt.Sprintf(`{"topics":[{"topic":"carry","count":5}],"acks":[{"id":%q,"lease_token":%q},{"id":%q,"lease_token":%q}]}`,
			got[1].Id, got[1].LeaseToken, resp.Items[0].Id, resp.Items[0].LeaseToken))
	require.Equal(t, http.StatusOK, status, "%v", body)
	require.Len(t, body["items"], 1)
	results, _ := body["ack_results"].([]any)
	require.Len(t, results, 2, "%v", body)
	for _, r := range results {
		require.Equal(t, true, r.(map[string]any)["ok"], "%v", body)
	}
	require.Equal(t, 1, b.rowCount("items"))
}

// TestCarriedAcksFailPerShard: acks carried by a Dequeue to two shards, one
// of them fenced, commit on the other, and only the fenced shard's refs
// say they were not acked.
func TestCarriedAcksFailPerShard(t *testing.T) {
	t.Parallel()
	b := setup(t, bedOpts{})
	var got []*triagev1.LeasedItem
	onShard := map[string]int{}
	for onShard["1"] == 0 || onShard["2"] == 0 {
		require.Less(t, len(got), 50, "items on both shards")
		enqueue(t, b, "fence", &triagev1.NewItem{Payload: []byte("x")})
		for _, it := range dequeueWait(t, b, "fence", 10, 5*time.Second, 0) {
			got = append(got, it)
			onShard[strings.SplitN(it.Id, "-", 2)[0]]++
		}
	}

	prev := b.node.ShardMap()
	s2, ok := prev.Shard(2)
	require.True(t, ok)
	s2.Fenced = true
	next, err := prev.WithShard(s2)
	require.NoError(t, err)
	b.publishMap(prev, next)

	var acks []*triagev1.LeaseRef
	for _, it := range got {
		acks = append(acks, &triagev1.LeaseRef{Id: it.Id, LeaseToken: it.LeaseToken})
	}
	resp, err := b.queue.Dequeue(b.ctx(), &triagev1.DequeueRequest{Namespace: "default",
		Topics: []*triagev1.TopicCount{{Topic: "fence", Count: 1}}, Acks: acks})
	require.NoError(t, err)
	require.Len(t, resp.AckResults, len(got))
	for i, r := range resp.AckResults {
		require.Equal(t, got[i].Id, r.Id)
		if strings.HasPrefix(r.Id, "1-") {
			require.True(t, r.Ok, "%s: %s", r.Id, r.Error)
		} else {
			require.False(t, r.Ok, "%s on the fenced shard", r.Id)
			require.Contains(t, r.Error, "shard 2 is failing over")
		}
	}
	count := func(db *sqlx.DB) (n int) {
		require.NoError(t, db.Get(&n, "SELECT COUNT(*) FROM items"))
		return n
	}
	require.Zero(t, count(b.region.shards[0]), "shard 1's acks committed")
	require.Equal(t, onShard["2"], count(b.region.shards[1]), "shard 2's items are left")
}
