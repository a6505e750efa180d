package client_test

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/triage-queue/triage/client"
	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
)

// flakyQueue is a router that answers UNAVAILABLE while down is set.
type flakyQueue struct {
	triagev1.UnimplementedQueueServer
	down  atomic.Bool
	calls atomic.Int32
}

func (f *flakyQueue) GetItem(context.Context, *triagev1.GetItemRequest) (*triagev1.Item, error) {
	f.calls.Add(1)
	if f.down.Load() {
		return nil, status.Error(codes.Unavailable, "no primary")
	}
	return &triagev1.Item{Id: "x"}, nil
}

func (f *flakyQueue) Enqueue(context.Context, *triagev1.EnqueueRequest) (*triagev1.EnqueueResponse, error) {
	f.calls.Add(1)
	if f.down.Load() {
		return nil, status.Error(codes.Unavailable, "no primary")
	}
	return &triagev1.EnqueueResponse{}, nil
}

func startFlaky(t *testing.T) (*flakyQueue, string) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	f := &flakyQueue{}
	srv := grpc.NewServer()
	triagev1.RegisterQueueServer(srv, f)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return f, lis.Addr().String()
}

func TestEndpointsPreferRegionAndFailOver(t *testing.T) {
	t.Parallel()
	a, aAddr := startFlaky(t)
	b, bAddr := startFlaky(t)
	c, err := client.DialEndpoints(t.Context(), []client.Endpoint{{Addr: aAddr, Region: "us"}, {Addr: bAddr, Region: "eu"}},
		client.WithRegion("eu"), client.WithRetry(client.RetryPolicy{Initial: time.Millisecond, MaxAttempts: 4}))
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	get := func() error {
		_, err := c.Queue.GetItem(t.Context(), &triagev1.GetItemRequest{Namespace: "ns", Id: "x"})
		return err
	}

	require.NoError(t, get())
	require.EqualValues(t, 0, a.calls.Load(), "the preferred region's router first")
	require.EqualValues(t, 1, b.calls.Load())

	b.down.Store(true)
	require.NoError(t, get(), "failed over")
	require.EqualValues(t, 1, a.calls.Load())
	require.NoError(t, get())
	require.EqualValues(t, 2, b.calls.Load(), "a router that answered UNAVAILABLE is passed over for a while")

	a.down.Store(true)
	err = get()
	require.ErrorIs(t, err, client.ErrUnavailable)
	require.Equal(t, codes.Unavailable, status.Code(err))
	var ce *client.Error
	require.ErrorAs(t, err, &ce)
	require.Equal(t, 4, ce.Attempts, "retried up to MaxAttempts, with backoff between rounds")
}

func TestEnqueueWithoutDedupKeysIsNotRepeated(t *testing.T) {
	t.Parallel()
	a, aAddr := startFlaky(t)
	b, bAddr := startFlaky(t)
	a.down.Store(true)
	c, err := client.DialEndpoints(t.Context(), []client.Endpoint{{Addr: aAddr}, {Addr: bAddr}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })

	_, err = c.Enqueue(t.Context(), "ns", "t", &triagev1.NewItem{Payload: []byte("x")})
	require.ErrorIs(t, err, client.ErrUnavailable, "a repeat could store the batch twice")
	require.EqualValues(t, 0, b.calls.Load())

	// A fresh client, which has not seen a fail yet: its first try goes to
	// a again.
	c2, err := client.DialEndpoints(t.Context(), []client.Endpoint{{Addr: aAddr}, {Addr: bAddr}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c2.Close() })
	_, err = c2.Enqueue(t.Context(), "ns", "t", &triagev1.NewItem{Payload: []byte("x"), DedupKey: "k"})
	require.NoError(t, err, "with dedup keys a repeat is harmless")
	require.EqualValues(t, 2, a.calls.Load())
	require.EqualValues(t, 1, b.calls.Load())
}

func TestDialEndpointsNeedsOne(t *testing.T) {
	t.Parallel()
	_, err := client.DialEndpoints(t.Context(), nil)
	require.ErrorIs(t, err, client.ErrInvalid)
}
