package routing

import (
	"context"
	"fmt"
	"math"
	"sync"
	"time"

	"golang.org/x/time/rate"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/triage-queue/triage/shardmap"
)

// quotas enforces a namespace's enqueue rate (a token bucket per router:
// with N routers the namespace gets up to N times the rate; say so when
// sizing it) and max depth (against a count of the region's items
// refreshed every depthEvery, plus what this router admitted since).
type quotas struct {
	mu      sync.Mutex
	buckets map[string]*bucket
	depths  map[[2]string]*depth
}

type bucket struct {
	limit float64
	burst int
	lim   *rate.Limiter
}

type depth struct {
	counted  int64 // items at the last count
	admitted int64 // items this router admitted since
	at       time.Time
	counting bool
}

const depthEvery = 2 * time.Second

func newQuotas() *quotas {
	return &quotas{buckets: map[string]*bucket{}, depths: map[[2]string]*depth{}}
}

// errRate is RESOURCE_EXHAUSTED with a RetryInfo detail and the wait in
// the message; the gateway answers it with HTTP 429.
func errRate(ns string, limit float64, wait time.Duration) error {
	wait = max(wait, time.Millisecond).Round(time.Millisecond)
	st := status.New(codes.ResourceExhausted, fmt.Sprintf(
		"namespace %q is over its enqueue rate of %g items/s; retry after %s", ns, limit, wait))
	if d, err := st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(wait)}); err == nil {
		st = d
	}
	return st.Err()
}

// admitRate takes n tokens or says how long to wait. A request larger than
// the burst can never pass and is refused as such.
func (q *quotas) admitRate(ns *shardmap.Namespace, n int, now time.Time) error {
	if ns.EnqueueRateLimit <= 0 {
		return nil
	}
	q.mu.Lock()
	b := q.buckets[ns.Name]
	if b == nil || b.limit != ns.EnqueueRateLimit || b.burst != ns.EnqueueBurst {
		b = &bucket{limit: ns.EnqueueRateLimit, burst: ns.EnqueueBurst, lim: rate.NewLimiter(rate.Limit(ns.EnqueueRateLimit), ns.EnqueueBurst)}
		q.buckets[ns.Name] = b
	}
	q.mu.Unlock()
	if n > b.burst {
		return invalid("%d items in one request exceed namespace %q's enqueue burst of %d; send smaller batches", n, ns.Name, b.burst)
	}
	r := b.lim.ReserveN(now, n)
	if !r.OK() {
		return errRate(ns.Name, b.limit, time.Second)
	}
	if wait := r.DelayFrom(now); wait > 0 {
		r.CancelAt(now)
		return errRate(ns.Name, b.limit, wait)
	}
	return nil
}

// admitDepth refuses n more items when the region's shards hold max_depth
// already. count recounts the namespace's items; it runs in the
// background at most every depthEvery, so the check stays off the hot path
// and is approximate by what other routers admitted meanwhile.
func (q *quotas) admitDepth(ns *shardmap.Namespace, region string, n int, now time.Time, count func(context.Context) (int64, error)) error {
	if ns.MaxDepth <= 0 {
		return nil
	}
	k := [2]string{ns.Name, region}
	q.mu.Lock()
	defer q.mu.Unlock()
	d := q.depths[k]
	if d == nil {
		d = &depth{}
		q.depths[k] = d
		// First use: count synchronously so the check means something.
		q.mu.Unlock()
		c, err := count(context.Background())
		q.mu.Lock()
		if err != nil {
			return errorf(ErrUnavailable, "counting namespace %q: %v", ns.Name, err)
		}
		d.counted, d.at = c, now
	}
	if now.Sub(d.at) > depthEvery && !d.counting {
		d.counting = true
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			c, err := count(ctx)
			q.mu.Lock()
			defer q.mu.Unlock()
			d.counting = false
			if err == nil {
				d.counted, d.admitted, d.at = c, 0, time.Now()
			}
		}()
	}
	if d.counted+d.admitted+int64(n) > ns.MaxDepth {
		return status.Error(codes.ResourceExhausted, fmt.Sprintf(
			"namespace %q holds about %d items in region %s; its max_depth is %d: consume some first",
			ns.Name, d.counted+d.admitted, region, ns.MaxDepth))
	}
	d.admitted += int64(n)
	if d.admitted > math.MaxInt32 {
		d.admitted = math.MaxInt32
	}
	return nil
}
