package drill

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
)

// Scenarios are the drills Run knows.
var Scenarios = []string{"primary-kill", "region-down", "partition", "nats-kill", "dequeuer-kill",
	"mariadb-pause", "enqueuer-kill", "wan-spike"}

// Router is one router the workload talks to.
type Router struct {
	Region string
	// Addr is its gRPC address.
	Addr string
	// Token, when set, is the API key sent with every RPC (a bed with
	// authentication on).
	Token string
}

// dial connects to r, with its key when it has one.
func dial(r Router) (*grpc.ClientConn, error) {
	opts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	if r.Token != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(bearer(r.Token)))
	}
	return grpc.NewClient(r.Addr, opts...)
}

// bearer sends "authorization: Bearer <key>"; beds are on loopback, so
// plaintext is allowed.
type bearer string

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}

func (bearer) RequireTransportSecurity() bool { return false }

// Fault is what a drill breaks: Scenario (one of Scenarios) in Region;
// Shard is the shard whose primary a primary-kill kills or a
// mariadb-pause pauses (Run resolves it to the region's lowest when the
// Config leaves it 0), and the shard whose old primary Fate describes.
type Fault struct {
	Scenario string
	Region   string
	Shard    uint32
}

// Bed is the running bed a drill works against. The process bed of
// `triage up` implements it through its control endpoint (deploy/bed
// Client), the docker-compose bed through the docker CLI (deploy/compose
// Bed); the drill, its workload and its report are the same on both.
type Bed interface {
	// Routers lists the router of every region, in region order.
	Routers(ctx context.Context) ([]Router, error)
	// Inject breaks what f names and says what it did and when it took
	// effect:
	//
	//	primary-kill   kill the shard's current primary (no clean shutdown)
	//	region-down    kill every process of the region
	//	partition      cut the region off from every other region
	//	nats-kill      kill the region's NATS server
	//	dequeuer-kill  kill the region's dequeuer (no lease hand-back)
	//	mariadb-pause  stop the shard's current primary mariadbd (SIGSTOP,
	//	               docker pause): alive but silent, its connections open
	//	enqueuer-kill  kill an enqueuer of the region alone (no nak of what
	//	               it pulled, its transactions cut off)
	//	wan-spike      add hundreds of milliseconds of one-way latency to
	//	               every link between the region and the others
	Inject(ctx context.Context, f Fault) (Injection, error)
	// Heal undoes Inject: it reconnects what was cut, restarts what was
	// killed, wakes what was paused (SIGCONT, docker unpause) and restores
	// the latency; a primary the shard failed over from is restarted so
	// that crash recovery drops what no replica acknowledged and the
	// controller rejoins it as a replica (replication.RejoinArgs). A paused
	// one first runs awake for a few seconds, with the sessions and
	// transactions it had open, before that crash.
	Heal(ctx context.Context, f Fault) (string, error)
	// Fate says what the shard's primary from before the fault is now,
	// giving the controller a few seconds to rejoin it: "rejoined as a
	// read-only replica of ..." is the good answer.
	Fate(ctx context.Context, f Fault) (string, error)
}

// Injection is a fault Inject put in place.
type Injection struct {
	// Description says what was done, for the report.
	Description string
	// At is when the fault took effect, where the bed knows it exactly
	// (the compose bed: docker's record of the kill or the disconnect);
	// zero means "by the time Inject returned".
	At time.Time
}

// Config of one drill.
type Config struct {
	Scenario string
	// Bed injects and heals the fault and names the routers. Required.
	Bed Bed
	// Via are the regions whose routers carry the workload, each with its
	// own producers and consumers. Default: every region's, the faulted
	// one's included: a fault test watches both sides, and what the
	// cut-off side acknowledges is what a partition loses.
	Via []string
	// Region is the faulted region; the workload's items live there.
	Region string
	// Shard to kill for primary-kill (0: the region's lowest).
	Shard uint32
	// Warmup before the fault (default 5s), Hold of the fault (15s),
	// Drain limit after heal (90s).
	Warmup, Hold, Drain time.Duration
	// Producers and Consumers per router. Default 2 and 2.
	Producers, Consumers int
	// Lease consumers take. Default 5s.
	Lease time.Duration
	// Progress gets a line per phase.
	Progress io.Writer
	// Report sends every Progress line, the drill's phase and, at the end,
	// its verdict and the report's summary to ReportDrill of the first
	// router that survives the fault (the console's Drills view shows
	// them). Best effort: a failure is printed once to Progress and never
	// fails or slows the drill.
	Report bool
	// ID names the drill reported. Default: the scenario and the start
	// time ("primary-kill-20060102T150405Z").
	ID string
}

