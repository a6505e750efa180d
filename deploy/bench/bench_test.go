package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestRunQuick runs the whole benchmark in quick mode on real beds (one
// region, then three) and River on a private Postgres: every scenario must
// produce a number (or be marked skipped), bench.json must parse, and no
// mariadbd or postgres the run started may outlive it. River's rows may be
// skipped only where Postgres cannot be installed, and the test then
// reports itself skipped, not passed. It asserts nothing about speed: CI
// boxes vary.
func TestRunQuick(t *testing.T) {
	dir := t.TempDir()
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	start := time.Now()
	rep, err := Run(ctx, Config{Quick: true, Dir: dir, Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))}, &out)
	t.Logf("quick run took %s; output:\n%s", time.Since(start).Round(time.Second), out.String())
	require.NoError(t, err)
	require.NotNil(t, rep)

	// Every scenario, in order, with a number unless marked skipped.
	var names []string
	var riverSkipped []string
	for _, s := range rep.Scenarios {
		names = append(names, s.Name)
		if s.Skipped && slices.Contains(riverNames, s.Name) {
			riverSkipped = append(riverSkipped, s.Name+": "+s.Notes)
		}
		if s.Skipped {
			require.Zero(t, s.ItemsPerSec, s.Name)
			require.Contains(t, s.Notes, "skipped", s.Name)
			continue
		}
		require.Empty(t, s.Error, s.Name)
		require.Greater(t, s.ItemsPerSec, 0.0, s.Name)
	}
	require.Equal(t, Names, names)

	// bench.json parses and holds the same scenarios and the machine facts.
	data, err := os.ReadFile(filepath.Join(dir, "bench.json"))
	require.NoError(t, err)
	var doc struct {
		Machine   map[string]any   `json:"machine"`
		Scenarios []map[string]any `json:"scenarios"`
	}
	require.NoError(t, json.Unmarshal(data, &doc))
	require.Len(t, doc.Scenarios, len(Names))
	for i, s := range doc.Scenarios {
		require.Equal(t, Names[i], s["name"])
		for _, k := range []string{"items_per_sec", "p50_ms", "p99_ms", "p999_ms", "ratio_vs_naive", "ratio_vs_ceiling", "ratio_vs_river", "notes"} {
			require.Contains(t, s, k, Names[i])
		}
	}
	require.NotZero(t, doc.Machine["cores"])
	require.NotEmpty(t, doc.Machine["mariadb_version"])
	durability, _ := doc.Machine["durability"].(map[string]any)
	require.Equal(t, "1", durability["innodb_flush_log_at_trx_commit"])
	require.Equal(t, "1", durability["sync_binlog"])

	// The run's bed lived elsewhere and is gone: no bed.json in Dir, and
	// none of its mariadbd processes is running.
	require.NoFileExists(t, filepath.Join(dir, "bed.json"))
	require.NotEmpty(t, rep.MariaDBPIDs)
	for _, pid := range rep.MariaDBPIDs {
		cmd, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
		if err == nil {
			require.NotContains(t, string(cmd), "mariadbd", "mariadbd pid %d outlived the run", pid)
		}
	}
	for _, pid := range rep.PostgresPIDs {
		cmd, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
		if err == nil {
			require.NotContains(t, string(cmd), "postgres", "postgres pid %d outlived the run", pid)
		}
	}

	// River's rows ran beside Triage's, with durable commits, and the
	// Triage rows they compare with carry the ratio.
	if len(riverSkipped) > 0 {
		t.Skipf("River's rows did not run: %s", strings.Join(riverSkipped, "; "))
	}
	pg, _ := doc.Machine["postgres"].(map[string]any)
	settings, _ := pg["settings"].(map[string]any)
	require.Equal(t, "on", settings["fsync"])
	require.Equal(t, "on", settings["synchronous_commit"])
	require.NotEmpty(t, rep.PostgresPIDs)
	for name, peer := range riverPeers {
		require.Equal(t, peer, find(rep.Scenarios, name).RiverPeer, name)
		require.Greater(t, find(rep.Scenarios, name).RatioVsRiver, 0.0, name)
	}
	require.Contains(t, out.String(), "x "+RiverInsertMany)
}

