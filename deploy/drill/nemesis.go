package drill

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
)

// NemesisConfig of one nemesis run.
type NemesisConfig struct {
	// Bed injects and heals the faults and names the routers. Required.
	Bed Bed
	// Region holds the workload's items (default: the first region).
	Region string
	// Duration is how long faults are injected; the workload runs through
	// it, then produces 5 s more after the last heal and drains.
	Duration time.Duration
	// Seed decides the fault schedule: the same seed on the same bed
	// replays the same faults at the same offsets.
	Seed uint64
	// Lease consumers take (default 5 s); Producers and Consumers per
	// router (default 2 and 2); Drain limit after the last heal (90 s).
	Lease                time.Duration
	Producers, Consumers int
	Drain                time.Duration
	// Progress gets a line per fault and phase.
	Progress io.Writer
}

// NemesisEvent is one step of the fault timeline.
type NemesisEvent struct {
	// AtMS counts from the start of the faults.
	AtMS     int64  `json:"at_ms"`
	Action   string `json:"action"` // inject or heal
	Scenario string `json:"scenario"`
	Region   string `json:"region"`
	Shard    uint32 `json:"shard,omitempty"`
	Detail   string `json:"detail,omitempty"`
	Error    string `json:"error,omitempty"`
}

// NemesisReport is what a nemesis run found: the fault timeline and the
// checks of the whole history (Checks: lost, acks and nacks undone, keys
// delivered twice, early deliveries, duplicates by cause, priority
// inversions). Violations must be empty.
type NemesisReport struct {
	Seed   uint64         `json:"seed"`
	Region string         `json:"region"`
	Faults map[string]int `json:"faults"`
	// Overlapping counts the faults injected while another was in effect.
	Overlapping int            `json:"overlapping"`
	Timeline    []NemesisEvent `json:"timeline"`
	Checks      *Report        `json:"checks"`
	// Violations are the checks' and the bed's: a fault that could not be
	// healed leaves the bed broken behind the run.
	Violations []string `json:"violations"`
	// NotInjected are the faults the bed could not inject (a process
	// that cannot start while another fault holds NATS without a quorum,
	// say): they tested nothing and are not in Faults, but the queue
	// broke no promise either.
	NotInjected []string `json:"not_injected,omitempty"`
}

// nemesisScenarios are the faults the schedule draws from, with weights.
// The heavy ones fault a primary or a region's links; the light ones a
// single process or the WAN's latency, and only they are drawn as a
// second fault overlapping another. region-down comes last if at all:
// the process bed restarts a downed region's mariadbds on heal, but not
// its NATS server and node.
var nemesisScenarios = []struct {
	scenario string
	weight   int
	light    bool
}{
	{"primary-kill", 3, false}, {"partition", 3, false}, {"mariadb-pause", 2, false},
	{"nats-kill", 2, true}, {"dequeuer-kill", 2, true}, {"enqueuer-kill", 2, true}, {"wan-spike", 2, true},
}

// Holds of the schedule's faults. A paused mariadbd is held past the
// clients' timeouts (the driver's read timeout, schema.ReadTimeout, is
// 30 s), long after the controller detects it down and fails the shard
// over, so that it wakes up deposed with the transactions it had open.
const (
	minHold, maxHold           = 4 * time.Second, 12 * time.Second
	minPauseHold, maxPauseHold = 32 * time.Second, 40 * time.Second
)

// overlapOneIn: one fault in this many gets a second, light fault of
// another kind and another region injected during its hold.
const overlapOneIn = 4

