package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/triage-queue/triage/deploy/postgres"
)

// River's peer rows: the job queue a Go user would pick instead of Triage,
// on a private Postgres in the same run as the rest (doc.go, Scenarios).
const (
	RiverInsertMany = "river-insert-many"
	RiverSteady     = "river-steady"
	RiverBacklog    = "river-backlog"
)

var riverNames = []string{RiverInsertMany, RiverSteady, RiverBacklog}

const (
	// riverFetchCooldown is the least time between a River client's fetches
	// and between its insert notifications. With River's default, 100 ms,
	// a job can wait up to 100 ms for the next fetch; a user after latency
	// lowers it, and at 10 ms one fetch still takes a batch of jobs.
	riverFetchCooldown = 10 * time.Millisecond
	// riverInsertConns is the inserting client's pool: 64 producers never
	// wait for a connection, 512 queue for one, as they would in an
	// application (a connection per producer would be 512 backends on two
	// cores).
	riverInsertConns = 64
	// riverWorkConns is the working client's pool, apart from the
	// inserters' so that queued producers cannot starve its fetches and
	// completions.
	riverWorkConns = 16
	// riverFillBatch is the InsertMany size that fills river-backlog.
	riverFillBatch = 1000
)

// riverArgs is a bench job: the 128-byte payload Triage's items carry,
// and the time its Insert was sent, in nanoseconds since the trial's
// epoch, for end-to-end latency.
type riverArgs struct {
	Payload string `json:"payload"`
	Sent    int64  `json:"sent"`
}

func (riverArgs) Kind() string { return "triage_bench" }

// riverPriority spreads jobs over River's priorities (1, most urgent, to
// 4) as Triage's rows spread items over 0-9.
func riverPriority(i int) int { return 1 + i%4 }

// riverWorker counts each job as it starts into the sink the running
// scenario set, and does nothing else: the rows measure the queue, not
// the work.
type riverWorker struct {
	river.WorkerDefaults[riverArgs]
	sink atomic.Pointer[riverSink]
}

func (w *riverWorker) Work(_ context.Context, job *river.Job[riverArgs]) error {
	if s := w.sink.Load(); s != nil {
		s.worked(job.Args.Sent)
	}
	return nil
}

// riverSink collects what River's worker goroutines observe: jobs worked,
// end-to-end latency (Insert sent to Work start) inside a window, and the
// last start. River runs Work on goroutines of its own, so a lock guards
// it instead of a sampler per worker.
type riverSink struct {
	epoch time.Time
	prog  *progress // nil: no progress lines
	all   atomic.Int64

	mu   sync.Mutex
	s    *sampler
	last time.Time
}

func newRiverSink(epoch time.Time, w window, prog *progress) *riverSink {
	return &riverSink{epoch: epoch, prog: prog, s: newSampler(w)}
}

func (k *riverSink) worked(sent int64) {
	now := time.Now()
	d := time.Since(k.epoch) - time.Duration(sent)
	k.all.Add(1)
	if k.prog != nil {
		k.prog.items.Add(1)
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	k.s.observe("e2e", now, d)
	k.s.done(now, 1)
	k.last = now
}

// result returns the samples so far, sorted.
func (k *riverSink) result() *sampler {
	k.mu.Lock()
	defer k.mu.Unlock()
	return merge(k.s.w, []*sampler{k.s})
}

// riverPeer is River on its Postgres: an insert-only client, and the
// workers that working clients, started per measurement, run.
type riverPeer struct {
	pg                   *postgres.Server
	dir                  string
	insertPool, workPool *pgxpool.Pool
	inserter             *river.Client[pgx.Tx]
	workers              *river.Workers
	worker               *riverWorker
	payload              string
	logger               *slog.Logger
	facts                PostgresFacts
}

// startRiver installs Postgres when it is missing (an error wrapping
// postgres.ErrNotInstalled when it cannot be), starts a private server,
// runs River's migrations and makes the inserting client.
func startRiver(ctx context.Context, logger *slog.Logger, payload []byte) (p *riverPeer, err error) {
	if err := postgres.EnsureInstalled(ctx, logger); err != nil {
		return nil, err
	}
	p = &riverPeer{payload: string(payload), logger: logger, worker: &riverWorker{}}
	defer func() {
		if err != nil {
			p.close()
		}
	}()
	if p.dir, err = os.MkdirTemp("", "triage-bench-pg-"); err != nil {
		return nil, err
	}
	if p.pg, err = postgres.Start(ctx, postgres.Config{Dir: p.dir, Logger: logger}); err != nil {
		return nil, err
	}
	if p.insertPool, err = riverPool(ctx, p.pg.DSN("postgres"), riverInsertConns); err != nil {
		return nil, err
	}
	if p.workPool, err = riverPool(ctx, p.pg.DSN("postgres"), riverWorkConns); err != nil {
		return nil, err
	}
	migrator, err := rivermigrate.New(riverpgxv5.New(p.workPool), &rivermigrate.Config{Logger: logger})
	if err != nil {
		return nil, err
	}
	if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return nil, fmt.Errorf("river migrations: %w", err)
	}
	p.workers = river.NewWorkers()
	river.AddWorker(p.workers, p.worker)
	if p.inserter, err = river.NewClient(riverpgxv5.New(p.insertPool), &river.Config{Workers: p.workers, Logger: logger}); err != nil {
		return nil, err
	}
	if p.facts, err = postgresFacts(ctx, p.workPool); err != nil {
		return nil, err
	}
	return p, nil
}