// TestRiverRatios: Triage's rows carry their ratio to the River row they
// compare with, and triage-steady compares each producer count both ran.
func TestRiverRatios(t *testing.T) {
	t.Parallel()
	ss := []Scenario{
		{Name: EnqueueBatch100, ItemsPerSec: 125_000},
		{Name: Steady, ItemsPerSec: 5_000, Metrics: map[string]float64{"p64_delivered_per_sec": 5_200, "p64_e2e_p99_ms": 60,
			"p512_delivered_per_sec": 5_000, "p512_e2e_p99_ms": 160, "sustained_delivered_per_sec": 5_200}},
		{Name: DequeueAck, ItemsPerSec: 27_000},
		{Name: Backlog, Skipped: true},
		{Name: RiverInsertMany, ItemsPerSec: 100_000},
		{Name: RiverSteady, ItemsPerSec: 2_500, Metrics: map[string]float64{"p64_worked_per_sec": 2_600, "p64_e2e_p99_ms": 40,
			"p512_worked_per_sec": 2_500, "p512_e2e_p99_ms": 5_800}},
		{Name: RiverBacklog, ItemsPerSec: 22_500},
	}
	applyRiverRatios(ss)
	require.InDelta(t, 1.25, find(ss, EnqueueBatch100).RatioVsRiver, 1e-9)
	require.Equal(t, RiverInsertMany, find(ss, EnqueueBatch100).RiverPeer)
	require.InDelta(t, 1.2, find(ss, DequeueAck).RatioVsRiver, 1e-9)
	require.Zero(t, find(ss, Backlog).RatioVsRiver, "a row that did not run has no ratio")
	require.Zero(t, find(ss, RiverSteady).RatioVsRiver, "River's rows have no peer")
	steady := find(ss, Steady)
	require.InDelta(t, 2.0, steady.RatioVsRiver, 1e-9)
	require.InDelta(t, 2.0, steady.Metrics["vs_river_p64_delivered"], 1e-9)
	require.InDelta(t, 1.5, steady.Metrics["vs_river_p64_e2e_p99"], 1e-9)
	require.Contains(t, steady.Notes, "against river-steady: 64 producers: delivered 2.00x River's worked rate")
	require.Less(t, strings.Index(steady.Notes, "64 producers"), strings.Index(steady.Notes, "512 producers"))

	var out bytes.Buffer
	printTable(&out, &Report{Scenarios: ss})
	require.Contains(t, out.String(), "1.25x river-insert-many")
}

func TestCountInversions(t *testing.T) {
	t.Parallel()
	const ms = int64(time.Millisecond)
	tests := []struct {
		name  string
		prios []int32
		ackAt []int64
		all   []delivery
		want  int
	}{
		{
			name:  "in order",
			prios: []int32{0, 5},
			ackAt: []int64{1 * ms, 1 * ms},
			all:   []delivery{{seq: 0, prio: 0, sent: 10 * ms, recv: 11 * ms}, {seq: 1, prio: 5, sent: 12 * ms, recv: 13 * ms}},
		},
		{
			name:  "urgent item waited 9 ms while a lower one went out",
			prios: []int32{0, 5},
			ackAt: []int64{1 * ms, 1 * ms},
			all:   []delivery{{seq: 1, prio: 5, sent: 10 * ms, recv: 11 * ms}, {seq: 0, prio: 0, sent: 12 * ms, recv: 13 * ms}},
			want:  1,
		},
		{
			name:  "urgent item ready only 2 ms: not counted",
			prios: []int32{0, 5},
			ackAt: []int64{8 * ms, 1 * ms},
			all:   []delivery{{seq: 1, prio: 5, sent: 10 * ms, recv: 11 * ms}, {seq: 0, prio: 0, sent: 12 * ms, recv: 13 * ms}},
		},
		{
			name:  "same answer carries both",
			prios: []int32{0, 5},
			ackAt: []int64{1 * ms, 1 * ms},
			all:   []delivery{{seq: 1, prio: 5, sent: 10 * ms, recv: 11 * ms}, {seq: 0, prio: 0, sent: 10 * ms, recv: 11 * ms}},
		},
		{
			name:  "overlapping requests of two consumers: not counted",
			prios: []int32{0, 5},
			ackAt: []int64{1 * ms, 1 * ms},
			all:   []delivery{{seq: 1, prio: 5, sent: 10 * ms, recv: 12 * ms}, {seq: 0, prio: 0, sent: 11 * ms, recv: 13 * ms}},
		},
		{
			name:  "never delivered urgent item",
			prios: []int32{0, 5, 5},
			ackAt: []int64{1 * ms, 1 * ms, 1 * ms},
			all:   []delivery{{seq: 1, prio: 5, sent: 10 * ms, recv: 11 * ms}, {seq: 2, prio: 5, sent: 20 * ms, recv: 21 * ms}},
			want:  2,
		},
		{
			name:  "failed enqueue is not waiting",
			prios: []int32{0, 5},
			ackAt: []int64{-1, 1 * ms},
			all:   []delivery{{seq: 1, prio: 5, sent: 10 * ms, recv: 11 * ms}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := countInversions(tt.prios, tt.ackAt, tt.all, 5*ms)
			require.Equal(t, tt.want, got.count)
		})
	}
}

