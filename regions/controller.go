package regions

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/triage-queue/triage/proto/triage/peer"
	"github.com/triage-queue/triage/regions/replication"
	"github.com/triage-queue/triage/schema/metrics"
	"github.com/triage-queue/triage/shardmap"
)

// ControlBucket holds the leader lease.
const ControlBucket = "triage_control"

// Config configures a controller.
type Config struct {
	// ID names this controller (its node). Required.
	ID string
	// Region the controller runs in.
	Region string
	// Maps is the node's shard-map holder. Required.
	Maps *shardmap.Holder
	// MapKV is the shard-map bucket the controller publishes to. Required.
	MapKV jetstream.KeyValue
	// NC and JS reach NATS. Required.
	NC *nats.Conn
	JS jetstream.JetStream
	// Admin is the account with SUPER the controller runs replication
	// statements as. Default root with no password (the local bed).
	Admin shardmap.Credentials
	// Repl is the replication account replicas connect as.
	Repl replication.Credentials
	// Dial maps a server address to the one this node dials.
	Dial func(string) string
	// ReplicationVia[region][addr] is the address a server in region
	// reaches addr at (the bed's WAN links). Missing: addr itself.
	ReplicationVia map[string]map[string]string
	// Detect is how long a primary must be reported down by observers in
	// two regions before it is failed over. Default 1s (four observer
	// rounds): a timeout may be a network blip.
	Detect time.Duration
	// DetectRefused replaces Detect when every observer that reports the
	// primary down was refused the connection (Report.Refused): the host
	// is up and nothing listens, so the server is dead and waiting longer
	// only adds to the outage. Default ObserveEvery: a second round of
	// reports confirms the first.
	DetectRefused time.Duration
	// Cooldown blocks another failover of a shard after one. Default 60s.
	Cooldown time.Duration
	// Metrics counts failovers and times their steps. Nil: none.
	Metrics *metrics.Set
	// KVReplicas for the control buckets. Default 1.
	KVReplicas int
	Logger     *slog.Logger
}

// Controller fails shards over. Every controller campaigns; the leader
// acts.
type Controller struct {
	cfg     Config
	log     *slog.Logger
	control jetstream.KeyValue
	health  *healthView

	lease    sync.Mutex // serialises renewals
	mu       sync.Mutex
	leader   bool
	rev      uint64               // revision of this controller's leader key
	leaseAt  time.Time            // when the last successful renewal was sent
	suspect  map[string]time.Time // by group (groupKey): when its primary was first reported down
	cooldown map[uint32]time.Time
	blocked  map[string]time.Time // by group: the cooldown end a "down but cooling" alarm was raised for
	inflight map[uint32]bool      // automatic failovers running
	alarmed  map[string]bool      // alarms the rejoin loop raised (alarmOnce), by key
	events   []Event              // the last MaxEvents
	nEvents  int                  // events ever recorded
	stepAt   time.Time            // the running failover's start or last step; zero between failovers
	hist     chan Event           // events to publish to HistoryStream (nil: none)
	busy     sync.Mutex           // one failover at a time

	// rejoinAttempts and rejoinFailures count the rejoin loop's
	// RejoinAsReplica calls and those that failed.
	rejoinAttempts, rejoinFailures atomic.Int64
	// rejoinReads, when set (tests, under mu), is given after each rejoin
	// pass the replica status reads it made, by server.
	rejoinReads func(map[string]int)

	// stepHook, when set (tests), runs before each irreversible step.
	stepHook func(shard uint32, step string)
}

func (c *Controller) hook(shard uint32, step string) {
	if c.stepHook != nil {
		c.stepHook(shard, step)
	}
}

// Event is a failover step, kept for reports and drills.
type Event struct {
	At      time.Time `json:"at"`
	Shard   uint32    `json:"shard"`
	Step    string    `json:"step"`
	Details string    `json:"details,omitempty"`
}

