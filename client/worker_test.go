package client_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
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

// enqueue stores payloads in topic and returns their IDs.
func enqueue(t *testing.T, c *client.Client, topic string, payloads ...string) []string {
	t.Helper()
	items := make([]*triagev1.NewItem, len(payloads))
	for i, p := range payloads {
		items[i] = &triagev1.NewItem{Payload: []byte(p)}
	}
	res, err := c.Enqueue(t.Context(), "default", topic, items...)
	require.NoError(t, err)
	ids := make([]string, len(res))
	for i, r := range res {
		ids[i] = r.Id
	}
	return ids
}

func getItem(t *testing.T, c *client.Client, id string) (*triagev1.Item, error) {
	t.Helper()
	return c.Queue.GetItem(t.Context(), &triagev1.GetItemRequest{Namespace: "default", Id: id})
}

func stats(t *testing.T, c *client.Client, topic string) *triagev1.TopicStats {
	t.Helper()
	st, err := c.Queue.GetTopicStats(t.Context(), &triagev1.GetTopicStatsRequest{Namespace: "default", Topic: topic})
	require.NoError(t, err)
	return st
}

func newWorker(t *testing.T, c *client.Client, cfg client.WorkerConfig) *client.Worker {
	t.Helper()
	cfg.Namespace = "default"
	if cfg.Logger == nil {
		cfg.Logger = quietLogger(t)
	}
	if cfg.Wait == 0 {
		cfg.Wait = time.Second
	}
	w, err := client.NewWorker(c, cfg)
	require.NoError(t, err)
	return w
}

// stopAtCleanup stops w at the end of the test if the test did not.
func stopAtCleanup(t *testing.T, w *client.Worker) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_ = w.Stop(ctx)
	})
}

// counter counts handler calls per item ID.
type counter struct {
	mu    sync.Mutex
	calls map[string]int
}

func (c *counter) add(id string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.calls == nil {
		c.calls = map[string]int{}
	}
	c.calls[id]++
	return c.calls[id]
}

func (c *counter) get() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]int{}
	for k, v := range c.calls {
		out[k] = v
	}
	return out
}

// The worker's main path and the bed harness: items of two topics, with
// JSON decoding and middleware, are each handled once and acked in
// batches (every item gone afterwards).
func TestWorkerHandlesAndAcks(t *testing.T) {
	b := newBed(t, bedOpts{shards: 2})
	// Record the size of every Ack the worker sends, and of the acks its
	// Dequeues carry.
	var ackMu sync.Mutex
	var ackSizes, carried []int
	record := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		ackMu.Lock()
		switch r := req.(type) {
		case *triagev1.AckRequest:
			ackSizes = append(ackSizes, len(r.Acks))
		case *triagev1.DequeueRequest:
			if len(r.Acks) > 0 {
				carried = append(carried, len(r.Acks))
			}
		}
		ackMu.Unlock()
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	c := b.dial(t, client.WithDialOptions(grpc.WithChainUnaryInterceptor(record)))
	var plain, typed counter
	var seen atomic.Int32
	w := newWorker(t, c, client.WorkerConfig{})
	w.Use(func(next client.Handler) client.Handler {
		return func(ctx context.Context, it *client.Item) error {
			seen.Add(1)
			return next(ctx, it)
		}
	})
	w.Handle("plain", func(_ context.Context, it *client.Item) error {
		plain.add(it.ID)
		return nil
	}, client.TopicOptions{Concurrency: 4})
	type job struct{ N int }
	var sum atomic.Int64
	client.HandleJSON(w, "typed", func(_ context.Context, it *client.Item, j job) error {
		typed.add(it.ID)
		sum.Add(int64(j.N))
		return nil
	}, client.TopicOptions{Concurrency: 2})

	var pl, ty []string
	for i := range 20 {
		pl = append(pl, fmt.Sprint("p", i))
		ty = append(ty, fmt.Sprintf(`{"N":%d}`, i))
	}
	plainIDs := enqueue(t, c, "plain", pl...)
	typedIDs := enqueue(t, c, "typed", ty...)
	require.NoError(t, w.Start(t.Context()))
	stopAtCleanup(t, w)

	require.Eventually(t, func() bool { return len(plain.get()) == 20 && len(typed.get()) == 20 }, 30*time.Second, 20*time.Millisecond)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	require.NoError(t, w.Stop(ctx))
	require.Equal(t, int64(190), sum.Load())
	require.EqualValues(t, 40, seen.Load(), "middleware sees every item")
	for _, id := range append(plainIDs, typedIDs...) {
		_, err := getItem(t, c, id)
		require.ErrorIs(t, err, client.ErrNotFound, "acked: %s", id)
	}
	for id, n := range plain.get() {
		require.Equal(t, 1, n, id)
	}
	ackMu.Lock()
	defer ackMu.Unlock()
	total := 0
	for _, n := range append(slices.Clone(ackSizes), carried...) {
		total += n
	}
	require.Equal(t, 40, total, "every item acked once: by Ack %v, carried by Dequeue %v", ackSizes, carried)
	require.Less(t, len(ackSizes)+len(carried), 40, "acks of several handlers share calls: %v, %v", ackSizes, carried)
	require.NotEmpty(t, carried, "a worker whose slots are full carries acks in the Dequeue a freed slot wakes")
	t.Logf("ack batches: %v; carried by Dequeue: %v", ackSizes, carried)
}

