package bench

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/riverqueue/river"
)

// riverBatch is river-insert-many's InsertMany size, triage-enqueue-
// batch100's batch.
const riverBatch = 100

// insertMany inserts n jobs in one InsertMany (one transaction), their
// priorities spread from seed.
func (p *riverPeer) insertMany(ctx context.Context, seed, n int) (int, error) {
	params := make([]river.InsertManyParams, n)
	for j := range params {
		params[j] = river.InsertManyParams{Args: riverArgs{Payload: p.payload},
			InsertOpts: &river.InsertOpts{Priority: riverPriority(seed + j)}}
	}
	if _, err := p.inserter.InsertMany(ctx, params); err != nil {
		return 0, err
	}
	return n, nil
}

// riverSetup describes River's configuration for a row's notes.
func (r *runner) riverSetup() string {
	p := r.riv
	return fmt.Sprintf("%s on Postgres %s (fsync=%s, synchronous_commit=%s)", p.facts.river(), p.facts.Version,
		p.facts.Settings["fsync"], p.facts.Settings["synchronous_commit"])
}

// riverInsertMany: closed-loop InsertMany of 100 jobs from a few
// goroutines, River's bulk insert, beside triage-enqueue-batch100.
func (r *runner) riverInsertMany(ctx context.Context) (Scenario, error) {
	p := r.riv
	if err := p.truncate(ctx); err != nil {
		return Scenario{}, err
	}
	prog := r.progress(RiverInsertMany)
	s := runLoad(ctx, loadSpec{workers: r.p.riverInsertClients, warmup: r.p.warmup, measure: r.p.measure,
		op: func(ctx context.Context, w int, _ *sampler) (int, error) { return p.insertMany(ctx, w, riverBatch) }}, prog)
	prog.close()
	if s.items == 0 {
		return Scenario{}, fmt.Errorf("no job inserted%s", errSuffix(s))
	}
	return Scenario{
		ItemsPerSec: s.rate(),
		P50MS:       s.pct("op", 50), P99MS: s.pct("op", 99), P999MS: s.pct("op", 99.9),
		Latency: fmt.Sprintf("InsertMany call (%d jobs)", riverBatch),
		Notes: fmt.Sprintf("%s; closed loop, %d goroutines x InsertMany of %d jobs (128-byte payload, priorities 1-4), "+
			"a transaction each, from an empty job table%s", r.riverSetup(), r.p.riverInsertClients, riverBatch, errSuffix(s)),
		Metrics: map[string]float64{"goroutines": float64(r.p.riverInsertClients)},
	}, nil
}

// riverSteady mirrors triage-steady: per producer count, single-job
// Inserts back to back (each its own transaction) while a working client
// works the jobs, from an empty job table; end-to-end latency runs from
// the Insert sent to Work starting. Its figures are the trial that kept
// up least, as triage-steady's are.
func (r *runner) riverSteady(ctx context.Context) (Scenario, error) {
	var trials []steadyTrial
	for _, producers := range r.p.steadyProducers {
		t, err := r.riverSteadyTrial(ctx, producers)
		if err != nil {
			return Scenario{}, err
		}
		trials = append(trials, t)
	}
	worst := trials[0]
	var parts []string
	m := map[string]float64{"max_workers": float64(r.riverWorkers())}
	for _, t := range trials {
		parts = append(parts, fmt.Sprintf("%d producers: inserted %s/s, worked %s/s (%.2fx), backlog at the end %d, "+
			"end-to-end p50 %.1f ms p99 %.1f ms; Insert p50 %.1f ms p99 %.1f ms%s",
			t.producers, human(t.enq.rate()), human(t.deq.rate()), t.keepUp(), t.backlog, t.deq.pct("e2e", 50), t.deq.pct("e2e", 99),
			t.enq.pct("enqueue", 50), t.enq.pct("enqueue", 99), errNotes(t.enq)))
		if t.keepUp() < worst.keepUp() {
			worst = t
		}
		pre := fmt.Sprintf("p%d_", t.producers)
		m[pre+"inserted_per_sec"] = t.enq.rate()
		m[pre+"worked_per_sec"] = t.deq.rate()
		m[pre+"backlog_jobs"] = float64(t.backlog)
		m[pre+"e2e_p50_ms"] = t.deq.pct("e2e", 50)
		m[pre+"e2e_p99_ms"] = t.deq.pct("e2e", 99)
	}
	m["keep_up_ratio"] = worst.keepUp()
	m["inserted_per_sec"] = worst.enq.rate()
	if t, ok := sustained(trials); ok {
		m["sustained_worked_per_sec"] = t.deq.rate()
		m["sustained_producers"] = float64(t.producers)
	}
	return Scenario{
		ItemsPerSec: worst.deq.rate(),
		P50MS:       worst.deq.pct("e2e", 50), P99MS: worst.deq.pct("e2e", 99), P999MS: worst.deq.pct("e2e", 99.9),
		Latency: fmt.Sprintf("end to end, Insert sent to Work start (%d producers)", worst.producers),
		Notes: fmt.Sprintf("%s; closed loop, single-job Insert producers (a transaction each, pool of %d connections) beside a client "+
			"working the queue (MaxWorkers %d, FetchCooldown %s, pool of %d); kept up when worked >= %.2fx inserted; %s",
			r.riverSetup(), riverInsertConns, r.riverWorkers(), riverFetchCooldown, riverWorkConns, keptUp, strings.Join(parts, "; ")),
		Metrics: m,
	}, nil
}