// Run runs one drill and returns its report.
func Run(ctx context.Context, cfg Config) (rep *Report, err error) {
	routers, err := drillRouters(ctx, cfg)
	if err != nil {
		return nil, err
	}
	cfg.fill()
	started := time.Now()
	clients, admins, closeAll, err := connect(routers)
	if err != nil {
		return nil, err
	}
	defer closeAll()
	d := newDrillRun(cfg, routers, clients, admins)
	if cfg.Report {
		r := d.startReporting(started)
		defer func() { d.finishReporting(ctx, r, rep, err) }()
	}
	if err := d.pickShards(ctx); err != nil {
		return nil, err
	}
	ns := "drill-" + cfg.Region
	if err := confine(ctx, d.admin, admins, ns, cfg.Region, d.regions, d.home); err != nil {
		return nil, err
	}
	w := newWorkload(ns, "drill-"+cfg.Scenario, cfg.Region, cfg.Lease)
	load := w.launch(ctx, clients, cfg.Producers, cfg.Consumers, 0)
	defer load.cancel()
	fmt.Fprintf(d.progress, "drill %s: %d producers and %d consumers on each router (%s), items in region %s (shards %v)\n",
		cfg.Scenario, cfg.Producers, cfg.Consumers, strings.Join(d.f.routers, ", "), cfg.Region, shortList(d.rep.Shards))
	sleep(ctx, cfg.Warmup)
	if err := d.injectAndHold(ctx); err != nil {
		return nil, err
	}
	d.heal(ctx)
	sleep(ctx, 5*time.Second)
	load.stopProducers()
	d.phase(PhaseDraining)
	load.drain(ctx, cfg.Drain, cfg.Lease, d.progress)
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	d.conclude(ctx, w, clients, ns)
	return d.rep, nil
}

// drillRouters checks cfg's scenario and bed and returns the routers the
// workload runs through: cfg.Via's, or every region's. It fails before
// the drill touches the bed.
func drillRouters(ctx context.Context, cfg Config) ([]Router, error) {
	if !slices.Contains(Scenarios, cfg.Scenario) {
		return nil, configError("unknown scenario %q: allowed %s", cfg.Scenario, strings.Join(Scenarios, ", "))
	}
	if cfg.Bed == nil {
		return nil, configError("no bed to run against")
	}
	all, err := cfg.Bed.Routers(ctx)
	if err != nil {
		return nil, fmt.Errorf("find the bed's routers: %w", err)
	}
	var routers []Router
	var names []string
	for _, r := range all {
		names = append(names, r.Region)
		if len(cfg.Via) == 0 || slices.Contains(cfg.Via, r.Region) {
			routers = append(routers, r)
		}
	}
	if len(routers) == 0 {
		return nil, configError("no router to run the workload through: via %v, the bed's regions are %v", cfg.Via, names)
	}
	return routers, nil
}

// fill gives the durations and counts cfg leaves zero their defaults.
func (cfg *Config) fill() {
	cfg.Warmup = cmp.Or(cfg.Warmup, 5*time.Second)
	cfg.Hold = cmp.Or(cfg.Hold, 15*time.Second)
	cfg.Drain = cmp.Or(cfg.Drain, 90*time.Second)
	cfg.Lease = cmp.Or(cfg.Lease, 5*time.Second)
	cfg.Producers = cmp.Or(cfg.Producers, 2)
	cfg.Consumers = cmp.Or(cfg.Consumers, 2)
}