// A handler that runs three times its lease is never handed the item a
// second time, and no other consumer gets it meanwhile: the worker extends
// the lease every third of it.
func TestWorkerHeartbeatsSlowHandler(t *testing.T) {
	b := newBed(t, bedOpts{})
	c := b.dial(t)
	const lease = time.Second
	var calls counter
	w := newWorker(t, c, client.WorkerConfig{Lease: lease})
	w.Handle("slow", func(ctx context.Context, it *client.Item) error {
		calls.add(it.ID)
		select {
		case <-time.After(3*lease + lease/2):
			return nil
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}, client.TopicOptions{Concurrency: 2})
	ids := enqueue(t, c, "slow", "x")
	require.NoError(t, w.Start(t.Context()))
	stopAtCleanup(t, w)

	require.Eventually(t, func() bool { return len(calls.get()) == 1 }, 20*time.Second, 10*time.Millisecond)
	// Another consumer polls the topic the whole time the handler runs: a
	// lapsed lease would hand it the item.
	other := b.dial(t)
	deadline := time.Now().Add(3 * lease)
	for time.Now().Before(deadline) {
		got, err := other.Dequeue(t.Context(), "default", "slow", 1, time.Minute, 300*time.Millisecond)
		require.NoError(t, err)
		require.Empty(t, got, "the item was delivered twice")
	}
	require.Eventually(t, func() bool {
		_, err := getItem(t, c, ids[0])
		return status.Code(err) == codes.NotFound
	}, 10*time.Second, 20*time.Millisecond, "acked after the slow handler")
	require.Equal(t, map[string]int{ids[0]: 1}, calls.get())
}

// A lease lost under a running handler (here the item is deleted) cancels
// the handler's context with ErrLeaseLost.
func TestWorkerLostLeaseCancelsHandler(t *testing.T) {
	b := newBed(t, bedOpts{})
	c := b.dial(t)
	started := make(chan string, 1)
	cause := make(chan error, 1)
	w := newWorker(t, c, client.WorkerConfig{Lease: 600 * time.Millisecond})
	w.Handle("t", func(ctx context.Context, it *client.Item) error {
		started <- it.ID
		<-ctx.Done()
		cause <- context.Cause(ctx)
		return ctx.Err()
	}, client.TopicOptions{})
	enqueue(t, c, "t", "x")
	require.NoError(t, w.Start(t.Context()))
	stopAtCleanup(t, w)
	id := <-started
	_, err := c.Queue.DeleteItem(t.Context(), &triagev1.DeleteItemRequest{Namespace: "default", Id: id})
	require.NoError(t, err)
	select {
	case err := <-cause:
		require.ErrorIs(t, err, client.ErrLeaseLost)
	case <-time.After(10 * time.Second):
		t.Fatal("handler context not cancelled after its lease was lost")
	}
}

// Stop mid-flight: running handlers finish and are acked, prefetched items
// that no handler started are back at once (ready, no attempt counted),
// the rest untouched. Nothing is lost.
func TestWorkerShutdownMidFlight(t *testing.T) {
	b := newBed(t, bedOpts{})
	c := b.dial(t)
	release := make(chan struct{})
	var running atomic.Int32
	var calls counter
	w := newWorker(t, c, client.WorkerConfig{})
	w.Handle("t", func(ctx context.Context, it *client.Item) error {
		calls.add(it.ID)
		running.Add(1)
		<-release
		require.NoError(t, ctx.Err(), "a graceful stop does not cancel running handlers")
		return nil
	}, client.TopicOptions{Concurrency: 2, Prefetch: 3})
	var payloads []string
	for i := range 10 {
		payloads = append(payloads, fmt.Sprint(i))
	}
	ids := enqueue(t, c, "t", payloads...)
	require.NoError(t, w.Start(t.Context()))
	stopAtCleanup(t, w)

	// Two handlers running, three more items prefetched.
	require.Eventually(t, func() bool { return running.Load() == 2 && stats(t, c, "t").Leased == 5 }, 20*time.Second, 20*time.Millisecond)

	stopped := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		stopped <- w.Stop(ctx)
	}()
	// The prefetched items are back while the handlers still run.
	require.Eventually(t, func() bool { st := stats(t, c, "t"); return st.Leased == 2 && st.Ready == 8 }, 10*time.Second, 10*time.Millisecond)
	select {
	case err := <-stopped:
		t.Fatalf("Stop returned before its handlers finished: %v", err)
	default:
	}
	close(release)
	require.NoError(t, <-stopped)

	handled := calls.get()
	require.Len(t, handled, 2)
	st := stats(t, c, "t")
	require.EqualValues(t, 8, st.Total, "the two handled items acked, nothing else gone")
	require.EqualValues(t, 8, st.Ready, "ready at once")
	require.Zero(t, st.Leased)
	for _, id := range ids {
		it, err := getItem(t, c, id)
		if handled[id] > 0 {
			require.ErrorIs(t, err, client.ErrNotFound)
			continue
		}
		require.NoError(t, err)
		require.Zero(t, it.Attempts, "a handed-back item counts no attempt: %s", id)
	}
	// Another consumer gets them all now, without waiting for a lease.
	got, err := c.Dequeue(t.Context(), "default", "t", 10, time.Minute, 0)
	require.NoError(t, err)
	require.Len(t, got, 8)
}

