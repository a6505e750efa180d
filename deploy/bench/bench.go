package bench

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"runtime/trace"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/triage-queue/triage/deploy/bed"
	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
	"github.com/triage-queue/triage/routing"
	"github.com/triage-queue/triage/schema/itemid"
	"github.com/triage-queue/triage/shardmap"
)

// Scenario names, in report order.
const (
	CeilingInsert   = "ceiling-insert"
	CeilingLeaseAck = "ceiling-lease-ack"
	NaiveEnqueue    = "naive-enqueue"
	NaiveDequeueAck = "naive-dequeue-ack"
	EnqueueBatch1   = "triage-enqueue-batch1"
	EnqueueBatch100 = "triage-enqueue-batch100"
	EnqueueJSON     = "triage-enqueue-json"
	DequeueAck      = "triage-dequeue-ack"
	Mixed           = "triage-mixed"
	Steady          = "triage-steady"
	Backlog         = "triage-backlog"
	Enqueue3Region  = "triage-enqueue-3region"
)

// Names lists every scenario in report order: River's peer rows last.
var Names = []string{CeilingInsert, CeilingLeaseAck, NaiveEnqueue, NaiveDequeueAck, EnqueueBatch1, EnqueueBatch100,
	EnqueueJSON, DequeueAck, Steady, Mixed, Backlog, Enqueue3Region, RiverInsertMany, RiverSteady, RiverBacklog}

// Config of a benchmark run.
type Config struct {
	// Quick runs every scenario for a second or two on small backlogs (the
	// three-region bed with one shard per region), so the whole run takes
	// about a minute: a smoke test for CI whose numbers mean little.
	// Default false: the full run takes over ten minutes on two cores.
	Quick bool
	// Dir receives bench.json. Default ".triage". The bed the run starts
	// lives in a temp dir of its own, so a bed started by `make up` in Dir is
	// neither used nor disturbed.
	Dir string
	// Shards is the number of shard primaries of the bed. Default 2.
	Shards int
	// Logger receives the bed's logs. Default: warnings and errors to
	// stderr.
	Logger *slog.Logger
	// ProfileDir, when set, receives a CPU profile per scenario,
	// <ProfileDir>/<scenario>.pprof. It covers this process: the load
	// generators and the bed's Triage node and NATS server (not mariadbd).
	// Default: no profiles.
	ProfileDir string
	// TraceDir, when set, receives an execution trace of the last
	// traceSpan of each scenario, <TraceDir>/<scenario>.trace (a flight
	// recorder runs through the scenario). `go tool trace -pprof=sched`
	// turns one into a profile of where goroutines waited to run: on a
	// saturated box a request's latency is mostly such waits. Tracing
	// costs CPU, so a run with traces is not one to report figures from.
	// Default: no traces.
	TraceDir string
	// Only, when set, runs just the named scenarios (Names); the others are
	// reported as skipped, and ratios and targets that need them are left
	// out. For working on one path: `triage-bed bench --only triage-steady`.
	// Default: every scenario.
	Only []string
}

// Report is the outcome of a run; bench.json holds it.
type Report struct {
	Machine   Machine    `json:"machine"`
	Run       RunInfo    `json:"run"`
	Scenarios []Scenario `json:"scenarios"`
	// MariaDBPIDs are the mariadbd processes the run started. All of them
	// have exited by the time Run returns.
	MariaDBPIDs []int `json:"-"`
	// PostgresPIDs are the postgres servers (postmasters) the run started
	// for River's rows; they too have exited by the time Run returns.
	PostgresPIDs []int `json:"-"`
}

// RunInfo says how the run was made.
type RunInfo struct {
	Quick     bool      `json:"quick"`
	Shards    int       `json:"shards"`
	StartedAt time.Time `json:"started_at"`
	Seconds   float64   `json:"seconds"`
	// PayloadBytes is the payload size of every item.
	PayloadBytes int `json:"payload_bytes"`
	// LoadAvgStart and LoadAvgEnd are the box's 1-minute load averages
	// when the run began and ended: other work on the box shows here.
	LoadAvgStart float64 `json:"load_avg_start"`
	LoadAvgEnd   float64 `json:"load_avg_end"`
}