// drillRun is one run of Run: its configuration, where it reports, what
// it knows about the fault, and the report it fills.
type drillRun struct {
	cfg Config
	// progress gets the drill's lines, and phase its phases: the
	// reporter's when it reports to a router.
	progress io.Writer
	phase    func(string)
	f        facts
	// admin is the Admin client of the first router that survives the
	// fault, or of the only router when none does (it is asked while it
	// answers).
	admin triagev1.AdminClient
	// regions are the bed's regions, per the shard map; home the shards
	// homed in the faulted region, in order, and primaries their
	// primaries before the fault.
	regions   []string
	home      []uint32
	primaries map[uint32]string
	fault     Fault
	rep       *Report
}

// newDrillRun sets a drill up over routers, dialed as clients and admins
// (in routers' order).
func newDrillRun(cfg Config, routers []Router, clients []client, admins []triagev1.AdminClient) *drillRun {
	d := &drillRun{cfg: cfg, progress: cfg.Progress, phase: noReporter{}.phase,
		f: facts{shards: map[uint32]bool{}, survivors: map[string]bool{}, published: map[uint32]time.Time{}}}
	if d.progress == nil {
		d.progress = io.Discard
	}
	for i, r := range routers {
		d.f.routers = append(d.f.routers, r.Region)
		if survives(cfg.Scenario, cfg.Region, r.Region) {
			d.f.survivors[r.Region] = true
			if d.admin == nil {
				d.admin = admins[i]
			}
		}
	}
	if d.admin == nil {
		d.admin = admins[0]
	}
	if cfg.Scenario == "partition" {
		d.f.isolated = cfg.Region
	}
	return d
}

// startReporting sends the drill's lines and phases to ReportDrill of
// d.admin's router from here on (Config.Report), under cfg.ID or an ID
// made of the scenario and started.
func (d *drillRun) startReporting(started time.Time) *reporter {
	id := cmp.Or(d.cfg.ID, d.cfg.Scenario+"-"+started.UTC().Format("20060102T150405Z"))
	r := newReporter(d.admin, id, d.cfg.Scenario, d.progress)
	d.progress, d.phase = r, r.phase
	d.phase(PhaseStarting)
	return r
}

// finishReporting reports the drill's outcome through r: the error it
// failed with, or rep's verdict and printout. It flushes whatever the
// outcome; a context already cancelled still gets a moment to say so.
func (d *drillRun) finishReporting(ctx context.Context, r *reporter, rep *Report, err error) {
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), flushTimeout)
	defer cancel()
	if err != nil {
		r.finish(fctx, "ERROR: "+err.Error(), nil)
		return
	}
	var buf bytes.Buffer
	rep.Print(&buf)
	r.finish(fctx, rep.Verdict(), strings.Split(buf.String(), "\n"))
}

// pickShards reads the shard map and picks the faulted shards (see
// faulted): for a primary-kill or mariadb-pause those on the server of
// cfg.Shard, by default the region's lowest. It starts the report with
// them.
func (d *drillRun) pickShards(ctx context.Context) error {
	before, err := getMap(ctx, d.admin)
	if err != nil {
		return fmt.Errorf("read the shard map: %w", err)
	}
	d.regions = before.Regions
	d.home, d.primaries = homeShards(before, d.cfg.Region)
	switch {
	case len(d.home) == 0:
		return configError("no shard is homed in region %q", d.cfg.Region)
	case d.cfg.Shard == 0:
		d.cfg.Shard = d.home[0]
	case !slices.Contains(d.home, d.cfg.Shard):
		return configError("shard %d is not homed in region %q: its shards are %v", d.cfg.Shard, d.cfg.Region, d.home)
	}
	d.f.shards = faulted(d.cfg.Scenario, d.cfg.Shard, d.home, d.primaries)
	d.fault = Fault{Scenario: d.cfg.Scenario, Region: d.cfg.Region, Shard: d.cfg.Shard}
	d.rep = &Report{Scenario: d.cfg.Scenario, Routers: d.f.routers, MapBefore: describeMap(before, d.cfg.Region)}
	for id := range d.f.shards {
		d.rep.Shards = append(d.rep.Shards, id)
	}
	slices.Sort(d.rep.Shards)
	return nil
}