// riverSteadyTrial runs one producer count of river-steady: enq holds the
// Inserts, deq the jobs whose Work started inside the window.
func (r *runner) riverSteadyTrial(ctx context.Context, producers int) (steadyTrial, error) {
	p := r.riv
	t := steadyTrial{producers: producers}
	if err := p.truncate(ctx); err != nil {
		return t, err
	}
	prog := r.progress(fmt.Sprintf("%s (%d producers, worked)", RiverSteady, producers))
	defer prog.close()
	start := time.Now()
	sink := newRiverSink(start, window{from: start.Add(r.p.warmup), to: start.Add(r.p.warmup + r.p.steadyMeasure)}, prog)
	p.worker.sink.Store(sink)
	defer p.worker.sink.Store(nil)
	c, err := p.startWorking(ctx, r.riverWorkers())
	if err != nil {
		return t, err
	}
	var inserted atomic.Int64
	t.enq = runLoad(ctx, loadSpec{workers: producers, warmup: r.p.warmup, measure: r.p.steadyMeasure,
		op: func(ctx context.Context, w int, s *sampler) (int, error) {
			args := riverArgs{Payload: p.payload, Sent: int64(time.Since(start))}
			t0 := time.Now()
			if _, err := p.inserter.Insert(ctx, args, &river.InsertOpts{Priority: riverPriority(w)}); err != nil {
				return 0, err
			}
			end := time.Now()
			s.observe("enqueue", end, end.Sub(t0))
			inserted.Add(1)
			return 1, nil
		}}, nil)
	t.deq = sink.result()
	t.enqAll, t.deqAll = inserted.Load(), sink.all.Load()
	t.backlog = t.enqAll - t.deqAll
	if err := stopWorking(c); err != nil {
		return t, fmt.Errorf("%d producers: stop River's client: %w", producers, err)
	}
	if ctx.Err() != nil {
		return t, ctx.Err()
	}
	if t.enq.items == 0 || t.deq.items == 0 {
		return t, fmt.Errorf("%d producers: inserted %d, worked %d jobs%s", producers, t.enq.items, t.deq.items, errNotes(t.enq))
	}
	return t, nil
}

// riverBacklog works off a backlog filled with InsertMany first: jobs/s
// from the working client's start to the last job's Work start. Beside
// triage-backlog and triage-dequeue-ack, which consume a backlog too.
func (r *runner) riverBacklog(ctx context.Context) (Scenario, error) {
	p, n := r.riv, r.p.riverBacklog
	if err := p.truncate(ctx); err != nil {
		return Scenario{}, err
	}
	fillStart := time.Now()
	if err := p.fill(ctx, n); err != nil {
		return Scenario{}, fmt.Errorf("fill: %w", err)
	}
	fillSecs := time.Since(fillStart).Seconds()
	// The fill's dirty pages are written out first, as InnoDB's are
	// before triage-backlog measures (settle).
	if _, err := p.workPool.Exec(ctx, "CHECKPOINT"); err != nil {
		return Scenario{}, err
	}
	prog := r.progress(RiverBacklog + " (worked)")
	start := time.Now()
	sink := newRiverSink(start, window{from: start, to: start.Add(24 * time.Hour)}, prog)
	p.worker.sink.Store(sink)
	defer p.worker.sink.Store(nil)
	c, err := p.startWorking(ctx, r.riverWorkers())
	if err != nil {
		prog.close()
		return Scenario{}, err
	}
	waitWorked(ctx, sink, int64(n))
	prog.close()
	worked := sink.result()
	took := sink.lastStart().Sub(start)
	stopErr := stopWorking(c)
	stopped := time.Since(start)
	if stopErr != nil {
		return Scenario{}, fmt.Errorf("stop River's client: %w", stopErr)
	}
	if worked.items < int64(n) {
		return Scenario{}, fmt.Errorf("worked %d of %d jobs", worked.items, n)
	}
	var completed int64
	if err := p.workPool.QueryRow(ctx, "SELECT count(*) FROM river_job WHERE state = 'completed'").Scan(&completed); err != nil {
		return Scenario{}, err
	}
	rate := float64(n) / took.Seconds()
	return Scenario{
		ItemsPerSec: rate,
		Latency:     "none: River has no dequeue call to time",
		Notes: fmt.Sprintf("%s; %s jobs inserted first (InsertMany of %d, at %s jobs/s), then a client working the queue "+
			"(MaxWorkers %d, FetchCooldown %s) started: %s jobs/s from its start to the last job's Work start (%.2f s); "+
			"%d jobs completed when the client had stopped, %.2f s after its start (completions are batched)",
			r.riverSetup(), human(float64(n)), riverFillBatch, human(float64(n)/fillSecs), r.riverWorkers(), riverFetchCooldown,
			human(rate), took.Seconds(), completed, stopped.Seconds()),
		Metrics: map[string]float64{"backlog_jobs": float64(n), "completed_jobs": float64(completed),
			"fill_jobs_per_sec": float64(n) / fillSecs, "seconds_to_stopped": stopped.Seconds()},
	}, nil
}

// lastStart is when the sink's last job started.
func (k *riverSink) lastStart() time.Time {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.last
}

// waitWorked waits until n jobs have started, or none has for 10 s, or ctx
// ends.
func waitWorked(ctx context.Context, sink *riverSink, n int64) {
	seen, at := int64(-1), time.Now()
	for ctx.Err() == nil {
		got := sink.all.Load()
		if got >= n {
			return
		}
		if got != seen {
			seen, at = got, time.Now()
		} else if time.Since(at) > 10*time.Second {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// fill inserts n jobs with InsertMany batches from four goroutines.
func (p *riverPeer) fill(ctx context.Context, n int) error {
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for g := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for errs[g] == nil && ctx.Err() == nil {
				from := int(next.Add(riverFillBatch)) - riverFillBatch
				if from >= n {
					return
				}
				_, errs[g] = p.insertMany(ctx, from, min(riverFillBatch, n-from))
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return ctx.Err()
}
