package bed

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/triage-queue/triage/deploy/mariadb"
	"github.com/triage-queue/triage/regions/replication"
	"github.com/triage-queue/triage/shardmap"
)

// The bed's MariaDB accounts. Fixed, because the bed is a local test
// rig reachable only on loopback, and because a drill in another process
// must be able to log in without reading a secret from bed.json.
const (
	// AppUser and AppPassword: the account nodes use. No SUPER, no READ
	// ONLY ADMIN, so read_only fences it.
	AppUser     = "triage"
	AppPassword = "triage"
	// ReplUser and ReplPassword: the replication account (REPLICATION
	// SLAVE), which replicas use to reach their primary.
	ReplUser     = "repl"
	ReplPassword = "repl"
	// Database is the shard database on every server.
	Database = "triage"
)

// AppCredentials is the application account, as package replication
// takes it.
func (b *Bed) AppCredentials() replication.Credentials {
	return replication.Credentials{User: AppUser, Password: AppPassword, Database: Database}
}

// ReplCredentials is the replication account, for ReplicateFrom,
// RejoinAsReplica and the like.
func (b *Bed) ReplCredentials() replication.Credentials {
	return replication.Credentials{User: ReplUser, Password: ReplPassword}
}

// serverID gives every mariadbd of the bed a distinct server_id, which
// replication needs: the primary of shard N has N, its replica 1000+N.
func serverID(shard uint32, role string) int {
	if role == RoleReplica {
		return 1000 + int(shard)
	}
	return int(shard)
}

// startMariaDB starts every shard's primary and, with several regions, its
// replica in the next region, all at once, then opens the WAN links that
// other regions reach them through.
func (b *Bed) startMariaDB(ctx context.Context) error {
	type plan struct {
		shard        uint32
		role, region string
	}
	var plans []plan
	shard := uint32(0)
	for i, r := range b.cfg.Regions {
		for range b.cfg.ShardsPerRegion {
			shard++
			plans = append(plans, plan{shard, RolePrimary, r})
			if b.multi() {
				plans = append(plans, plan{shard, RoleReplica, b.cfg.Regions[(i+1)%len(b.cfg.Regions)]})
			}
		}
	}
	b.progress("starting %d mariadbd (%d shard(s) in %d region(s))", len(plans), shard, len(b.regions))
	started := make([]*dbServer, len(plans))
	err := parallel(len(plans), func(i int) error {
		p := plans[i]
		args := append([]string(nil), b.cfg.MariaDBArgs...)
		if p.role == RoleReplica {
			// Fenced from its first connection, also after a restart.
			args = append(args, "--read-only=ON")
		}
		s, err := mariadb.Start(ctx, mariadb.Config{
			Dir:       filepath.Join(b.tmp, fmt.Sprintf("%s-%d-%s", strings.TrimPrefix(p.role, "mysql-"), p.shard, p.region)),
			ServerID:  serverID(p.shard, p.role),
			ExtraArgs: args,
		})
		if err != nil {
			return fmt.Errorf("shard %d %s in %s: %w", p.shard, p.role, p.region, err)
		}
		d := &dbServer{shard: p.shard, role: p.role, region: p.region, srv: s, args: args}
		started[i] = d
		b.mu.Lock()
		b.servers = append(b.servers, d) // so Stop finds it even if a sibling fails
		b.mu.Unlock()
		return nil
	})
	if err != nil {
		return err
	}
	b.mu.Lock()
	b.servers = started // plan order: bed.json lists them so
	b.mu.Unlock()
	for _, d := range started {
		if d.role == RolePrimary {
			b.Shards[d.shard] = d.srv
		}
		b.Layout.Processes = append(b.Layout.Processes, Process{Role: d.role, Region: d.region, Shard: d.shard, Port: d.srv.Port(), PID: d.srv.PID()})
		b.progress("  shard %d %-7s %-9s mariadbd %s (pid %d)", d.shard, strings.TrimPrefix(d.role, "mysql-"), d.region, d.srv.Addr(), d.srv.PID())
		if !b.multi() {
			continue
		}
		for _, from := range b.cfg.Regions {
			if from == d.region {
				continue
			}
			name := fmt.Sprintf("%s>%s/%s-%d", from, d.region, d.role, d.shard)
			listen, err := b.net.Link(name, from, d.region, d.srv.Addr(), b.cfg.WANLatency)
			if err != nil {
				return err
			}
			b.via[from][d.srv.Addr()] = listen
		}
	}
	return nil
}