// faulted returns the shards a scenario's fault reaches, of the region's
// home shards: for a fault of one server (primary-kill, mariadb-pause)
// the shards whose primary it is, shard's and those sharing its server;
// for the others every home shard. The drill's items spread over every
// home shard, so recovery (RTO) is the first call served on any shard of
// the fault: with one shard of a server's 251 counted, the RTO at 1,000
// shards was the wait until a call happened to land on that one shard
// (9.6-23 s), not the recovery.
func faulted(scenario string, shard uint32, home []uint32, primaries map[uint32]string) map[uint32]bool {
	out := map[uint32]bool{}
	for _, id := range home {
		if scenario != "primary-kill" && scenario != "mariadb-pause" || primaries[id] == primaries[shard] {
			out[id] = true
		}
	}
	return out
}

// homeShards returns the shards of m homed in region, in order, and
// their primaries.
func homeShards(m *triagev1.ShardMap, region string) (home []uint32, primaries map[uint32]string) {
	primaries = map[uint32]string{}
	for _, s := range m.Shards {
		if s.HomeRegion == region {
			primaries[s.Id] = s.Primary
			home = append(home, s.Id)
		}
	}
	slices.Sort(home)
	return home, primaries
}

// injectAndHold injects the fault, holds it for cfg.Hold and reports
// when it took effect and when the new primaries were published.
//
// The failover is watched from before the injection: the compose bed's
// docker CLI can take seconds to return after the fault took effect, and
// a watch started only then saw the new primary that much later. It
// times what it sees once it knows when the fault took effect.
func (d *drillRun) injectAndHold(ctx context.Context) error {
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	faultKnown := make(chan struct{})
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		faultAt := func() (time.Time, bool) {
			select {
			case <-faultKnown:
				return d.f.faultAt, true
			case <-watchCtx.Done():
				return time.Time{}, false
			}
		}
		watchFailover(watchCtx, d.admin, d.primaries, d.f.shards, d.f.published, faultAt, d.progress)
		if len(d.f.published) == len(d.f.shards) {
			d.phase(PhaseFailedOver)
		}
	}()
	injecting := time.Now()
	inj, err := d.cfg.Bed.Inject(ctx, d.fault)
	if err != nil {
		stopWatch()
		<-watched
		return fmt.Errorf("inject %s: %w", d.cfg.Scenario, err)
	}
	d.injected(inj, injecting, time.Now())
	close(faultKnown)
	sleep(ctx, d.cfg.Hold)
	stopWatch()
	<-watched
	d.rep.FailoverMS = -1
	if len(d.f.published) == len(d.f.shards) {
		for _, t := range d.f.published {
			d.rep.FailoverMS = max(d.rep.FailoverMS, t.Sub(d.f.faultAt).Milliseconds())
		}
	}
	return nil
}

// injected records inj, asked for at injecting and returned at injected.
// The clocks start when the fault took effect: as the bed recorded it, or
// else once Inject returned, when it is certainly in place. A call sent
// while the bed was still injecting (the compose bed's docker CLI takes a
// second or more) may have been served before the fault took effect,
// which would pass for a recovery.
func (d *drillRun) injected(inj Injection, injecting, injected time.Time) {
	d.f.faultAt = injected
	if at := inj.At; !at.IsZero() && at.After(injecting) && at.Before(injected) {
		d.f.faultAt = at
	}
	d.f.cutAt = d.f.faultAt
	d.rep.FaultAt = d.f.faultAt
	d.rep.InjectMS = injected.Sub(injecting).Milliseconds()
	d.rep.Fault = inj.Description
	d.phase(PhaseFaulted)
	fmt.Fprintf(d.progress, "fault injected in %s, in effect %s before that: %s; holding %s\n", injected.Sub(injecting).Round(time.Millisecond),
		injected.Sub(d.f.faultAt).Round(time.Millisecond), inj.Description, d.cfg.Hold)
}

