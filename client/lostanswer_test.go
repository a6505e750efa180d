package client_test

import (
	"context"
	"log/slog"
	"sync"
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

// warnings records the messages logged at Warn or above.
type warnings struct {
	mu   sync.Mutex
	msgs []string
}

func (w *warnings) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (w *warnings) Handle(_ context.Context, r slog.Record) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.msgs = append(w.msgs, r.Message)
	return nil
}
func (w *warnings) WithAttrs([]slog.Attr) slog.Handler { return w }
func (w *warnings) WithGroup(string) slog.Handler      { return w }

func (w *warnings) get() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.msgs...)
}

// TestWorkerAckWhoseAnswerIsLost: an ack that took effect but whose
// answer the worker never got (the router answered UNAVAILABLE "outcome
// unknown", as it does when it cannot settle a lost commit) is retried
// with the same token; the retry finds the item gone ("item not found"),
// which the worker takes as done: nothing is refused, nothing handled
// twice. The interceptor is the only fake: it loses the first Ack's
// answer after the real router applied it.
func TestWorkerAckWhoseAnswerIsLost(t *testing.T) {
	b := newBed(t, bedOpts{})
	var acks atomic.Int32
	lose := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		err := invoker(ctx, method, req, reply, cc, opts...)
		if _, ok := req.(*triagev1.AckRequest); ok && acks.Add(1) == 1 && err == nil {
			return status.Error(codes.Unavailable, `shard 1: ack: outcome unknown: the write was sent to the shard and its answer was lost; retrying with the same lease token is safe`)
		}
		return err
	}
	c := b.dial(t, client.WithDialOptions(grpc.WithChainUnaryInterceptor(lose)),
		client.WithRetry(client.RetryPolicy{Initial: time.Millisecond}))
	warned := &warnings{}
	var calls counter
	w := newWorker(t, c, client.WorkerConfig{Logger: slog.New(warned)})
	w.Handle("lost", func(_ context.Context, it *client.Item) error {
		calls.add(it.ID)
		return nil
	}, client.TopicOptions{})
	ids := enqueue(t, c, "lost", "x")
	require.NoError(t, w.Start(t.Context()))
	stopAtCleanup(t, w)
	require.Eventually(t, func() bool { return acks.Load() >= 2 }, 30*time.Second, 10*time.Millisecond, "the ack is retried")
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	require.NoError(t, w.Stop(ctx))

	_, err := getItem(t, c, ids[0])
	require.ErrorIs(t, err, client.ErrNotFound, "acked")
	require.Equal(t, map[string]int{ids[0]: 1}, calls.get())
	require.Empty(t, warned.get(), "a retried ack that finds its item gone is done, not refused")
}