func TestPercentile(t *testing.T) {
	t.Parallel()
	var d []time.Duration
	for i := 1; i <= 1000; i++ {
		d = append(d, time.Duration(i)*time.Millisecond)
	}
	require.Equal(t, 500.0, percentile(d, 50))
	require.Equal(t, 990.0, percentile(d, 99))
	require.Equal(t, 999.0, percentile(d, 99.9))
	require.Equal(t, 0.0, percentile(nil, 99))
	require.True(t, strings.HasSuffix(human(12345), "k"))
}

// TestApplyTargets: the targets (issue 11's, and issue 39's beside River),
// judged on the figures each names, and left out when a scenario they
// need did not run.
func TestApplyTargets(t *testing.T) {
	t.Parallel()
	type want map[string]bool // "scenario: goal" -> met
	run := func(ss []Scenario) want {
		applyRatios(ss)
		applyRiverRatios(ss)
		applyTargets(ss)
		out := want{}
		for _, s := range ss {
			for _, tg := range s.Targets {
				require.NotEmpty(t, tg.Measured, tg.Goal)
				out[s.Name+": "+tg.Goal] = tg.Met
			}
		}
		return out
	}
	all := func() []Scenario {
		return []Scenario{
			{Name: CeilingInsert, ItemsPerSec: 100_000},
			{Name: CeilingLeaseAck, ItemsPerSec: 40_000},
			{Name: NaiveEnqueue, ItemsPerSec: 10_000},
			{Name: NaiveDequeueAck, ItemsPerSec: 1_000},
			{Name: EnqueueBatch1, ItemsPerSec: 20_000},
			{Name: EnqueueBatch100, ItemsPerSec: 65_000},
			{Name: DequeueAck, ItemsPerSec: 28_000, P99MS: 500, Metrics: map[string]float64{"ack_p99_ms": 400,
				"fixed_consumers": 16, "fixed_dequeue_p99_ms": 90, "fixed_ack_p99_ms": 40}},
			{Name: Steady, ItemsPerSec: 9_000, Metrics: map[string]float64{"keep_up_ratio": 0.96, "enqueued_per_sec": 9_400,
				"sustained_delivered_per_sec": 10_000, "sustained_producers": 512,
				"p64_delivered_per_sec": 5_000, "p64_e2e_p99_ms": 40, "p512_delivered_per_sec": 10_000, "p512_e2e_p99_ms": 300}},
			{Name: RiverInsertMany, ItemsPerSec: 65_000},
			{Name: RiverSteady, ItemsPerSec: 4_000, Metrics: map[string]float64{"p64_worked_per_sec": 4_000, "p64_e2e_p99_ms": 40,
				"p512_worked_per_sec": 5_000, "p512_e2e_p99_ms": 200}},
			{Name: Mixed, ItemsPerSec: 1_000, Metrics: map[string]float64{"dequeue_p99_ms": 10, "enqueue_p99_ms": 25, "e2e_p99_ms": 50}},
			{Name: Enqueue3Region, ItemsPerSec: 9_000, P50MS: 120, Metrics: map[string]float64{"wan_rtt_ms": 40, "batch1_p50_ms": 121}},
		}
	}
	met := want{
		Steady + ": delivered >= 0.95x enqueued (the backlog stays flat)":           true,
		Steady + ": >= 0.50x triage-enqueue-batch1 delivered while keeping up":      true,
		Mixed + ": non-waiting dequeue p99 <= 10 ms":                                true,
		Mixed + ": enqueue p99 <= 25 ms":                                            true,
		Mixed + ": end-to-end p99 <= 50 ms":                                         true,
		Mixed + ": zero priority inversions (more urgent item ready >= 5 ms)":       true,
		DequeueAck + ": >= 0.70x ceiling-lease-ack":                                 true,
		DequeueAck + ": Dequeue and Ack p99 <= 100 ms (16 consumers)":               true,
		EnqueueBatch1 + ": >= 2x naive-enqueue":                                     true,
		EnqueueBatch100 + ": >= 0.65x ceiling-insert":                               true,
		EnqueueBatch100 + ": >= 1x river-insert-many":                               true,
		Steady + ": end-to-end p99 <= river-steady's (64 producers)":                true,
		Steady + ": >= 2x river-steady's worked rate, delivered while keeping up":   true,
		Enqueue3Region + ": COMMITTED enqueue p50 <= 3 WAN round trips (batch 100)": true,
		Enqueue3Region + ": COMMITTED enqueue p50 <= 3 WAN round trips (batch 1)":   false,
	}
	require.Equal(t, met, run(all()), "every target, at and just past its bar")

	tests := []struct {
		name   string
		change func(ss []Scenario)
		goal   string
		met    bool
	}{
		{"backlog grows", func(ss []Scenario) { find(ss, Steady).Metrics["keep_up_ratio"] = 0.94 },
			Steady + ": delivered >= 0.95x enqueued (the backlog stays flat)", false},
		{"steady below half of batch1", func(ss []Scenario) { find(ss, Steady).Metrics["sustained_delivered_per_sec"] = 9_999 },
			Steady + ": >= 0.50x triage-enqueue-batch1 delivered while keeping up", false},
		{"no steady trial kept up", func(ss []Scenario) { delete(find(ss, Steady).Metrics, "sustained_delivered_per_sec") },
			Steady + ": >= 0.50x triage-enqueue-batch1 delivered while keeping up", false},
		{"mixed dequeue p99 over", func(ss []Scenario) { find(ss, Mixed).Metrics["dequeue_p99_ms"] = 10.01 },
			Mixed + ": non-waiting dequeue p99 <= 10 ms", false},
		{"mixed end to end over", func(ss []Scenario) { find(ss, Mixed).Metrics["e2e_p99_ms"] = 51 },
			Mixed + ": end-to-end p99 <= 50 ms", false},
		{"one inversion", func(ss []Scenario) { find(ss, Mixed).Metrics["priority_inversions"] = 1 },
			Mixed + ": zero priority inversions (more urgent item ready >= 5 ms)", false},
		{"dequeue+ack below the ceiling ratio", func(ss []Scenario) { find(ss, DequeueAck).ItemsPerSec = 27_000 },
			DequeueAck + ": >= 0.70x ceiling-lease-ack", false},
		{"ack p99 over", func(ss []Scenario) { find(ss, DequeueAck).Metrics["fixed_ack_p99_ms"] = 101 },
			DequeueAck + ": Dequeue and Ack p99 <= 100 ms (16 consumers)", false},
		{"dequeue p99 over", func(ss []Scenario) { find(ss, DequeueAck).Metrics["fixed_dequeue_p99_ms"] = 100.5 },
			DequeueAck + ": Dequeue and Ack p99 <= 100 ms (16 consumers)", false},
		{"batch1 under 2x naive", func(ss []Scenario) { find(ss, EnqueueBatch1).ItemsPerSec = 19_000 },
			EnqueueBatch1 + ": >= 2x naive-enqueue", false},
		{"batch100 under 0.65x ceiling", func(ss []Scenario) { find(ss, EnqueueBatch100).ItemsPerSec = 64_000 },
			EnqueueBatch100 + ": >= 0.65x ceiling-insert", false},
		{"batch100 behind InsertMany", func(ss []Scenario) { find(ss, RiverInsertMany).ItemsPerSec = 65_001 },
			EnqueueBatch100 + ": >= 1x river-insert-many", false},
		{"a longer tail than River at its rate", func(ss []Scenario) { find(ss, Steady).Metrics["p64_e2e_p99_ms"] = 40.1 },
			Steady + ": end-to-end p99 <= river-steady's (64 producers)", false},
		{"under twice River's most", func(ss []Scenario) { find(ss, RiverSteady).Metrics["p512_worked_per_sec"] = 5_001 },
			Steady + ": >= 2x river-steady's worked rate, delivered while keeping up", false},
		{"twice River's most, but not kept up", func(ss []Scenario) { delete(find(ss, Steady).Metrics, "sustained_delivered_per_sec") },
			Steady + ": >= 2x river-steady's worked rate, delivered while keeping up", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ss := all()
			tt.change(ss)
			got := run(ss)
			require.Contains(t, got, tt.goal)
			require.Equal(t, tt.met, got[tt.goal])
		})
	}

	// Scenarios that did not run leave their targets out, and those of the
	// others that need them.
	ss := all()
	for i := range ss {
		if ss[i].Name == EnqueueBatch1 || ss[i].Name == CeilingLeaseAck || ss[i].Name == RiverSteady {
			ss[i] = Scenario{Name: ss[i].Name, Skipped: true}
		}
	}
	got := run(ss)
	require.NotContains(t, got, Steady+": >= 0.50x triage-enqueue-batch1 delivered while keeping up")
	require.NotContains(t, got, EnqueueBatch1+": >= 2x naive-enqueue")
	require.NotContains(t, got, DequeueAck+": >= 0.70x ceiling-lease-ack")
	require.NotContains(t, got, Steady+": end-to-end p99 <= river-steady's (64 producers)")
	require.NotContains(t, got, Steady+": >= 2x river-steady's worked rate, delivered while keeping up")
	require.Contains(t, got, Steady+": delivered >= 0.95x enqueued (the backlog stays flat)")
	require.Contains(t, got, EnqueueBatch100+": >= 1x river-insert-many")

	// The report prints them under one heading.
	var out bytes.Buffer
	printTable(&out, &Report{Scenarios: ss})
	require.Contains(t, out.String(), "Targets:")
	require.Contains(t, out.String(), "MISSED "+Enqueue3Region+": COMMITTED enqueue p50 <= 3 WAN round trips (batch 1) (measured 3.02 round trips")
}

// TestSustained: the steady throughput target is judged on the trial that
// delivered the most while keeping up, not on one whose backlog grew.
func TestSustained(t *testing.T) {
	t.Parallel()
	w := window{from: time.Unix(0, 0), to: time.Unix(10, 0)}
	trial := func(producers int, enqueued, delivered int64) steadyTrial {
		return steadyTrial{producers: producers, enq: &sampler{w: w, items: enqueued}, deq: &sampler{w: w, items: delivered}}
	}
	_, ok := sustained([]steadyTrial{trial(64, 1000, 900), trial(512, 2000, 1000)})
	require.False(t, ok, "neither kept up")

	best, ok := sustained([]steadyTrial{trial(64, 1000, 1000), trial(512, 3000, 2900), trial(1024, 5000, 3000)})
	require.True(t, ok)
	require.Equal(t, 512, best.producers, "1024 delivered more but fell behind")
	require.InDelta(t, 290.0, best.deq.rate(), 1e-9)

	best, ok = sustained([]steadyTrial{trial(512, 1000, 999), trial(64, 500, 500)})
	require.True(t, ok)
	require.Equal(t, 512, best.producers, "the hardest trial that kept up")
}
