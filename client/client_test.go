package client_test

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/triage-queue/triage/client"
	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
)

// fakeQueue records the requests it gets and answers with canned responses.
type fakeQueue struct {
	triagev1.UnimplementedQueueServer

	mu   sync.Mutex
	reqs []proto.Message

	nackResp *triagev1.NackResponse
}

func (f *fakeQueue) record(m proto.Message) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reqs = append(f.reqs, m)
}

func (f *fakeQueue) requests() []proto.Message {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]proto.Message(nil), f.reqs...)
}

func (f *fakeQueue) Enqueue(_ context.Context, r *triagev1.EnqueueRequest) (*triagev1.EnqueueResponse, error) {
	f.record(r)
	resp := &triagev1.EnqueueResponse{}
	for range r.Items {
		resp.Results = append(resp.Results, &triagev1.EnqueueResult{Id: "1-00000000000000aa", Region: r.Region})
	}
	return resp, nil
}

func (f *fakeQueue) Dequeue(_ context.Context, r *triagev1.DequeueRequest) (*triagev1.DequeueResponse, error) {
	f.record(r)
	return &triagev1.DequeueResponse{Items: []*triagev1.LeasedItem{{Id: "1-00000000000000aa", LeaseToken: "tok"}}}, nil
}

func (f *fakeQueue) Ack(_ context.Context, r *triagev1.AckRequest) (*triagev1.AckResponse, error) {
	f.record(r)
	resp := &triagev1.AckResponse{}
	for _, a := range r.Acks {
		resp.Results = append(resp.Results, &triagev1.ItemResult{Id: a.Id, Ok: true})
	}
	return resp, nil
}

func (f *fakeQueue) Nack(_ context.Context, r *triagev1.NackRequest) (*triagev1.NackResponse, error) {
	f.record(r)
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.nackResp, nil
}

func (f *fakeQueue) GetTopicStats(_ context.Context, r *triagev1.GetTopicStatsRequest) (*triagev1.TopicStats, error) {
	f.record(r)
	return &triagev1.TopicStats{}, nil
}

func (f *fakeQueue) ListTopics(_ context.Context, r *triagev1.ListTopicsRequest) (*triagev1.ListTopicsResponse, error) {
	f.record(r)
	return &triagev1.ListTopicsResponse{}, nil
}

func (f *fakeQueue) GetItem(_ context.Context, r *triagev1.GetItemRequest) (*triagev1.Item, error) {
	f.record(r)
	return &triagev1.Item{Id: r.Id}, nil
}

// setup starts a fake router on a loopback port and dials it.
func setup(t *testing.T, opts ...client.Option) (*fakeQueue, *client.Client) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	fake := &fakeQueue{nackResp: &triagev1.NackResponse{}}
	srv := grpc.NewServer()
	triagev1.RegisterQueueServer(srv, fake)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)

	c, err := client.Dial(t.Context(), lis.Addr().String(), opts...)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, c.Close()) })
	return fake, c
}

func TestWithRegionFillsEmptyRegions(t *testing.T) {
	t.Parallel()
	fake, c := setup(t, client.WithRegion("eu"))
	ctx := t.Context()

	enq := &triagev1.EnqueueRequest{Namespace: "ns", Topic: "t", Items: []*triagev1.NewItem{{Payload: []byte("x")}}}
	_, err := c.Queue.Enqueue(ctx, enq)
	require.NoError(t, err)
	_, err = c.Queue.Dequeue(ctx, &triagev1.DequeueRequest{Namespace: "ns"})
	require.NoError(t, err)
	_, err = c.Queue.GetTopicStats(ctx, &triagev1.GetTopicStatsRequest{Namespace: "ns", Topic: "t"})
	require.NoError(t, err)
	_, err = c.Queue.ListTopics(ctx, &triagev1.ListTopicsRequest{Namespace: "ns", Region: "us"})
	require.NoError(t, err)
	_, err = c.Queue.GetItem(ctx, &triagev1.GetItemRequest{Namespace: "ns", Id: "1-00000000000000aa"})
	require.NoError(t, err)

	reqs := fake.requests()
	require.Len(t, reqs, 5)
	require.Equal(t, "eu", reqs[0].(*triagev1.EnqueueRequest).Region)
	require.Equal(t, "eu", reqs[1].(*triagev1.DequeueRequest).Region)
	require.Equal(t, "eu", reqs[2].(*triagev1.GetTopicStatsRequest).Region)
	require.Equal(t, "us", reqs[3].(*triagev1.ListTopicsRequest).Region, "an explicit region wins")
	require.Empty(t, enq.Region, "the caller's request must not change")
}