// New validates cfg.
func New(cfg Config) (*Controller, error) {
	if cfg.ID == "" || cfg.Maps == nil || cfg.MapKV == nil || cfg.NC == nil || cfg.JS == nil {
		return nil, errors.New("regions: ID, Maps, MapKV, NC and JS are required")
	}
	cfg.Detect = cmp.Or(cfg.Detect, time.Second)
	cfg.DetectRefused = min(cmp.Or(cfg.DetectRefused, ObserveEvery), cfg.Detect)
	cfg.Cooldown = cmp.Or(cfg.Cooldown, 60*time.Second)
	cfg.Admin.User = cmp.Or(cfg.Admin.User, "root")
	if cfg.Dial == nil {
		cfg.Dial = func(a string) string { return a }
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Controller{cfg: cfg, log: cfg.Logger.With("role", "controller", "region", cfg.Region),
		suspect: map[string]time.Time{}, cooldown: map[uint32]time.Time{}, blocked: map[string]time.Time{}, inflight: map[uint32]bool{}, alarmed: map[string]bool{}}, nil
}

// FailoverSubject is where the leader takes failover requests.
const FailoverSubject = "triage.ctl.failover"

// EventsSubject is where the leader answers for its recent failover steps
// (an EventsRequest, answered with EventsResult): the console's history.
const EventsSubject = "triage.ctl.events"

// MaxEvents is how many failover steps a controller keeps.
const MaxEvents = 1000

// EventsRequest asks the leader for its last Limit events (100 when 0).
type EventsRequest struct {
	Limit int `json:"limit,omitempty"`
}

// EventsResult is the leader's answer to an EventsRequest: its ID and
// events, oldest first.
type EventsResult struct {
	Controller string  `json:"controller"`
	Events     []Event `json:"events"`
}

// FailoverRequest asks for a failover of Shard (to a replica in ToRegion,
// if set). Planned makes the old primary read-only first and refuses when
// it cannot.
type FailoverRequest struct {
	Shard    uint32 `json:"shard"`
	ToRegion string `json:"to_region,omitempty"`
	Planned  bool   `json:"planned"`

	automatic bool // from detection: refused while the shard cools down
	resume    bool // finishing a fenced shard: refused once it is not
}

// FailoverResult is the outcome.
type FailoverResult struct {
	Error      string  `json:"error,omitempty"`
	NewPrimary string  `json:"new_primary,omitempty"`
	Epoch      uint64  `json:"epoch,omitempty"`
	Events     []Event `json:"events,omitempty"`
}

// OpenControl creates or opens the control bucket (the leader key, TTL
// LeaseTTL) with replicas copies. Controller.Run opens it; a deployment's
// bootstrap creates it first, alone (see deploy/compose).
func OpenControl(ctx context.Context, js jetstream.JetStream, replicas int) (jetstream.KeyValue, error) {
	kv, err := peer.EnsureKeyValue(ctx, js, jetstream.KeyValueConfig{
		Bucket: ControlBucket, TTL: LeaseTTL, Storage: jetstream.FileStorage, Replicas: max(replicas, 1)})
	if err != nil {
		return nil, fmt.Errorf("open kv bucket %s: %w", ControlBucket, err)
	}
	return kv, nil
}

// Run campaigns for leadership and, while leader, watches health and
// fails shards over, until ctx ends.
func (c *Controller) Run(ctx context.Context) error {
	var err error
	if c.control, err = OpenControl(ctx, c.cfg.JS, c.cfg.KVReplicas); err != nil {
		return err
	}
	hkv, err := OpenHealth(ctx, c.cfg.JS, c.cfg.KVReplicas)
	if err != nil {
		return err
	}
	if c.health, err = watchHealth(ctx, hkv, c.cfg.NC); err != nil {
		return err
	}
	c.hist = make(chan Event, historyBacklog)
	go c.keepHistory(ctx)
	go c.campaign(ctx)
	go c.every(ctx, evaluateEvery, c.evaluate)
	go c.every(ctx, rejoinEvery, func(ctx context.Context) {
		// A map the bucket has not confirmed lately may be long gone (this
		// controller is back from a partition): wait for the watch to
		// catch up. mayRejoin's LoadCurrent is what keeps the step safe;
		// this spares it attempts bound to be refused.
		if c.cfg.Maps.Unconfirmed() > shardmap.MaxStaleness {
			return
		}
		c.rejoin(ctx, c.cfg.Maps.Current())
	})
	return nil
}

// evaluateEvery is the leader's detection tick: a primary reported down
// for Detect fails over at most this much later. A tick reads only the
// health view, in memory. Rejoining, which opens an admin connection to
// every listed replica across the WAN (up to its connect timeout for one
// that is cut off), runs in its own loop every rejoinEvery, so it never
// holds detection back.
const (
	evaluateEvery = 100 * time.Millisecond
	rejoinEvery   = time.Second
)

// every runs f every period while this controller leads, until ctx ends.
func (c *Controller) every(ctx context.Context, period time.Duration, f func(context.Context)) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if c.isLeader() {
			f(ctx)
		}
	}
}

