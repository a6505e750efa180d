package routing

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
	"github.com/triage-queue/triage/shardmap"
)

// TestWithPaused: pausing a configured topic keeps its config; pausing
// an unconfigured one adds a config that resuming removes again; the
// other topics and namespaces stay as they are.
func TestWithPaused(t *testing.T) {
	t.Parallel()
	m := quotaMap(t)
	m, err := withPaused(m, "default", "a", true)
	require.NoError(t, err)
	m, err = withPaused(m, "default", "b", true)
	require.NoError(t, err)
	ns, err := m.Namespace("default")
	require.NoError(t, err)
	require.Equal(t, map[string]shardmap.TopicConfig{
		"a": {Policy: shardmap.PolicyWeighted, Paused: true},
		"b": {Paused: true},
	}, ns.Topics)
	require.Equal(t, 1000, int(ns.MaxDepth), "the rest of the namespace is kept")
	require.True(t, topicPaused(m, "default", "b"))
	require.False(t, topicPaused(m, "default", "c"))
	require.False(t, topicPaused(m, "nope", "b"))

	m, err = withPaused(m, "default", "a", false)
	require.NoError(t, err)
	m, err = withPaused(m, "default", "b", false)
	require.NoError(t, err)
	ns, err = m.Namespace("default")
	require.NoError(t, err)
	require.Equal(t, map[string]shardmap.TopicConfig{"a": {Policy: shardmap.PolicyWeighted}}, ns.Topics,
		"a keeps its config; b's, which only held the pause, is gone")

	_, err = withPaused(m, "nope", "a", true)
	require.Equal(t, codes.NotFound, status.Code(toStatus(err)), "%v", err)
}

// TestPauseNeedsRoomForAConfig: a namespace with MaxTopicConfigs topic
// configs may pause one of them, but not a topic without a config:
// FAILED_PRECONDITION, saying what to do.
func TestPauseNeedsRoomForAConfig(t *testing.T) {
	t.Parallel()
	m := quotaMap(t)
	ns, err := m.Namespace("default")
	require.NoError(t, err)
	full := *ns
	full.Topics = map[string]shardmap.TopicConfig{}
	for i := range MaxTopicConfigs {
		full.Topics[fmt.Sprintf("t%d", i)] = shardmap.TopicConfig{Policy: shardmap.PolicyStrict}
	}
	m, err = m.WithNamespace(full)
	require.NoError(t, err)
	_, err = withPaused(m, "default", "t3", true)
	require.NoError(t, err)
	_, err = withPaused(m, "default", "new", true)
	err = toStatus(mapChangeError(err))
	require.Equal(t, codes.FailedPrecondition, status.Code(err), "%v", err)
	require.Contains(t, status.Convert(err).Message(), "remove a topic config")
}

// TestPutNamespaceKeepsPauses: a replace, an update of all topics and an
// update of one topic neither resume a paused topic (even one whose
// config they remove or send with paused false) nor pause another (one
// sent with paused true).
func TestPutNamespaceKeepsPauses(t *testing.T) {
	t.Parallel()
	m := quotaMap(t)
	m, err := withPaused(m, "default", "a", true)
	require.NoError(t, err)
	m, err = withPaused(m, "default", "b", true)
	require.NoError(t, err)
	stored, err := m.Namespace("default")
	require.NoError(t, err)
	base := func() *triagev1.Namespace {
		return &triagev1.Namespace{MaxDepth: stored.MaxDepth, EnqueueRateLimit: stored.EnqueueRateLimit, EnqueueBurst: int32(stored.EnqueueBurst),
			Shards: []*triagev1.NamespaceShards{{Region: "eu", Shards: []uint32{3}}}}
	}

	replace := base()
	replace.Topics = map[string]*triagev1.TopicConfig{"a": {AtMostOnce: true, Paused: false}, "c": {Paused: true}}
	ns, err := change(m, nsAdmin, "default", replace)
	require.NoError(t, err)
	require.Equal(t, map[string]shardmap.TopicConfig{
		"a": {Policy: shardmap.PolicyStrict, AtMostOnce: true, Paused: true},
		"b": {Paused: true},
		"c": {Policy: shardmap.PolicyStrict},
	}, ns.Topics)

	ns, err = change(m, nsAdmin, "default", &triagev1.Namespace{}, "topics")
	require.NoError(t, err)
	require.Equal(t, map[string]shardmap.TopicConfig{"a": {Paused: true}, "b": {Paused: true}}, ns.Topics,
		"topics cleared: the pauses stay, the rest of a's config goes")

	ns, err = change(m, nsAdmin, "default", &triagev1.Namespace{Topics: map[string]*triagev1.TopicConfig{"b": {AtMostOnce: true}}}, "topics.b", "topics.a")
	require.NoError(t, err)
	require.Equal(t, map[string]shardmap.TopicConfig{
		"a": {Paused: true},
		"b": {Policy: shardmap.PolicyStrict, AtMostOnce: true, Paused: true},
	}, ns.Topics)

	got := namespaceProto(m, stored)
	require.True(t, got.Topics["a"].Paused)
	require.True(t, got.Topics["b"].Paused)
}
