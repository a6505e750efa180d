package e2e

import (
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
)

func putNamespace(t *testing.T, b *bed, ns *triagev1.Namespace) *triagev1.Namespace {
	t.Helper()
	got, err := b.admin.PutNamespace(b.ctx(), &triagev1.PutNamespaceRequest{Namespace: ns.Name, Config: ns})
	require.NoError(t, err)
	return got
}

func enqueueNS(t *testing.T, b *bed, ns, topic string, items ...*triagev1.NewItem) error {
	t.Helper()
	_, err := b.queue.Enqueue(b.ctx(), &triagev1.EnqueueRequest{Namespace: ns, Topic: topic, Items: items})
	return err
}

func TestNamespaceAdminOverHTTP(t *testing.T) {
	t.Parallel()
	b := setup(t, bedOpts{})
	req, err := http.NewRequest(http.MethodPut, b.http+"/v1/namespaces/billing",
		strings.NewReader(`{"max_attempts":4,"default_lease_duration":"45s","topics":{"invoices":{"policy":"WEIGHTED"}}}`))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
	require.Contains(t, string(body), `"max_attempts":4`)

	resp, err = http.Get(b.http + "/v1/namespaces/billing")
	require.NoError(t, err)
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	for _, want := range []string{`"name":"billing"`, `"default_lease_duration":"45s"`, `"max_payload_bytes":262144`, `"WEIGHTED"`, `"region":"us-east"`} {
		require.Contains(t, string(body), want)
	}
	// The new namespace serves at once; defaults filled in.
	require.NoError(t, enqueueNS(t, b, "billing", "invoices", &triagev1.NewItem{Payload: []byte("x")}))
	// Bad config is refused and changes nothing.
	req, _ = http.NewRequest(http.MethodPut, b.http+"/v1/namespaces/billing", strings.NewReader(`{"default_lease_duration":"0.001s"}`))
	req.Header.Set("Content-Type", "application/json")
	resp, err = http.DefaultClient.Do(req)
	require.NoError(t, err)
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusBadRequest, resp.StatusCode, string(body))
	require.Contains(t, string(body), "default_lease_duration must be within")
	got, err := b.admin.GetNamespace(b.ctx(), &triagev1.GetNamespaceRequest{Namespace: "billing"})
	require.NoError(t, err)
	require.Equal(t, 45*time.Second, got.DefaultLeaseDuration.AsDuration())
	_, err = b.admin.GetNamespace(b.ctx(), &triagev1.GetNamespaceRequest{Namespace: "nope"})
	require.Equal(t, codes.NotFound, status.Code(err))
}

func TestEnqueueRateLimitAndMaxDepth(t *testing.T) {
	t.Parallel()
	b := setup(t, bedOpts{})
	putNamespace(t, b, &triagev1.Namespace{Name: "limited", EnqueueRateLimit: 2, EnqueueBurst: 5})
	accepted, refused := 0, 0
	for i := 0; i < 12; i++ {
		err := enqueueNS(t, b, "limited", "t", &triagev1.NewItem{Payload: []byte("x")})
		if err == nil {
			accepted++
			continue
		}
		refused++
		st := status.Convert(err)
		require.Equal(t, codes.ResourceExhausted, st.Code())
		require.Contains(t, st.Message(), "retry after")
		var hint *errdetails.RetryInfo
		for _, d := range st.Details() {
			if ri, ok := d.(*errdetails.RetryInfo); ok {
				hint = ri
			}
		}
		require.NotNil(t, hint, "RetryInfo detail")
		require.Positive(t, hint.RetryDelay.AsDuration())
	}
	require.GreaterOrEqual(t, accepted, 5)
	require.Less(t, accepted, 9, "a burst of 5 at 2/s cannot pass 12 back-to-back requests")
	require.Positive(t, refused)
	// HTTP: 429.
	resp, err := http.Post(b.http+"/v1/namespaces/limited/topics/t/items", "application/json", strings.NewReader(`{"items":[{"payload":"eA=="}]}`))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	// Nothing refused was stored, nothing accepted lost.
	require.Equal(t, accepted, b.rowCount("items"))

	putNamespace(t, b, &triagev1.Namespace{Name: "shallow", MaxDepth: 3})
	require.NoError(t, enqueueNS(t, b, "shallow", "t", &triagev1.NewItem{}, &triagev1.NewItem{}))
	require.NoError(t, enqueueNS(t, b, "shallow", "t", &triagev1.NewItem{}))
	err = enqueueNS(t, b, "shallow", "t", &triagev1.NewItem{})
	require.Equal(t, codes.ResourceExhausted, status.Code(err))
	require.Contains(t, status.Convert(err).Message(), "max_depth is 3")
}