func TestNoRegionByDefault(t *testing.T) {
	t.Parallel()
	fake, c := setup(t)
	_, err := c.Enqueue(t.Context(), "ns", "t", &triagev1.NewItem{Payload: []byte("x")})
	require.NoError(t, err)
	require.Empty(t, fake.requests()[0].(*triagev1.EnqueueRequest).Region)
}

func TestConvenienceMethods(t *testing.T) {
	t.Parallel()
	fake, c := setup(t)
	ctx := t.Context()

	res, err := c.Enqueue(ctx, "ns", "emails", &triagev1.NewItem{Payload: []byte("a")}, &triagev1.NewItem{Payload: []byte("b"), Priority: 3})
	require.NoError(t, err)
	require.Len(t, res, 2)

	items, err := c.Dequeue(ctx, "ns", "emails", 7, time.Minute, 2*time.Second)
	require.NoError(t, err)
	require.Len(t, items, 1)

	ack, err := c.Ack(ctx, "ns", items...)
	require.NoError(t, err)
	require.True(t, ack[0].Ok)

	require.NoError(t, c.Nack(ctx, "ns", items[0], 5*time.Second, "boom"))

	reqs := fake.requests()
	require.Len(t, reqs, 4)
	enq := reqs[0].(*triagev1.EnqueueRequest)
	require.Equal(t, "ns", enq.Namespace)
	require.Equal(t, "emails", enq.Topic)
	require.Len(t, enq.Items, 2)
	require.EqualValues(t, 3, enq.Items[1].Priority)

	deq := reqs[1].(*triagev1.DequeueRequest)
	require.Equal(t, "ns", deq.Namespace)
	require.Len(t, deq.Topics, 1)
	require.Equal(t, "emails", deq.Topics[0].Topic)
	require.EqualValues(t, 7, deq.Topics[0].Count)
	require.Equal(t, time.Minute, deq.LeaseDuration.AsDuration())
	require.Equal(t, 2*time.Second, deq.Wait.AsDuration())

	a := reqs[2].(*triagev1.AckRequest)
	require.Equal(t, "1-00000000000000aa", a.Acks[0].Id)
	require.Equal(t, "tok", a.Acks[0].LeaseToken)

	n := reqs[3].(*triagev1.NackRequest)
	require.Len(t, n.Nacks, 1)
	require.Equal(t, "tok", n.Nacks[0].LeaseToken)
	require.Equal(t, 5*time.Second, n.Nacks[0].Delay.AsDuration())
	require.Equal(t, "boom", n.Nacks[0].Error)
}

func TestDequeueZeroLeaseAndWaitAreUnset(t *testing.T) {
	t.Parallel()
	fake, c := setup(t)
	_, err := c.Dequeue(t.Context(), "ns", "t", 1, 0, 0)
	require.NoError(t, err)
	deq := fake.requests()[0].(*triagev1.DequeueRequest)
	require.Nil(t, deq.LeaseDuration, "zero lease must keep each item's own")
	require.Nil(t, deq.Wait)
}

func TestNackItemError(t *testing.T) {
	t.Parallel()
	fake, c := setup(t)
	fake.mu.Lock()
	fake.nackResp = &triagev1.NackResponse{Results: []*triagev1.ItemResult{{Id: "1-00000000000000aa", Error: "stale lease token"}}}
	fake.mu.Unlock()
	err := c.Nack(t.Context(), "ns", &triagev1.LeasedItem{Id: "1-00000000000000aa", LeaseToken: "old"}, 0, "")
	var ie *client.ItemError
	require.ErrorAs(t, err, &ie)
	require.Equal(t, "1-00000000000000aa", ie.ID)
	require.Equal(t, "stale lease token", ie.Reason)
}

func TestDialCancelled(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	_, err := client.Dial(ctx, "127.0.0.1:1")
	require.ErrorIs(t, err, context.Canceled)
}
