package regions

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/triage-queue/triage/regions/replication"
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
	// two regions before it is failed over. Default 2s.
	Detect time.Duration
	// Cooldown blocks another failover of a shard after one. Default 60s.
	Cooldown time.Duration
	// SemiSyncTimeout is the primaries' rpl_semi_sync_master_timeout (and
	// is set on a promoted primary). Default 2.5s. It must exceed
	// shardmap.MaxStaleness: a primary cut off from its replica then
	// commits nothing until writers that cannot see the control plane
	// have stopped trusting their map, and every commit after its async
	// fallback finds its writer stale, which then does not acknowledge it.
	SemiSyncTimeout time.Duration
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

	mu       sync.Mutex
	leader   bool
	suspect  map[uint32]time.Time
	cooldown map[uint32]time.Time
	inflight map[uint32]bool // automatic failovers running
	events   []Event
	busy     sync.Mutex // one failover at a time
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
	cfg.Detect = cmp.Or(cfg.Detect, 2*time.Second)
	cfg.Cooldown = cmp.Or(cfg.Cooldown, 60*time.Second)
	cfg.SemiSyncTimeout = cmp.Or(cfg.SemiSyncTimeout, 2500*time.Millisecond)
	cfg.Admin.User = cmp.Or(cfg.Admin.User, "root")
	if cfg.Dial == nil {
		cfg.Dial = func(a string) string { return a }
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Controller{cfg: cfg, log: cfg.Logger.With("role", "controller", "region", cfg.Region),
		suspect: map[uint32]time.Time{}, cooldown: map[uint32]time.Time{}, inflight: map[uint32]bool{}}, nil
}

// FailoverSubject is where the leader takes failover requests.
const FailoverSubject = "triage.ctl.failover"

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

// Run campaigns for leadership and, while leader, watches health and
// fails shards over, until ctx ends.
func (c *Controller) Run(ctx context.Context) error {
	var err error
	c.control, err = c.cfg.JS.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket: ControlBucket, TTL: 5 * time.Second, Storage: jetstream.FileStorage, Replicas: max(c.cfg.KVReplicas, 1)})
	if err != nil {
		return fmt.Errorf("open kv bucket %s: %w", ControlBucket, err)
	}
	hkv, err := OpenHealth(ctx, c.cfg.JS, c.cfg.KVReplicas)
	if err != nil {
		return err
	}
	if c.health, err = watchHealth(ctx, hkv); err != nil {
		return err
	}
	go c.campaign(ctx)
	go func() {
		t := time.NewTicker(500 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if c.isLeader() {
				c.evaluate(ctx)
			}
		}
	}()
	return nil
}

func (c *Controller) isLeader() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.leader
}

