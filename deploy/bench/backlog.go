package bench

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/triage-queue/triage/schema"
)

// backlog: the same consumer load on a topic with a shallow backlog and on
// one with a deep backlog; dequeue latency must not grow with depth. The
// shallow topic is topped up to its depth between rounds, so every round
// starts with the same number of items waiting.
func (r *runner) backlog(ctx context.Context) (Scenario, error) {
	dbs := r.shardDBs()
	if err := r.fill(ctx, dbs, shallowTopic, r.p.shallowBacklog, r.label(Backlog)); err != nil {
		return Scenario{}, err
	}
	r.settle(ctx, dbs, r.label(Backlog))
	smallReads := statusSum(ctx, dbs, "Innodb_buffer_pool_reads")
	small, err := r.backlogPhase(ctx, shallowTopic, r.p.shallowBacklog)
	smallReads = statusSum(ctx, dbs, "Innodb_buffer_pool_reads") - smallReads
	if err != nil {
		return Scenario{}, fmt.Errorf("%s items waiting: %w", human(float64(r.p.shallowBacklog)), err)
	}
	fmt.Fprintf(r.out, "%s: %s waiting: dequeue p99 %.2f ms\n", r.label(Backlog), human(float64(r.p.shallowBacklog)), small.pct("dequeue", 99))

	fillStart := time.Now()
	if err := r.fill(ctx, dbs, deepTopic, r.p.deepBacklog, r.label(Backlog)); err != nil {
		return Scenario{}, err
	}
	fillSecs := time.Since(fillStart).Seconds()
	r.settle(ctx, dbs, r.label(Backlog))
	r.deepDepth.Add(int64(r.p.deepBacklog))
	deepAt := r.deepDepth.Load()
	tableMB := tableMB(ctx, dbs, "items")
	bigReads := statusSum(ctx, dbs, "Innodb_buffer_pool_reads")
	big, err := r.backlogPhase(ctx, deepTopic, 0)
	bigReads = statusSum(ctx, dbs, "Innodb_buffer_pool_reads") - bigReads
	if err != nil {
		return Scenario{}, fmt.Errorf("%s items waiting: %w", human(float64(deepAt)), err)
	}
	fmt.Fprintf(r.out, "%s: %s waiting: dequeue p99 %.2f ms\n", r.label(Backlog), human(float64(deepAt)), big.pct("dequeue", 99))

	smallP99, bigP99 := small.pct("dequeue", 99), big.pct("dequeue", 99)
	ratio := 0.0
	if smallP99 > 0 {
		ratio = bigP99 / smallP99
	}
	return Scenario{
		ItemsPerSec: big.rate(),
		P50MS:       big.pct("dequeue", 50), P99MS: bigP99, P999MS: big.pct("dequeue", 99.9),
		Latency: fmt.Sprintf("Dequeue RPC (count %d) with %s items waiting", r.p.backlogCount, human(float64(deepAt))),
		Notes: fmt.Sprintf("dequeue p99 %.2f ms with %s waiting vs %.2f ms with %s waiting (%.2fx); p50 %.2f vs %.2f ms; "+
			"each phase measured once InnoDB had flushed the fill's dirty pages (waiting at most %s); "+
			"%d consumers x Dequeue(count %d) + Ack, %d rounds of %s items after a warm-up round; deep backlog filled with raw INSERTs "+
			"at %s rows/s",
			bigP99, human(float64(deepAt)), smallP99, human(float64(r.p.shallowBacklog)), ratio, big.pct("dequeue", 50), small.pct("dequeue", 50), r.p.settleWait,
			r.p.backlogConsumers, r.p.backlogCount, r.p.backlogRounds, human(float64(r.p.backlogRoundItems)),
			human(float64(r.p.deepBacklog)/fillSecs)) +
			fmt.Sprintf("; with the deep backlog the items table is %.0f MB per shard (buffer pool %s MB); InnoDB read %.0f pages from disk "+
				"while serving the deep backlog and %.0f while serving the shallow one; ratios n/a: a latency test at a light fixed load",
				tableMB/float64(len(dbs)), r.bufferPoolMB(), bigReads, smallReads) +
			errSuffix(big) + errSuffix(small),
		Metrics: map[string]float64{
			"deep_items": float64(deepAt), "shallow_items": float64(r.p.shallowBacklog),
			"deep_dequeue_p99_ms": bigP99, "shallow_dequeue_p99_ms": smallP99, "p99_ratio": ratio,
			"shallow_items_per_sec": small.rate(), "deep_disk_page_reads": bigReads, "shallow_disk_page_reads": smallReads,
			"items_table_mb_per_shard": tableMB / float64(len(dbs)),
		},
	}, nil
}

