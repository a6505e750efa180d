package regions

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/triage-queue/triage/regions/replication"
	"github.com/triage-queue/triage/shardmap"
)

// readOnlyWait bounds the attempt to make a primary reported down
// read-only: a live server's connect and SET take a few WAN round trips
// (~0.2 s across the beds' 40 ms). It is all the wait for the old
// primary when its address vanished with the server (the compose bed's
// killed container).
const readOnlyWait = 500 * time.Millisecond

// Failover moves the primary of shard's group (see group.go: the shards
// whose primary is the same server, with the same replicas) to its most
// advanced replica (in req.ToRegion, if set), in the steps the package
// doc describes: fence, stop the old primary's commits, choose, promote,
// publish. Each step records an event; a failed step leaves the group
// fenced (retried) or unfenced on the old primary, never with two
// writable primaries.
func (c *Controller) Failover(ctx context.Context, req FailoverRequest) (res FailoverResult, err error) {
	c.busy.Lock()
	defer c.busy.Unlock()
	c.mu.Lock()
	first := c.nEvents
	c.stepAt = time.Now()
	c.mu.Unlock()
	shards := []uint32{req.Shard}
	defer func() { c.finishFailover(req, shards, first, &res, err) }()
	f, err := c.newFailover(req)
	if f == nil || err != nil {
		return res, err
	}
	defer f.close()
	shards = ids(f.g)
	for _, step := range []func(context.Context) error{f.fence, f.stopCommits, f.choose, f.promote, f.publish} {
		if err := step(ctx); err != nil {
			return res, err
		}
	}
	res.NewPrimary = f.newPrimary
	for _, s := range f.g {
		if s.ID == req.Shard {
			res.Epoch = s.Epoch
		}
	}
	return res, nil
}

// finishFailover records the outcome of a Failover call: its events, and
// the failover metric of each of its shards when it did anything.
func (c *Controller) finishFailover(req FailoverRequest, shards []uint32, first int, res *FailoverResult, err error) {
	c.mu.Lock()
	c.stepAt = time.Time{}
	c.mu.Unlock()
	res.Events = c.eventsSince(first)
	if err == nil && len(res.Events) == 0 {
		return // nothing to do (finished meanwhile, cooling down)
	}
	kind, result := "emergency", "done"
	if req.Planned {
		kind = "planned"
	}
	if err != nil {
		result = "failed"
	}
	for _, id := range shards {
		c.cfg.Metrics.Failover(id, kind, result)
	}
}

// failover is one attempt at failing a group of shards over: what each
// step learns and the next one needs.
type failover struct {
	c   *Controller
	req FailoverRequest
	// g is the group as published by the last step, in ID order; s is its
	// first shard, whose primary and replicas are every shard's, and
	// which the group's events name.
	g   []shardmap.Shard
	s   shardmap.Shard
	old string // the primary being replaced
	// resumed are the shards fenced before this attempt: an earlier one
	// may have claimed a server for them.
	resumed []shardmap.Shard
	// candidates are the replicas the request allows (all, or those in
	// req.ToRegion).
	candidates []string

	// Found by stopCommits: an admin connection and the role of every
	// replica that answered, those that did not, and whether the old
	// primary was made read-only (at oldPos).
	replicas    map[string]*replication.Admin
	roles       map[string]replication.Role
	unreachable []string
	readOnly    bool
	oldPos      replication.GTIDList

	// Found by choose: the server this epoch promotes, and the one an
	// earlier attempt at this epoch claimed ("" if none).
	earlier    string
	newPrimary string
	chooseTook time.Duration // finding the candidate
	claimTook  time.Duration // recording the claim

	// Found by promote.
	epochStored bool
	epochTook   time.Duration
	detached    bool // by an earlier attempt: finished, not promoted again
}