func (c *Controller) campaign(ctx context.Context) {
	var rev uint64
	var sub *nats.Subscription
	defer func() {
		if sub != nil {
			_ = sub.Unsubscribe()
		}
	}()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		var err error
		if c.isLeader() {
			rev, err = c.control.Update(ctx, "leader", []byte(c.cfg.ID), rev)
		} else {
			rev, err = c.control.Create(ctx, "leader", []byte(c.cfg.ID))
		}
		c.mu.Lock()
		was := c.leader
		c.leader = err == nil
		now := c.leader
		c.mu.Unlock()
		if now != was {
			c.log.Info("controller leadership", "leader", now)
			// Only the leader takes failover requests.
			if now {
				sub, _ = c.cfg.NC.Subscribe(FailoverSubject, c.handleFailover)
			} else if sub != nil {
				_ = sub.Unsubscribe()
				sub = nil
			}
		}
		select {
		case <-ctx.Done():
			if c.isLeader() {
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

func (c *Controller) event(shard uint32, step, details string) {
	c.log.Info("failover", "shard", shard, "step", step, "details", details)
	c.mu.Lock()
	c.events = append(c.events, Event{At: time.Now(), Shard: shard, Step: step, Details: details})
	c.mu.Unlock()
}

// evaluate runs one leader pass: finish fenced shards, fail over dead
// primaries, rejoin deposed ones.
func (c *Controller) evaluate(ctx context.Context) {
	m := c.cfg.Maps.Current()
	now := time.Now()
	for _, s := range m.Shards {
		if s.Fenced {
			// A failover that a previous leader (or a failed attempt) left
			// half-done.
			go c.runFailover(ctx, FailoverRequest{Shard: s.ID, resume: true})
			continue
		}
		if len(s.Replicas) == 0 {
			continue
		}
		up, down := c.health.verdict(s, now, 3*time.Second)
		c.mu.Lock()
		cooling := now.Before(c.cooldown[s.ID])
		if len(down) >= 2 && !cooling {
			if _, ok := c.suspect[s.ID]; !ok {
				c.suspect[s.ID] = now
				c.log.Warn("primary reported down", "shard", s.ID, "primary", s.Primary, "down_in", down, "up_in", up)
			}
		} else {
			delete(c.suspect, s.ID)
		}
		since, suspect := c.suspect[s.ID]
		c.mu.Unlock()
		if suspect && now.Sub(since) >= c.cfg.Detect {
			c.event(s.ID, "detected", fmt.Sprintf("primary %s down in %v for %s", s.Primary, down, now.Sub(since).Round(time.Millisecond)))
			go c.runFailover(ctx, FailoverRequest{Shard: s.ID, automatic: true})
		}
	}
	c.rejoin(ctx, m)
}

// runFailover starts an automatic failover unless one of the shard is
// already running.
func (c *Controller) runFailover(ctx context.Context, req FailoverRequest) {
	c.mu.Lock()
	if c.inflight[req.Shard] {
		c.mu.Unlock()
		return
	}
	c.inflight[req.Shard] = true
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		delete(c.inflight, req.Shard)
		c.mu.Unlock()
	}()
	if _, err := c.Failover(ctx, req); err != nil {
		c.log.Error("failover failed", "shard", req.Shard, "err", err)
		time.Sleep(time.Second) // keep a failing retry from spinning
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

// admin opens a replication admin connection to addr as this node dials it.
func (c *Controller) admin(addr string) (*replication.Admin, error) {
	cfg := mysql.NewConfig()
	cfg.User, cfg.Passwd, cfg.Net, cfg.Addr = c.cfg.Admin.User, c.cfg.Admin.Password, "tcp", c.cfg.Dial(addr)
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

func (c *Controller) publish(ctx context.Context, s shardmap.Shard) (*shardmap.Map, error) {
	for attempt := 0; ; attempt++ {
		cur := c.cfg.Maps.Current()
		next, err := cur.WithShard(s)
		if err != nil {
			return nil, err
		}
		err = shardmap.Publish(ctx, c.cfg.MapKV, cur, next)
		if err == nil {
			c.cfg.Maps.Offer(next)
			return next, nil
		}
		if !errors.Is(err, shardmap.ErrConflict) || attempt >= 10 {
			return nil, err
		}
		if m, lerr := shardmap.Load(ctx, c.cfg.MapKV); lerr == nil {
			c.cfg.Maps.Offer(m)
		}
	}
}

// Failover moves shard's primary to its most advanced replica (in
// req.ToRegion, if set). See the package doc for the steps.
func (c *Controller) Failover(ctx context.Context, req FailoverRequest) (res FailoverResult, err error) {
	c.busy.Lock()
	defer c.busy.Unlock()
	first := len(c.Events())
	defer func() { res.Events = c.Events()[first:] }()
	s, ok := c.cfg.Maps.Current().Shard(req.Shard)
	if !ok {
		return res, fmt.Errorf("shard %d is not in the shard map", req.Shard)
	}
	c.mu.Lock()
	cooling := time.Now().Before(c.cooldown[req.Shard])
	c.mu.Unlock()
	switch {
	case req.resume && !s.Fenced:
		return res, nil // finished meanwhile
	case req.automatic && (cooling || s.Fenced):
		return res, nil // just failed over, or being failed over
	}
	var candidates []string
	for i, r := range s.Replicas {
		if req.ToRegion == "" || (i < len(s.ReplicaRegions) && s.ReplicaRegions[i] == req.ToRegion) {
			candidates = append(candidates, r)
		}
	}
	if len(candidates) == 0 {
		return res, fmt.Errorf("shard %d has no replica%s to fail over to", req.Shard, map[bool]string{true: " in " + req.ToRegion}[req.ToRegion != ""])
	}
	old := s.Primary
	// 1. Fence.
	if !s.Fenced {
		s.Fenced = true
		s.Epoch++
		if _, err := c.publish(ctx, s); err != nil {
			return res, fmt.Errorf("fence: %w", err)
		}
		c.event(s.ID, "fenced", fmt.Sprintf("epoch %d published fenced", s.Epoch))
	}
	// 2. Old primary read-only, or wait out stale writers.
	readOnly := false
	if a, err := c.admin(old); err == nil {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err = a.SetReadOnly(rctx, true)
		cancel()
		a.Close()
		readOnly = err == nil
	}
	if readOnly {
		c.event(s.ID, "old-primary-read-only", old)
	} else {
		if req.Planned {
			return res, c.unfence(ctx, s, fmt.Errorf("planned switchover: old primary %s cannot be made read-only; use an emergency failover", old))
		}
		// Writers cut off from the control plane stop at MaxStaleness;
		// their commits hang in semi-sync until its timeout at most.
		wait := shardmap.MaxStaleness + c.cfg.SemiSyncTimeout + 500*time.Millisecond
		c.event(s.ID, "old-primary-unreachable", fmt.Sprintf("%s; waiting %s for stale writers to stop", old, wait))
		select {
		case <-ctx.Done():
			return res, ctx.Err()
		case <-time.After(wait):
		}
	}
	// 3. Promote the most advanced reachable candidate.
	var admins []*replication.Admin
	var addrs []string
	for _, r := range candidates {
		a, err := c.admin(r)
		if err != nil {
			continue
		}
		sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err = a.Status(sctx)
		cancel()
		if err != nil {
			a.Close()
			continue
		}
		admins = append(admins, a)
		addrs = append(addrs, r)
	}
	defer func() {
		for _, a := range admins {
			a.Close()
		}
	}()
	if len(admins) == 0 {
		return res, fmt.Errorf("shard %d: no replica answers (%v); the shard stays fenced and is retried", s.ID, candidates)
	}
	i, err := replication.MostAdvanced(ctx, admins)
	if err != nil {
		return res, fmt.Errorf("choose replica: %w", err)
	}
	newPrimary := addrs[i]
	gtid, perr := admins[i].Promote(ctx, 30*time.Second)
	err = perr
	if err != nil && !errors.Is(err, replication.ErrNotReplica) {
		return res, fmt.Errorf("promote %s: %w", newPrimary, err)
	}
	c.event(s.ID, "promoted", fmt.Sprintf("%s at %s", newPrimary, gtid))
	if err := admins[i].EnableSemiSync(ctx, true, c.cfg.SemiSyncTimeout); err != nil {
		c.log.Warn("semi-sync on new primary", "err", err)
	}
	// 4. Publish: new primary; the old one and the other replicas listed
	// as replicas (the old one rejoins once it answers).
	newRegion := s.ReplicaRegion(newPrimary)
	var replicas, regions []string
	for j, r := range s.Replicas {
		if r == newPrimary {
			continue
		}
		replicas = append(replicas, r)
		regions = append(regions, s.ReplicaRegions[min(j, len(s.ReplicaRegions)-1)])
		if a, err := c.admin(r); err == nil {
			if err := a.ReplicateFrom(ctx, c.via(s.ReplicaRegions[min(j, len(s.ReplicaRegions)-1)], newPrimary), c.cfg.Repl); err != nil {
				c.log.Warn("repoint replica", "replica", r, "err", err)
			}
			a.Close()
		}
	}
	replicas = append(replicas, old)
	regions = append(regions, c.primaryRegion(s))
	s.Primary, s.Replicas, s.ReplicaRegions, s.Fenced = newPrimary, replicas, regions, false
	s.PrimaryRegion = newRegion
	if _, err := c.publish(ctx, s); err != nil {
		return res, fmt.Errorf("publish new primary: %w", err)
	}
	c.event(s.ID, "published", fmt.Sprintf("primary %s (region %s) epoch %d", newPrimary, newRegion, s.Epoch))
	c.mu.Lock()
	c.cooldown[s.ID] = time.Now().Add(c.cfg.Cooldown)
	delete(c.suspect, s.ID)
	c.mu.Unlock()
	res.NewPrimary, res.Epoch = newPrimary, s.Epoch
	return res, nil
}

// primaryRegion is where a shard's current primary runs.
func (c *Controller) primaryRegion(s shardmap.Shard) string {
	return cmp.Or(s.PrimaryRegion, s.HomeRegion)
}

func (c *Controller) unfence(ctx context.Context, s shardmap.Shard, cause error) error {
	s.Fenced = false
	if _, err := c.publish(ctx, s); err != nil {
		return fmt.Errorf("%w (and unfencing failed: %v)", cause, err)
	}
	return cause
}

// rejoin repoints listed replicas that answer but do not replicate from
// the current primary: a deposed primary coming back.
func (c *Controller) rejoin(ctx context.Context, m *shardmap.Map) {
	for _, s := range m.Shards {
		if s.Fenced {
			continue
		}
		for j, r := range s.Replicas {
			a, err := c.admin(r)
			if err != nil {
				continue
			}
			sctx, cancel := context.WithTimeout(ctx, time.Second)
			st, err := a.Status(sctx)
			cancel()
			region := ""
			if j < len(s.ReplicaRegions) {
				region = s.ReplicaRegions[j]
			}
			want := c.via(region, s.Primary)
			if err == nil && (st.PrimaryAddr != want || !st.IOThreadRunning() && st.IORunning != "Connecting") {
				if st.PrimaryAddr == want && strings.EqualFold(st.IORunning, "No") && st.LastIOErrno != 0 {
					a.Close()
					continue // diverged: needs a rebuild; reported by Status
				}
				rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				err := a.RejoinAsReplica(rctx, want, c.cfg.Repl)
				cancel()
				if err != nil {
					c.log.Warn("rejoin failed", "shard", s.ID, "server", r, "err", err)
				} else {
					c.event(s.ID, "rejoined", fmt.Sprintf("%s replicates from %s", r, s.Primary))
				}
			}
			a.Close()
		}
	}
}
