package client_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"

	"github.com/triage-queue/triage/client"
	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
)

// leaseCall is one lease call the worker sent, for one item's token.
type leaseCall struct {
	method string // "extend", "ack" or "nack"
	token  string
	err    string // the nack's error
	ok     bool   // an extension the router granted
}

// leaseLog records, in the order they were sent, the lease calls that go
// through its interceptor, one entry per item of a batch.
type leaseLog struct {
	mu    sync.Mutex
	calls []leaseCall
}

func (l *leaseLog) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	var sent []leaseCall
	switch r := req.(type) {
	case *triagev1.ExtendLeaseRequest:
		sent = append(sent, leaseCall{method: "extend", token: r.LeaseToken})
	case *triagev1.AckRequest:
		for _, a := range r.Acks {
			sent = append(sent, leaseCall{method: "ack", token: a.LeaseToken})
		}
	case *triagev1.NackRequest:
		for _, n := range r.Nacks {
			sent = append(sent, leaseCall{method: "nack", token: n.LeaseToken, err: n.Error})
		}
	}
	l.mu.Lock()
	first := len(l.calls)
	l.calls = append(l.calls, sent...)
	l.mu.Unlock()
	err := invoker(ctx, method, req, reply, cc, opts...)
	if _, ok := req.(*triagev1.ExtendLeaseRequest); ok && err == nil {
		l.mu.Lock()
		l.calls[first].ok = true
		l.mu.Unlock()
	}
	return err
}

// of returns the calls made with token, in order.
func (l *leaseLog) of(token string) []leaseCall {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []leaseCall
	for _, c := range l.calls {
		if c.token == token {
			out = append(out, c)
		}
	}
	return out
}

// count counts the calls of method made with token (granted extensions
// only, for "extend", when granted is set).
func (l *leaseLog) count(token, method string, granted bool) int {
	n := 0
	for _, c := range l.of(token) {
		if c.method == method && (!granted || c.ok) {
			n++
		}
	}
	return n
}

// seenDelivery is what a handler saw of one delivery.
type seenDelivery struct {
	attempts int
	// maxAttempts and lastErr: what the item told of its retry policy
	// and its last failure.
	maxAttempts int
	lastErr     string
	token       string
	cause       error
	deadline    bool
}

// A handler that blocks until its context is done is cancelled at the
// topic's timeout with ErrHandlerTimeout; the item is nacked with the
// server's backoff, so it comes back with its attempt counted, and the
// heartbeat stops: no extension of the timed-out delivery's lease is sent
// after its nack. At max_attempts the timed-out item dead-letters with
// the timeout as its last error.
func TestWorkerTimeoutCancelsHungHandler(t *testing.T) {
	b := newBed(t, bedOpts{maxAttempts: 2})
	var log leaseLog
	c := b.dial(t, client.WithDialOptions(grpc.WithChainUnaryInterceptor(log.intercept)))
	seen := make(chan seenDelivery, 2)
	w := newWorker(t, c, client.WorkerConfig{Lease: 900 * time.Millisecond})
	w.Handle("hung", func(ctx context.Context, it *client.Item) error {
		_, hasDeadline := ctx.Deadline()
		<-ctx.Done()
		seen <- seenDelivery{attempts: it.Attempts, token: it.LeaseToken(), cause: context.Cause(ctx), deadline: hasDeadline,
			maxAttempts: it.MaxAttempts, lastErr: it.LastError}
		return ctx.Err()
	}, client.TopicOptions{Timeout: time.Second})
	ids := enqueue(t, c, "hung", "x")
	require.NoError(t, w.Start(t.Context()))
	stopAtCleanup(t, w)

	var got []seenDelivery
	for range 2 {
		select {
		case d := <-seen:
			got = append(got, d)
		case <-time.After(30 * time.Second):
			t.Fatalf("handler not cancelled at its timeout; deliveries so far: %+v", got)
		}
	}
	for i, d := range got {
		require.Equal(t, i+1, d.attempts, "each timed-out delivery counts an attempt")
		require.ErrorIs(t, d.cause, client.ErrHandlerTimeout)
		require.True(t, d.deadline, "the handler's context carries the timeout as its deadline")
		require.Equal(t, 2, d.maxAttempts, "the handler sees how many tries the item gets")
	}
	require.Empty(t, got[0].lastErr)
	require.Equal(t, "handler timed out after 1s", got[1].lastErr, "the retry sees why the last try failed")
	require.Eventually(t, func() bool { return stats(t, c, "hung").Total == 0 }, 20*time.Second, 20*time.Millisecond)
	dl, err := c.Queue.ListDeadLetters(t.Context(), &triagev1.ListDeadLettersRequest{Namespace: "default", Topic: "hung"})
	require.NoError(t, err)
	require.Len(t, dl.DeadLetters, 1)
	require.Equal(t, ids[0], dl.DeadLetters[0].Id)
	require.EqualValues(t, 2, dl.DeadLetters[0].Attempts)
	require.Equal(t, "handler timed out after 1s", dl.DeadLetters[0].LastError)

	first := log.of(got[0].token)
	require.Positive(t, log.count(got[0].token, "extend", true), "the heartbeat ran while the handler did: %+v", first)
	require.Equal(t, 1, log.count(got[0].token, "nack", false), "nacked once: %+v", first)
	last := first[len(first)-1]
	require.Equal(t, "nack", last.method, "no extension after the nack: %+v", first)
	require.Equal(t, "handler timed out after 1s", last.err)
	require.Zero(t, log.count(got[0].token, "ack", false))
}