// newFailover checks req against the current map and takes req.Shard's
// group; a nil failover with a nil error means there is nothing to do.
func (c *Controller) newFailover(req FailoverRequest) (*failover, error) {
	g := groupOf(c.cfg.Maps.Current(), req.Shard)
	if g == nil {
		return nil, fmt.Errorf("shard %d is not in the shard map", req.Shard)
	}
	now := time.Now()
	c.mu.Lock()
	cooling := slices.ContainsFunc(g, func(s shardmap.Shard) bool { return now.Before(c.cooldown[s.ID]) })
	c.mu.Unlock()
	var resumed []shardmap.Shard
	for _, s := range g {
		if s.Fenced {
			resumed = append(resumed, s)
		}
	}
	switch {
	case req.resume && len(resumed) == 0:
		return nil, nil // finished meanwhile
	case req.automatic && (cooling || len(resumed) > 0):
		return nil, nil // just failed over, or being failed over
	}
	s := g[0]
	f := &failover{c: c, req: req, g: g, s: s, old: s.Primary, resumed: resumed,
		replicas: map[string]*replication.Admin{}, roles: map[string]replication.Role{}}
	for i, r := range s.Replicas {
		if req.ToRegion == "" || (i < len(s.ReplicaRegions) && s.ReplicaRegions[i] == req.ToRegion) {
			f.candidates = append(f.candidates, r)
		}
	}
	if len(f.candidates) == 0 {
		in := ""
		if req.ToRegion != "" {
			in = " in " + req.ToRegion
		}
		return nil, fmt.Errorf("shard %d has no replica%s to fail over to", req.Shard, in)
	}
	return f, nil
}

func (f *failover) close() {
	for _, a := range f.replicas {
		a.Close()
	}
}

// event records a step of the group's failover, under its first shard.
func (f *failover) event(step, details string) {
	f.c.event(f.s.ID, step, groupPrefix(f.g)+details)
}

// update takes the shards of next, as just published, into the group.
func (f *failover) update(next []shardmap.Shard) {
	for _, n := range next {
		if i := slices.IndexFunc(f.g, func(s shardmap.Shard) bool { return s.ID == n.ID }); i >= 0 {
			f.g[i] = n
		}
	}
	f.s = f.g[0]
}

// fence publishes the group's shards fenced at their next epoch, in one
// publish: routers and dequeuers stop writing to them. Shards fenced
// already (resuming) keep their epoch.
func (f *failover) fence(ctx context.Context) error {
	var prev, next []shardmap.Shard
	for _, s := range f.g {
		if !s.Fenced {
			prev = append(prev, s)
			s.Fenced = true
			s.Epoch++
			next = append(next, s)
		}
	}
	if len(next) == 0 {
		return nil // resuming
	}
	if err := f.c.checkLeader(ctx, f.s.ID, "fence"); err != nil {
		return err
	}
	if _, err := f.c.publish(ctx, prev, next); err != nil {
		return fmt.Errorf("fence: %w", err)
	}
	f.update(next)
	f.event("fenced", epochs(next)+" published fenced")
	return nil
}

// epochs says the epochs of g: "epoch N", or "epochs N-M".
func epochs(g []shardmap.Shard) string {
	lo, hi := g[0].Epoch, g[0].Epoch
	for _, s := range g {
		lo, hi = min(lo, s.Epoch), max(hi, s.Epoch)
	}
	if lo == hi {
		return fmt.Sprintf("epoch %d", lo)
	}
	return fmt.Sprintf("epochs %d-%d", lo, hi)
}

// stopCommits stops the old primary from completing commits: read_only
// if it answers, else every replica stops receiving from it (with
// semi-sync and no fallback it then completes none).
func (f *failover) stopCommits(ctx context.Context) error {
	if err := f.c.checkLeader(ctx, f.s.ID, "read-only"); err != nil {
		return err
	}
	begun := time.Now()
	f.reach(ctx)
	if f.readOnly {
		f.event("old-primary-read-only", fmt.Sprintf("%s at %s", f.old, f.oldPos))
		return nil
	}
	if f.req.Planned {
		return f.c.unfence(ctx, f.g, fmt.Errorf("planned switchover: old primary %s cannot be made read-only; use an emergency failover", f.old))
	}
	// Every replica must stop receiving: one we cannot reach may still
	// take the old primary's commits, and hold the only copy of
	// acknowledged ones. Refuse (the shard stays fenced and is retried)
	// rather than lose them.
	if len(f.unreachable) > 0 {
		f.c.log.Error("ALARM: failover blocked: old primary and some replicas unreachable; promoting another replica could lose acknowledged commits",
			"shard", f.s.ID, "old_primary", f.old, "unreachable", f.unreachable)
		return fmt.Errorf("shard %d: old primary %s and replicas %v cannot be reached; the shard stays fenced and is retried", f.s.ID, f.old, f.unreachable)
	}
	reached := time.Now()
	slowest, err := f.stopReceiving(ctx)
	if err != nil {
		return fmt.Errorf("shard %d: %w", f.s.ID, err)
	}
	// The timings say where the step's time went: reaching the servers
	// (a dead one costs readOnlyWait) or a replica's stop.
	f.event("old-primary-unreachable", fmt.Sprintf("%s; every replica stopped receiving from it, so it can complete no commit "+
		"(servers reached in %v, slowest replica stopped in %v)", f.old, reached.Sub(begun).Round(time.Millisecond), slowest.Round(time.Millisecond)))
	return nil
}

