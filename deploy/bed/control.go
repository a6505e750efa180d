package bed

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/triage-queue/triage/cmd/triage/natsserver"
	"github.com/triage-queue/triage/regions/replication"
	"github.com/triage-queue/triage/shardmap"
)

// The control endpoint lets `triage-bed drill`, a separate process, inject
// and heal faults in this bed, which owns the processes, links and NATS
// servers: POST /fault/SCENARIO, /heal/SCENARIO and /fate/SCENARIO with
// ?region=R&shard=N, answered with {"description": ...} or {"error": ...}.
// The nemesis's own faults (mariadb-pause, enqueuer-kill, wan-spike) are
// in faults.go.
// It listens on loopback only; bed.json names it ("control"), and Client
// (client.go) is its client side.

// serveControl starts the endpoint.
func (b *Bed) serveControl() error {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /{action}/{scenario}", func(w http.ResponseWriter, r *http.Request) {
		region := r.URL.Query().Get("region")
		shard, _ := strconv.ParseUint(r.URL.Query().Get("shard"), 10, 32)
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Minute)
		defer cancel()
		desc, err := b.control(ctx, r.PathValue("action"), r.PathValue("scenario"), region, uint32(shard))
		out := map[string]string{"description": desc}
		if err != nil {
			out = map[string]string{"error": err.Error()}
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(out)
	})
	b.control_ = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = b.control_.Serve(l) }()
	b.Layout.Control = l.Addr().String()
	return nil
}

func (b *Bed) regionByName(name string) (*region, error) {
	for _, r := range b.regions {
		if r.name == name {
			return r, nil
		}
	}
	return nil, fmt.Errorf("no region %q (regions: %v)", name, b.cfg.Regions)
}

// firstShard is the first shard homed in region.
func (b *Bed) firstShard(region string) (uint32, error) {
	for _, d := range b.serverList() {
		if d.role == RolePrimary && d.region == region {
			return d.shard, nil
		}
	}
	return 0, fmt.Errorf("region %q has no shard", region)
}

// failedOver reports whether shard's primary moved off the server the bed
// started as its primary, in the map of any live region's node. Any, not
// the first: right after a partition heals, the healed region's node still
// holds the map from before the cut, and asking it alone made the heal
// leave a deposed primary running as a primary (its commits that waited
// for a semi-sync acknowledgement kept it from being fenced read-only, so
// it never rejoined).
func (b *Bed) failedOver(shard uint32) bool {
	d := b.server(shard, RolePrimary)
	if d == nil {
		return false
	}
	for _, r := range b.regions {
		if r.node == nil || r.dead {
			continue
		}
		if s, ok := r.node.ShardMap().Shard(shard); ok && s.Primary != d.srv.Addr() {
			return true
		}
	}
	return false
}

// errUnknownScenario is what the handlers of one action return for a
// scenario they do not know; control turns it into the error listing the
// scenarios.
var errUnknownScenario = errors.New("unknown scenario")

// control runs action ("fault", "heal" or "fate") of scenario in the
// region named regionName, on shard (0: the region's first shard), and
// describes what it did.
func (b *Bed) control(ctx context.Context, action, scenario, regionName string, shard uint32) (string, error) {
	r, err := b.regionByName(regionName)
	if err != nil {
		return "", err
	}
	if shard == 0 {
		if shard, err = b.firstShard(r.name); err != nil {
			return "", err
		}
	}
	var desc string
	switch action {
	case "fault":
		desc, err = b.injectFault(ctx, scenario, r, shard)
	case "heal":
		desc, err = b.healFault(ctx, scenario, r, shard)
		if more := b.superviseDeposed(ctx); more != "" {
			desc += "; " + more
		}
	case "fate":
		desc, err = b.fateAfter(ctx, scenario, shard)
	default:
		err = errUnknownScenario
	}
	if err == errUnknownScenario {
		return "", fmt.Errorf("unknown %s %q: scenarios are primary-kill, region-down, partition, nats-kill, dequeuer-kill, mariadb-pause, enqueuer-kill, wan-spike", action, scenario)
	}
	return desc, err
}