func riverPool(ctx context.Context, dsn string, conns int32) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = conns
	return pgxpool.NewWithConfig(ctx, cfg)
}

// close stops the server and removes its directory.
func (p *riverPeer) close() {
	for _, pool := range []*pgxpool.Pool{p.insertPool, p.workPool} {
		if pool != nil {
			pool.Close()
		}
	}
	if p.pg != nil {
		if err := p.pg.Stop(); err != nil {
			p.logger.Warn("bench: stop postgres", "err", err)
		}
	}
	if p.dir != "" {
		_ = os.RemoveAll(p.dir)
	}
}

// PostgresFacts describes the Postgres and River the peer rows ran on.
type PostgresFacts struct {
	Version string `json:"version"`
	// RiverVersion is River's module version, "" where the binary does
	// not record it (a test binary).
	RiverVersion string `json:"river_version"`
	// Settings are the server's settings that decide what a commit costs
	// and guarantees, and its memory sizes, read from the server.
	Settings map[string]string `json:"settings"`
}

var postgresSettings = []string{"fsync", "synchronous_commit", "full_page_writes", "wal_sync_method", "wal_level",
	"commit_delay", "shared_buffers", "max_connections", "max_wal_size", "checkpoint_timeout"}

func postgresFacts(ctx context.Context, pool *pgxpool.Pool) (PostgresFacts, error) {
	f := PostgresFacts{RiverVersion: moduleVersion("github.com/riverqueue/river"), Settings: map[string]string{}}
	if err := pool.QueryRow(ctx, "SHOW server_version").Scan(&f.Version); err != nil {
		return f, err
	}
	for _, name := range postgresSettings {
		var v string
		if err := pool.QueryRow(ctx, "SELECT current_setting($1)", name).Scan(&v); err != nil {
			return f, err
		}
		f.Settings[name] = v
	}
	return f, nil
}

// moduleVersion is the version of module path linked into this binary,
// or "" where the binary does not record its modules' versions.
func moduleVersion(path string) string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			if d.Path == path {
				return d.Version
			}
		}
	}
	return ""
}

// river names River with its version when known: "River v0.51.2".
func (f PostgresFacts) river() string { return strings.TrimSpace("River " + f.RiverVersion) }

// truncate empties River's job table, so that a measurement starts from
// no jobs as Triage's start from empty items tables.
func (p *riverPeer) truncate(ctx context.Context) error {
	_, err := p.workPool.Exec(ctx, "TRUNCATE river_job")
	return err
}

// startWorking starts a client that works the default queue with workers
// goroutines. Its goroutines carry no load label: River's client is the
// system under test, as the bed's node is.
func (p *riverPeer) startWorking(ctx context.Context, workers int) (*river.Client[pgx.Tx], error) {
	c, err := river.NewClient(riverpgxv5.New(p.workPool), &river.Config{
		Queues:        map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: workers}},
		Workers:       p.workers,
		FetchCooldown: riverFetchCooldown,
		Logger:        p.logger,
	})
	if err != nil {
		return nil, err
	}
	withoutLoadLabel(ctx, func() { err = c.Start(ctx) })
	return c, err
}

