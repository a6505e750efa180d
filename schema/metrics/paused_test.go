package metrics

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/triage-queue/triage/shardmap"
)

type fixedMap struct{ m *shardmap.Map }

func (f fixedMap) Current() *shardmap.Map { return f.m }
func (f fixedMap) Age() time.Duration     { return 0 }

// TestTopicPausedGauge: a paused topic has a series, 1, one that is not
// has none; paused topics past the label cap add up under Other.
func TestTopicPausedGauge(t *testing.T) {
	t.Parallel()
	m, err := shardmap.New(shardmap.Map{Version: 3, Regions: []string{"r"},
		Shards: []shardmap.Shard{{ID: 1, HomeRegion: "r", Primary: "a:3306"}},
		Namespaces: []shardmap.Namespace{
			{Name: "ns", Topics: map[string]shardmap.TopicConfig{"a": {Paused: true}, "b": {Policy: shardmap.PolicyStrict}}},
			{Name: "capped", Topics: map[string]shardmap.TopicConfig{"x": {Paused: true}, "y": {Paused: true}, "z": {Paused: true}}},
		}})
	require.NoError(t, err)
	// One label per namespace: x and a take it (labelled first, as a node
	// that saw them before would have), y and z add up under Other; b,
	// not paused, has no series.
	s := New(prometheus.NewRegistry(), Options{MaxTopics: 1})
	s.TopicLabel("capped", "x")
	s.TopicLabel("ns", "a")
	s.RegisterShardMap(fixedMap{m})
	want := `
# HELP triage_topic_paused 1 while PauseTopic holds the topic's deliveries; topics not paused have no series (under topic "_other": how many of those topics are paused).
# TYPE triage_topic_paused gauge
triage_topic_paused{namespace="capped",topic="_other"} 2
triage_topic_paused{namespace="capped",topic="x"} 1
triage_topic_paused{namespace="ns",topic="a"} 1
`
	require.NoError(t, testutil.GatherAndCompare(s.Registry, strings.NewReader(want), "triage_topic_paused"))
}