// injectFault injects scenario into region r (shard, for the scenarios
// that fault one shard's primary).
func (b *Bed) injectFault(ctx context.Context, scenario string, r *region, shard uint32) (string, error) {
	switch scenario {
	case "primary-kill":
		return b.killPrimary(shard)
	case "region-down":
		b.rememberPrimaries(r.name)
		if err := b.KillRegion(r.name); err != nil {
			return "", err
		}
		return fmt.Sprintf("region %s down: its mariadbds killed -9, its NATS server and node stopped, its links cut", r.name), nil
	case "partition":
		b.rememberPrimaries(r.name)
		if err := b.Cut(r.name); err != nil {
			return "", err
		}
		return fmt.Sprintf("every cross-region link of %s cut (NATS routes, replication, remote primaries)", r.name), nil
	case "nats-kill":
		if r.nats == nil {
			return "", errors.New("region has no NATS server")
		}
		r.nats.Shutdown()
		r.nats.WaitForShutdown()
		return fmt.Sprintf("NATS server of %s stopped abruptly", r.name), nil
	case "dequeuer-kill":
		if r.node == nil {
			return "", errors.New("region has no node")
		}
		return fmt.Sprintf("dequeuer of %s crashed (no lease hand-back, ownership left to expire)", r.name), r.node.CrashDequeuer()
	case "mariadb-pause":
		return b.pause(shard)
	case "enqueuer-kill":
		return b.crashEnqueuer(ctx, r)
	case "wan-spike":
		return b.spike(r, true)
	}
	return "", errUnknownScenario
}

// healFault heals scenario in region r (shard, for the scenarios that
// fault one shard's primary).
func (b *Bed) healFault(ctx context.Context, scenario string, r *region, shard uint32) (string, error) {
	switch scenario {
	case "primary-kill":
		return b.healKilledPrimary(ctx, shard)
	case "region-down":
		return b.healRegionDown(ctx, r)
	case "partition":
		return b.healPartition(ctx, r)
	case "nats-kill":
		s, err := natsserver.Start(r.natsCfg)
		if err != nil {
			return "", err
		}
		r.nats = s
		return fmt.Sprintf("NATS server of %s restarted on %s", r.name, s.ClientURL()), nil
	case "dequeuer-kill":
		return fmt.Sprintf("a new dequeuer started in %s", r.name), r.node.RestartDequeuer(ctx)
	case "mariadb-pause":
		return b.thaw(ctx, shard)
	case "enqueuer-kill":
		return b.healEnqueuer(ctx, r)
	case "wan-spike":
		return b.spike(r, false)
	}
	return "", errUnknownScenario
}

// fateAfter says, after scenario, what the bed's original primary of
// shard is now, for the scenarios that fault a primary.
func (b *Bed) fateAfter(ctx context.Context, scenario string, shard uint32) (string, error) {
	switch scenario {
	case "primary-kill", "region-down", "partition", "mariadb-pause":
		return b.fate(ctx, shard), nil
	case "nats-kill", "dequeuer-kill", "enqueuer-kill", "wan-spike":
		return "not applicable: no primary was faulted", nil
	}
	return "", errUnknownScenario
}

// killPrimary kills -9 shard's current primary, per the live map (after
// an earlier drill on the same bed, the one the bed started is a replica
// now), and remembers it for the heal.
func (b *Bed) killPrimary(shard uint32) (string, error) {
	d := b.currentPrimary(shard)
	if d == nil {
		return "", fmt.Errorf("shard %d: no server of the bed is its primary in the shard map", shard)
	}
	if err := d.srv.Kill(); err != nil {
		return "", err
	}
	b.mu.Lock()
	if b.killed == nil {
		b.killed = map[uint32]*dbServer{}
	}
	b.killed[shard] = d
	b.mu.Unlock()
	return fmt.Sprintf("kill -9 of shard %d's primary mariadbd (pid %d, %s, region %s, started as %s)",
		shard, d.srv.PID(), d.srv.Addr(), d.region, d.role), nil
}

