package metrics

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
)

// TestThroughputCountsPerNamespace: the counters the roles increment fill
// their namespace's ring, and only its; the Prometheus series count as
// before.
func TestThroughputCountsPerNamespace(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_700_000_000, 0) // on an interval's start
	s := New(prometheus.NewRegistry(), Options{})
	s.now = func() time.Time { return now }

	tm := s.Topic("a", "t")
	for range 30 {
		tm.Enqueued[Band(1)].Inc()
	}
	tm.Dequeued[Band(0)].Inc()
	tm.DeadLettered.Add(2)
	s.Namespace("a").AckOK.Add(5)
	s.Namespace("a").AckRefused.Add(7) // refused acks are not acked
	s.Topic("b", "t").Enqueued[0].Add(100)
	require.Equal(t, 30.0, testutil.ToFloat64(s.enqueued.WithLabelValues("a", "t", "1")))
	require.Equal(t, 5.0, testutil.ToFloat64(s.acks.WithLabelValues("a", "ok")))

	now = now.Add(4 * time.Second)
	got := s.Throughput("a")
	require.Equal(t, Interval, got.Interval)
	for _, r := range got.Rates {
		require.Len(t, r, Intervals)
	}
	last := Intervals - 1
	require.Equal(t, now.Add(-4*time.Second).Add(-(Intervals-1)*Interval), got.Start, "the last interval is the current one")
	// The current interval has run 4 s: rates over those.
	require.Equal(t, []float64{30.0 / 4, 1.0 / 4, 5.0 / 4, 2.0 / 4},
		[]float64{got.Rates[RateEnqueued][last], got.Rates[RateDelivered][last], got.Rates[RateAcked][last], got.Rates[RateDeadLettered][last]})
	require.Equal(t, 100.0/4, s.Throughput("b").Rates[RateEnqueued][last], "b's counts are b's")
	require.Zero(t, s.Throughput("c").Rates[RateEnqueued][last], "a namespace not counted")

	// An interval later, the first is whole; an hour after it, it is gone
	// and its slot counts the new interval from zero.
	now = now.Add(Interval)
	got = s.Throughput("a")
	require.Equal(t, 30.0/10, got.Rates[RateEnqueued][last-1])
	require.Zero(t, got.Rates[RateEnqueued][last])
	now = now.Add((Intervals - 1) * Interval) // 4 s into the interval an hour after the first
	tm.Enqueued[0].Inc()
	got = s.Throughput("a")
	require.Equal(t, 1.0/4, got.Rates[RateEnqueued][last], "the first interval's slot counts the new one from zero")
	for j := range last {
		require.Zero(t, got.Rates[RateEnqueued][j], "interval %d", j)
	}
}