// reach makes the old primary read-only, if it answers, and connects to
// every replica, all at once: each admin connection crosses the WAN, and
// a dead server costs its connect timeout, so in sequence they add up.
func (f *failover) reach(ctx context.Context) {
	var mu sync.Mutex
	var wg sync.WaitGroup
	wg.Go(func() {
		a, err := f.c.admin(f.old)
		if err != nil {
			return
		}
		defer a.Close()
		// A dead server whose address vanished (a killed container)
		// answers nothing, so this waits out its whole timeout before the
		// replicas are fenced instead: readOnlyWait when the primary was
		// reported down. If a live one is missed, the replica-side fence is
		// as safe. A planned switchover needs read_only, so it waits
		// longer.
		wait := readOnlyWait
		if f.req.Planned {
			wait = 5 * time.Second
		}
		rctx, cancel := context.WithTimeout(ctx, wait)
		defer cancel()
		if err := a.SetReadOnly(rctx, true); err != nil {
			return
		}
		if st, err := a.Status(rctx); err == nil {
			f.oldPos, f.readOnly = st.BinlogPos, true
		}
	})
	for _, r := range f.s.Replicas {
		wg.Go(func() {
			a, err := f.c.admin(r)
			var st replication.Status
			if err == nil {
				sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
				st, err = a.Status(sctx)
				cancel()
				if err != nil {
					a.Close()
				}
			}
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				f.unreachable = append(f.unreachable, r)
				return
			}
			f.replicas[r], f.roles[r] = a, st.Role
		})
	}
	wg.Wait()
}

// stopReceiving stops every reached replica's IO thread, in parallel, and
// says how long the slowest took.
func (f *failover) stopReceiving(ctx context.Context) (slowest time.Duration, err error) {
	var mu sync.Mutex
	var errs []error
	var wg sync.WaitGroup
	for r, a := range f.replicas {
		wg.Go(func() {
			start := time.Now()
			// STOP SLAVE IO_THREAD waits for an IO thread that is
			// connecting to the dead primary to give up (on the compose
			// bed, about 3 s for a vanished address), and a timeout here
			// fails the whole failover, which then starts over a detection
			// round later, so it gets the time.
			sctx, cancel := context.WithTimeout(ctx, 6*time.Second)
			err := a.StopReceiving(sctx)
			cancel()
			mu.Lock()
			defer mu.Unlock()
			slowest = max(slowest, time.Since(start))
			if err != nil {
				errs = append(errs, fmt.Errorf("stop replica %s receiving from the old primary: %w", r, err))
			}
		})
	}
	wg.Wait()
	return slowest, errors.Join(errs...)
}

// eligible: only a server that replicates can be promoted. A listed
// server that replicates from nobody is a deposed primary not yet
// rejoined: it lacks whatever was written since it was deposed, and
// promoting it (or writing the epoch there) forks the shard's history.
// The one exception is the server this epoch's failover already claimed
// and detached: it is finished, not chosen again.
func (f *failover) eligible(r string) bool {
	return f.roles[r] == replication.RoleReplica || r == f.earlier
}