// A panicking handler nacks its item with the panic and the stack as the
// last error; the worker goes on.
func TestWorkerPanicNacks(t *testing.T) {
	b := newBed(t, bedOpts{})
	c := b.dial(t)
	var calls counter
	var mwErr atomic.Value
	w := newWorker(t, c, client.WorkerConfig{})
	w.Use(func(next client.Handler) client.Handler {
		return func(ctx context.Context, it *client.Item) error {
			err := next(ctx, it)
			if err != nil {
				mwErr.Store(err)
			}
			return err
		}
	})
	w.Handle("t", func(_ context.Context, it *client.Item) error {
		if calls.add(it.ID) == 1 && string(it.Payload) == "bad" {
			panic("handler bug")
		}
		return nil
	}, client.TopicOptions{})
	ids := enqueue(t, c, "t", "bad", "good")
	require.NoError(t, w.Start(t.Context()))
	stopAtCleanup(t, w)
	require.Eventually(t, func() bool {
		it, err := getItem(t, c, ids[0])
		return err == nil && it.LastError != ""
	}, 20*time.Second, 20*time.Millisecond)
	it, err := getItem(t, c, ids[0])
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(it.LastError, "panic: handler bug"), it.LastError)
	require.Contains(t, it.LastError, "worker_test.go", "the stack names the handler")
	require.EqualValues(t, 1, it.Attempts)
	require.Equal(t, triagev1.ItemState_DELAYED, it.State, "nacked with the namespace's backoff")
	var pe *client.PanicError
	require.ErrorAs(t, mwErr.Load().(error), &pe, "middleware sees the panic as an error")
	require.Eventually(t, func() bool {
		_, err := getItem(t, c, ids[1])
		return status.Code(err) == codes.NotFound
	}, 20*time.Second, 20*time.Millisecond, "the worker goes on")
}