// Schedule is the faults a seed gives for a run of d over regions with
// the workload's items in region and its shards home. Each fault waits
// 2-6 s after every earlier one healed and holds 4-12 s (a mariadb-pause
// 32-40 s); one in overlapOneIn gets a second, light fault (nats-kill,
// dequeuer-kill, enqueuer-kill or wan-spike) of another kind in another
// region, injected during its hold and held 4-12 s, so two faults are in
// effect at once; region-down may close the run, alone. The result is in
// injection order. It is pure, so a seed replays.
func Schedule(seed uint64, d time.Duration, regions []string, region string, home []uint32) []ScheduledFault {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	draw := func(lightOnly bool, not string) string {
		total := 0
		for _, s := range nemesisScenarios {
			if (s.light || !lightOnly) && s.scenario != not {
				total += s.weight
			}
		}
		pick := rng.IntN(total)
		for _, s := range nemesisScenarios {
			if (!s.light && lightOnly) || s.scenario == not {
				continue
			}
			if pick < s.weight {
				return s.scenario
			}
			pick -= s.weight
		}
		panic("unreachable")
	}
	holdOf := func(sc string) time.Duration {
		if sc == "mariadb-pause" {
			return minPauseHold + time.Duration(rng.Int64N(int64(maxPauseHold-minPauseHold)/int64(time.Millisecond)))*time.Millisecond
		}
		return minHold + time.Duration(rng.Int64N(int64(maxHold-minHold)/int64(time.Millisecond)))*time.Millisecond
	}
	fault := func(sc, notRegion string) Fault {
		f := Fault{Scenario: sc, Region: regions[rng.IntN(len(regions))]}
		switch {
		case sc == "primary-kill" || sc == "mariadb-pause":
			f.Region = region
			f.Shard = home[rng.IntN(len(home))]
		case f.Region == notRegion && len(regions) > 1:
			// Another region: the next one, so the draw stays one call.
			f.Region = regions[(slices.Index(regions, f.Region)+1)%len(regions)]
		}
		return f
	}
	var out []ScheduledFault
	last := 0 // index in out of the last group's first fault
	at := time.Duration(0)
	for {
		gap := time.Duration(2000+rng.IntN(4000)) * time.Millisecond
		sc := draw(false, "")
		hold := holdOf(sc)
		if at+gap+hold > d {
			break
		}
		at += gap
		first := ScheduledFault{Fault: fault(sc, ""), After: at, Hold: hold}
		last = len(out)
		out = append(out, first)
		end := at + hold
		if len(regions) > 1 && rng.IntN(overlapOneIn) == 0 {
			sc2 := draw(true, sc)
			hold2 := holdOf(sc2)
			after2 := at + time.Duration(rng.Int64N(int64(hold)/int64(time.Millisecond)))*time.Millisecond
			if after2+hold2 <= d {
				out = append(out, ScheduledFault{Fault: fault(sc2, first.Fault.Region), After: after2, Hold: hold2})
				end = max(end, after2+hold2)
			}
		}
		at = end
	}
	if len(out) > 0 && rng.IntN(2) == 0 {
		out = out[:last+1]
		out[last].Fault = Fault{Scenario: "region-down", Region: regions[rng.IntN(len(regions))]}
		out[last].Hold = min(out[last].Hold, maxHold)
	}
	return out
}

// ScheduledFault is one fault of a schedule: injected After from the
// start, healed Hold after it was injected.
type ScheduledFault struct {
	Fault Fault
	After time.Duration
	Hold  time.Duration
}

// Nemesis runs the drill's workload (idempotent producers with dedup keys
// and retries, consumers that ack, nack and crash) through every router
// while a seeded schedule injects and heals faults, one or two at a time,
// then drains and checks the whole history.
func Nemesis(ctx context.Context, cfg NemesisConfig) (*NemesisReport, error) {
	if cfg.Bed == nil {
		return nil, configError("no bed to run against")
	}
	if cfg.Duration <= 0 {
		return nil, configError("the duration must be positive")
	}
	cfg.fill()
	progress := cfg.Progress
	if progress == nil {
		progress = io.Discard
	}
	routers, err := cfg.Bed.Routers(ctx)
	if err != nil {
		return nil, fmt.Errorf("find the bed's routers: %w", err)
	}
	if len(routers) == 0 {
		return nil, configError("the bed has no routers")
	}
	cfg.Region = cmp.Or(cfg.Region, routers[0].Region)
	clients, admins, closeAll, err := connect(routers)
	if err != nil {
		return nil, err
	}
	defer closeAll()
	var regions []string
	for _, r := range routers {
		regions = append(regions, r.Region)
	}
	if !slices.Contains(regions, cfg.Region) {
		return nil, configError("region %q: the bed's regions are %v", cfg.Region, regions)
	}
	home, mapRegions, err := nemesisShards(ctx, admins[0], cfg.Region)
	if err != nil {
		return nil, err
	}
	ns := "nemesis-" + cfg.Region
	if err := confine(ctx, admins[0], admins, ns, cfg.Region, mapRegions, home); err != nil {
		return nil, err
	}
	plan := Schedule(cfg.Seed, cfg.Duration, regions, cfg.Region, home)
	rep := &NemesisReport{Seed: cfg.Seed, Region: cfg.Region, Faults: map[string]int{}}
	fmt.Fprintf(progress, "nemesis seed %d: %d faults over %s, items in %s (shards %v), %d producers and %d consumers on each router (%s)\n",
		cfg.Seed, len(plan), cfg.Duration, cfg.Region, home, cfg.Producers, cfg.Consumers, strings.Join(regions, ", "))

	w := newWorkload(ns, "nemesis", cfg.Region, cfg.Lease)
	load := w.launch(ctx, clients, cfg.Producers, cfg.Consumers, cfg.Seed)
	defer load.cancel()
	start := time.Now()
	rep.Overlapping = run(ctx, cfg.Bed, plan, start, rep.recorder(start, progress), func(f Fault) { rep.Faults[f.Scenario]++ })
	sleep(ctx, 5*time.Second)
	load.stopProducers()
	load.drain(ctx, cfg.Drain, cfg.Lease, progress)
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	rep.check(ctx, w, clients, ns, regions, home, start)
	return rep, nil
}

