package e2e

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/durationpb"

	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
)

// TestDeadLetterAndRedrive: an item nacked max_attempts times lands in the
// DLQ with its last error; redrive brings it back, dequeueable, attempts
// reset. Lease expiry counts as a failed delivery too.
func TestDeadLetterAndRedrive(t *testing.T) {
	t.Parallel()
	b := setup(t, bedOpts{maxAttempts: 3})
	ids := enqueue(t, b, "dl", &triagev1.NewItem{Payload: []byte("nacked"), Metadata: map[string]string{"k": "v"}},
		&triagev1.NewItem{Payload: []byte("expired"), Priority: 1})
	nacked, expired := ids[0].Id, ids[1].Id

	zero := durationpb.New(0)
	for attempt := 1; attempt <= 3; attempt++ {
		var got *triagev1.LeasedItem
		require.Eventually(t, func() bool {
			for _, it := range dequeue(t, b, "dl", 2, 200*time.Millisecond) {
				if it.Id == nacked {
					got = it
				}
			}
			return got != nil
		}, 10*time.Second, 20*time.Millisecond)
		require.Equal(t, int32(attempt), got.Attempts)
		res, err := b.queue.Nack(b.ctx(), &triagev1.NackRequest{Namespace: "default", Nacks: []*triagev1.NackItem{
			{Id: nacked, LeaseToken: got.LeaseToken, Delay: zero, Error: "boom " + string(rune('0'+attempt))}}})
		require.NoError(t, err)
		require.True(t, res.Results[0].Ok, res.Results[0].Error)
	}
	// The expired one: its leases (200ms) lapse three times, then the next
	// dequeue dead-letters it instead of delivering it a fourth time.
	require.Eventually(t, func() bool {
		dequeue(t, b, "dl", 2, 200*time.Millisecond)
		st, err := b.queue.GetTopicStats(b.ctx(), &triagev1.GetTopicStatsRequest{Namespace: "default", Topic: "dl"})
		require.NoError(t, err)
		return st.DeadLetters == 2 && st.Total == 0
	}, 20*time.Second, 100*time.Millisecond)

	list, err := b.queue.ListDeadLetters(b.ctx(), &triagev1.ListDeadLettersRequest{Namespace: "default", Topic: "dl", PageSize: 1})
	require.NoError(t, err)
	require.Len(t, list.DeadLetters, 1)
	require.NotEmpty(t, list.NextPageToken)
	list2, err := b.queue.ListDeadLetters(b.ctx(), &triagev1.ListDeadLettersRequest{Namespace: "default", Topic: "dl", PageToken: list.NextPageToken})
	require.NoError(t, err)
	require.Len(t, list2.DeadLetters, 1)
	byID := map[string]*triagev1.DeadLetter{}
	for _, d := range append(list.DeadLetters, list2.DeadLetters...) {
		byID[d.Id] = d
	}
	require.Equal(t, "boom 3", byID[nacked].LastError)
	require.Equal(t, int32(3), byID[nacked].Attempts)
	require.Equal(t, "v", byID[nacked].Metadata["k"])
	require.Equal(t, "nacked", string(byID[nacked].Payload))
	require.Contains(t, byID[expired].LastError, "lease expired")

	// Redrive one by ID, then the rest.
	rd, err := b.queue.RedriveDeadLetters(b.ctx(), &triagev1.RedriveDeadLettersRequest{Namespace: "default", Topic: "dl", Ids: []string{nacked}})
	require.NoError(t, err)
	require.Equal(t, int64(1), rd.Redriven)
	// Redriven items are announced to the dequeuer; poll for them.
	var got []*triagev1.LeasedItem
	require.Eventually(t, func() bool { got = dequeue(t, b, "dl", 5, 0); return len(got) > 0 }, 5*time.Second, 20*time.Millisecond)
	require.Len(t, got, 1)
	require.Equal(t, nacked, got[0].Id)
	require.Equal(t, int32(1), got[0].Attempts, "attempts reset by redrive")
	require.True(t, ack(t, b, got...)[0].Ok)
	rd, err = b.queue.RedriveDeadLetters(b.ctx(), &triagev1.RedriveDeadLettersRequest{Namespace: "default", Topic: "dl"})
	require.NoError(t, err)
	require.Equal(t, int64(1), rd.Redriven)
	require.Eventually(t, func() bool { got = dequeue(t, b, "dl", 5, 0); return len(got) > 0 }, 5*time.Second, 20*time.Millisecond)
	require.Len(t, got, 1)
	require.Equal(t, expired, got[0].Id)
	st, err := b.queue.GetTopicStats(b.ctx(), &triagev1.GetTopicStatsRequest{Namespace: "default", Topic: "dl"})
	require.NoError(t, err)
	require.Zero(t, st.DeadLetters)
}

