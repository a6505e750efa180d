package e2e

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
)

func enqueue(t *testing.T, b *bed, topic string, items ...*triagev1.NewItem) []*triagev1.EnqueueResult {
	t.Helper()
	resp, err := b.queue.Enqueue(b.ctx(), &triagev1.EnqueueRequest{Namespace: "default", Topic: topic, Items: items})
	require.NoError(t, err)
	require.Len(t, resp.Results, len(items))
	return resp.Results
}

// copies returns n items like it, each its own copy.
func copies(n int, it *triagev1.NewItem) []*triagev1.NewItem {
	out := make([]*triagev1.NewItem, n)
	for i := range out {
		out[i] = proto.CloneOf(it)
	}
	return out
}

func dequeue(t *testing.T, b *bed, topic string, n int32, lease time.Duration) []*triagev1.LeasedItem {
	t.Helper()
	req := &triagev1.DequeueRequest{Namespace: "default", Topics: []*triagev1.TopicCount{{Topic: topic, Count: n}}}
	if lease > 0 {
		req.LeaseDuration = durationpb.New(lease)
	}
	resp, err := b.queue.Dequeue(b.ctx(), req)
	require.NoError(t, err)
	return resp.Items
}

func ack(t *testing.T, b *bed, items ...*triagev1.LeasedItem) []*triagev1.ItemResult {
	t.Helper()
	req := &triagev1.AckRequest{Namespace: "default"}
	for _, it := range items {
		req.Acks = append(req.Acks, &triagev1.LeaseRef{Id: it.Id, LeaseToken: it.LeaseToken})
	}
	resp, err := b.queue.Ack(b.ctx(), req)
	require.NoError(t, err)
	return resp.Results
}

func TestEnqueueDequeueAck(t *testing.T) {
	t.Parallel()
	b := setup(t, bedOpts{})
	var items []*triagev1.NewItem
	for i := 0; i < 10; i++ {
		items = append(items, &triagev1.NewItem{Payload: []byte(fmt.Sprintf("p%d", i)), Priority: int32(9 - i),
			Metadata: map[string]string{"n": fmt.Sprint(i)}})
	}
	res := enqueue(t, b, "jobs", items...)
	for _, r := range res {
		require.NotEmpty(t, r.Id)
		require.False(t, r.Duplicate)
		require.Equal(t, "us-east", r.Region)
	}
	require.Equal(t, 10, b.rowCount("items"), "committed durability: rows exist when Enqueue returns")

	got := dequeue(t, b, "jobs", 10, 0)
	require.Len(t, got, 10)
	for i, it := range got {
		require.Equal(t, int32(i), it.Priority, "most urgent first")
		require.Equal(t, fmt.Sprintf("p%d", 9-i), string(it.Payload))
		require.Equal(t, fmt.Sprint(9-i), it.Metadata["n"])
		require.Equal(t, int32(1), it.Attempts)
		require.Len(t, it.LeaseToken, 16)
		require.WithinDuration(t, time.Now().Add(30*time.Second), it.LeaseExpiresAt.AsTime(), 2*time.Second)
	}
	require.Empty(t, dequeue(t, b, "jobs", 10, 0), "leased items are not delivered twice")
	for _, r := range ack(t, b, got...) {
		require.True(t, r.Ok, r.Error)
	}
	require.Equal(t, 0, b.rowCount("items"))
}

func TestLeaseExpiryRedelivers(t *testing.T) {
	t.Parallel()
	b := setup(t, bedOpts{})
	enqueue(t, b, "jobs", &triagev1.NewItem{Payload: []byte("x")})
	first := dequeue(t, b, "jobs", 1, 500*time.Millisecond)
	require.Len(t, first, 1)
	var again []*triagev1.LeasedItem
	require.Eventually(t, func() bool {
		again = dequeue(t, b, "jobs", 1, 0)
		return len(again) == 1
	}, 10*time.Second, 50*time.Millisecond)
	require.Equal(t, first[0].Id, again[0].Id)
	require.Equal(t, int32(2), again[0].Attempts)
	require.NotEqual(t, first[0].LeaseToken, again[0].LeaseToken)

	// The old token changes nothing: not an ack, not a nack, not an extend.
	res := ack(t, b, first[0])
	require.False(t, res[0].Ok)
	require.Contains(t, res[0].Error, "stale lease token")
	nres, err := b.queue.Nack(b.ctx(), &triagev1.NackRequest{Namespace: "default", Nacks: []*triagev1.NackItem{{Id: first[0].Id, LeaseToken: first[0].LeaseToken}}})
	require.NoError(t, err)
	require.False(t, nres.Results[0].Ok)
	_, err = b.queue.ExtendLease(b.ctx(), &triagev1.ExtendLeaseRequest{Namespace: "default", Id: first[0].Id, LeaseToken: first[0].LeaseToken})
	require.Equal(t, codes.FailedPrecondition, status.Code(err))
	item, err := b.queue.GetItem(b.ctx(), &triagev1.GetItemRequest{Namespace: "default", Id: first[0].Id})
	require.NoError(t, err)
	require.Equal(t, triagev1.ItemState_LEASED, item.State, "the current holder keeps its lease")
	require.Equal(t, int32(2), item.Attempts)

	require.True(t, ack(t, b, again[0])[0].Ok)
	require.Equal(t, 0, b.rowCount("items"))
}