// choose picks the candidate that holds everything the old primary
// acknowledged and claims it for this epoch.
func (f *failover) choose(ctx context.Context) error {
	chose := time.Now()
	var err error
	if f.earlier, err = f.claimedEarlier(ctx); err != nil {
		return err
	}
	if f.readOnly {
		err = f.chooseCaughtUp(ctx)
	} else {
		err = f.chooseMostAdvanced(ctx)
	}
	if err != nil {
		return err
	}
	// One promotion per shard and epoch: the claim is created once; a
	// controller resuming this epoch promotes the claimed server, or none.
	claimAt := time.Now()
	f.chooseTook = claimAt.Sub(chose)
	if f.earlier != "" && f.earlier != f.newPrimary {
		f.event("claimed-earlier", fmt.Sprintf("%s promotes %s (claimed before), not %s", epochs(f.resumed), f.earlier, f.newPrimary))
		f.newPrimary = f.earlier
	}
	errs := eachShard(f.g, func(_ int, s shardmap.Shard) error { return f.c.claim(ctx, s, f.newPrimary) })
	if err := errors.Join(errs...); err != nil {
		return err
	}
	f.claimTook = time.Since(claimAt)
	if _, ok := f.replicas[f.newPrimary]; !ok {
		return fmt.Errorf("shard %d: claimed candidate %s does not answer; the shard stays fenced", f.s.ID, f.newPrimary)
	}
	return nil
}

// claimedEarlier returns the server an earlier attempt claimed for the
// shards fenced before this one, at their epochs ("" if none): a
// controller resuming the group promotes it, or none. (A shard this
// attempt fenced is at an epoch no attempt claimed for; its claim, made
// with the others', fails if one did.) Claims naming different servers
// cannot come from one group's attempts: the group stays fenced.
func (f *failover) claimedEarlier(ctx context.Context) (string, error) {
	got := make([]string, len(f.resumed))
	errs := eachShard(f.resumed, func(i int, s shardmap.Shard) (err error) {
		got[i], err = f.c.claimed(ctx, s)
		return err
	})
	if err := errors.Join(errs...); err != nil {
		return "", err
	}
	slices.Sort(got)
	got = slices.Compact(slices.DeleteFunc(got, func(a string) bool { return a == "" }))
	if len(got) > 1 {
		return "", fmt.Errorf("shard %d: the group's shards claim different servers %v at their epochs; it stays fenced", f.s.ID, got)
	}
	if len(got) == 0 {
		return "", nil
	}
	return got[0], nil
}

// chooseCaughtUp, the old primary being read-only, takes the first
// candidate that applies its final position; if none does in time, the
// old primary serves again.
func (f *failover) chooseCaughtUp(ctx context.Context) error {
	wait := 5 * time.Second
	if f.req.Planned {
		wait = 30 * time.Second
	}
	var errs []error
	for _, r := range f.candidates {
		a, ok := f.replicas[r]
		if !ok || !f.eligible(r) {
			continue
		}
		if err := a.WaitApplied(ctx, f.oldPos, wait); err != nil {
			errs = append(errs, err)
			continue
		}
		f.newPrimary = r
		return nil
	}
	why := errors.Join(errs...)
	if why == nil {
		why = errors.New("no candidate replicates (deposed primaries not rejoined yet)")
	}
	f.c.log.Error("ALARM: failover refused: no candidate caught up with the old primary; it serves again",
		"shard", f.s.ID, "old_primary", f.old, "position", f.oldPos.String(), "err", why)
	if a, err := f.c.admin(f.old); err == nil {
		err = a.SetReadOnly(ctx, false)
		a.Close()
		if err != nil {
			return fmt.Errorf("shard %d: no candidate caught up, and the old primary cannot be unfenced: %w", f.s.ID, err)
		}
	}
	return f.c.unfence(ctx, f.g, fmt.Errorf("shard %d: no candidate applied the old primary's position %s in time; refused: %w",
		f.s.ID, f.oldPos, why))
}