// Scenario is one row of the report.
type Scenario struct {
	Name        string  `json:"name"`
	ItemsPerSec float64 `json:"items_per_sec"`
	// P50MS, P99MS and P999MS are latency percentiles in milliseconds; Latency
	// says of what.
	P50MS  float64 `json:"p50_ms"`
	P99MS  float64 `json:"p99_ms"`
	P999MS float64 `json:"p999_ms"`
	// RatioVsNaive and RatioVsCeiling compare ItemsPerSec with the matching
	// baseline (enqueue scenarios with naive-enqueue and ceiling-insert,
	// dequeue scenarios with naive-dequeue-ack and ceiling-lease-ack); 0
	// where no comparison applies.
	RatioVsNaive   float64 `json:"ratio_vs_naive"`
	RatioVsCeiling float64 `json:"ratio_vs_ceiling"`
	// RatioVsRiver compares ItemsPerSec with River's matching row, named
	// by RiverPeer (batch 100 with river-insert-many, steady state with
	// river-steady, backlog work with river-backlog); 0 where none applies
	// or either did not run.
	RatioVsRiver float64 `json:"ratio_vs_river"`
	RiverPeer    string  `json:"river_peer,omitempty"`
	Notes        string  `json:"notes"`
	// Latency says what the percentiles measure.
	Latency string `json:"latency,omitempty"`
	// Skipped is set when the scenario could not run; its numbers are zero.
	Skipped bool `json:"skipped"`
	// Error is set when the scenario failed.
	Error string `json:"error,omitempty"`
	// Metrics holds further figures; names carry their unit.
	Metrics map[string]float64 `json:"metrics,omitempty"`
	// Targets are the targets for this scenario and whether the run
	// met them.
	Targets []Target `json:"targets,omitempty"`
	// Seconds is the scenario's wall-clock time, set-up included.
	Seconds float64 `json:"seconds"`

	cpuDone bool // the scenario accounted for CPU itself
}

// Target is one of the benchmark issue's goals.
type Target struct {
	Goal     string `json:"goal"`
	Measured string `json:"measured"`
	Met      bool   `json:"met"`
}

const (
	namespace    = "default"
	payloadBytes = 128
)