// backlogPhase runs a warm-up round and then the configured rounds of
// consuming backlogRoundItems from topic, returning the recorded rounds'
// samples with the window set to their total consuming time. With refill
// > 0 the topic is topped up by what the previous round consumed.
func (r *runner) backlogPhase(ctx context.Context, topic string, refill int) (*sampler, error) {
	var recorded []*sampler
	var busy time.Duration
	for round := 0; round <= r.p.backlogRounds; round++ {
		ss, took, n, err := r.consumeN(ctx, topic, r.p.backlogRoundItems)
		if topic == deepTopic {
			r.deepDepth.Add(-int64(n))
		}
		if err != nil {
			return nil, err
		}
		if round > 0 {
			recorded = append(recorded, ss...)
			busy += took
		}
		if refill > 0 && n > 0 {
			if err := r.fill(ctx, r.shardDBs(), topic, n, ""); err != nil {
				return nil, err
			}
		}
	}
	t0 := time.Unix(0, 0)
	return merge(window{from: t0, to: t0.Add(busy)}, recorded), nil
}

// consumeN has backlogConsumers consumers dequeue and ack exactly n items
// of topic (fewer if the topic runs dry for a second), and returns their
// samples, the time it took and the items acked.
func (r *runner) consumeN(ctx context.Context, topic string, n int) ([]*sampler, time.Duration, int, error) {
	start := time.Now()
	all := window{from: start, to: start.Add(24 * time.Hour)}
	var left, acked atomic.Int64
	left.Store(int64(n))
	ss := make([]*sampler, r.p.backlogConsumers)
	var wg sync.WaitGroup
	for i := range ss {
		ss[i] = newSampler(all)
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := ss[i]
			dryUntil := time.Time{}
			for ctx.Err() == nil {
				want := min(int64(r.p.backlogCount), left.Add(-int64(r.p.backlogCount))+int64(r.p.backlogCount))
				if want <= 0 {
					return
				}
				got, err := r.dequeueAck(ctx, r.client(i), topic, int(want), 0, s)
				if err != nil {
					s.fail(err)
				}
				acked.Add(int64(got))
				s.done(time.Now(), got)
				if rest := want - int64(got); rest > 0 {
					left.Add(rest)
				}
				if got == 0 {
					if dryUntil.IsZero() {
						dryUntil = time.Now().Add(time.Second)
					} else if time.Now().After(dryUntil) {
						return
					}
					schema.Sleep(ctx, time.Millisecond)
				} else {
					dryUntil = time.Time{}
				}
			}
		}()
	}
	wg.Wait()
	took := time.Since(start)
	var err error
	if a := acked.Load(); a == 0 {
		err = fmt.Errorf("no item acked from %s", topic)
		for _, s := range ss {
			if s.err != nil {
				err = fmt.Errorf("%w: %v", err, s.err)
				break
			}
		}
	}
	return ss, took, int(acked.Load()), err
}

// statusSum adds up a numeric global status variable over dbs.
func statusSum(ctx context.Context, dbs []*sql.DB, name string) float64 {
	sum := 0.0
	for _, db := range dbs {
		var k string
		var v float64
		if db.QueryRowContext(ctx, "SHOW GLOBAL STATUS LIKE ?", name).Scan(&k, &v) == nil {
			sum += v
		}
	}
	return sum
}

// tableMB adds up the data and index size of table in the current
// database of dbs, from InnoDB's statistics (estimates). table must be a
// plain identifier.
func tableMB(ctx context.Context, dbs []*sql.DB, table string) float64 {
	sum := 0.0
	for _, db := range dbs {
		// Statistics lag a bulk fill until they are recomputed (sampled, so
		// cheap).
		_, _ = db.ExecContext(ctx, "ANALYZE TABLE "+table)
		var n sql.NullFloat64
		if db.QueryRowContext(ctx, "SELECT data_length + index_length FROM information_schema.TABLES WHERE table_schema = DATABASE() AND table_name = ?",
			table).Scan(&n) == nil {
			sum += n.Float64
		}
	}
	return sum / (1 << 20)
}

// bufferPoolMB is innodb_buffer_pool_size of the first shard in MB.
func (r *runner) bufferPoolMB() string {
	var k, v string
	if r.shardDB[r.shardIDs[0]].QueryRow("SHOW GLOBAL VARIABLES LIKE 'innodb_buffer_pool_size'").Scan(&k, &v) != nil {
		return "?"
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return v
	}
	return strconv.FormatInt(n>>20, 10)
}