func (c *Controller) isLeader() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.leader
}

// LeaseTTL is how long the leader key lives without a renewal (the control
// bucket's TTL); the leader renews it every renewEvery. When a region goes
// down with the leader, a new one takes over at most LeaseTTL + renewEvery
// later, which is on a region-down drill's critical path (it was 5 s + 1 s
// tick of a 10 s budget). Shorter is safe because leadership is re-checked
// with a committed renewal before every irreversible step (checkLeader),
// never assumed from the last tick; what it costs is a renewal every
// renewEvery on the control bucket.
const (
	LeaseTTL   = 3 * time.Second
	renewEvery = 500 * time.Millisecond
)

// leaseMargin is how much of LeaseTTL a step may take after the renewal
// that allowed it: a controller acts only within LeaseTTL - leaseMargin of
// its last successful renewal, so its step has begun before any other
// controller can take the key. A renewal has a 1 s timeout, so a step that
// passed checkLeader began at most 1 s after the renewal was sent.
const leaseMargin = 1500 * time.Millisecond

// freshLease is how recent a committed renewal must be for checkLeader to
// act on it without renewing again.
const freshLease = 300 * time.Millisecond

// ErrNotLeader: this controller does not hold the leader lease (any more).
var ErrNotLeader = errors.New("regions: not the controller leader")

// renew takes or renews the leader key with a compare-and-set on its
// revision: the KV stream's leader commits it only with a quorum, so
// success proves this controller holds the lease until LeaseTTL from now,
// also if its NATS server has just been cut off into a minority (which
// cannot commit). It updates c.leader.
func (c *Controller) renew(ctx context.Context) error {
	c.lease.Lock()
	defer c.lease.Unlock()
	var rev uint64
	var err error
	sent := time.Now()
	rctx, cancel := context.WithTimeout(ctx, time.Second)
	if c.rev != 0 {
		rev, err = c.control.Update(rctx, "leader", []byte(c.cfg.ID), c.rev)
	} else {
		rev, err = c.control.Create(rctx, "leader", []byte(c.cfg.ID))
	}
	cancel()
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil {
		c.rev, c.leader = 0, false
		return fmt.Errorf("%w: %v", ErrNotLeader, err)
	}
	c.rev, c.leader, c.leaseAt = rev, true, sent
	return nil
}

// checkLeader is run before each irreversible step of a failover (fence,
// read_only, promote, publish): the step runs under a lease the KV leader
// committed at most freshLease ago, renewed now unless it was renewed
// that recently. A committed renewal sent at t holds the key until
// t + LeaseTTL, and a step may begin up to LeaseTTL - leaseMargin after
// it; renewing a lease a few hundred milliseconds old changes neither,
// and a failover's four checks cost four quorum commits across the WAN
// on its critical path (each a few hundred milliseconds on a loaded
// compose bed). Never the memory of a lease older than that: a
// controller cut off from NATS fails the renewal and stops.
func (c *Controller) checkLeader(ctx context.Context, shard uint32, step string) error {
	c.hook(shard, step)
	c.mu.Lock()
	fresh := c.leader && time.Since(c.leaseAt) < freshLease
	c.mu.Unlock()
	if !fresh {
		if err := c.renew(ctx); err != nil {
			c.event(shard, "lost-leadership", "before "+step+": "+err.Error())
			return err
		}
	}
	c.mu.Lock()
	at := c.leaseAt
	c.mu.Unlock()
	if time.Since(at) > LeaseTTL-leaseMargin {
		return fmt.Errorf("%w: lease renewed %s ago, too long before %s", ErrNotLeader, time.Since(at).Round(time.Millisecond), step)
	}
	return nil
}

