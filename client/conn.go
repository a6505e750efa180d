package client

import (
	"context"
	"math/rand/v2"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
)

// Endpoint is a router the client may send calls to.
type Endpoint struct {
	// Addr is the router's gRPC address, host:port.
	Addr string
	// Region is the router's region. Endpoints in the client's preferred
	// region (WithRegion) are tried first; empty matches no preference.
	Region string
}

// RetryPolicy says how calls that fail with UNAVAILABLE are retried.
type RetryPolicy struct {
	// MaxAttempts is how many times a call is sent at most, failovers
	// included. Default 8; 1 disables retries.
	MaxAttempts int
	// Initial is the first backoff, doubled after each round over the
	// endpoints up to Max. Defaults 50ms and 2s. Each sleep is drawn from
	// [d/2, d) (jitter), so workers that lost the same router do not come
	// back in step.
	Initial, Max time.Duration
	// DownFor is how long an endpoint that answered UNAVAILABLE is passed
	// over while others are healthy. Default 5s.
	DownFor time.Duration
}

func (p RetryPolicy) withDefaults() RetryPolicy {
	if p.MaxAttempts <= 0 {
		p.MaxAttempts = 8
	}
	if p.Initial <= 0 {
		p.Initial = 50 * time.Millisecond
	}
	if p.Max <= 0 {
		p.Max = 2 * time.Second
	}
	if p.DownFor <= 0 {
		p.DownFor = 5 * time.Second
	}
	return p
}

// endpoint is one router and its connection.
type endpoint struct {
	Endpoint
	conn *grpc.ClientConn
	// downUntil: passed over until then (guarded by multiConn.mu).
	downUntil time.Time
}

// multiConn is a grpc.ClientConnInterface over several routers: each call
// goes to the most preferred endpoint that is not marked down, and a call
// that fails with UNAVAILABLE is retried on the next one, then with
// backoff. Every router serves every call (item IDs name their shard), so
// any of them will do; preference only saves the cross-region hop.
type multiConn struct {
	eps    []*endpoint // in preference order
	policy RetryPolicy
	sleep  func(ctx context.Context, d time.Duration) error // a seam for tests

	mu sync.Mutex
}

var _ grpc.ClientConnInterface = (*multiConn)(nil)

// pick returns the first endpoint not marked down, or, when all are, the
// one that comes back soonest: a client never refuses to try.
func (m *multiConn) pick(skip map[*endpoint]bool) *endpoint {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := time.Now()
	var best *endpoint
	for _, e := range m.eps {
		if skip[e] {
			continue
		}
		if e.downUntil.Before(now) {
			return e
		}
		if best == nil || e.downUntil.Before(best.downUntil) {
			best = e
		}
	}
	return best
}

func (m *multiConn) markDown(e *endpoint) {
	m.mu.Lock()
	e.downUntil = time.Now().Add(m.policy.DownFor)
	m.mu.Unlock()
}

func (m *multiConn) markUp(e *endpoint) {
	m.mu.Lock()
	e.downUntil = time.Time{}
	m.mu.Unlock()
}

// Invoke sends a unary call with failover and retries on UNAVAILABLE.
// Within one round every endpoint is tried once without sleeping; between
// rounds the call backs off. Calls that are not safe to repeat are sent
// once (retryable).
func (m *multiConn) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	attempts := m.policy.MaxAttempts
	if !retryable(method, args) {
		attempts = 1
	}
	backoff := m.policy.Initial
	tried := map[*endpoint]bool{}
	var last *endpoint // and lastErr: the UNAVAILABLE of the last try
	var lastErr error
	for n := 1; ; n++ {
		e := m.pick(tried)
		if e == nil { // every endpoint tried this round
			clear(tried)
			if err := m.sleep(ctx, jitter(backoff)); err != nil {
				// The caller's deadline ended the backoff: what it
				// needs to hear is why the calls failed (UNAVAILABLE,
				// and from which router), not that time ran out.
				if lastErr != nil {
					return wrapErr(method, last, lastErr, n-1)
				}
				return err
			}
			backoff = min(2*backoff, m.policy.Max)
			e = m.pick(tried)
		}
		tried[e] = true
		err := e.conn.Invoke(ctx, method, args, reply, opts...)
		if err == nil {
			m.markUp(e)
			return nil
		}
		if status.Code(err) != codes.Unavailable || ctx.Err() != nil || n >= attempts {
			if status.Code(err) == codes.Unavailable {
				m.markDown(e)
			}
			return wrapErr(method, e, err, n)
		}
		m.markDown(e)
		last, lastErr = e, err
	}
}

// NewStream opens a stream on the preferred endpoint, without retries: a
// stream's messages cannot be replayed safely. (The v1 API has none.)
func (m *multiConn) NewStream(ctx context.Context, desc *grpc.StreamDesc, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	return m.pick(nil).conn.NewStream(ctx, desc, method, opts...)
}

// retryable reports whether a call may be sent again after UNAVAILABLE,
// which does not say whether the router acted on it. Lease calls carry a
// token, so a repeat is refused per item rather than applied twice; reads
// are free to repeat. An Enqueue repeats only when every item has a dedup
// key, since otherwise a repeat of a batch that was stored stores it
// twice; the control plane's changes are not repeated.
func retryable(method string, args any) bool {
	switch method {
	case triagev1.Queue_Enqueue_FullMethodName:
		req, ok := args.(*triagev1.EnqueueRequest)
		if !ok {
			return false
		}
		for _, it := range req.GetItems() {
			if it.GetDedupKey() == "" {
				return false
			}
		}
		return true
	case triagev1.Admin_Failover_FullMethodName, triagev1.Admin_PutNamespace_FullMethodName,
		triagev1.Admin_AddShard_FullMethodName, triagev1.Admin_AddNamespaceShard_FullMethodName,
		triagev1.Admin_SetShardWeight_FullMethodName, triagev1.Admin_DrainShard_FullMethodName,
		triagev1.Admin_RetireShard_FullMethodName:
		return false
	}
	return true
}

// jitter draws from [d/2, d).
func jitter(d time.Duration) time.Duration {
	if d <= 1 {
		return d
	}
	return d/2 + rand.N(d/2)
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// wrapErr turns a status error into an *Error; context errors from the
// caller's own context pass through as they are, so errors.Is(err,
// context.Canceled) keeps working.
func wrapErr(method string, e *endpoint, err error, attempts int) error {
	if err == nil {
		return nil
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	return &Error{Method: method, Endpoint: e.Addr, Code: st.Code(), Message: st.Message(), Attempts: attempts}
}