// A handler that ignores its context entirely is abandoned at its
// timeout: the item is nacked and comes back, the topic's only slot goes
// to the next item at once, the handler's late result is ignored (nothing
// is settled twice), and Stop does not wait for it.
func TestWorkerTimeoutAbandonsHandlerIgnoringContext(t *testing.T) {
	b := newBed(t, bedOpts{})
	var log leaseLog
	c := b.dial(t, client.WithDialOptions(grpc.WithChainUnaryInterceptor(log.intercept)))
	release, releaseHang := make(chan struct{}), make(chan struct{})
	var stuckToken, hangToken atomic.Value
	started, returned := make(chan struct{}), make(chan struct{})
	hangStarted, hangReturned := make(chan struct{}), make(chan struct{})
	var calls counter
	w := newWorker(t, c, client.WorkerConfig{})
	w.Handle("t", func(_ context.Context, it *client.Item) error {
		calls.add(it.ID)
		switch {
		case string(it.Payload) == "stuck" && it.Attempts == 1:
			stuckToken.Store(it.LeaseToken())
			close(started)
			<-release // the context is not looked at
			close(returned)
			return nil // too late: must not ack
		case string(it.Payload) == "hang" && it.Attempts == 1:
			hangToken.Store(it.LeaseToken())
			close(hangStarted)
			<-releaseHang
			close(hangReturned)
			return nil
		}
		return nil
	}, client.TopicOptions{Concurrency: 1, Timeout: 300 * time.Millisecond})
	stuck := enqueue(t, c, "t", "stuck")[0]
	require.NoError(t, w.Start(t.Context()))
	stopAtCleanup(t, w)
	// The handlers must return before the test does (goroutine leaks).
	var once, onceHang sync.Once
	t.Cleanup(func() { once.Do(func() { close(release) }); onceHang.Do(func() { close(releaseHang) }) })
	<-started
	next := enqueue(t, c, "t", "next")[0]

	// With the stuck handler still running, the one slot handles the
	// next item and the stuck item's second delivery.
	require.Eventually(t, func() bool {
		_, errNext := getItem(t, c, next)
		_, errStuck := getItem(t, c, stuck)
		return isNotFound(errNext) && isNotFound(errStuck)
	}, 30*time.Second, 20*time.Millisecond, "the abandoned handler does not hold the slot")
	require.Equal(t, 2, calls.get()[stuck], "redelivered once")

	// Its late result reaches the worker while it still runs; Stop
	// flushes whatever the worker queued to send.
	once.Do(func() { close(release) })
	<-returned
	// A handler that ignores its context when Stop is called is waited
	// for until its timeout, no longer.
	enqueue(t, c, "t", "hang")
	<-hangStarted
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	require.NoError(t, w.Stop(ctx), "a graceful stop: the hung handler was abandoned at its timeout")
	select {
	case <-hangReturned:
		t.Fatal("the hung handler returned before Stop did")
	default:
	}
	onceHang.Do(func() { close(releaseHang) })
	<-hangReturned

	token := stuckToken.Load().(string)
	calls1 := log.of(token)
	require.Zero(t, log.count(token, "ack", false), "the late result is ignored: %+v", calls1)
	require.Equal(t, 1, log.count(token, "nack", false), "settled once: %+v", calls1)
	hangCalls := log.of(hangToken.Load().(string))
	require.Equal(t, []leaseCall{{method: "nack", token: hangToken.Load().(string), err: "handler timed out after 300ms"}}, hangCalls,
		"the hung handler's item is nacked at its timeout, during Stop")
}

// With NoTimeout a handler runs as long as it likes: its context has no
// deadline and its lease is extended again and again, as without a
// timeout before.
func TestWorkerNoTimeoutKeepsExtending(t *testing.T) {
	b := newBed(t, bedOpts{})
	var log leaseLog
	c := b.dial(t, client.WithDialOptions(grpc.WithChainUnaryInterceptor(log.intercept)))
	tokens := make(chan string, 1)
	enough := make(chan struct{})
	results := make(chan error, 1)
	var calls counter
	w := newWorker(t, c, client.WorkerConfig{Lease: 600 * time.Millisecond})
	w.Handle("long", func(ctx context.Context, it *client.Item) error {
		calls.add(it.ID)
		if _, ok := ctx.Deadline(); ok {
			results <- context.DeadlineExceeded
			return nil
		}
		tokens <- it.LeaseToken()
		select {
		case <-enough:
		case <-ctx.Done():
		}
		results <- context.Cause(ctx)
		return nil
	}, client.TopicOptions{Timeout: client.NoTimeout})
	ids := enqueue(t, c, "long", "x")
	require.NoError(t, w.Start(t.Context()))
	stopAtCleanup(t, w)

	var token string
	select {
	case token = <-tokens:
	case err := <-results:
		t.Fatalf("the handler's context has a deadline: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("handler not started")
	}
	// Many leases' worth of extensions, far past a timeout as short as
	// the other tests use.
	require.Eventually(t, func() bool { return log.count(token, "extend", true) >= 6 }, 30*time.Second, 20*time.Millisecond)
	close(enough)
	require.NoError(t, <-results, "never cancelled")
	require.Eventually(t, func() bool {
		_, err := getItem(t, c, ids[0])
		return isNotFound(err)
	}, 10*time.Second, 20*time.Millisecond, "acked")
	require.Equal(t, map[string]int{ids[0]: 1}, calls.get())
}

func isNotFound(err error) bool { return errors.Is(err, client.ErrNotFound) }