// TestNackDefaultBackoff: a nack without a delay backs off (about 1 s after
// the first delivery), one with "0s" is ready at once.
func TestNackDefaultBackoff(t *testing.T) {
	t.Parallel()
	b := setup(t, bedOpts{})
	enqueue(t, b, "bo", &triagev1.NewItem{Payload: []byte("a")})
	it := dequeue(t, b, "bo", 1, 0)[0]
	before := time.Now()
	_, err := b.queue.Nack(b.ctx(), &triagev1.NackRequest{Namespace: "default", Nacks: []*triagev1.NackItem{{Id: it.Id, LeaseToken: it.LeaseToken}}})
	require.NoError(t, err)
	item, err := b.queue.GetItem(b.ctx(), &triagev1.GetItemRequest{Namespace: "default", Id: it.Id})
	require.NoError(t, err)
	require.Equal(t, triagev1.ItemState_DELAYED, item.State)
	wait := item.DeliverAfter.AsTime().Sub(before)
	require.True(t, wait >= 400*time.Millisecond && wait <= 1100*time.Millisecond, "backoff after 1 delivery: 0.5-1s, got %s", wait)
}

// TestTopicRetryPolicy: a topic's max_attempts and backoff override the
// namespace's. A nack without a delay waits the topic's fixed backoff
// (deliver_after − updated_at, both the primary's time, is exactly it
// with no jitter); each delivery carries max_attempts and the last nack's
// error; the topic's last attempt dead-letters while another topic of the
// namespace keeps the namespace's limit.
func TestTopicRetryPolicy(t *testing.T) {
	t.Parallel()
	b := setup(t, bedOpts{})
	noJitter := 0.0
	putNamespace(t, b, &triagev1.Namespace{Name: "rp", MaxAttempts: 7, Topics: map[string]*triagev1.TopicConfig{
		"flaky": {MaxAttempts: 2, RetryBackoff: &triagev1.RetryBackoff{Kind: triagev1.RetryBackoff_FIXED,
			Base: durationpb.New(150 * time.Millisecond), Jitter: &noJitter}}}})
	enq, err := b.queue.Enqueue(b.ctx(), &triagev1.EnqueueRequest{Namespace: "rp", Topic: "flaky", Items: []*triagev1.NewItem{{Payload: []byte("f")}}})
	require.NoError(t, err)
	other, err := b.queue.Enqueue(b.ctx(), &triagev1.EnqueueRequest{Namespace: "rp", Topic: "other", Items: []*triagev1.NewItem{{Payload: []byte("o")}}})
	require.NoError(t, err)
	got, err := b.queue.GetItem(b.ctx(), &triagev1.GetItemRequest{Namespace: "rp", Id: other.Results[0].Id})
	require.NoError(t, err)
	require.Equal(t, int32(7), got.MaxAttempts, "a topic without a policy keeps the namespace's")

	next := func() *triagev1.LeasedItem {
		t.Helper()
		resp, err := b.queue.Dequeue(b.ctx(), &triagev1.DequeueRequest{Namespace: "rp",
			Topics: []*triagev1.TopicCount{{Topic: "flaky", Count: 1}}, Wait: durationpb.New(5 * time.Second)})
		require.NoError(t, err)
		require.Len(t, resp.Items, 1)
		return resp.Items[0]
	}
	first := next()
	require.Equal(t, enq.Results[0].Id, first.Id)
	require.Equal(t, int32(2), first.MaxAttempts)
	require.Empty(t, first.LastError)
	_, err = b.queue.Nack(b.ctx(), &triagev1.NackRequest{Namespace: "rp", Nacks: []*triagev1.NackItem{
		{Id: first.Id, LeaseToken: first.LeaseToken, Error: "downstream 503"}}})
	require.NoError(t, err)
	item, err := b.queue.GetItem(b.ctx(), &triagev1.GetItemRequest{Namespace: "rp", Id: first.Id})
	require.NoError(t, err)
	require.Equal(t, int32(2), item.MaxAttempts)
	require.Equal(t, "downstream 503", item.LastError)
	require.InDelta(t, 150*time.Millisecond, item.DeliverAfter.AsTime().Sub(item.UpdatedAt.AsTime()), float64(time.Millisecond),
		"the topic's fixed backoff, not the namespace's 0.5-1 s")

	second := next()
	require.Equal(t, int32(2), second.Attempts)
	require.Equal(t, "downstream 503", second.LastError, "the consumer sees why the last try failed")
	_, err = b.queue.Nack(b.ctx(), &triagev1.NackRequest{Namespace: "rp", Nacks: []*triagev1.NackItem{
		{Id: second.Id, LeaseToken: second.LeaseToken, Error: "still 503"}}})
	require.NoError(t, err)
	dl, err := b.queue.ListDeadLetters(b.ctx(), &triagev1.ListDeadLettersRequest{Namespace: "rp", Topic: "flaky"})
	require.NoError(t, err)
	require.Len(t, dl.DeadLetters, 1, "the topic's second attempt was its last")
	require.Equal(t, "still 503", dl.DeadLetters[0].LastError)
}
