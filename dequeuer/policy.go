package dequeuer

import (
	"context"
	"math"
	"sync"

	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
	"github.com/triage-queue/triage/shardmap"
)

// takeTopic takes up to tc.Count items of one topic by the topic's policy:
// strict (one band, all priorities, or the request's min/max priority) or
// weighted (bands served by smooth weighted round robin, skipping bands
// with nothing ready). It returns the buffers involved, for long polls.
func (s *Service) takeTopic(ctx context.Context, m *shardmap.Map, req *triagev1.DequeueRequest, tc *triagev1.TopicCount, shards []uint32) ([]bufItem, []*topicBuf, error) {
	b := allPriorities
	if req.MinPriority != nil {
		b.lo = *req.MinPriority
	}
	if req.MaxPriority != nil {
		b.hi = *req.MaxPriority
	}
	var cfg shardmap.TopicConfig
	if ns, err := m.Namespace(req.Namespace); err == nil {
		cfg = ns.Topic(tc.Topic)
	}
	if cfg.Policy != shardmap.PolicyWeighted || req.MinPriority != nil || req.MaxPriority != nil {
		buf := s.buf(bufKey{req.Namespace, tc.Topic, b})
		items, err := s.take(ctx, buf, shards, int(tc.Count))
		return items, []*topicBuf{buf}, err
	}
	bands := weightedBands(len(cfg.BandWeights))
	bufs := make([]*topicBuf, len(bands))
	for i, bd := range bands {
		bufs[i] = s.buf(bufKey{req.Namespace, tc.Topic, bd})
	}
	w := s.wrrFor(req.Namespace, tc.Topic, cfg.BandWeights)
	empty := make([]bool, len(bands))
	var out []bufItem
	var firstErr error
	for len(out) < int(tc.Count) {
		i := w.next(empty)
		if i < 0 {
			break
		}
		got, err := s.take(ctx, bufs[i], shards, 1)
		if err != nil && firstErr == nil {
			firstErr = err
		}
		if len(got) == 0 {
			empty[i] = true
			w.undo(i)
			continue
		}
		out = append(out, got...)
	}
	if len(out) > 0 {
		firstErr = nil
	}
	return out, bufs, firstErr
}

// paused tells whether PauseTopic holds topic of namespace ns in m
// (shardmap.TopicConfig.Paused). A dequeue serves nothing of a paused
// topic and takes nothing from its buffers; a long poll waiting on it
// reads the map again every round (recheckEvery), so it is served once
// this dequeuer's map has the resume.
func paused(m *shardmap.Map, ns, topic string) bool {
	n, err := m.Namespace(ns)
	return err == nil && n.Topics[topic].Paused
}

// weightedBands returns n bands: priorities up to 0, then 1, 2, ... and
// the last band from n-1 up.
func weightedBands(n int) []band {
	out := make([]band, n)
	for i := range out {
		out[i] = band{int32(i), int32(i)}
	}
	out[0].lo = math.MinInt32
	out[n-1].hi = math.MaxInt32
	return out
}

// wrr is smooth weighted round robin (as nginx does it): every pick adds
// each band's weight to its credit and picks the band with the most
// credit, which then pays the total. Over any window the picks follow the
// weights closely, without bursts.
type wrr struct {
	mu      sync.Mutex
	weights []float64
	credit  []float64
}

func (s *Service) wrrFor(ns, topic string, weights []float64) *wrr {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := [2]string{ns, topic}
	w := s.wrr[k]
	if w == nil || len(w.weights) != len(weights) {
		w = &wrr{weights: weights, credit: make([]float64, len(weights))}
		s.wrr[k] = w
	}
	return w
}

// next picks a band among those not skipped, or -1.
func (w *wrr) next(skip []bool) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	total, best := 0.0, -1
	for i, wt := range w.weights {
		if skip[i] {
			continue
		}
		w.credit[i] += wt
		total += wt
		if best < 0 || w.credit[i] > w.credit[best] {
			best = i
		}
	}
	if best >= 0 {
		w.credit[best] -= total
	}
	return best
}

// undo gives back a pick that found its band empty, so empty bands do not
// bank credit against the others.
func (w *wrr) undo(i int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.credit[i] = 0
}