// chooseMostAdvanced, the old primary being unreachable, takes the
// replica that received the most of its transactions, or a candidate
// (req.ToRegion) that received as much.
func (f *failover) chooseMostAdvanced(ctx context.Context) error {
	var all []*replication.Admin
	var addrs, deposed []string
	for _, r := range f.s.Replicas {
		if !f.eligible(r) {
			deposed = append(deposed, r)
			continue
		}
		all = append(all, f.replicas[r])
		addrs = append(addrs, r)
	}
	if len(deposed) > 0 {
		f.event("skipped-deposed", fmt.Sprintf("%v replicate from nobody (deposed primaries not rejoined yet): not candidates", deposed))
	}
	if len(all) == 0 {
		return fmt.Errorf("shard %d: no listed server replicates (%v are deposed primaries not rejoined yet); the shard stays fenced and is retried", f.s.ID, deposed)
	}
	i, err := replication.MostAdvanced(ctx, all)
	if err != nil {
		return fmt.Errorf("choose replica: %w", err)
	}
	best := addrs[i]
	if f.req.ToRegion == "" {
		f.newPrimary = best
		return nil
	}
	bst, err := f.replicas[best].Status(ctx)
	if err != nil {
		return fmt.Errorf("shard %d: status of %s: %w", f.s.ID, best, err)
	}
	for _, r := range f.candidates {
		if !f.eligible(r) {
			continue
		}
		if st, err := f.replicas[r].Status(ctx); err == nil && st.Received().Covers(bst.Received()) {
			f.newPrimary = r
			return nil
		}
	}
	return fmt.Errorf("shard %d: no replica in %v has everything %s received; the shard stays fenced", f.s.ID, f.candidates, best)
}

// promote makes the chosen server the primary, repoints the other
// replicas to it and stores every shard's new epoch there.
func (f *failover) promote(ctx context.Context) error {
	if err := f.c.checkLeader(ctx, f.s.ID, "promote"); err != nil {
		return err
	}
	promoteAt := time.Now()
	p := f.repointer(ctx)
	// The epoch is stored in prepare, while the candidate is detached and
	// before it takes writes: a commit there waits for no replica yet, so
	// the map is published while the repointed replicas' IO threads are
	// still connecting, instead of after. A failed store is tried again
	// below, as the new primary's first commit.
	var epochErr error
	prepare := func(ctx context.Context) error {
		p.start()
		f.epochTook, epochErr = f.storeEpochs(ctx)
		f.epochStored = epochErr == nil
		return nil
	}
	gtid, err := f.replicas[f.newPrimary].Promote(ctx, 30*time.Second, prepare)
	promoted := time.Since(promoteAt)
	if err != nil && !errors.Is(err, replication.ErrNotReplica) {
		p.wait()
		return fmt.Errorf("promote %s: %w", f.newPrimary, err)
	}
	if err != nil && f.newPrimary != f.earlier {
		return fmt.Errorf("shard %d: %s replicates from nobody and was not claimed by an earlier attempt at %s; the shard stays fenced", f.s.ID, f.newPrimary, epochs(f.g))
	}
	f.detached = err != nil
	p.start() // no-op if prepare ran; detached by an earlier attempt, it did not
	repointed := p.wait()
	ms := func(d time.Duration) time.Duration { return d.Round(time.Millisecond) }
	f.event("promoted", fmt.Sprintf("%s at %s; other replicas repointed to it (candidate chosen in %v, claimed in %v, promoted in %v, slowest repoint %v)",
		f.newPrimary, gtid, ms(f.chooseTook), ms(f.claimTook), ms(promoted), ms(repointed)))
	if epochErr != nil {
		f.c.log.Warn("storing the failover epoch before the promotion failed; storing it now", "shard", f.s.ID, "err", epochErr)
	}
	return f.finishPromotion(ctx)
}

// storeEpochs stores the epoch of every shard of the group on the new
// primary (each in its own database), perShardParallel at a time, and
// says how long it took.
func (f *failover) storeEpochs(ctx context.Context) (time.Duration, error) {
	start := time.Now()
	a := f.replicas[f.newPrimary]
	errs := eachShard(f.g, func(_ int, s shardmap.Shard) error {
		_, err := f.c.storeEpoch(ctx, s, a)
		return err
	})
	return time.Since(start), errors.Join(errs...)
}

// finishPromotion stores the epochs if prepare did not (the server was
// detached by an earlier attempt, or a store failed): now they are the
// new primary's first commits and need a replica's acknowledgement. A
// server detached earlier is then brought to the end of Promote.
func (f *failover) finishPromotion(ctx context.Context) error {
	if !f.epochStored {
		took, err := f.storeEpochs(ctx)
		if err != nil {
			return fmt.Errorf("%w (no replica acknowledges the new primary yet?); the shard stays fenced and is retried", err)
		}
		f.epochTook = took
	}
	if f.detached {
		if err := f.replicas[f.newPrimary].FinishPromotion(ctx); err != nil {
			return fmt.Errorf("shard %d: finish the promotion of %s: %w; the shard stays fenced and is retried", f.s.ID, f.newPrimary, err)
		}
	}
	return nil
}