// fill gives the durations and counts cfg leaves zero their defaults.
func (cfg *NemesisConfig) fill() {
	cfg.Lease = cmp.Or(cfg.Lease, 5*time.Second)
	cfg.Producers = cmp.Or(cfg.Producers, 2)
	cfg.Consumers = cmp.Or(cfg.Consumers, 2)
	cfg.Drain = cmp.Or(cfg.Drain, 90*time.Second)
}

// nemesisShards reads the shard map through admin and returns the shards
// homed in region, in order, and the map's regions.
func nemesisShards(ctx context.Context, admin triagev1.AdminClient, region string) (home []uint32, regions []string, err error) {
	before, err := getMap(ctx, admin)
	if err != nil {
		return nil, nil, fmt.Errorf("read the shard map: %w", err)
	}
	home, _ = homeShards(before, region)
	if len(home) == 0 {
		return nil, nil, configError("no shard is homed in region %q", region)
	}
	return home, before.Regions, nil
}

// recorder returns the event callback of run: it adds each injection and
// heal to the timeline, timed from start, a failed heal to the
// violations and a failed injection to NotInjected, and writes it to
// progress.
func (r *NemesisReport) recorder(start time.Time, progress io.Writer) func(string, Fault, string, error) {
	return func(action string, f Fault, detail string, err error) {
		e := NemesisEvent{AtMS: time.Since(start).Milliseconds(), Action: action, Scenario: f.Scenario, Region: f.Region, Shard: f.Shard, Detail: detail}
		if err != nil {
			e.Error = err.Error()
			what := fmt.Sprintf("%s %s in %s at %s: %v", action, f.Scenario, f.Region, fmtMS(e.AtMS), err)
			if action == "inject" {
				r.NotInjected = append(r.NotInjected, what)
			} else {
				r.Violations = append(r.Violations, what)
			}
		}
		r.Timeline = append(r.Timeline, e)
		fmt.Fprintf(progress, "%s %-6s %s %s: %s%s\n", fmtMS(e.AtMS), action, f.Scenario, f.Region, detail, errSuffix(err))
	}
}

// check runs the drill's checks over w's whole history, as if one fault
// of every home shard had lasted from start until now, seen by every
// router of regions as a survivor, asks what became of lost items (through
// clients, in namespace ns), and puts the checks' violations before the
// bed's.
func (r *NemesisReport) check(ctx context.Context, w *workload, clients []client, ns string, regions []string, home []uint32, start time.Time) {
	checks := &Report{Scenario: "nemesis", Routers: regions, Shards: home, FaultAt: start, HealedAt: time.Now()}
	survivors := map[string]bool{}
	for _, region := range regions {
		survivors[region] = true
	}
	shards := map[uint32]bool{}
	for _, s := range home {
		shards[s] = true
	}
	w.mu.Lock()
	analyze(checks, &w.h, facts{faultAt: start, cutAt: start, healAt: time.Now(), shards: shards,
		routers: regions, survivors: survivors, published: map[uint32]time.Time{}})
	w.mu.Unlock()
	r.Checks = checks
	if len(checks.LostIDs) > 0 {
		checks.LostState = lostState(ctx, clients, ns, checks.LostIDs)
		w.mu.Lock()
		for _, id := range checks.LostIDs {
			if story := keyStory(&w.h, id, start); story != "" {
				checks.LostState[id] += "; " + story
			}
		}
		w.mu.Unlock()
	}
	r.Violations = append(checks.Violations, r.Violations...)
	if checks.Acknowledged == 0 {
		r.Violations = append(r.Violations, "no enqueue was acknowledged: the run checked nothing")
	}
}