func (c *Controller) campaign(ctx context.Context) {
	var sub, evSub *nats.Subscription
	defer func() {
		for _, s := range []*nats.Subscription{sub, evSub} {
			if s != nil {
				_ = s.Unsubscribe()
			}
		}
	}()
	t := time.NewTicker(renewEvery)
	defer t.Stop()
	was := false
	for {
		_ = c.renew(ctx)
		now := c.isLeader()
		if now != was {
			c.log.Info("controller leadership", "leader", now)
			// Only the leader takes failover requests.
			if now {
				go c.loadHistory(ctx)
				sub, _ = c.cfg.NC.Subscribe(FailoverSubject, c.handleFailover)
				evSub, _ = c.cfg.NC.Subscribe(EventsSubject, c.handleEvents)
			} else {
				for _, s := range []**nats.Subscription{&sub, &evSub} {
					if *s != nil {
						_ = (*s).Unsubscribe()
						*s = nil
					}
				}
			}
			was = now
		}
		select {
		case <-ctx.Done():
			c.mu.Lock()
			rev, leader := c.rev, c.leader
			c.mu.Unlock()
			if leader {
				dctx, cancel := context.WithTimeout(context.Background(), time.Second)
				_ = c.control.Delete(dctx, "leader", jetstream.LastRevision(rev))
				cancel()
			}
			return
		case <-t.C:
		}
	}
}

// Events returns the failover steps taken so far by this controller.
func (c *Controller) Events() []Event {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.events)
}

// eventsSince returns the events recorded after the first n.
func (c *Controller) eventsSince(n int) []Event {
	c.mu.Lock()
	defer c.mu.Unlock()
	k := min(c.nEvents-n, len(c.events))
	return slices.Clone(c.events[len(c.events)-k:])
}

func (c *Controller) event(shard uint32, step, details string) {
	now := time.Now()
	c.mu.Lock()
	var took time.Duration
	running := !c.stepAt.IsZero() // a step of Failover, not detection or rejoin
	if running {
		took = now.Sub(c.stepAt)
		c.stepAt = now
	}
	e := Event{At: now, Shard: shard, Step: step, Details: details}
	c.events = append(c.events, e)
	c.nEvents++
	if len(c.events) > MaxEvents {
		c.events = slices.Delete(c.events, 0, len(c.events)-MaxEvents)
	}
	c.mu.Unlock()
	select {
	case c.hist <- e:
	default:
		if c.hist != nil {
			c.log.Warn("failover history backlog full; event kept in memory only", "shard", shard, "step", step)
		}
	}
	if !running {
		c.log.Info("failover", "shard", shard, "step", step, "details", details)
		return
	}
	c.log.Info("failover", "shard", shard, "step", step, "details", details, "took", took.Round(time.Millisecond))
	c.cfg.Metrics.FailoverStep(step, took)
}

// evaluate runs one leader pass: finish fenced groups, fail over the
// groups of dead primary servers. The verdict is one per group (its
// primary server's), however many shards it holds.
func (c *Controller) evaluate(ctx context.Context) {
	now := time.Now()
	for _, g := range groups(c.cfg.Maps.Current().Shards) {
		if i := slices.IndexFunc(g, func(s shardmap.Shard) bool { return s.Fenced }); i >= 0 {
			// A failover that a previous leader (or a failed attempt) left
			// half-done.
			go c.runFailover(ctx, FailoverRequest{Shard: g[i].ID, resume: true})
			continue
		}
		if len(g[0].Replicas) > 0 {
			c.evaluateGroup(ctx, g, now)
		}
	}
}

