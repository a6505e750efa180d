package store

import (
	"context"
	"fmt"
	"time"
)

// depthSQL counts every (namespace, topic, priority band) of the shard's
// items by state, with the oldest ready time, for the metrics collector.
// It reads the whole table (it is a GROUP BY over every row, no index can
// narrow it), so callers run it on a timer or a throttled scrape, and
// max_statement_time bounds it (a number Sprintf'd in: SET STATEMENT takes
// no placeholder): a shard with a backlog too big to count
// in time reports an error instead of holding a connection. Bands follow
// the weighted policy's: priorities up to 0, 1, 2, 3, and 4 and up.
// Prefetched rows count as ready, with their ready_since, as in TopicStats.
const depthSQL = `SET STATEMENT max_statement_time = %g FOR
SELECT namespace, topic, LEAST(GREATEST(priority, 0), 4) AS band,
	COALESCE(SUM(deliver_after <= ? OR (lease_token <> 0 AND leased_until IS NULL)), 0) AS ready,
	COALESCE(SUM(lease_token <> 0 AND COALESCE(leased_until > ?, FALSE)), 0) AS leased,
	COUNT(*) AS total,
	COALESCE(MIN(` + readySinceSQL + `), 0) AS oldest
FROM items GROUP BY namespace, topic, band`

// deadDepthSQL counts dead letters per topic, under the same bound.
const deadDepthSQL = `SET STATEMENT max_statement_time = %g FOR
SELECT namespace, topic, COUNT(*) AS n FROM dead_letters GROUP BY namespace, topic`

// BandDepth is one (namespace, topic, band)'s item counts on a shard.
type BandDepth struct {
	Namespace string `db:"namespace"`
	Topic     string `db:"topic"`
	// Band is 0..4: priorities up to 0, 1, 2, 3, 4 and up.
	Band   int   `db:"band"`
	Ready  int64 `db:"ready"`
	Leased int64 `db:"leased"`
	Total  int64 `db:"total"`
	// Oldest is when (µs) the oldest ready item became ready: its
	// deliver_after, or its ready_since if a dequeuer prefetched it; 0:
	// none.
	Oldest int64 `db:"oldest"`
}

// Delayed is what is neither ready nor leased: a future deliver_after.
func (d BandDepth) Delayed() int64 { return max(d.Total-d.Ready-d.Leased, 0) }

// TopicDead is a topic's dead-letter count on a shard.
type TopicDead struct {
	Namespace string `db:"namespace"`
	Topic     string `db:"topic"`
	N         int64  `db:"n"`
}

// ItemDepthParams: see ItemDepth.
type ItemDepthParams struct {
	NowUS int64
	// Budget bounds each statement (max_statement_time). Default 2s.
	Budget time.Duration
}

// ItemDepth counts the shard's items per namespace, topic and priority
// band, and its dead letters per topic. Its cost grows with the shard's
// row count (see depthSQL).
func (s Store) ItemDepth(ctx context.Context, p ItemDepthParams) ([]BandDepth, []TopicDead, error) {
	budget := p.Budget
	if budget <= 0 {
		budget = 2 * time.Second
	}
	var rows []BandDepth
	if err := s.db.SelectContext(ctx, &rows, fmt.Sprintf(depthSQL, budget.Seconds()), p.NowUS, p.NowUS, p.NowUS); err != nil {
		return nil, nil, err
	}
	var dead []TopicDead
	if err := s.db.SelectContext(ctx, &dead, fmt.Sprintf(deadDepthSQL, budget.Seconds())); err != nil {
		return nil, nil, err
	}
	return rows, dead, nil
}