// run injects and heals plan's faults: each at start plus its After, and
// healed Hold after its injection returned, two at once where the plan
// overlaps them. A fault whose injection failed is not healed. It calls
// injected for each fault in effect and returns how many were injected
// while another was in effect.
func run(ctx context.Context, bed Bed, plan []ScheduledFault, start time.Time, event func(string, Fault, string, error), injected func(Fault)) int {
	type step struct {
		at   time.Time
		heal bool
		sf   ScheduledFault
	}
	var steps []step
	for _, sf := range plan {
		steps = append(steps, step{at: start.Add(sf.After), sf: sf})
	}
	inEffect, overlapping := 0, 0
	for len(steps) > 0 {
		// The earliest step next; injections and heals run one at a time.
		i := 0
		for j := range steps {
			if steps[j].at.Before(steps[i].at) {
				i = j
			}
		}
		st := steps[i]
		steps = slices.Delete(steps, i, i+1)
		if !st.heal {
			sleep(ctx, time.Until(st.at))
			if ctx.Err() != nil {
				continue // cancelled: inject nothing more, heal what is in effect
			}
			// A step that ran long (a slow heal) makes this injection
			// late, and its heal is timed from when it lands: the
			// injections after it move by as much, or the next could
			// land before this one's heal, two heavy faults at once.
			if late := time.Since(st.at); late > 0 {
				for j := range steps {
					if !steps[j].heal {
						steps[j].at = steps[j].at.Add(late)
					}
				}
			}
			inj, err := bed.Inject(ctx, st.sf.Fault)
			event("inject", st.sf.Fault, inj.Description, err)
			if err != nil {
				continue
			}
			injected(st.sf.Fault)
			if inEffect > 0 {
				overlapping++
			}
			inEffect++
			steps = append(steps, step{at: time.Now().Add(st.sf.Hold), heal: true, sf: st.sf})
			continue
		}
		// A heal is due even when the run is cancelled: nothing is left
		// broken behind.
		sleep(ctx, time.Until(st.at))
		healed, err := bed.Heal(context.WithoutCancel(ctx), st.sf.Fault)
		event("heal", st.sf.Fault, healed, err)
		inEffect--
	}
	return overlapping
}

// keyStory tells, for the report of a lost item, every enqueue attempt of
// its dedup key and every delivery of it, timed from from: what the
// producer was told and what the consumers saw.
func keyStory(h *history, id string, from time.Time) string {
	s, ok := h.sent[id]
	if !ok {
		return ""
	}
	at := func(t time.Time) string { return fmt.Sprintf("%+.3fs", t.Sub(from).Seconds()) }
	var parts []string
	for _, c := range h.enqueues {
		if c.key != s.key {
			continue
		}
		what := c.code.String()
		if c.ok {
			what = "ok " + c.id
			if c.dup {
				what += " (duplicate)"
			}
		}
		parts = append(parts, fmt.Sprintf("enqueue via %s %s..%s: %s", c.router, at(c.start), at(c.end), what))
	}
	for _, d := range h.deliveries {
		if d.key == s.key {
			parts = append(parts, fmt.Sprintf("delivered %s via %s at %s (attempt %d, %s)", d.id, d.router, at(d.at), d.attempts, d.action))
		}
	}
	return strings.Join(parts, "; ")
}