// Run starts a private bed, runs every scenario against it, prints progress
// and a table to out, writes <Dir>/bench.json and stops everything it
// started. A scenario that fails is reported with its error and the run
// goes on; Run then returns the report together with an error.
func Run(ctx context.Context, cfg Config, out io.Writer) (*Report, error) {
	if err := cfg.prepare(); err != nil {
		return nil, err
	}
	out = &syncWriter{w: out} // progress lines come from several goroutines
	started := time.Now()
	rep := &Report{Run: RunInfo{Quick: cfg.Quick, Shards: cfg.Shards, StartedAt: started.UTC(), PayloadBytes: payloadBytes,
		LoadAvgStart: loadAvg()}}
	bedDir, err := os.MkdirTemp("", "triage-bench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(bedDir)

	mode := "full"
	if cfg.Quick {
		mode = "quick"
	}
	fmt.Fprintf(out, "triage-bed bench (%s): starting a bed with %d shards...\n", mode, cfg.Shards)
	b, err := bed.Start(ctx, bed.Config{Dir: bedDir, ShardsPerRegion: cfg.Shards, HTTPBase: 0, GRPCBase: 0, NATSPort: -1, Logger: cfg.Logger})
	if err != nil {
		return nil, fmt.Errorf("bench: start bed: %w", err)
	}
	defer b.Stop()
	for _, p := range b.Layout.Processes {
		if p.Role == "mysql-primary" {
			rep.MariaDBPIDs = append(rep.MariaDBPIDs, p.PID)
		}
	}

	r, err := newRunner(ctx, cfg, out, b)
	if err != nil {
		return nil, err
	}
	defer r.close()
	if rep.Machine, err = machineFacts(ctx, r.shardDB[r.shardIDs[0]]); err != nil {
		return nil, fmt.Errorf("bench: machine facts: %w", err)
	}
	fmt.Fprintf(out, "bed up in %.1fs: gRPC %s, HTTP %s; MariaDB %s, %d cores\n",
		time.Since(started).Seconds(), b.Layout.Regions[0].GRPC, b.Layout.Regions[0].HTTP, rep.Machine.MariaDBVersion, rep.Machine.Cores)

	results := r.runAll(ctx)
	// River and then the three-region bed get the box to themselves.
	r.close()
	b.Stop()
	r.runRiver(ctx, rep)
	r.scenario(ctx, Enqueue3Region, func(ctx context.Context) (Scenario, error) {
		return r.enqueue3Region(ctx, &rep.MariaDBPIDs)
	})
	rep.collect(results, started)
	printTable(out, rep)
	errs := rep.failures(ctx)
	if err := rep.write(out, cfg.Dir); err != nil {
		return rep, err
	}
	// Stop the bed before returning, so that MariaDBPIDs have exited.
	r.close()
	b.Stop()
	return rep, errors.Join(errs...)
}

// prepare fills in cfg's defaults, checks it, and makes its directories.
func (cfg *Config) prepare() error {
	cfg.Dir = cmp.Or(cfg.Dir, ".triage")
	cfg.Shards = cmp.Or(cfg.Shards, 2)
	if cfg.Shards < 1 {
		return fmt.Errorf("bench: Shards %d: want at least 1", cfg.Shards)
	}
	for _, name := range cfg.Only {
		if !slices.Contains(Names, name) {
			return fmt.Errorf("bench: no scenario %q; the scenarios are %s", name, strings.Join(Names, ", "))
		}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	for _, d := range []string{cfg.Dir, cfg.ProfileDir, cfg.TraceDir} {
		if d == "" {
			continue
		}
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	return nil
}

// collect puts the scenarios' results in the report, in Names order (one
// not run says so), with their ratios and targets, and ends the run.
func (rep *Report) collect(results map[string]Scenario, started time.Time) {
	for _, name := range Names {
		s, ok := results[name]
		if !ok {
			s = Scenario{Name: name, Error: "not run"}
		}
		rep.Scenarios = append(rep.Scenarios, s)
	}
	applyRatios(rep.Scenarios)
	applyRiverRatios(rep.Scenarios)
	applyTargets(rep.Scenarios)
	rep.Run.Seconds = time.Since(started).Seconds()
	rep.Run.LoadAvgEnd = loadAvg()
}

// failures returns why the run is not complete: ctx ended, or scenarios
// failed.
func (rep *Report) failures(ctx context.Context) []error {
	var errs []error
	if ctx.Err() != nil {
		errs = append(errs, ctx.Err())
	}
	for _, s := range rep.Scenarios {
		if s.Error != "" {
			errs = append(errs, fmt.Errorf("%s: %s", s.Name, s.Error))
		}
	}
	return errs
}

// write writes the report to dir/bench.json.
func (rep *Report) write(out io.Writer, dir string) error {
	sanitize(rep.Scenarios)
	data, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	path := filepath.Join(dir, "bench.json")
	if err := os.WriteFile(path, append(data, '\n'), 0o644); err != nil {
		return err
	}
	fmt.Fprintf(out, "wrote %s (%.0fs in all)\n", path, rep.Run.Seconds)
	return nil
}

// runner holds what the scenarios share.
type runner struct {
	cfg  Config
	p    params
	out  io.Writer
	bed  *bed.Bed
	step int

	grpcConns []*grpc.ClientConn
	clients   []triagev1.QueueClient
	httpBase  string

	shardIDs []uint32
	shardDB  map[uint32]*sql.DB // the "triage" database of each shard
	nc       *nats.Conn
	claim    *routing.NodeClaim
	ids      *itemid.Generator
	payload  []byte
	closed   bool

	// Baseline databases (bench_raw on every shard, by position in
	// shardIDs; bench_naive on the first) and how many ready rows their
	// topic holds.
	rawDB      []*sql.DB
	rawDepth   []*atomic.Int64
	naiveDB    *sql.DB
	naiveDepth atomic.Int64
	deepDepth  atomic.Int64 // ready items in deepTopic
	best       bestConfigs
	rechecking bool // progress lines say [recheck] instead of [i/n]

	riv *riverPeer // River on its Postgres, while its rows run

	results map[string]Scenario
}

func newRunner(ctx context.Context, cfg Config, out io.Writer, b *bed.Bed) (r *runner, err error) {
	r = &runner{cfg: cfg, p: paramsFor(cfg.Quick), out: out, bed: b, shardDB: map[uint32]*sql.DB{}, results: map[string]Scenario{}}
	defer func() {
		if err != nil {
			r.close()
		}
	}()
	region := b.Layout.Regions[0]
	r.httpBase = "http://" + region.HTTP
	// Several connections, so that HTTP/2 flow control and one connection's
	// reader goroutine do not become the limit of many concurrent clients.
	// Their transports' goroutines count as load (loadshare.go).
	for range 4 {
		var cc *grpc.ClientConn
		asLoad(ctx, func(context.Context) {
			cc, err = grpc.NewClient(region.GRPC, grpc.WithTransportCredentials(insecure.NewCredentials()))
		})
		if err != nil {
			return nil, err
		}
		r.grpcConns = append(r.grpcConns, cc)
		r.clients = append(r.clients, triagev1.NewQueueClient(cc))
	}
	for id, s := range b.Shards {
		db, err := openRaw(s, "triage")
		if err != nil {
			return nil, err
		}
		r.shardIDs = append(r.shardIDs, id)
		r.shardDB[id] = db
	}
	slices.Sort(r.shardIDs)
	// Rows the bench writes itself need item keys no router hands out: claim
	// a node number in the bed's NATS KV like a router does.
	natsOpts, err := shardmap.NATSOptions(b.Layout.NATSAuth, b.Layout.NATSTLS)
	if err != nil {
		return nil, err
	}
	if r.nc, err = nats.Connect(b.Layout.NATS, append(natsOpts, nats.Name("triage-bench"))...); err != nil {
		return nil, err
	}
	js, err := jetstream.New(r.nc)
	if err != nil {
		return nil, err
	}
	if r.claim, err = routing.ClaimNode(ctx, js, "bench", 1, func(error) {}); err != nil {
		return nil, err
	}
	if r.ids, err = itemid.NewGenerator(r.claim.Node); err != nil {
		return nil, err
	}
	r.payload = make([]byte, payloadBytes)
	for i := range r.payload {
		r.payload[i] = byte('a' + i%26)
	}
	return r, nil
}

func (r *runner) close() {
	if r.closed {
		return
	}
	r.closed = true
	for _, cc := range r.grpcConns {
		cc.Close()
	}
	for _, db := range r.shardDB {
		db.Close()
	}
	for _, db := range append([]*sql.DB{r.naiveDB}, r.rawDB...) {
		if db != nil {
			db.Close()
		}
	}
	if r.claim != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		r.claim.Release(ctx)
		cancel()
	}
	if r.nc != nil {
		r.nc.Close()
	}
}

func (r *runner) client(i int) triagev1.QueueClient { return r.clients[i%len(r.clients)] }

// runAll runs every scenario of the one-region bed: the baselines first,
// then Triage's enqueue scenarios and the mixed load on small tables, then
// the scenarios that need a deep table (ceiling-lease-ack's own, dropped
// after it, and the backlog filled once for triage-backlog and
// triage-dequeue-ack), so that a table of millions of rows, its drop and
// the purge of what they delete slow nothing else (the enqueue scenarios
// lost up to half their rate running after ceiling-lease-ack's deep
// table), and last the baselines' recheck.
func (r *runner) runAll(ctx context.Context) map[string]Scenario {
	r.scenario(ctx, CeilingInsert, r.ceilingInsert)
	r.scenario(ctx, NaiveEnqueue, r.naiveEnqueue)
	r.scenario(ctx, NaiveDequeueAck, r.naiveDequeueAck)
	notReady := r.waitReady(ctx)
	if notReady != nil {
		for _, name := range []string{EnqueueBatch1, EnqueueBatch100, EnqueueJSON, Backlog, DequeueAck, Steady, Mixed} {
			r.results[name] = Scenario{Name: name, Error: notReady.Error(), Notes: "the bed's router never became ready"}
		}
	} else {
		r.scenario(ctx, EnqueueBatch1, r.enqueueBatch1)
		r.scenario(ctx, EnqueueBatch100, r.enqueueBatch100)
		r.scenario(ctx, EnqueueJSON, r.enqueueJSON)
		r.scenario(ctx, Steady, r.steady)
		r.scenario(ctx, Mixed, r.mixed)
	}
	r.scenario(ctx, CeilingLeaseAck, r.ceilingLeaseAck)
	if notReady == nil {
		r.scenario(ctx, Backlog, r.backlog)
		r.scenario(ctx, DequeueAck, r.dequeueAckScenario)
	}
	r.recheck(ctx)
	return r.results
}

// scenario runs one scenario with a heading, a CPU profile when asked for,
// and a summary line, and stores its result.
func (r *runner) scenario(ctx context.Context, name string, fn func(context.Context) (Scenario, error)) {
	if len(r.cfg.Only) > 0 && !slices.Contains(r.cfg.Only, name) {
		r.results[name] = Scenario{Name: name, Skipped: true, Notes: "not selected (--only)"}
		return
	}
	r.step++
	fmt.Fprintf(r.out, "[%d/%d] %s\n", r.step, len(Names), name)
	if ctx.Err() != nil {
		r.results[name] = Scenario{Name: name, Error: ctx.Err().Error()}
		return
	}
	start := time.Now()
	var profiled string
	if r.cfg.ProfileDir != "" {
		path := filepath.Join(r.cfg.ProfileDir, name+".pprof")
		if f, err := os.Create(path); err == nil {
			if pprof.StartCPUProfile(f) == nil {
				profiled = path
				defer f.Close()
			} else {
				f.Close()
			}
		}
	}
	var fr *trace.FlightRecorder
	if r.cfg.TraceDir != "" {
		fr = trace.NewFlightRecorder(trace.FlightRecorderConfig{MinAge: traceSpan, MaxBytes: 512 << 20})
		if fr.Start() != nil {
			fr = nil // another trace is running
		}
	}
	before := takeCPU(r.mariadbPIDs())
	var s Scenario
	var err error
	asLoad(ctx, func(ctx context.Context) { s, err = fn(ctx) })
	if fr != nil {
		if werr := writeTrace(fr, filepath.Join(r.cfg.TraceDir, name+".trace")); werr != nil {
			s.Notes += fmt.Sprintf("; execution trace not written: %v", werr)
		}
	}
	use := cpuSince(before, takeCPU(r.mariadbPIDs()), runtime.NumCPU())
	if profiled != "" {
		pprof.StopCPUProfile()
		if share, perr := loadShare(profiled); perr != nil {
			s.Notes += fmt.Sprintf("; CPU profile unreadable: %v", perr)
		} else if err == nil && !s.Skipped {
			if s.Metrics == nil {
				s.Metrics = map[string]float64{}
			}
			s.Metrics["load_cpu_share"] = share
			s.Notes += fmt.Sprintf("; the load generators (profiler label bench=load) took %.0f %% of this process's CPU samples", 100*share)
		}
	}
	s.Name = name
	s.Seconds = time.Since(start).Seconds()
	if !s.Skipped && err == nil && !s.cpuDone {
		if s.Metrics == nil {
			s.Metrics = map[string]float64{}
		}
		use.metrics(s.Metrics)
		s.Notes += "; " + use.note(runtime.NumCPU()) + " (whole scenario, set-up included)"
	}
	if err != nil {
		s.Error = err.Error()
		fmt.Fprintf(r.out, "[%d/%d] %s: FAILED: %v\n", r.step, len(Names), name, err)
	} else if s.Skipped {
		fmt.Fprintf(r.out, "[%d/%d] %s: %s\n", r.step, len(Names), name, s.Notes)
	} else if s.P99MS == 0 { // no latency to report (river-backlog)
		fmt.Fprintf(r.out, "[%d/%d] %s: %s items/s (%.0fs)\n", r.step, len(Names), name, human(s.ItemsPerSec), s.Seconds)
	} else {
		fmt.Fprintf(r.out, "[%d/%d] %s: %s items/s, p50 %.2f ms, p99 %.2f ms, p99.9 %.2f ms (%.0fs)\n",
			r.step, len(Names), name, human(s.ItemsPerSec), s.P50MS, s.P99MS, s.P999MS, s.Seconds)
	}
	r.results[name] = s
}

func (r *runner) mariadbPIDs() []int {
	var out []int
	for _, id := range r.shardIDs {
		out = append(out, r.bed.Shards[id].PID())
	}
	return out
}

// label is the progress prefix of the running scenario.
func (r *runner) label(name string) string {
	if r.rechecking {
		return "[recheck] " + name
	}
	return fmt.Sprintf("[%d/%d] %s", r.step, len(Names), name)
}

func (r *runner) progress(name string) *progress {
	return startProgress(r.out, r.label(name), r.p.progressEvery)
}

// syncWriter serialises writes to an io.Writer that may not be safe for
// concurrent use (a bytes.Buffer in tests).
type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

// sanitize replaces NaN and infinities, which JSON cannot carry, by 0.
func sanitize(ss []Scenario) {
	fix := func(v *float64) {
		if math.IsNaN(*v) || math.IsInf(*v, 0) {
			*v = 0
		}
	}
	for i := range ss {
		s := &ss[i]
		for _, v := range []*float64{&s.ItemsPerSec, &s.P50MS, &s.P99MS, &s.P999MS, &s.RatioVsNaive, &s.RatioVsCeiling, &s.RatioVsRiver} {
			fix(v)
		}
		for k, v := range s.Metrics {
			fix(&v)
			s.Metrics[k] = v
		}
	}
}

// traceSpan is how much of a scenario's end its execution trace keeps.
const traceSpan = 3 * time.Second

// writeTrace writes what fr holds to path and stops it.
func writeTrace(fr *trace.FlightRecorder, path string) error {
	defer fr.Stop()
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := fr.WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