// heal heals the fault. A heal that fails still gets a report: the
// figures up to here are what the drill is for, and the failure is a
// violation of its own.
func (d *drillRun) heal(ctx context.Context) {
	d.f.healAt = time.Now()
	if healed, err := d.cfg.Bed.Heal(ctx, d.fault); err != nil {
		d.rep.HealError = err.Error()
		fmt.Fprintf(d.progress, "heal failed: %v; draining anyway (up to %s)\n", err, d.cfg.Drain)
	} else {
		fmt.Fprintf(d.progress, "healed in %s: %s; producing 5s more, then draining (up to %s)\n",
			time.Since(d.f.healAt).Round(time.Millisecond), healed, d.cfg.Drain)
	}
	d.phase(PhaseHealed)
	d.rep.HealedAt = time.Now()
}

// conclude fills the report once the workload has stopped: the checks of
// w's history, what became of lost items (asked through clients, in
// namespace ns), the shard map after, the controller's failover steps and
// the old primary's fate.
func (d *drillRun) conclude(ctx context.Context, w *workload, clients []client, ns string) {
	rep := d.rep
	w.mu.Lock()
	analyze(rep, &w.h, d.f)
	w.mu.Unlock()
	if len(rep.LostIDs) > 0 {
		rep.LostState = lostState(ctx, clients, ns, rep.LostIDs)
		w.mu.Lock()
		for _, id := range rep.LostIDs {
			if story := keyStory(&w.h, id, d.f.faultAt); story != "" {
				rep.LostState[id] += "; " + story
			}
		}
		w.mu.Unlock()
	}
	if rep.HealError != "" {
		rep.Violations = append(rep.Violations, "the heal failed: "+rep.HealError)
	}
	if after, err := getMap(ctx, d.admin); err == nil {
		rep.MapAfter = describeMap(after, d.cfg.Region)
	} else {
		rep.MapAfter = "unavailable: " + err.Error()
	}
	var err error
	rep.FailoverSteps, err = failoverSteps(ctx, d.admin, d.f.shards, d.f.faultAt, d.f.healAt)
	if err != nil {
		rep.FailoverStepsError = err.Error()
	}
	if fate, err := d.cfg.Bed.Fate(ctx, d.fault); err == nil {
		rep.OldPrimary = fate
	} else {
		rep.OldPrimary = "unknown: " + err.Error()
	}
}

// connect dials every router and returns, in routers' order, a Queue and
// an Admin client of each, and closeAll, which closes the connections.
func connect(routers []Router) (clients []client, admins []triagev1.AdminClient, closeAll func(), err error) {
	var conns []*grpc.ClientConn
	closeAll = func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}
	for _, r := range routers {
		conn, err := dial(r)
		if err != nil {
			closeAll()
			return nil, nil, nil, err
		}
		conns = append(conns, conn)
		clients = append(clients, client{region: r.Region, q: triagev1.NewQueueClient(conn)})
		admins = append(admins, triagev1.NewAdminClient(conn))
	}
	return clients, admins, closeAll, nil
}

// failoverSteps reads the controller leader's steps on shards between
// from and to, oldest first, timed from from.
func failoverSteps(ctx context.Context, admin triagev1.AdminClient, shards map[uint32]bool, from, to time.Time) ([]Step, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := admin.ListFailoverEvents(ctx, &triagev1.ListFailoverEventsRequest{Limit: 1000})
	if err != nil {
		return nil, err
	}
	var out []Step
	for _, e := range resp.Events {
		at := e.At.AsTime()
		if !shards[e.Shard] || at.Before(from) || at.After(to) {
			continue
		}
		out = append(out, Step{AtMS: at.Sub(from).Milliseconds(), Shard: e.Shard, Step: e.Step, Details: e.Details})
	}
	slices.SortStableFunc(out, func(a, b Step) int { return cmp.Compare(a.AtMS, b.AtMS) })
	return out, nil
}

// noReporter takes the phases of a drill that reports none.
type noReporter struct{}

func (noReporter) phase(string) {}

// survives says whether the router of region keeps serving through the
// scenario's fault of faulted: it does not when its region is down, cut
// off or without its NATS server.
func survives(scenario, faulted, region string) bool {
	switch scenario {
	case "region-down", "partition", "nats-kill":
		return region != faulted
	}
	return true
}

