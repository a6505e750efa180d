package bed

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"

	_ "github.com/go-sql-driver/mysql" // the "mysql" driver

	"github.com/triage-queue/triage/cmd/triage/provision"
	"github.com/triage-queue/triage/deploy/mariadb"
	"github.com/triage-queue/triage/deploy/wan"
)

// Net is the bed's WAN: cut, heal or slow cross-region links with it. nil
// for a one-region bed.
func (b *Bed) Net() *wan.Net { return b.net }

// Cut partitions region from the others (wan.Net.Cut) and records the
// links' state in bed.json.
func (b *Bed) Cut(region string) error {
	if b.net == nil {
		return errors.New("bed: one region, no WAN to cut")
	}
	return errors.Join(b.net.Cut(region), b.rewriteLayout())
}

// Heal ends a Cut or the partition KillRegion leaves behind, and records
// the links' state in bed.json. It first waits until the nodes of killed
// regions have finished stopping, so none of them reaches another region
// through a healed link.
func (b *Bed) Heal(region string) error {
	if b.net == nil {
		return errors.New("bed: one region, no WAN to heal")
	}
	b.bg.Wait()
	return errors.Join(b.net.Heal(region), b.rewriteLayout())
}

// Server returns the mariadbd the bed started for shard in role "primary"
// or "replica" (RolePrimary and RoleReplica work too), or nil. Roles name
// the placement at start: after a failover the shard map, not this, says
// which one is the primary. After Restart it returns the new process.
// "replica" is the shard's first replica, in the next region; ReplicaIn
// finds the others.
func (b *Bed) Server(shard uint32, role string) *mariadb.Server {
	if d := b.server(shard, role); d != nil {
		return d.srv
	}
	return nil
}

// ReplicaIn returns the mariadbd the bed started as shard's replica in
// region, or nil.
func (b *Bed) ReplicaIn(shard uint32, region string) *mariadb.Server {
	for _, d := range b.replicasOf(shard) {
		if d.region == region {
			return d.srv
		}
	}
	return nil
}

// replicasOf lists shard's replicas in preference order (next region
// first).
func (b *Bed) replicasOf(shard uint32) []*dbServer {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []*dbServer
	for _, d := range b.servers {
		if d.shard == shard && d.role == RoleReplica {
			out = append(out, d)
		}
	}
	return out
}

func (b *Bed) server(shard uint32, role string) *dbServer {
	switch role {
	case "primary":
		role = RolePrimary
	case "replica":
		role = RoleReplica
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, d := range b.servers {
		if d.shard == shard && d.role == role {
			return d
		}
	}
	return nil
}

func (b *Bed) serverList() []*dbServer {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.servers)
}

// Via returns the address a process of region from dials to reach addr, a
// server of the bed: its WAN link from that region, or addr itself for a
// server of the same region (or an unknown address).
func (b *Bed) Via(from, addr string) string {
	if a, ok := b.via[from][addr]; ok {
		return a
	}
	return addr
}

// DialVia is region's map from remote servers' addresses to the WAN links
// it reaches them through, as node.Config.MySQL.DialVia takes it.
func (b *Bed) DialVia(region string) map[string]string { return maps.Clone(b.via[region]) }

// Regions lists the bed's regions in port order.
func (b *Bed) Regions() []string { return slices.Clone(b.cfg.Regions) }

// KillRegion makes region vanish, as a drill's "region down": it cuts the
// region's WAN links (every connection crossing to or from it is reset),
// SIGKILLs every mariadbd in it (its primaries and the replicas it hosts),
// shuts its NATS server down and stops its node. The node runs in this
// process, so it cannot be killed; with its NATS server gone and its links
// cut it can reach nothing, and its stop finishes in the background
// (Stop and Heal wait for it, which takes up to ~10 s of the node's own
// timeouts). The links stay cut: Heal the region (Bed.Heal) before
// restarting any of its servers.
func (b *Bed) KillRegion(name string) error {
	b.mu.Lock()
	if b.stopped {
		b.mu.Unlock()
		return errors.New("bed: stopped")
	}
	var r *region
	for _, x := range b.regions {
		if x.name == name {
			r = x
		}
	}
	if r == nil {
		b.mu.Unlock()
		return fmt.Errorf("bed: no region %q (regions: %v)", name, b.cfg.Regions)
	}
	if r.dead {
		b.mu.Unlock()
		return fmt.Errorf("bed: region %q is already down", name)
	}
	r.dead = true
	var victims []*dbServer
	for _, d := range b.servers {
		if d.region == name {
			victims = append(victims, d)
		}
	}
	b.bg.Add(1)
	b.mu.Unlock()

	var errs []error
	if b.net != nil {
		errs = append(errs, b.net.Cut(name))
	}
	errs = append(errs, provision.Parallel(len(victims), func(i int) error { return victims[i].srv.Kill() }))
	if r.nats != nil {
		r.nats.Shutdown()
	}
	go func() {
		defer b.bg.Done()
		if r.nats != nil {
			r.nats.WaitForShutdown()
		}
		if r.node != nil {
			r.node.Stop()
		}
	}()
	b.log.Warn("bed: region killed", "region", name, "mariadbd", len(victims))
	errs = append(errs, b.rewriteLayout())
	return errors.Join(errs...)
}

// Restart starts shard's mariadbd in role again on its datadir and port
// after it was killed or stopped (it stops it first if it still runs),
// with the flags the bed first gave it plus extraArgs (e.g.
// replication.RejoinArgs() for a deposed primary; a later Restart without
// them drops them again). The bed stops the new process on Stop, and
// bed.json gets its PID. Replicas keep --read-only=ON.
func (b *Bed) Restart(ctx context.Context, shard uint32, role string, extraArgs ...string) (*mariadb.Server, error) {
	d := b.server(shard, role)
	if d == nil {
		return nil, fmt.Errorf("bed: no %s of shard %d", role, shard)
	}
	return b.restart(ctx, d, extraArgs...)
}

func (b *Bed) restart(ctx context.Context, d *dbServer, extraArgs ...string) (*mariadb.Server, error) {
	shard, role := d.shard, d.role
	if err := d.srv.Stop(); err != nil {
		b.log.Warn("bed: stop before restart", "shard", shard, "role", role, "err", err)
	}
	cfg := d.srv.Config()
	cfg.ExtraArgs = append(slices.Clone(d.args), extraArgs...)
	s, err := mariadb.Start(ctx, cfg)
	if err != nil {
		return nil, err
	}
	b.mu.Lock()
	if b.stopped {
		b.mu.Unlock()
		_ = s.Stop()
		return nil, errors.New("bed: stopped")
	}
	d.srv = s
	if d.role == RolePrimary {
		b.Shards[shard] = s
	}
	for i, p := range b.Layout.Processes {
		if p.Role == d.role && p.Shard == shard && p.Region == d.region {
			b.Layout.Processes[i].PID = s.PID()
		}
	}
	b.mu.Unlock()
	return s, b.rewriteLayout()
}

// rewriteLayout refreshes bed.json (PIDs, link states) while the bed runs.
func (b *Bed) rewriteLayout() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.stopped {
		return nil
	}
	return b.writeLayout()
}
