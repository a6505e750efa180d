package bench

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
)

// kind says which baselines a scenario compares with.
var kind = map[string]string{
	CeilingInsert: "enqueue", NaiveEnqueue: "enqueue", EnqueueBatch1: "enqueue", EnqueueBatch100: "enqueue",
	EnqueueJSON: "enqueue", Enqueue3Region: "enqueue",
	CeilingLeaseAck: "dequeue", NaiveDequeueAck: "dequeue", DequeueAck: "dequeue",
	// triage-mixed and triage-backlog measure latency at a light fixed load;
	// their items/s is not a throughput to compare with a baseline.
}

func find(ss []Scenario, name string) *Scenario {
	for i := range ss {
		if ss[i].Name == name {
			return &ss[i]
		}
	}
	return nil
}

func ratio(a, b float64) float64 {
	if a <= 0 || b <= 0 {
		return 0
	}
	return a / b
}

// applyRatios fills RatioVsNaive and RatioVsCeiling from the matching
// baselines: enqueue scenarios against naive-enqueue and ceiling-insert,
// dequeue scenarios against naive-dequeue-ack and ceiling-lease-ack. The
// latency scenarios (triage-mixed, triage-backlog) get none.
func applyRatios(ss []Scenario) {
	base := map[string][2]string{
		"enqueue": {NaiveEnqueue, CeilingInsert},
		"dequeue": {NaiveDequeueAck, CeilingLeaseAck},
	}
	for i := range ss {
		s := &ss[i]
		b, ok := base[kind[s.Name]]
		if !ok || s.Skipped || s.Error != "" {
			continue
		}
		if n := find(ss, b[0]); n != nil {
			s.RatioVsNaive = ratio(s.ItemsPerSec, n.ItemsPerSec)
		}
		if c := find(ss, b[1]); c != nil {
			s.RatioVsCeiling = ratio(s.ItemsPerSec, c.ItemsPerSec)
		}
	}
}

// riverPeers names the River row each Triage row is compared with: bulk
// enqueue with InsertMany, steady state with steady state, working off a
// backlog with working off a backlog.
var riverPeers = map[string]string{
	EnqueueBatch100: RiverInsertMany,
	Steady:          RiverSteady,
	Backlog:         RiverBacklog,
	DequeueAck:      RiverBacklog,
}

// applyRiverRatios fills RatioVsRiver and RiverPeer of the Triage rows
// that have a River peer, where both ran. triage-steady's notes and
// metrics also compare each producer count both ran: delivered against
// worked per second, and end-to-end p99 (vs_river_p<N>_e2e_p99 below 1
// means Triage's tail is the shorter).
func applyRiverRatios(ss []Scenario) {
	ran := func(s *Scenario) bool { return s != nil && !s.Skipped && s.Error == "" && s.ItemsPerSec > 0 }
	for i := range ss {
		s := &ss[i]
		name, ok := riverPeers[s.Name]
		peer := find(ss, name)
		if !ok || !ran(s) || !ran(peer) {
			continue
		}
		s.RatioVsRiver, s.RiverPeer = ratio(s.ItemsPerSec, peer.ItemsPerSec), name
		if s.Name == Steady {
			compareSteady(s, peer)
		}
	}
}

// compareSteady adds to triage-steady's notes and metrics its ratios to
// river-steady at each producer count both ran.
func compareSteady(s, river *Scenario) {
	var producers []int
	for k := range s.Metrics {
		var n int
		if _, err := fmt.Sscanf(k, "p%d_delivered_per_sec", &n); err == nil && k == fmt.Sprintf("p%d_delivered_per_sec", n) {
			producers = append(producers, n)
		}
	}
	slices.Sort(producers)
	var parts []string
	for _, n := range producers {
		pre := fmt.Sprintf("p%d_", n)
		worked, ok := river.Metrics[pre+"worked_per_sec"]
		rate := ratio(s.Metrics[pre+"delivered_per_sec"], worked)
		if !ok || rate == 0 {
			continue
		}
		tail := ratio(s.Metrics[pre+"e2e_p99_ms"], river.Metrics[pre+"e2e_p99_ms"])
		s.Metrics["vs_river_"+pre+"delivered"] = rate
		s.Metrics["vs_river_"+pre+"e2e_p99"] = tail
		parts = append(parts, fmt.Sprintf("%d producers: delivered %.2fx River's worked rate (%s/s against %s/s), end-to-end p99 %.2fx River's (%.1f against %.1f ms)",
			n, rate, human(s.Metrics[pre+"delivered_per_sec"]), human(worked), tail, s.Metrics[pre+"e2e_p99_ms"], river.Metrics[pre+"e2e_p99_ms"]))
	}
	if len(parts) > 0 {
		s.Notes += "; against " + RiverSteady + ": " + strings.Join(parts, "; ")
	}
}