// lostState asks the routers, in turn, what became of each lost item.
func lostState(ctx context.Context, clients []client, ns string, ids []string) map[string]string {
	out := map[string]string{}
	for _, id := range ids {
		// Every router is asked: one whose map is stale reads another
		// server, and their answers differing is a finding of its own.
		var answers []string
		for _, c := range clients {
			rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			it, err := c.q.GetItem(rctx, &triagev1.GetItemRequest{Namespace: ns, Id: id})
			cancel()
			switch {
			case err == nil:
				answers = append(answers, fmt.Sprintf("still stored: %s, %d attempts, deliver after %s (via %s)",
					it.State, it.Attempts, it.GetDeliverAfter().AsTime().Format(time.RFC3339Nano), c.region))
			case status.Code(err) == codes.NotFound:
				answers = append(answers, "not found (via "+c.region+")")
			default:
				answers = append(answers, fmt.Sprintf("unknown (via %s): %v", c.region, err))
			}
		}
		out[id] = strings.Join(answers, "; ")
	}
	return out
}

func errSuffix(err error) string {
	if err == nil {
		return ""
	}
	return " FAILED: " + err.Error()
}

// Print writes the report for a reader: the timeline, the faults by kind,
// the checks, and the seed to replay it.
func (r *NemesisReport) Print(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "nemesis seed %d, items in %s\n", r.Seed, r.Region)
	for _, e := range r.Timeline {
		fmt.Fprintf(tw, "  %s\t%s\t%s %s\t%s%s\n", fmtMS(e.AtMS), e.Action, e.Scenario, e.Region, e.Detail,
			map[bool]string{true: " FAILED: " + e.Error}[e.Error != ""])
	}
	kinds := make([]string, 0, len(r.Faults))
	for k := range r.Faults {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	var parts []string
	for _, k := range kinds {
		parts = append(parts, fmt.Sprintf("%s %d", k, r.Faults[k]))
	}
	fmt.Fprintf(tw, "  faults injected\t%s (%d while another was in effect)\n", strings.Join(parts, ", "), r.Overlapping)
	for _, n := range r.NotInjected {
		fmt.Fprintf(tw, "  not injected\t%s\n", n)
	}
	if c := r.Checks; c != nil {
		fmt.Fprintf(tw, "  acknowledged enqueues\t%d\n", c.Acknowledged)
		fmt.Fprintf(tw, "  delivered (distinct)\t%d\n", c.Delivered)
		fmt.Fprintf(tw, "  acks / nacks answered ok\t%d / %d\n", c.AcksOK, c.NacksOK)
		fmt.Fprintf(tw, "  lost (must be 0)\t%d\n", c.Lost)
		for _, id := range sortedKeys(c.LostState) {
			fmt.Fprintf(tw, "  \t%s: %s\n", id, c.LostState[id])
		}
		fmt.Fprintf(tw, "  resurrected after ack (must be 0)\t%d deliveries of %d items\n", c.ResurrectedAfterAck, c.ResurrectedItems)
		fmt.Fprintf(tw, "  keys delivered again after their ack (must be 0)\t%d\n", c.KeysDeliveredAgain)
		fmt.Fprintf(tw, "  nacks undone (must be 0)\t%d\n", c.NacksUndone)
		fmt.Fprintf(tw, "  early deliveries (must be 0)\t%d\n", c.EarlyDeliveries)
		fmt.Fprintf(tw, "  delivered IDs no enqueue was answered with\t%d\n", c.UnknownIDs)
		fmt.Fprintf(tw, "  duplicates\t%s\n", fmtCounts(c.Duplicates))
		fmt.Fprintf(tw, "  priority inversions (ready >= 5 ms)\t%d\n", c.PriorityInversions)
		fmt.Fprintf(tw, "  enqueue errors\t%s\n", fmtCounts(c.EnqueueErrors))
		fmt.Fprintf(tw, "  dequeue errors\t%s\n", fmtCounts(c.DequeueErrors))
		for _, ex := range slices.Concat(c.ResurrectedExamples, c.KeysDeliveredAgainExamples, c.NacksUndoneExamples, c.EarlyExamples) {
			fmt.Fprintf(tw, "  \t%s\n", ex)
		}
	}
	verdict := "PASS"
	if len(r.Violations) > 0 {
		verdict = "FAIL: " + strings.Join(r.Violations, "; ") + fmt.Sprintf(" (replay: --seed %d)", r.Seed)
	}
	fmt.Fprintf(tw, "  result\t%s\n", verdict)
	tw.Flush()
}