func TestPriorityBandDequeue(t *testing.T) {
	t.Parallel()
	b := setup(t, bedOpts{})
	for p := int32(0); p < 5; p++ {
		enqueue(t, b, "bands", &triagev1.NewItem{Priority: p}, &triagev1.NewItem{Priority: p})
	}
	lo, hi := int32(2), int32(3)
	resp, err := b.queue.Dequeue(b.ctx(), &triagev1.DequeueRequest{Namespace: "default", MinPriority: &lo, MaxPriority: &hi,
		Topics: []*triagev1.TopicCount{{Topic: "bands", Count: 10}}})
	require.NoError(t, err)
	require.Len(t, resp.Items, 4)
	for _, it := range resp.Items {
		require.True(t, it.Priority >= 2 && it.Priority <= 3, "priority %d outside [2,3]", it.Priority)
	}
	// The rest are still there for an unbounded dequeue, most urgent first.
	rest := dequeue(t, b, "bands", 10, 0)
	require.Len(t, rest, 6)
	require.Equal(t, int32(0), rest[0].Priority)
}

func TestAtMostOnceTopicDeletesOnLeaseExpiry(t *testing.T) {
	t.Parallel()
	b := setup(t, bedOpts{})
	putNamespace(t, b, &triagev1.Namespace{Name: "amo", Topics: map[string]*triagev1.TopicConfig{"fire": {AtMostOnce: true}}})
	_, err := b.queue.Enqueue(b.ctx(), &triagev1.EnqueueRequest{Namespace: "amo", Topic: "fire", Items: []*triagev1.NewItem{{Payload: []byte("once")}}})
	require.NoError(t, err)
	dq := func() []*triagev1.LeasedItem {
		resp, err := b.queue.Dequeue(b.ctx(), &triagev1.DequeueRequest{Namespace: "amo", LeaseDuration: durationpb.New(200 * time.Millisecond),
			Topics: []*triagev1.TopicCount{{Topic: "fire", Count: 1}}})
		require.NoError(t, err)
		return resp.Items
	}
	var first []*triagev1.LeasedItem
	require.Eventually(t, func() bool { first = dq(); return len(first) == 1 }, 5*time.Second, 20*time.Millisecond)
	// After the lease lapses the item is gone, never redelivered.
	deadline := time.Now().Add(1500 * time.Millisecond)
	for time.Now().Before(deadline) {
		require.Empty(t, dq())
		time.Sleep(50 * time.Millisecond)
	}
	require.Eventually(t, func() bool { return b.rowCount("items") == 0 }, 5*time.Second, 50*time.Millisecond)
}

// TestWeightedShareUnderFlood: a flood of priority-0 items keeps coming,
// yet a weighted topic delivers each band at its share (8:4:2:1:0.5)
// within 10%.
func TestWeightedShareUnderFlood(t *testing.T) {
	t.Parallel()
	b := setup(t, bedOpts{})
	putNamespace(t, b, &triagev1.Namespace{Name: "wq", Topics: map[string]*triagev1.TopicConfig{"jobs": {Policy: triagev1.DequeuePolicy_WEIGHTED}}})
	enq := func(p int32, n int) {
		items := make([]*triagev1.NewItem, n)
		for i := range items {
			items[i] = &triagev1.NewItem{Priority: p}
		}
		require.NoError(t, enqueueNS(t, b, "wq", "jobs", items...))
	}
	for p := int32(1); p <= 5; p++ {
		enq(p, 200) // band 4+ holds priorities 4 and 5
	}
	enq(0, 500)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // the flood
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
				enq(0, 20)
			}
		}
	}()
	counts := map[int]int{}
	const total = 620
	for got := 0; got < total; {
		resp, err := b.queue.Dequeue(b.ctx(), &triagev1.DequeueRequest{Namespace: "wq", Topics: []*triagev1.TopicCount{{Topic: "jobs", Count: 10}}})
		require.NoError(t, err)
		for _, it := range resp.Items {
			counts[min(int(it.Priority), 4)]++
		}
		got += len(resp.Items)
	}
	close(stop)
	wg.Wait()
	weights := []float64{8, 4, 2, 1, 0.5}
	sum := 15.5
	for band, w := range weights {
		want := float64(total) * w / sum
		got := float64(counts[band])
		require.InDelta(t, want, got, max(0.1*want, 1.5), "band %d: got %v of %d, want %.1f (counts %v)", band, got, total, want, counts)
	}
}