// applyTargets records the targets (issue 11's "keep up in steady state",
// issue 39's beside River) and whether the run met them, each with the
// figure it was judged on. A target whose scenarios did not run (--only,
// a failure) is left out. Call it after applyRatios and applyRiverRatios.
func applyTargets(ss []Scenario) {
	ok := func(name string) *Scenario {
		s := find(ss, name)
		if s == nil || s.Skipped || s.Error != "" || s.ItemsPerSec == 0 {
			return nil
		}
		return s
	}
	atLeast := func(s *Scenario, goal string, v, want float64) {
		if v > 0 {
			s.Targets = append(s.Targets, Target{Goal: goal, Measured: fmt.Sprintf("%.3fx", v), Met: v >= want})
		}
	}
	atMost := func(s *Scenario, goal string, v, want float64) {
		s.Targets = append(s.Targets, Target{Goal: goal, Measured: fmt.Sprintf("%.2f ms", v), Met: v <= want})
	}
	if s := ok(Steady); s != nil {
		k := s.Metrics["keep_up_ratio"]
		s.Targets = append(s.Targets, Target{Goal: "delivered >= 0.95x enqueued (the backlog stays flat)",
			Measured: fmt.Sprintf("%.3fx (%s/s of %s/s)", k, human(s.ItemsPerSec), human(s.Metrics["enqueued_per_sec"])), Met: k >= keptUp})
		if b1 := ok(EnqueueBatch1); b1 != nil {
			// Judged on the most a trial delivered while keeping up; a run
			// in which no trial kept up sustains nothing.
			d := s.Metrics["sustained_delivered_per_sec"]
			v := d / b1.ItemsPerSec
			s.Targets = append(s.Targets, Target{Goal: ">= 0.50x triage-enqueue-batch1 delivered while keeping up",
				Measured: fmt.Sprintf("%.3fx (%s/s at %.0f producers, of %s/s)", v, human(d), s.Metrics["sustained_producers"], human(b1.ItemsPerSec)),
				Met:      v >= 0.5})
		}
	}
	if s := ok(Mixed); s != nil {
		atMost(s, "non-waiting dequeue p99 <= 10 ms", s.Metrics["dequeue_p99_ms"], 10)
		atMost(s, "enqueue p99 <= 25 ms", s.Metrics["enqueue_p99_ms"], 25)
		atMost(s, "end-to-end p99 <= 50 ms", s.Metrics["e2e_p99_ms"], 50)
		inv := s.Metrics["priority_inversions"]
		s.Targets = append(s.Targets, Target{Goal: "zero priority inversions (more urgent item ready >= 5 ms)", Measured: fmt.Sprintf("%.0f", inv), Met: inv == 0})
	}
	if s := ok(DequeueAck); s != nil {
		atLeast(s, ">= 0.70x ceiling-lease-ack", s.RatioVsCeiling, 0.70)
		// At a fixed configuration (the first trial), not the fastest one.
		d, a := s.Metrics["fixed_dequeue_p99_ms"], s.Metrics["fixed_ack_p99_ms"]
		s.Targets = append(s.Targets, Target{Goal: fmt.Sprintf("Dequeue and Ack p99 <= 100 ms (%.0f consumers)", s.Metrics["fixed_consumers"]),
			Measured: fmt.Sprintf("Dequeue %.2f ms, Ack %.2f ms", d, a), Met: d <= 100 && a <= 100})
	}
	if s := ok(EnqueueBatch1); s != nil {
		atLeast(s, ">= 2x naive-enqueue", s.RatioVsNaive, 2)
	}
	if s := ok(EnqueueBatch100); s != nil {
		atLeast(s, ">= 0.65x ceiling-insert", s.RatioVsCeiling, 0.65)
		atLeast(s, ">= 1x river-insert-many", s.RatioVsRiver, 1)
	}
	if s, river := ok(Steady), ok(RiverSteady); s != nil && river != nil {
		riverTargets(s, river)
	}
	if s := ok(Enqueue3Region); s != nil {
		if rtt := s.Metrics["wan_rtt_ms"]; rtt > 0 {
			for _, c := range []struct {
				what string
				p50  float64
			}{{"batch 100", s.P50MS}, {"batch 1", s.Metrics["batch1_p50_ms"]}} {
				s.Targets = append(s.Targets, Target{Goal: "COMMITTED enqueue p50 <= 3 WAN round trips (" + c.what + ")",
					Measured: fmt.Sprintf("%.2f round trips (%.2f ms, round trip %.0f ms)", c.p50/rtt, c.p50, rtt), Met: c.p50 > 0 && c.p50 <= 3*rtt})
			}
		}
	}
}