// setUpReplication creates the accounts on every server and the shard
// database on every primary, then (several regions) makes each replica
// replicate from its primary through the WAN link, with semi-sync, and
// waits until it has caught up and acknowledges.
func (b *Bed) setUpReplication(ctx context.Context) error {
	b.progress("creating accounts %q and %q on every server (sql_log_bin=0)", AppUser, ReplUser)
	servers := b.serverList()
	err := parallel(len(servers), func(i int) error {
		d := servers[i]
		if err := b.ensureUsers(ctx, d.srv); err != nil {
			return fmt.Errorf("shard %d %s: %w", d.shard, d.role, err)
		}
		if d.role == RolePrimary {
			return d.srv.CreateDatabase(ctx, Database)
		}
		return nil
	})
	if err != nil || !b.multi() {
		return err
	}
	b.progress("replicating every shard to the next region (GTID, semi-sync AFTER_SYNC, timeout %v) through the WAN", b.cfg.SemiSyncTimeout)
	var shards []uint32
	for _, d := range servers {
		if d.role == RolePrimary {
			shards = append(shards, d.shard)
		}
	}
	return parallel(len(shards), func(i int) error {
		return b.replicate(ctx, shards[i])
	})
}

// ensureUsers runs replication.EnsureUsers, then grants the application
// account the DDL its nodes' schema migrations need, unlogged like every
// admin statement.
func (b *Bed) ensureUsers(ctx context.Context, s *mariadb.Server) error {
	a, err := replication.Open(s.DSN(""))
	if err != nil {
		return err
	}
	defer a.Close()
	if err := a.EnsureUsers(ctx, b.ReplCredentials(), b.AppCredentials()); err != nil {
		return err
	}
	db, err := openDB(s.DSN(""))
	if err != nil {
		return err
	}
	defer db.Close()
	c, err := db.Conn(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	for _, stmt := range []string{
		"SET SESSION sql_log_bin = 0",
		"GRANT CREATE, ALTER, INDEX ON `" + Database + "`.* TO '" + AppUser + "'@'%'",
	} {
		if _, err := c.ExecContext(ctx, stmt); err != nil {
			return fmt.Errorf("grant schema rights to %s on %s: %w", AppUser, s.Addr(), err)
		}
	}
	return nil
}

// replicate sets shard's replica up and waits until it is caught up and
// connected as a semi-sync replica, so the first application commit is
// acknowledged rather than timing out into async.
func (b *Bed) replicate(ctx context.Context, shard uint32) error {
	p, r := b.Server(shard, "primary"), b.Server(shard, "replica")
	pd, rd := b.server(shard, RolePrimary), b.server(shard, RoleReplica)
	pa, err := replication.Open(p.DSN(""))
	if err != nil {
		return err
	}
	defer pa.Close()
	ra, err := replication.Open(r.DSN(""))
	if err != nil {
		return err
	}
	defer ra.Close()
	if err := pa.EnableSemiSync(ctx, true, b.cfg.SemiSyncTimeout); err != nil {
		return err
	}
	if err := ra.EnableSemiSync(ctx, false, b.cfg.SemiSyncTimeout); err != nil {
		return err
	}
	via := b.Via(rd.region, p.Addr())
	if err := ra.ReplicateFrom(ctx, via, b.ReplCredentials()); err != nil {
		return err
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		ps, perr := pa.Status(ctx)
		rs, rerr := ra.Status(ctx)
		ss, serr := pa.SemiSyncStatus(ctx)
		if perr == nil && rerr == nil && serr == nil &&
			rs.IORunning == "Yes" && rs.SQLRunning && rs.SlavePos.Covers(ps.BinlogPos) && ss.Clients >= 1 && ss.Active {
			b.progress("  shard %d: %s replica %s replicates from %s (%s) via %s, semi-sync on", shard, rd.region, r.Addr(), pd.region, p.Addr(), via)
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("shard %d: replica %s did not catch up with %s via %s within 30s: replica %+v (err %v), semi-sync %+v (err %v)",
				shard, r.Addr(), p.Addr(), via, rs, errors.Join(perr, rerr), ss, serr)
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// writeShardMap writes the bootstrap shard map: every shard with its home
// region, primary and replicas, by their real addresses.
func (b *Bed) writeShardMap() error {
	m := shardmap.Map{Version: 1, Regions: b.cfg.Regions, Namespaces: []shardmap.Namespace{{Name: "default"}}}
	for _, d := range b.serverList() {
		if d.role != RolePrimary {
			continue
		}
		s := shardmap.Shard{ID: d.shard, HomeRegion: d.region, Primary: d.srv.Addr(), Database: Database}
		if r := b.server(d.shard, RoleReplica); r != nil {
			s.Replicas = []string{r.srv.Addr()}
			s.ReplicaRegions = []string{r.region}
		}
		m.Shards = append(m.Shards, s)
	}
	sm, err := shardmap.New(m)
	if err != nil {
		return err
	}
	data, err := sm.Marshal()
	if err != nil {
		return err
	}
	b.Layout.ShardMap = filepath.Join(b.cfg.Dir, "shardmap.json")
	return os.WriteFile(b.Layout.ShardMap, data, 0o644)
}

// appMySQL is what a node of region uses to reach MariaDB.
func (b *Bed) appMySQL(region string) shardmap.Credentials {
	c := shardmap.Credentials{User: AppUser, Password: AppPassword}
	if len(b.via[region]) > 0 {
		c.DialVia = maps.Clone(b.via[region])
	}
	return c
}

func shardmapDuration(d time.Duration) shardmap.Duration { return shardmap.Duration(d) }