// Permanent errors dead-letter at once, with attempts to spare; a snooze
// comes back after its delay without counting a failure; a plain error
// counts one.
func TestWorkerPermanentSnoozeAndRetry(t *testing.T) {
	b := newBed(t, bedOpts{maxAttempts: 5})
	c := b.dial(t)
	var calls counter
	type seen struct {
		attempts int
		at       time.Time
	}
	var mu sync.Mutex
	history := map[string][]seen{}
	w := newWorker(t, c, client.WorkerConfig{})
	w.Handle("t", func(_ context.Context, it *client.Item) error {
		n := calls.add(it.ID)
		mu.Lock()
		history[string(it.Payload)] = append(history[string(it.Payload)], seen{it.Attempts, time.Now()})
		mu.Unlock()
		switch {
		case string(it.Payload) == "permanent":
			return client.Permanent(fmt.Errorf("cannot parse: %w", errBoom))
		case string(it.Payload) == "snooze" && n == 1:
			return client.Snooze(700 * time.Millisecond)
		}
		return nil
	}, client.TopicOptions{Concurrency: 2})
	_ = enqueue(t, c, "t", "permanent", "snooze")
	require.NoError(t, w.Start(t.Context()))
	stopAtCleanup(t, w)

	require.Eventually(t, func() bool { return stats(t, c, "t").Total == 0 }, 20*time.Second, 20*time.Millisecond)
	dl, err := c.Queue.ListDeadLetters(t.Context(), &triagev1.ListDeadLettersRequest{Namespace: "default", Topic: "t"})
	require.NoError(t, err)
	require.Len(t, dl.DeadLetters, 1)
	require.Equal(t, "permanent", string(dl.DeadLetters[0].Payload))
	require.EqualValues(t, 1, dl.DeadLetters[0].Attempts, "dead-lettered at once, not after max attempts")
	require.Equal(t, "permanent: cannot parse: boom", dl.DeadLetters[0].LastError)

	mu.Lock()
	defer mu.Unlock()
	sn := history["snooze"]
	require.Len(t, sn, 2)
	require.Equal(t, 1, sn[0].attempts)
	require.Equal(t, 1, sn[1].attempts, "a snooze does not count an attempt")
	require.GreaterOrEqual(t, sn[1].at.Sub(sn[0].at), 600*time.Millisecond, "redelivered after the snooze")
}

// The router rules: release and dead_letter in one nack are refused.
func TestNackReleaseAndDeadLetterExclusive(t *testing.T) {
	b := newBed(t, bedOpts{})
	c := b.dial(t)
	enqueue(t, c, "t", "x")
	items, err := c.Dequeue(t.Context(), "default", "t", 1, time.Minute, 5*time.Second)
	require.NoError(t, err)
	require.Len(t, items, 1)
	_, err = c.Queue.Nack(t.Context(), &triagev1.NackRequest{Namespace: "default", Nacks: []*triagev1.NackItem{
		{Id: items[0].Id, LeaseToken: items[0].LeaseToken, Release: true, DeadLetter: true}}})
	require.ErrorIs(t, err, client.ErrInvalid)
	require.Equal(t, codes.InvalidArgument, status.Code(err))
}