// evaluateGroup starts the failover of group g once its primary server
// has been reported down in two regions for Detect (DetectRefused when
// every such report was refused), unless one of its shards cools down
// after a failover: then it raises an alarm, once per cooldown.
func (c *Controller) evaluateGroup(ctx context.Context, g []shardmap.Shard, now time.Time) {
	s, key := g[0], groupKey(g[0])
	up, down, refused := c.health.verdict(s.Primary, now, 3*time.Second)
	c.mu.Lock()
	var until time.Time // the latest cooldown end among g's shards
	for _, m := range g {
		if c.cooldown[m.ID].After(until) {
			until = c.cooldown[m.ID]
		}
	}
	cooling := now.Before(until)
	if len(down) >= 2 && !cooling {
		if _, ok := c.suspect[key]; !ok {
			c.suspect[key] = c.suspectSince(s.Primary, now)
			c.log.Warn("primary reported down", "shards", len(g), "shard_ids", shardIDs(g), "primary", s.Primary, "down_in", down, "up_in", up)
		}
	} else {
		delete(c.suspect, key)
	}
	if len(down) >= 2 && cooling && c.blocked[key] != until {
		// The cooldown keeps a flapping shard from failing over back and
		// forth; a second real failure inside it waits for an operator.
		c.blocked[key] = until
		c.log.Error("ALARM: primary down, automatic failover blocked by the cooldown after the last one; "+
			"fail over by hand (triage failover --shard N) or wait", "shards", len(g), "shard_ids", shardIDs(g), "primary", s.Primary,
			"down_in", down, "cooldown_until", until.Format(time.RFC3339))
	}
	since, suspect := c.suspect[key]
	running := slices.ContainsFunc(g, func(m shardmap.Shard) bool { return c.inflight[m.ID] })
	c.mu.Unlock()
	if running {
		return
	}
	need := c.cfg.Detect
	if refused {
		need = c.cfg.DetectRefused
	}
	if suspect && now.Sub(since) >= need {
		how := map[bool]string{true: " (connections refused: the server is dead)"}[refused]
		c.event(s.ID, "detected", fmt.Sprintf("%sprimary %s down in %v for %s%s", groupPrefix(g), s.Primary, down, now.Sub(since).Round(time.Millisecond), how))
		go c.runFailover(ctx, FailoverRequest{Shard: s.ID, automatic: true})
	}
}

// groupPrefix starts an event's details with the shards of g when it
// holds more than the shard the event names.
func groupPrefix(g []shardmap.Shard) string {
	if len(g) < 2 {
		return ""
	}
	return fmt.Sprintf("shards %s (%d, one primary server): ", shardIDs(g), len(g))
}

// suspectSince is when the detection clock of the primary server at addr
// starts: when two regions began reporting it down
// (healthView.downSince), as a leader elected during the outage heard it
// too, so it does not wait Detect again on evidence it already has; now
// if there is none, or if that time is not within the last minute (a
// report's clock ahead or far behind this one's).
func (c *Controller) suspectSince(addr string, now time.Time) time.Time {
	since := c.health.downSince(addr, now, 3*time.Second)
	if since.IsZero() || since.After(now) || now.Sub(since) > time.Minute {
		return now
	}
	return since
}

// runFailover starts an automatic failover of req.Shard's group unless
// one of the group's shards is in a failover already.
func (c *Controller) runFailover(ctx context.Context, req FailoverRequest) {
	g := ids(groupOf(c.cfg.Maps.Current(), req.Shard))
	c.mu.Lock()
	if slices.ContainsFunc(g, func(id uint32) bool { return c.inflight[id] }) {
		c.mu.Unlock()
		return
	}
	for _, id := range g {
		c.inflight[id] = true
	}
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		for _, id := range g {
			delete(c.inflight, id)
		}
		c.mu.Unlock()
	}()
	if _, err := c.Failover(ctx, req); err != nil {
		c.log.Error("failover failed", "shard", req.Shard, "shards", len(g), "err", err)
		// Keep a failing retry from spinning, but not past the
		// controller's end (goleak saw this sleep outlive its tests).
		t := time.NewTimer(time.Second)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
		}
	}
}

func (c *Controller) handleFailover(m *nats.Msg) {
	var req FailoverRequest
	res := FailoverResult{}
	if err := json.Unmarshal(m.Data, &req); err != nil {
		res.Error = "malformed request"
	} else if !c.isLeader() {
		res.Error = "not the leader"
	} else {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		out, err := c.Failover(ctx, req)
		cancel()
		res = out
		if err != nil {
			res.Error = err.Error()
		}
	}
	data, _ := json.Marshal(res)
	_ = m.Respond(data)
}

