package dequeuer

import (
	"context"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/jmoiron/sqlx"

	peerv1 "github.com/triage-queue/triage/proto/triage/peer/v1"
	"github.com/triage-queue/triage/schema/store"
	"github.com/triage-queue/triage/shardmap"
)

// Aging moves items that have been ready longer than a topic's
// aging_threshold up one priority level (priority - 1), and again after
// each further threshold at the new level, down to priority 0: items at 0
// or below are never aged. It is the anti-starvation rule of seeds 000 and
// 002, next to the weighted policy.
//
// Each sweep is bounded: per (shard, topic, level) it reads at most
// agingBatch index entries from a checkpoint in (deliver_after, id) order
// and starts over from the front once it reached the end, so a large
// backlog never causes an unbounded "deliver_after <= now" scan. The
// update is optimistic: it applies only if the row still has the priority
// and deliver_after it was read with, so a lease, ack or escalation in
// between wins.
const agingBatch = 500

type agingCursor struct {
	deliverAfter int64
	id           uint64
}

type aging struct {
	mu      sync.Mutex
	cursors map[agingKey]agingCursor
	lastRun map[[2]string]time.Time
	// topics are the topics of the map topicsOf last saw that age; a
	// sweep runs ten times a second, and a map of 100,000 topic
	// configurations, few of them with a threshold, is not read that
	// often.
	topicsOf *shardmap.Map
	topics   []agingTopic
}

// agingTopic is a topic with an aging threshold.
type agingTopic struct {
	ns, topic string
	threshold time.Duration
}

// agingTopics returns the topics of m with an aging threshold that are not
// paused.
func (a *aging) agingTopics(m *shardmap.Map) []agingTopic {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.topicsOf == m {
		return a.topics
	}
	a.topics = a.topics[:0:0]
	for _, ns := range m.Namespaces {
		for topic, tc := range ns.Topics {
			if th := time.Duration(tc.AgingThreshold); th > 0 && !tc.Paused {
				a.topics = append(a.topics, agingTopic{ns.Name, topic, th})
			}
		}
	}
	a.topicsOf = m
	return a.topics
}

type agingKey struct {
	shard     uint32
	ns, topic string
	level     int32
}

func newAging() *aging {
	return &aging{cursors: map[agingKey]agingCursor{}, lastRun: map[[2]string]time.Time{}}
}

// sweepAging runs the aging pass for every topic that has a threshold, on
// every shard this dequeuer owns, each topic at most every threshold/4.
// A paused topic does not age: nothing of it is served, so nothing
// starves, and a long pause would otherwise promote its whole backlog to
// priority 0 and leave it in enqueue order on the resume.
func (s *Service) sweepAging(ctx context.Context) {
	m := s.cfg.Maps.Current()
	owned := s.owner.owned()
	now := s.cfg.Now()
	for _, t := range s.aging.agingTopics(m) {
		ns, topic, th := t.ns, t.topic, t.threshold
		k := [2]string{ns, topic}
		s.aging.mu.Lock()
		due := now.Sub(s.aging.lastRun[k]) >= th/4
		if due {
			s.aging.lastRun[k] = now
		}
		s.aging.mu.Unlock()
		if !due {
			continue
		}
		for _, shard := range owned {
			db, err := s.cfg.Pool.Writer(s.cfg.Maps, shard)
			if err != nil {
				continue
			}
			// The cutoff compares with rows' stamps: the primary's time.
			at := s.cfg.Clock.Now(ctx, db)
			n, err := s.ageTopic(ctx, db, shard, ns, topic, at.Add(-th), at)
			if err != nil {
				s.log.Warn("aging sweep failed", "shard", shard, "topic", topic, "err", err)
			}
			if n > 0 {
				s.Ready(&peerv1.ItemsReady{Namespace: ns, Topic: topic, Shard: shard, MinPriority: math.MinInt32, Count: int32(n)})
			}
		}
	}
}

// ageTopic promotes items of one topic on one shard and returns how many.
func (s *Service) ageTopic(ctx context.Context, db *sqlx.DB, shard uint32, ns, topic string, cutoff, now time.Time) (int, error) {
	cutoffUS, nowUS := cutoff.UnixMicro(), now.UnixMicro()
	st := store.New(db)
	total := 0
	level := int32(0) // levels above 0 only
	for {
		// Next priority level present: one index seek.
		next, err := st.ItemNextPriority(ctx, store.ItemNextPriorityParams{Namespace: ns, Topic: topic, Above: level})
		if err != nil {
			return total, fmt.Errorf("aging: %w", err)
		}
		if !next.Valid {
			return total, nil
		}
		level = next.Int32
		k := agingKey{shard, ns, topic, level}
		s.aging.mu.Lock()
		cur := s.aging.cursors[k]
		s.aging.mu.Unlock()
		rows, err := st.ItemAgingCandidates(ctx, store.ItemAgingCandidatesParams{Namespace: ns, Topic: topic, Priority: level,
			CutoffUS: cutoffUS, AfterDeliverAfter: cur.deliverAfter, AfterID: cur.id, Limit: agingBatch})
		if err != nil {
			return total, fmt.Errorf("aging: %w", err)
		}
		var ids []uint64
		for _, r := range rows {
			// Waited a threshold at this level too, not just since enqueue.
			if !r.ChangedAt.Valid || r.ChangedAt.Int64 <= cutoffUS {
				ids = append(ids, r.ID)
			}
		}
		s.aging.mu.Lock()
		if len(rows) < agingBatch {
			delete(s.aging.cursors, k) // reached the end: start over next time
		} else {
			last := rows[len(rows)-1]
			s.aging.cursors[k] = agingCursor{last.DeliverAfter, last.ID}
		}
		s.aging.mu.Unlock()
		if len(ids) == 0 {
			continue
		}
		n, err := st.ItemAge(ctx, store.ItemAgeParams{IDs: ids, Priority: level, CutoffUS: cutoffUS, NowUS: nowUS})
		if err != nil {
			return total, fmt.Errorf("aging: %w", err)
		}
		total += int(n)
	}
}