// healKilledPrimary restarts the server the last primary-kill of shard
// killed, or, with none on record, the bed's original primary.
func (b *Bed) healKilledPrimary(ctx context.Context, shard uint32) (string, error) {
	b.mu.Lock()
	d := b.killed[shard]
	delete(b.killed, shard)
	b.mu.Unlock()
	if d == nil {
		return b.restartOldPrimaries(ctx, []uint32{shard})
	}
	return b.restartKilled(ctx, d)
}

// healRegionDown heals r's links and restarts its mariadbds: those that
// were shard primaries when it went down as restartKilled does (to rejoin
// when their shard failed over, as the primary otherwise), the others as
// the replicas they were. Its NATS server and node stay down.
func (b *Bed) healRegionDown(ctx context.Context, r *region) (string, error) {
	if err := b.Heal(r.name); err != nil {
		return "", err
	}
	primaries := b.takePrimaries(r.name)
	var parts []string
	for _, d := range b.serverList() {
		if d.region != r.name {
			continue
		}
		if slices.Contains(primaries, d) {
			desc, err := b.restartKilled(ctx, d)
			if err != nil {
				return strings.Join(parts, "; "), err
			}
			parts = append(parts, desc)
			continue
		}
		if _, err := b.restart(ctx, d); err != nil {
			return strings.Join(parts, "; "), err
		}
	}
	return "links healed; " + cmp.Or(strings.Join(parts, "; "), "no primary to restart") +
		" (the region's NATS server and node stay down until the bed restarts)", nil
}

// healPartition heals r's links, then crashes and restarts, to rejoin as
// replicas, the servers that were shard primaries when r was cut off and
// whose shards failed over meanwhile: crashed, not stopped, because a
// deposed primary may hold commits waiting for an acknowledgement no
// replica will send, which a clean shutdown would complete, forking the
// shard's history. Crash recovery with replication.RejoinArgs drops them.
func (b *Bed) healPartition(ctx context.Context, r *region) (string, error) {
	if err := b.Heal(r.name); err != nil {
		return "", err
	}
	var parts []string
	for _, d := range b.takePrimaries(r.name) {
		if b.currentPrimary(d.shard) == d {
			continue
		}
		if err := d.srv.Kill(); err != nil {
			return strings.Join(parts, "; "), err
		}
		desc, err := b.restartKilled(ctx, d)
		if err != nil {
			return strings.Join(parts, "; "), err
		}
		parts = append(parts, strings.Replace(desc, "killed primary", "old primary", 1))
	}
	return "links healed; " + cmp.Or(strings.Join(parts, "; "), "no primary to restart"), nil
}