// TestAgingPromotesWaitingItems: an item that waits keeps moving up one
// level per threshold, recorded on the item, and then goes before newer
// items of its new priority.
func TestAgingPromotesWaitingItems(t *testing.T) {
	t.Parallel()
	b := setup(t, bedOpts{})
	putNamespace(t, b, &triagev1.Namespace{Name: "ag", Topics: map[string]*triagev1.TopicConfig{
		"slow": {AgingThreshold: durationpb.New(300 * time.Millisecond)}}})
	resp, err := b.queue.Enqueue(b.ctx(), &triagev1.EnqueueRequest{Namespace: "ag", Topic: "slow", Items: []*triagev1.NewItem{{Priority: 3, Payload: []byte("old")}}})
	require.NoError(t, err)
	id := resp.Results[0].Id
	var item *triagev1.Item
	require.Eventually(t, func() bool {
		item, err = b.queue.GetItem(b.ctx(), &triagev1.GetItemRequest{Namespace: "ag", Id: id})
		require.NoError(t, err)
		return item.Priority == 0
	}, 10*time.Second, 50*time.Millisecond)
	require.Equal(t, int32(3), item.OriginalPriority)
	require.Equal(t, "aging", item.PriorityChangedBy)
	require.NotNil(t, item.PriorityChangedAt)
	// It does not age past 0.
	time.Sleep(700 * time.Millisecond)
	item, err = b.queue.GetItem(b.ctx(), &triagev1.GetItemRequest{Namespace: "ag", Id: id})
	require.NoError(t, err)
	require.Equal(t, int32(0), item.Priority)
	// Newer priority-0 items queue behind it.
	_, err = b.queue.Enqueue(b.ctx(), &triagev1.EnqueueRequest{Namespace: "ag", Topic: "slow", Items: []*triagev1.NewItem{{Priority: 0}, {Priority: 0}}})
	require.NoError(t, err)
	dq, err := b.queue.Dequeue(b.ctx(), &triagev1.DequeueRequest{Namespace: "ag", Topics: []*triagev1.TopicCount{{Topic: "slow", Count: 1}}})
	require.NoError(t, err)
	require.Len(t, dq.Items, 1)
	require.Equal(t, id, dq.Items[0].Id)
}

// TestEscalationRecordsWhoAndWhen: UpdateItem's priority change is recorded.
func TestEscalationRecordsWhoAndWhen(t *testing.T) {
	t.Parallel()
	b := setup(t, bedOpts{})
	ids := enqueue(t, b, "esc", &triagev1.NewItem{Priority: 7})
	p := int32(1)
	got, err := b.queue.UpdateItem(b.ctx(), &triagev1.UpdateItemRequest{Namespace: "default", Id: ids[0].Id, Priority: &p, UpdatedBy: "oncall@example"})
	require.NoError(t, err)
	require.Equal(t, int32(1), got.Priority)
	require.Equal(t, int32(7), got.OriginalPriority)
	require.Equal(t, "oncall@example", got.PriorityChangedBy)
	again, err := b.queue.GetItem(b.ctx(), &triagev1.GetItemRequest{Namespace: "default", Id: ids[0].Id})
	require.NoError(t, err)
	require.True(t, proto.Equal(got.PriorityChangedAt, again.PriorityChangedAt))
}

// TestDedupRetryWindowAfterAck: with no dedup window, an enqueue made
// within the namespace's retry window of the first item's enqueue is a
// duplicate of it even after that item was delivered and acked (the
// retry of an enqueue answered 504 whose first attempt was inserted);
// past the retry window the key makes a new item.
func TestDedupRetryWindowAfterAck(t *testing.T) {
	t.Parallel()
	b := setup(t, bedOpts{})
	putNamespace(t, b, &triagev1.Namespace{Name: "rw", DedupRetryWindow: durationpb.New(2 * time.Second)})
	enq := func() *triagev1.EnqueueResult {
		resp, err := b.queue.Enqueue(b.ctx(), &triagev1.EnqueueRequest{Namespace: "rw", Topic: "pay",
			Items: []*triagev1.NewItem{{DedupKey: "order-7", Payload: []byte("charge")}}})
		require.NoError(t, err)
		return resp.Results[0]
	}
	sent := time.Now()
	first := enq()
	require.False(t, first.Duplicate)
	var got []*triagev1.LeasedItem
	require.Eventually(t, func() bool {
		resp, err := b.queue.Dequeue(b.ctx(), &triagev1.DequeueRequest{Namespace: "rw", Topics: []*triagev1.TopicCount{{Topic: "pay", Count: 1}}})
		require.NoError(t, err)
		got = resp.Items
		return len(got) == 1
	}, 5*time.Second, 20*time.Millisecond)
	res, err := b.queue.Ack(b.ctx(), &triagev1.AckRequest{Namespace: "rw", Acks: []*triagev1.LeaseRef{{Id: got[0].Id, LeaseToken: got[0].LeaseToken}}})
	require.NoError(t, err)
	require.True(t, res.Results[0].Ok)
	again := enq()
	require.Less(t, time.Since(sent), 2*time.Second, "the retry went within the retry window")
	require.True(t, again.Duplicate, "a retry within the retry window, after the ack")
	require.Equal(t, first.Id, again.Id)
	require.Equal(t, 0, b.rowCount("items"))
	time.Sleep(time.Until(sent.Add(2*time.Second + clockSlack)))
	later := enq()
	require.False(t, later.Duplicate, "past the retry window the key makes a new item")
	require.NotEqual(t, first.Id, later.Id)
}