// riverTargets records triage-steady's targets beside river-steady: at
// River's own rate (the fewest producers both ran: River keeps up there)
// an end-to-end p99 no longer than River's, and, delivered while keeping
// up, at least twice the most River worked in any trial.
func riverTargets(s, river *Scenario) {
	low := 0
	for k := range s.Metrics {
		var n int
		if _, err := fmt.Sscanf(k, "vs_river_p%d_e2e_p99", &n); err == nil && (low == 0 || n < low) {
			low = n
		}
	}
	if low > 0 {
		pre := fmt.Sprintf("p%d_", low)
		v := s.Metrics["vs_river_"+pre+"e2e_p99"]
		s.Targets = append(s.Targets, Target{Goal: fmt.Sprintf("end-to-end p99 <= river-steady's (%d producers)", low),
			Measured: fmt.Sprintf("%.2fx (%.1f against %.1f ms)", v, s.Metrics[pre+"e2e_p99_ms"], river.Metrics[pre+"e2e_p99_ms"]),
			Met:      v > 0 && v <= 1})
	}
	most := 0.0
	for k, v := range river.Metrics {
		if strings.HasSuffix(k, "_worked_per_sec") && strings.HasPrefix(k, "p") {
			most = max(most, v)
		}
	}
	if d := s.Metrics["sustained_delivered_per_sec"]; most > 0 {
		v := d / most
		s.Targets = append(s.Targets, Target{Goal: ">= 2x river-steady's worked rate, delivered while keeping up",
			Measured: fmt.Sprintf("%.2fx (%s/s against %s/s)", v, human(d), human(most)), Met: v >= 2})
	}
}

func fmtRatio(v float64) string {
	if v == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2fx", v)
}

// fmtRiver is a row's ratio to its River peer: "1.25x river-insert-many".
func fmtRiver(s Scenario) string {
	if s.RatioVsRiver == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2fx %s", s.RatioVsRiver, s.RiverPeer)
}

// fmtMS prints a percentile; "-" where the row measured none.
func fmtMS(v float64, s Scenario) string {
	if s.Skipped || s.Error != "" || v == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f", v)
}

// printTable writes the results table, then targets and notes.
func printTable(out io.Writer, rep *Report) {
	mode := "full"
	if rep.Run.Quick {
		mode = "quick (smoke test: short runs, small backlogs; do not quote these numbers)"
	}
	m := rep.Machine
	fmt.Fprintf(out, "\nResults — %s run, %d shards, %d-byte payloads; %d cores (%s), %s, MariaDB %s; "+
		"innodb_flush_log_at_trx_commit=%s sync_binlog=%s binlog_format=%s; load average %.1f at start, %.1f at end\n\n",
		mode, rep.Run.Shards, rep.Run.PayloadBytes, m.Cores, m.CPU, m.GoVersion, m.MariaDBVersion,
		m.Durability["innodb_flush_log_at_trx_commit"], m.Durability["sync_binlog"], m.Durability["binlog_format"],
		rep.Run.LoadAvgStart, rep.Run.LoadAvgEnd)
	if pg := m.Postgres; pg != nil {
		fmt.Fprintf(out, "%s on Postgres %s: fsync=%s synchronous_commit=%s full_page_writes=%s shared_buffers=%s\n\n",
			pg.river(), pg.Version, pg.Settings["fsync"], pg.Settings["synchronous_commit"], pg.Settings["full_page_writes"],
			pg.Settings["shared_buffers"])
	}
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "scenario\titems/s\tp50 ms\tp99 ms\tp99.9 ms\tvs naive\tvs ceiling\tvs River\t")
	for _, s := range rep.Scenarios {
		rate := human(s.ItemsPerSec)
		switch {
		case s.Error != "":
			rate = "FAILED"
		case s.Skipped:
			rate = "skipped"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", s.Name, rate, fmtMS(s.P50MS, s), fmtMS(s.P99MS, s), fmtMS(s.P999MS, s),
			fmtRatio(s.RatioVsNaive), fmtRatio(s.RatioVsCeiling), fmtRiver(s))
	}
	tw.Flush()

	fmt.Fprintln(out, "\nTargets:")
	any := false
	for _, s := range rep.Scenarios {
		for _, t := range s.Targets {
			any = true
			mark := "met   "
			if !t.Met {
				mark = "MISSED"
			}
			fmt.Fprintf(out, "  %s %s: %s (measured %s)\n", mark, s.Name, t.Goal, t.Measured)
		}
	}
	if !any {
		fmt.Fprintln(out, "  none could be evaluated")
	}

	fmt.Fprintln(out, "\nWhat each row measures:")
	for _, s := range rep.Scenarios {
		var parts []string
		if s.Latency != "" {
			parts = append(parts, "latency = "+s.Latency)
		}
		if s.RatioVsRiver > 0 {
			parts = append(parts, fmtRiver(s))
		}
		if s.Notes != "" {
			parts = append(parts, s.Notes)
		}
		if s.Error != "" {
			parts = append(parts, "error: "+s.Error)
		}
		fmt.Fprintf(out, "  %s (%.0fs): %s\n", s.Name, s.Seconds, strings.Join(parts, "; "))
	}
	fmt.Fprintln(out)
}