// rememberPrimaries records the servers of region that the live shard
// map names primary, before a partition or region-down of it: whichever
// the bed started them as, those are what the fault may depose.
func (b *Bed) rememberPrimaries(region string) {
	var ds []*dbServer
	for _, d := range b.serverList() {
		if d.region == region && b.currentPrimary(d.shard) == d {
			ds = append(ds, d)
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.cutOff == nil {
		b.cutOff = map[string][]*dbServer{}
	}
	b.cutOff[region] = ds
}

// takePrimaries returns and forgets what rememberPrimaries recorded.
func (b *Bed) takePrimaries(region string) []*dbServer {
	b.mu.Lock()
	defer b.mu.Unlock()
	ds := b.cutOff[region]
	delete(b.cutOff, region)
	return ds
}

// currentPrimary is the server of the bed that the live shard map names
// as shard's primary (the one the bed started as primary when no node can
// tell), or nil.
func (b *Bed) currentPrimary(shard uint32) *dbServer {
	var newest *shardmap.Map
	for _, r := range b.regions {
		if r.node == nil || r.dead {
			continue
		}
		if m := r.node.ShardMap(); newest == nil || m.Version > newest.Version {
			newest = m
		}
	}
	if newest == nil {
		return b.server(shard, RolePrimary)
	}
	s, ok := newest.Shard(shard)
	if !ok {
		return nil
	}
	for _, d := range b.serverList() {
		if d.shard == shard && d.srv.Addr() == s.Primary {
			return d
		}
	}
	return nil
}

// restartKilled restarts d, which a primary-kill killed: to rejoin as a
// replica when the shard failed over away from it, as the primary again
// otherwise.
func (b *Bed) restartKilled(ctx context.Context, d *dbServer) (string, error) {
	var args []string
	how := "as primary"
	if cur := b.currentPrimary(d.shard); cur != d {
		args, how = replication.RejoinArgs(), "to rejoin as a replica"
	}
	s, err := b.restart(ctx, d, args...)
	if err != nil {
		return "", err
	}
	if args == nil {
		if err := enableSemiSyncPrimary(ctx, s.DSN("")); err != nil {
			return "", err
		}
	}
	return fmt.Sprintf("shard %d's killed primary (started as %s) restarted %s (pid %d)", d.shard, d.role, how, s.PID()), nil
}

// restartOldPrimaries restarts the bed's original primaries of shards: with
// replication.RejoinArgs when the shard failed over (so crash recovery
// drops what no replica acknowledged and the controller rejoins it as a
// replica), as a primary again otherwise.
func (b *Bed) restartOldPrimaries(ctx context.Context, shards []uint32) (string, error) {
	var parts []string
	for _, shard := range shards {
		var args []string
		how := "as primary"
		if b.failedOver(shard) {
			args, how = replication.RejoinArgs(), "to rejoin as a replica"
			// Crash it first: a clean shutdown of a deposed primary (a
			// partition's, still running) completes the commits that were
			// waiting for a semi-sync acknowledgement, which no replica
			// has, and it can never rejoin. Crash recovery with RejoinArgs
			// drops them.
			if d := b.server(shard, RolePrimary); d != nil {
				_ = d.srv.Kill()
			}
		}
		s, err := b.Restart(ctx, shard, RolePrimary, args...)
		if err != nil {
			return strings.Join(parts, "; "), err
		}
		if args == nil {
			// Still the primary: semi-sync was a runtime setting.
			if err := enableSemiSyncPrimary(ctx, s.DSN("")); err != nil {
				return strings.Join(parts, "; "), err
			}
		}
		parts = append(parts, fmt.Sprintf("shard %d's old primary restarted %s (pid %d)", shard, how, s.PID()))
	}
	if len(parts) == 0 {
		return "no primary to restart", nil
	}
	return strings.Join(parts, "; "), nil
}

func enableSemiSyncPrimary(ctx context.Context, dsn string) error {
	a, err := replication.Open(dsn)
	if err != nil {
		return err
	}
	defer a.Close()
	return a.EnableSemiSync(ctx, true)
}

// fate says what the bed's original primary of shard is now.
func (b *Bed) fate(ctx context.Context, shard uint32) string {
	d := b.server(shard, RolePrimary)
	if d == nil {
		return "unknown shard"
	}
	c := mysql.NewConfig()
	c.User, c.Net, c.Addr, c.Timeout = "root", "tcp", d.srv.Addr(), 2*time.Second
	a, err := replication.Open(c.FormatDSN())
	if err != nil {
		return "unreachable: " + err.Error()
	}
	defer a.Close()
	// The controller rejoins it within a few passes; give it that long.
	var st replication.Status
	deadline := time.Now().Add(15 * time.Second)
	for {
		sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		st, err = a.Status(sctx)
		cancel()
		if err == nil && (!b.failedOver(shard) || st.IOThreadRunning()) || time.Now().After(deadline) {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	switch {
	case err != nil:
		return "down: " + err.Error()
	case !b.failedOver(shard):
		return fmt.Sprintf("still the primary (%s, read_only=%v): no failover happened", d.srv.Addr(), st.ReadOnly)
	case st.IOThreadRunning():
		return fmt.Sprintf("rejoined as a read-only replica of %s (read_only=%v, at %s)", st.PrimaryAddr, st.ReadOnly, st.CurrentPos)
	default:
		return fmt.Sprintf("not replicating (read_only=%v, IO %s, last error %q): needs a rebuild from the new primary",
			st.ReadOnly, st.IORunning, st.LastIOError)
	}
}