// TestDedupWindowAfterAck: a retried enqueue (same dedup key) after the
// first item was consumed and acked is still a duplicate within the
// namespace's dedup_window; after the window a new item is created.
func TestDedupWindowAfterAck(t *testing.T) {
	t.Parallel()
	b := setup(t, bedOpts{})
	putNamespace(t, b, &triagev1.Namespace{Name: "dw", DedupWindow: durationpb.New(1500 * time.Millisecond), DedupRetryWindow: durationpb.New(0)})
	enq := func() *triagev1.EnqueueResult {
		resp, err := b.queue.Enqueue(b.ctx(), &triagev1.EnqueueRequest{Namespace: "dw", Topic: "pay",
			Items: []*triagev1.NewItem{{DedupKey: "order-42", Payload: []byte("charge")}}})
		require.NoError(t, err)
		return resp.Results[0]
	}
	first := enq()
	require.False(t, first.Duplicate)
	var got []*triagev1.LeasedItem
	require.Eventually(t, func() bool {
		resp, err := b.queue.Dequeue(b.ctx(), &triagev1.DequeueRequest{Namespace: "dw", Topics: []*triagev1.TopicCount{{Topic: "pay", Count: 1}}})
		require.NoError(t, err)
		got = resp.Items
		return len(got) == 1
	}, 5*time.Second, 20*time.Millisecond)
	res, err := b.queue.Ack(b.ctx(), &triagev1.AckRequest{Namespace: "dw", Acks: []*triagev1.LeaseRef{{Id: got[0].Id, LeaseToken: got[0].LeaseToken}}})
	require.NoError(t, err)
	require.True(t, res.Results[0].Ok)
	again := enq()
	require.True(t, again.Duplicate, "retry within the window")
	require.Equal(t, first.Id, again.Id)
	require.Equal(t, 0, b.rowCount("items"))
	time.Sleep(1600 * time.Millisecond)
	later := enq()
	require.False(t, later.Duplicate, "after the window the key is free")
	require.NotEqual(t, first.Id, later.Id)
}

// TestOverlappingBandsShareItems: buffers of overlapping priority bands
// of one topic must not hide ready items from each other.
func TestOverlappingBandsShareItems(t *testing.T) {
	t.Parallel()
	b := setup(t, bedOpts{})
	for p := int32(0); p < 5; p++ {
		enqueue(t, b, "overlap", &triagev1.NewItem{Priority: p}, &triagev1.NewItem{Priority: p})
	}
	// An unbounded consumer takes one; its buffer prefetches the rest.
	first := dequeue(t, b, "overlap", 1, 0)
	require.Len(t, first, 1)
	lo, hi := int32(2), int32(3)
	resp, err := b.queue.Dequeue(b.ctx(), &triagev1.DequeueRequest{Namespace: "default", MinPriority: &lo, MaxPriority: &hi,
		Topics: []*triagev1.TopicCount{{Topic: "overlap", Count: 10}}})
	require.NoError(t, err)
	require.Len(t, resp.Items, 4, "the band dequeue gets the band's ready items the unbounded buffer holds")
	// And the other way round: the band buffer holds nothing back.
	lo, hi = int32(4), int32(4)
	resp, err = b.queue.Dequeue(b.ctx(), &triagev1.DequeueRequest{Namespace: "default", MinPriority: &lo, MaxPriority: &hi,
		Topics: []*triagev1.TopicCount{{Topic: "overlap", Count: 1}}})
	require.NoError(t, err)
	require.Len(t, resp.Items, 1)
	rest := dequeue(t, b, "overlap", 10, 0)
	require.Len(t, rest, 4)
}