// handleEvents answers an EventsRequest with the last events.
func (c *Controller) handleEvents(m *nats.Msg) {
	var req EventsRequest
	_ = json.Unmarshal(m.Data, &req) // an empty or bad request asks for the default
	limit := req.Limit
	if limit <= 0 {
		limit = 100
	}
	ev := c.Events()
	ev = ev[max(0, len(ev)-limit):]
	data, _ := json.Marshal(EventsResult{Controller: c.cfg.ID, Events: ev})
	_ = m.Respond(data)
}

// admin opens a replication admin connection to addr as this node dials it.
func (c *Controller) admin(addr string) (*replication.Admin, error) {
	cfg := mysql.NewConfig()
	c.cfg.Admin.Apply(cfg)
	cfg.Net, cfg.Addr = "tcp", c.cfg.Dial(addr)
	cfg.Timeout, cfg.ReadTimeout, cfg.WriteTimeout = 2*time.Second, 30*time.Second, 10*time.Second
	return replication.Open(cfg.FormatDSN())
}

// via is the address a server in region reaches addr at.
func (c *Controller) via(region, addr string) string {
	if v, ok := c.cfg.ReplicationVia[region][addr]; ok {
		return v
	}
	return addr
}

// ErrEpochMoved: a shard's entry in the stored map is no longer the one a
// failover step was based on (another controller fenced or published it).
var ErrEpochMoved = errors.New("regions: the shard's epoch moved")

// publish stores the map with each shard of next replacing the shard of
// its ID, with optimistic concurrency on the whole map (shardmap.Publish)
// and on each shard: the stored shard must still be at the epoch and
// fence state of its entry in prev, or it returns ErrEpochMoved without
// writing. So one failover step of one epoch publishes at most once,
// whoever else is working on the shards, and a group's step is one
// publish for all of them.
func (c *Controller) publish(ctx context.Context, prev, next []shardmap.Shard) (*shardmap.Map, error) {
	for attempt := 0; ; attempt++ {
		// The map this process holds is the stored one unless a conflict
		// says otherwise (shardmap.Publish compares versions): reading
		// the bucket first cost every publish a round trip to the KV
		// leader across the WAN.
		cur := c.cfg.Maps.Current()
		if attempt > 0 {
			if m, err := c.loadMap(ctx); err == nil && m.Version > cur.Version {
				c.cfg.Maps.Offer(m)
				cur = m
			}
		}
		if attempt > 0 && holds(cur, next) {
			// An attempt that timed out was stored after all.
			return cur, nil
		}
		if err := moved(cur, prev); err != nil {
			return nil, err
		}
		m, err := withShards(cur, next)
		if err != nil {
			return nil, err
		}
		// Each attempt gets publishAttempt: while the map's stream elects
		// a leader (a region cut off or down), a request waits out
		// JetStream's 5 s default; tried again it is served as soon as
		// the new leader is.
		pctx, cancel := context.WithTimeout(ctx, publishAttempt)
		err = shardmap.Publish(pctx, c.cfg.MapKV, cur, m)
		cancel()
		if err == nil {
			c.cfg.Maps.Offer(m)
			return m, nil
		}
		if ctx.Err() != nil || attempt >= 10 || !(errors.Is(err, shardmap.ErrConflict) || errors.Is(err, context.DeadlineExceeded)) {
			return nil, err
		}
	}
}

// holds tells whether m has every shard of next as it is.
func holds(m *shardmap.Map, next []shardmap.Shard) bool {
	for _, s := range next {
		if was, ok := m.Shard(s.ID); !ok || !reflect.DeepEqual(was, s) {
			return false
		}
	}
	return true
}

// moved returns ErrEpochMoved if a shard of prev is not in m at its epoch
// and fence state.
func moved(m *shardmap.Map, prev []shardmap.Shard) error {
	for _, s := range prev {
		if was, ok := m.Shard(s.ID); !ok || was.Epoch != s.Epoch || was.Fenced != s.Fenced {
			return fmt.Errorf("%w: shard %d is at epoch %d (fenced %t), this step expected %d (fenced %t)",
				ErrEpochMoved, s.ID, was.Epoch, was.Fenced, s.Epoch, s.Fenced)
		}
	}
	return nil
}

// publishAttempt bounds one attempt to store the shard map; publish makes
// up to eleven.
const publishAttempt = 1500 * time.Millisecond

