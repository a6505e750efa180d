package metrics

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
)

func TestTopicsPastTheCapShareOther(t *testing.T) {
	t.Parallel()
	s := New(prometheus.NewRegistry(), Options{MaxTopics: 2})
	for _, topic := range []string{"a", "b", "c", "d", "a"} {
		s.Topic("ns", topic).Enqueued[Band(3)].Inc()
	}
	require.Equal(t, "a", s.TopicLabel("ns", "a"))
	require.Equal(t, Other, s.TopicLabel("ns", "c"))
	require.Equal(t, "x", s.TopicLabel("other-ns", "x"), "the cap is per namespace")
	require.Equal(t, 2.0, testutil.ToFloat64(s.enqueued.WithLabelValues("ns", "a", "3")))
	require.Equal(t, 2.0, testutil.ToFloat64(s.enqueued.WithLabelValues("ns", Other, "3")))
	// The per-topic cache stays bounded: topics past the cap are not kept.
	require.Len(t, s.topics["ns"], 3) // a, b, _other
}

func TestBands(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		priority int32
		want     string
	}{{-5, "0"}, {0, "0"}, {1, "1"}, {3, "3"}, {4, "4+"}, {1 << 30, "4+"}} {
		require.Equal(t, c.want, Bands[Band(c.priority)], "priority %d", c.priority)
	}
}

// A nil Set records into a private one: roles built without metrics need
// no checks.
func TestNilSetIsUsable(t *testing.T) {
	t.Parallel()
	var s *Set
	s.Topic("ns", "t").Dequeued[0].Inc()
	s.Namespace("ns").Ack.Observe(0.1)
	s.Shard(1).ReplicaLag("r:1", time.Second, true)
	s.Prefetch(true, 3)
	s.FailoverStep("fenced", time.Millisecond)
	s.Failover(1, "planned", "done")
	s.RegisterDepth(DepthConfig{})
	s.RegisterShardMap(nil)
}

func TestHotPathDoesNotAllocate(t *testing.T) {
	s := New(prometheus.NewRegistry(), Options{})
	s.Topic("ns", "t")
	s.Namespace("ns")
	allocs := testing.AllocsPerRun(100, func() {
		s.Topic("ns", "t").Enqueued[Band(2)].Inc()
		s.Namespace("ns").Dequeue.Observe(0.01)
	})
	require.Zero(t, allocs)
}