// publish names the new primary in the map for every shard of the
// group, unfenced, in one publish, with the old one and the other
// replicas listed as replicas (the old one rejoins once it answers), and
// starts the shards' cooldown.
func (f *failover) publish(ctx context.Context) error {
	if err := f.c.checkLeader(ctx, f.s.ID, "publish"); err != nil {
		return err
	}
	publishAt := time.Now()
	next := make([]shardmap.Shard, len(f.g))
	for i, s := range f.g {
		next[i] = f.moved(s)
	}
	if _, err := f.c.publish(ctx, f.g, next); err != nil {
		return fmt.Errorf("publish new primary: %w", err)
	}
	key := groupKey(f.s)
	f.update(next)
	when := "before it took writes"
	if !f.epochStored {
		when = "as its first commit"
	}
	f.event("published", fmt.Sprintf("primary %s (region %s) %s (epoch stored on it in %v %s; published in %v)",
		f.newPrimary, f.s.PrimaryRegion, epochs(f.g), f.epochTook.Round(time.Millisecond), when, time.Since(publishAt).Round(time.Millisecond)))
	f.c.mu.Lock()
	for _, s := range f.g {
		f.c.cooldown[s.ID] = time.Now().Add(f.c.cfg.Cooldown)
	}
	delete(f.c.suspect, key)
	f.c.mu.Unlock()
	return nil
}

// moved returns s with the new primary, unfenced, and the old primary
// listed last among its replicas.
func (f *failover) moved(s shardmap.Shard) shardmap.Shard {
	newRegion := s.ReplicaRegion(f.newPrimary)
	var replicas, regions []string
	for j, r := range s.Replicas {
		if r != f.newPrimary {
			replicas = append(replicas, r)
			regions = append(regions, s.ReplicaRegions[min(j, len(s.ReplicaRegions)-1)])
		}
	}
	replicas = append(replicas, f.old)
	regions = append(regions, f.c.primaryRegion(s))
	s.Primary, s.Replicas, s.ReplicaRegions, s.Fenced = f.newPrimary, replicas, regions, false
	s.PrimaryRegion = newRegion
	return s
}

// repointer repoints the shard's other reachable replicas to the new
// primary, in parallel, once started.
//
// They are repointed once the candidate has applied everything it
// received and before it takes writes (Promote's prepare): attached
// before its first commit they acknowledge it at once, and the rest of
// the promotion overlaps their connecting. Not earlier: a replica that
// received more than the candidate has applied yet asks for a position
// missing from its binary log, and stops for good on error 1236.
//
// A deposed primary not rejoined yet rejoins now: it is read-only since
// its restart (RejoinArgs), and acknowledging the new primary it lets the
// epoch be stored there.
type repointer struct {
	f       *failover
	ctx     context.Context
	started bool
	wg      sync.WaitGroup
	mu      sync.Mutex
	slowest time.Duration
}

func (f *failover) repointer(ctx context.Context) *repointer {
	return &repointer{f: f, ctx: ctx}
}

// start begins the repoints; a second call does nothing.
func (p *repointer) start() {
	if p.started {
		return
	}
	p.started = true
	f := p.f
	for j, r := range f.s.Replicas {
		a, ok := f.replicas[r]
		if r == f.newPrimary || !ok {
			continue // unreachable: rejoined when it answers
		}
		region := f.s.ReplicaRegions[min(j, len(f.s.ReplicaRegions)-1)]
		repoint := a.ReplicateFrom
		if f.roles[r] == replication.RolePrimary {
			repoint = a.RejoinAsReplica
		}
		p.wg.Go(func() {
			start := time.Now()
			if err := repoint(p.ctx, f.c.via(region, f.newPrimary), f.c.cfg.Repl); err != nil {
				f.c.log.Warn("repoint replica", "replica", r, "err", err)
			}
			p.mu.Lock()
			p.slowest = max(p.slowest, time.Since(start))
			p.mu.Unlock()
		})
	}
}

// wait waits for the repoints started and says how long the slowest took.
func (p *repointer) wait() time.Duration {
	p.wg.Wait()
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.slowest
}