// loadMap reads the stored map, bounded like a publish attempt.
func (c *Controller) loadMap(ctx context.Context) (*shardmap.Map, error) {
	lctx, cancel := context.WithTimeout(ctx, publishAttempt)
	defer cancel()
	return shardmap.LoadFrom(lctx, c.cfg.MapKV, c.cfg.Maps.Current())
}

// claimKey is the shard-map bucket key recording which server a failover
// of shard at epoch promotes.
func claimKey(shard uint32, epoch uint64) string {
	return fmt.Sprintf("promotion.s%d.e%d", shard, epoch)
}

// claim records, once per shard and epoch (KV Create), the server to
// promote: a controller resuming the failover promotes the same server,
// never a second one. A claim of another server for the same epoch is an
// error.
func (c *Controller) claim(ctx context.Context, s shardmap.Shard, candidate string) error {
	key := claimKey(s.ID, s.Epoch)
	_, err := c.cfg.MapKV.Create(ctx, key, []byte(candidate))
	if err == nil {
		return nil
	}
	if !errors.Is(err, jetstream.ErrKeyExists) {
		return fmt.Errorf("claim promotion of shard %d at epoch %d: %w", s.ID, s.Epoch, err)
	}
	e, err := c.getKey(ctx, key)
	if err != nil {
		return fmt.Errorf("read promotion claim of shard %d at epoch %d: %w", s.ID, s.Epoch, err)
	}
	if got := string(e.Value()); got != candidate {
		return fmt.Errorf("shard %d: epoch %d promotes %s (claimed before), not %s; the shard stays fenced", s.ID, s.Epoch, got, candidate)
	}
	return nil
}

// claimed returns the server claimed for promotion at s's epoch, "" if
// no failover of this epoch claimed one yet.
func (c *Controller) claimed(ctx context.Context, s shardmap.Shard) (string, error) {
	e, err := c.getKey(ctx, claimKey(s.ID, s.Epoch))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("read promotion claim of shard %d at epoch %d: %w", s.ID, s.Epoch, err)
	}
	return string(e.Value()), nil
}

// getTry bounds one read of getKey.
const getTry = time.Second

// getKey reads key of the shard-map bucket, a try at a time, until one
// answers or ctx ends. A read is a direct get, which any replica of the
// bucket may be asked to answer; in a partition the one asked can be cut
// off, while the route to it is not yet known to be dead, and the request
// then waits out its whole timeout (the jetstream default, 5 s): a
// compose partition drill lost 9 s of its failover that way. Another try
// is answered by another replica.
func (c *Controller) getKey(ctx context.Context, key string) (jetstream.KeyValueEntry, error) {
	for {
		tctx, cancel := context.WithTimeout(ctx, getTry)
		e, err := c.cfg.MapKV.Get(tctx, key)
		cancel()
		if err == nil || ctx.Err() != nil || !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, nats.ErrTimeout) {
			return e, err
		}
		c.log.Warn("a shard-map read went unanswered; asking again", "key", key, "within", getTry)
	}
}

// storeEpoch records the shard's epoch on the new primary (shard_meta), so
// that a writer whose map predates this failover cannot write there,
// within 10 s, and says how long it took (the failover's step timings). It
// runs on the promotion's admin connection, already open.
func (c *Controller) storeEpoch(ctx context.Context, s shardmap.Shard, primary *replication.Admin) (took time.Duration, err error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	start := time.Now()
	if err := shardmap.StoreEpoch(ctx, primary.DB(), cmp.Or(s.Database, "triage"), s.Epoch); err != nil {
		return time.Since(start), fmt.Errorf("shard %d: %w", s.ID, err)
	}
	return time.Since(start), nil
}

// primaryRegion is where a shard's current primary runs.
func (c *Controller) primaryRegion(s shardmap.Shard) string {
	return cmp.Or(s.PrimaryRegion, s.HomeRegion)
}

// unfence publishes the shards of g unfenced at their epoch, on the
// primary they had: a failover refused before its promotion.
func (c *Controller) unfence(ctx context.Context, g []shardmap.Shard, cause error) error {
	next := slices.Clone(g)
	for i := range next {
		next[i].Fenced = false
	}
	if _, err := c.publish(ctx, g, next); err != nil {
		return fmt.Errorf("%w (and unfencing failed: %v)", cause, err)
	}
	return cause
}
