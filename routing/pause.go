package routing

import (
	"context"
	"errors"
	"maps"

	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
	"github.com/triage-queue/triage/shardmap"
)

// ErrPrecondition marks a request the current state does not allow; the
// message says what to change first.
var ErrPrecondition = errors.New("failed precondition")

// PauseTopic implements triagev1.AdminServer: it marks the topic paused
// in the shard map (shardmap.TopicConfig.Paused), which the dequeuers of
// every region read on each dequeue round.
func (a *Admin) PauseTopic(ctx context.Context, req *triagev1.PauseTopicRequest) (*triagev1.TopicPauseState, error) {
	return a.r.setPaused(ctx, req.Namespace, req.Topic, true)
}

// ResumeTopic implements triagev1.AdminServer: it clears the topic's
// pause in the shard map.
func (a *Admin) ResumeTopic(ctx context.Context, req *triagev1.ResumeTopicRequest) (*triagev1.TopicPauseState, error) {
	return a.r.setPaused(ctx, req.Namespace, req.Topic, false)
}

// setPaused publishes a map in which topic of ns is paused or not. A
// topic already in that state publishes nothing and answers the current
// version, so a retried call is harmless.
func (r *Router) setPaused(ctx context.Context, ns, topic string, paused bool) (*triagev1.TopicPauseState, error) {
	if err := checkName("topic", topic); err != nil {
		return nil, err
	}
	m := r.cfg.Maps.Current()
	n, err := m.Namespace(ns)
	if err != nil {
		return nil, err
	}
	out := &triagev1.TopicPauseState{Namespace: ns, Topic: topic, Paused: paused, Version: m.Version}
	if n.Topics[topic].Paused == paused {
		return out, nil
	}
	next, err := r.changeMap(ctx, func(m *shardmap.Map) (*shardmap.Map, error) { return withPaused(m, ns, topic, paused) })
	if err != nil {
		return nil, err
	}
	out.Version = next.Version
	return out, nil
}

// withPaused is m with topic of namespace ns paused or resumed. Pausing a
// topic without a config gives it one, which counts towards
// MaxTopicConfigs; resuming removes a config that holds nothing else, so
// pauses leave no configs behind.
func withPaused(m *shardmap.Map, ns, topic string, paused bool) (*shardmap.Map, error) {
	stored, err := m.Namespace(ns)
	if err != nil {
		return nil, err
	}
	next := *stored
	next.Topics = maps.Clone(stored.Topics)
	tc, had := next.Topics[topic]
	tc.Paused = paused
	switch {
	case paused && !had && len(next.Topics) >= MaxTopicConfigs:
		return nil, errorf(ErrPrecondition, "namespace %q has %d topic configs, the most it may have, and pausing topic %q would add one; "+
			"remove a topic config (PutNamespace) first, nothing was changed", ns, len(next.Topics), topic)
	case paused && next.Topics == nil:
		next.Topics = map[string]shardmap.TopicConfig{topic: tc}
	case !paused && emptyTopicConfig(tc):
		delete(next.Topics, topic)
	default:
		next.Topics[topic] = tc
	}
	return m.WithNamespace(next)
}

// emptyTopicConfig tells a config that sets nothing: one a pause made.
// A config PutNamespace stored always names its policy.
func emptyTopicConfig(tc shardmap.TopicConfig) bool {
	return tc.Policy == "" && len(tc.BandWeights) == 0 && !tc.AtMostOnce && tc.AgingThreshold == 0 && !tc.Paused &&
		tc.MaxAttempts == 0 && tc.Backoff == nil
}

// keepPauses sets every topic's pause in ns as stored has it: only
// PauseTopic and ResumeTopic change a pause, so a PutNamespace (built
// from a GET that raced a pause, or by a tool that never heard of
// pauses) neither resumes a topic nor pauses one, even when it removes
// the topic's config.
func keepPauses(stored, ns *shardmap.Namespace) {
	for name, tc := range ns.Topics {
		tc.Paused = stored != nil && stored.Topics[name].Paused
		ns.Topics[name] = tc
	}
	if stored == nil {
		return
	}
	for name, tc := range stored.Topics {
		if _, ok := ns.Topics[name]; ok || !tc.Paused {
			continue
		}
		if ns.Topics == nil {
			ns.Topics = map[string]shardmap.TopicConfig{}
		}
		ns.Topics[name] = shardmap.TopicConfig{Paused: true}
	}
}

// topicPaused tells whether topic of ns is paused in m.
func topicPaused(m *shardmap.Map, ns, topic string) bool {
	n, err := m.Namespace(ns)
	return err == nil && n.Topics[topic].Paused
}