// stopWorking stops c gracefully: jobs it fetched are worked and their
// completions written.
func stopWorking(c *river.Client[pgx.Tx]) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.Stop(ctx); err != nil {
		return errors.Join(err, c.StopAndCancel(context.Background()))
	}
	return nil
}

// riverWorkers is the working client's MaxWorkers: as many jobs in hand
// as Triage's steady and mixed consumers hold (16 consumers x count 10).
func (r *runner) riverWorkers() int { return r.p.mixedConsumers * r.p.mixedCount }

// runRiver runs the River rows on a private Postgres started for them and
// stopped after them. The one-region bed is already stopped, so River
// gets the box to itself as each bed does. Rows that cannot run say why:
// skipped when Postgres cannot be installed, failed when it would not
// start.
func (r *runner) runRiver(ctx context.Context, rep *Report) {
	if !slices.ContainsFunc(riverNames, r.selected) {
		for _, name := range riverNames {
			r.scenario(ctx, name, nil) // reported as not selected
		}
		return
	}
	fmt.Fprintf(r.out, "starting Postgres for River...\n")
	p, err := startRiver(ctx, r.cfg.Logger, r.payload)
	if err != nil {
		for _, name := range riverNames {
			r.unavailable(name, err)
		}
		return
	}
	defer p.close()
	r.riv = p
	rep.PostgresPIDs = append(rep.PostgresPIDs, p.pg.PID())
	rep.Machine.Postgres = &p.facts
	fmt.Fprintf(r.out, "Postgres %s up (fsync=%s, synchronous_commit=%s) for %s\n",
		p.facts.Version, p.facts.Settings["fsync"], p.facts.Settings["synchronous_commit"], p.facts.river())
	r.riverScenario(ctx, RiverInsertMany, r.riverInsertMany)
	r.riverScenario(ctx, RiverSteady, r.riverSteady)
	r.riverScenario(ctx, RiverBacklog, r.riverBacklog)
}

func (r *runner) selected(name string) bool {
	return len(r.cfg.Only) == 0 || slices.Contains(r.cfg.Only, name)
}

// unavailable reports a River row that could not run because Postgres
// could not be had: skipped when it cannot be installed, failed otherwise.
func (r *runner) unavailable(name string, err error) {
	if !r.selected(name) {
		r.scenario(context.Background(), name, nil)
		return
	}
	r.step++
	s := Scenario{Name: name, Error: err.Error(), Notes: "Postgres did not start"}
	line := "FAILED: " + s.Notes + ": " + s.Error
	if errors.Is(err, postgres.ErrNotInstalled) {
		s = Scenario{Name: name, Skipped: true, Notes: "skipped: Postgres cannot be installed: " + err.Error()}
		line = s.Notes
	}
	fmt.Fprintf(r.out, "[%d/%d] %s: %s\n", r.step, len(Names), name, line)
	r.results[name] = s
}

// riverScenario runs a River row as scenario does, with the CPU split
// taken over the Postgres processes instead of the bed's mariadbd.
func (r *runner) riverScenario(ctx context.Context, name string, fn func(context.Context) (Scenario, error)) {
	r.scenario(ctx, name, func(ctx context.Context) (Scenario, error) {
		before, beforePG := takeCPU(nil), takeTreeCPU(r.riv.pg.PIDs())
		s, err := fn(ctx)
		after := takeCPU(nil)
		after.mariadbd = takeTreeCPU(r.riv.pg.PIDs()).since(beforePG)
		use := cpuSince(before, after, runtime.NumCPU())
		use.server, use.process = "postgres", "River clients, load generators"
		if s.Metrics == nil {
			s.Metrics = map[string]float64{}
		}
		use.metrics(s.Metrics)
		s.Notes += "; " + use.note(runtime.NumCPU()) + " (whole scenario, set-up included)"
		s.cpuDone = true
		return s, err
	})
}

// treeCPU is the CPU time of each of a server's processes: Postgres runs a
// process per connection, which come and go.
type treeCPU map[int]time.Duration

func takeTreeCPU(pids []int) treeCPU {
	t := treeCPU{}
	for _, pid := range pids {
		t[pid] = procCPU(pid)
	}
	return t
}

// since is the CPU the processes of t used after those of earlier: a
// process started since counts whole, one that exited since is lost.
func (t treeCPU) since(earlier treeCPU) time.Duration {
	var d time.Duration
	for pid, v := range t {
		d += max(0, v-earlier[pid])
	}
	return d
}