// watchFailover polls the shard map of a surviving router every 100 ms
// and records, per shard, when it first shows a primary other than the
// one before the fault and not fenced: the new primary is published.
func watchFailover(ctx context.Context, admin triagev1.AdminClient, before map[uint32]string, shards map[uint32]bool,
	published map[uint32]time.Time, faultAt func() (time.Time, bool), progress io.Writer) {
	for ctx.Err() == nil && len(published) < len(shards) {
		if m, err := getMap(ctx, admin); err == nil {
			now := time.Now()
			var moved []*triagev1.Shard
			for _, s := range m.Shards {
				if _, seen := published[s.Id]; seen || !shards[s.Id] || s.Fenced || s.Primary == before[s.Id] {
					continue
				}
				published[s.Id] = now
				moved = append(moved, s)
			}
			// faultAt waits until the fault is known: asked only once a
			// shard moved, so the polls go on while the bed injects.
			if len(moved) > 0 {
				printMoved(progress, moved, len(published), len(shards), now, faultAt)
			}
		}
		sleep(ctx, 100*time.Millisecond)
	}
}

// printMoved writes one line for the shards published together (a
// server's shards move as a group): their new primary and when, after
// the fault.
func printMoved(progress io.Writer, moved []*triagev1.Shard, published, faulted int, now time.Time, faultAt func() (time.Time, bool)) {
	at, ok := faultAt()
	if !ok {
		return
	}
	s, which := moved[0], fmt.Sprintf("shard %d", moved[0].Id)
	if len(moved) > 1 {
		which = fmt.Sprintf("%d shards (%d of %d)", len(moved), published, faulted)
	}
	fmt.Fprintf(progress, "%s: new primary %s (%s, epoch %d) published %s after the fault\n",
		which, s.Primary, s.PrimaryRegion, s.Epoch, now.Sub(at).Round(time.Millisecond))
}

// confine creates (or keeps) the workload's namespace ns with shards only
// in region: its home shards there, none elsewhere. Items with a dedup key
// go to the shard the namespace's dedup slot table names, which for a
// namespace spanning every region's shards may be in another region, out
// of the fault and out of reach of a dequeue with region preference
// region. The namespace's slot table is filled from its shards, so here
// every item lives on the faulted region's shards. It waits until every
// router serves the namespace. It keeps the default dedup retry window,
// under which the producers' retries must yield one item per key
// (the report's key check).
func confine(ctx context.Context, admin triagev1.AdminClient, routers []triagev1.AdminClient, ns, region string, regions []string, home []uint32) error {
	cfg := &triagev1.Namespace{Name: ns}
	for _, r := range regions {
		s := &triagev1.NamespaceShards{Region: r}
		if r == region {
			s.Shards = home
		}
		cfg.Shards = append(cfg.Shards, s)
	}
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := admin.PutNamespace(rctx, &triagev1.PutNamespaceRequest{Namespace: ns, Config: cfg}); err != nil {
		return fmt.Errorf("create the drill's namespace %s (shards %v of %s only): %w", ns, home, region, err)
	}
	for _, a := range routers {
		for {
			_, err := a.GetNamespace(rctx, &triagev1.GetNamespaceRequest{Namespace: ns})
			if err == nil {
				break
			}
			if rctx.Err() != nil {
				return fmt.Errorf("a router does not serve the drill's namespace %s yet: %w", ns, err)
			}
			sleep(rctx, 100*time.Millisecond)
		}
	}
	return nil
}

func getMap(ctx context.Context, admin triagev1.AdminClient) (*triagev1.ShardMap, error) {
	rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	return admin.GetShardMap(rctx, &triagev1.GetShardMapRequest{})
}

// describeMap summarizes the region's shards: primary, its region, epoch.
func describeMap(m *triagev1.ShardMap, region string) string {
	var parts []string
	for _, s := range m.Shards {
		if s.HomeRegion == region {
			parts = append(parts, fmt.Sprintf("shard %d primary %s (%s) epoch %d", s.Id, s.Primary, s.PrimaryRegion, s.Epoch))
		}
	}
	return fmt.Sprintf("v%d: %s", m.Version, strings.Join(parts, "; "))
}
