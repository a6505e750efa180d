package bed

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/triage-queue/triage/cmd/triage/provision"
	"github.com/triage-queue/triage/deploy/mariadb"
	"github.com/triage-queue/triage/regions/replication"
	"github.com/triage-queue/triage/shardmap"
)

// AppCredentials is the application account (provision.BedAccounts), as
// package replication takes it: REQUIRE SSL with Config.MySQLTLS.
func (b *Bed) AppCredentials() replication.Credentials { return b.accounts().App }

// ReplCredentials is the replication account (provision.BedAccounts), for
// ReplicateFrom, RejoinAsReplica and the like: over TLS, and REQUIRE SSL,
// with Config.MySQLTLS.
func (b *Bed) ReplCredentials() replication.Credentials { return b.accounts().Repl }

// accounts are provision.BedAccounts as this bed makes them: with
// Config.MySQLTLS both REQUIRE SSL, and the replicas connect over TLS.
func (b *Bed) accounts() provision.Accounts {
	acc := provision.BedAccounts
	if b.mysqlTLS != nil {
		acc.App.RequireSSL, acc.Repl.RequireSSL = true, true
		acc.Repl.TLS = b.mysqlTLS.replication()
	}
	return acc
}

// serverID gives every mariadbd of the bed a distinct server_id, which
// replication needs: the primary of shard N has N, its k-th replica
// (k = 1, 2, ...) k*1000+N.
func serverID(shard uint32, role string, k int) int {
	if role == RoleReplica {
		return k*1000 + int(shard)
	}
	return int(shard)
}

// semiSyncArgs are the semi-sync settings every server of a multi-region
// bed starts with, so that a restarted server is as safe as a configured
// one: a replica acknowledges from its first connection, and a primary
// never falls back to asynchronous replication (see
// replication.EnableSemiSync). Only the controller (or setUpReplication)
// turns rpl_semi_sync_master_enabled on, for the server it makes primary.
func semiSyncArgs() []string {
	return []string{
		"--rpl-semi-sync-master-wait-point=AFTER_SYNC",
		fmt.Sprintf("--rpl-semi-sync-master-timeout=%d", replication.NoFallback.Milliseconds()),
		"--rpl-semi-sync-master-wait-no-slave=ON",
		"--rpl-semi-sync-slave-enabled=ON",
	}
}

// serverPlan is one mariadbd startMariaDB is to start.
type serverPlan struct {
	shard        uint32
	role, region string
	k            int // replica number, from 1
	spare        bool
}

// startMariaDB starts every shard's primary and, with several regions, a
// replica in each other region (the next region's first: it is the
// preferred failover target), all at once, then opens the WAN links that
// other regions reach them through. Two replicas in three regions mean a
// dead replica costs nothing: semi-sync needs one acknowledgement.
func (b *Bed) startMariaDB(ctx context.Context) error {
	plans, shards := b.planServers()
	b.progress("starting %d mariadbd (%d shard(s) in %d region(s))", len(plans), shards, len(b.regions))
	started := make([]*dbServer, len(plans))
	err := provision.Parallel(len(plans), func(i int) error {
		d, err := b.startServer(ctx, plans[i])
		if err != nil {
			return err
		}
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
		b.Layout.Processes = append(b.Layout.Processes, Process{Role: d.role, Region: d.region, Shard: d.shard, Port: d.srv.Port(), PID: d.srv.PID(), Spare: d.spare})
		spare := ""
		if d.spare {
			spare = " (spare: not in the shard map)"
		}
		b.progress("  shard %d %-7s %-9s mariadbd %s (pid %d)%s", d.shard, strings.TrimPrefix(d.role, "mysql-"), d.region, d.srv.Addr(), d.srv.PID(), spare)
		if err := b.linkServer(d); err != nil {
			return err
		}
	}
	return nil
}

// planServers lists the bed's mariadbds in start order, each shard's
// primary followed by its replicas, and returns how many shards they
// make. Spares come after every region's shards, so shard numbers do not
// depend on whether a bed has spares.
func (b *Bed) planServers() ([]serverPlan, uint32) {
	var plans []serverPlan
	shard := uint32(0)
	for _, spare := range []bool{false, true} {
		n := map[bool]int{false: b.cfg.ShardsPerRegion, true: b.cfg.SpareShardsPerRegion}[spare]
		for i, r := range b.cfg.Regions {
			for range n {
				shard++
				plans = append(plans, serverPlan{shard, RolePrimary, r, 0, spare})
				if b.multi() {
					for k := 1; k < len(b.cfg.Regions); k++ {
						plans = append(plans, serverPlan{shard, RoleReplica, b.cfg.Regions[(i+k)%len(b.cfg.Regions)], k, spare})
					}
				}
			}
		}
	}
	return plans, shard
}

// startServer starts the mariadbd p plans, with the bed's TLS and extra
// flags, semi-sync settings with several regions, and a replica fenced
// read-only from its first connection, also after a restart.
func (b *Bed) startServer(ctx context.Context, p serverPlan) (*dbServer, error) {
	args := append(b.mysqlTLS.serverArgs(), b.cfg.MariaDBArgs...)
	if b.multi() {
		args = append(args, semiSyncArgs()...)
	}
	if p.role == RoleReplica {
		args = append(args, "--read-only=ON")
	}
	s, err := mariadb.Start(ctx, mariadb.Config{
		Dir:       filepath.Join(b.tmp, fmt.Sprintf("%s-%d-%s", strings.TrimPrefix(p.role, "mysql-"), p.shard, p.region)),
		ServerID:  serverID(p.shard, p.role, p.k),
		ExtraArgs: args,
	})
	if err != nil {
		return nil, fmt.Errorf("shard %d %s in %s: %w", p.shard, p.role, p.region, err)
	}
	return &dbServer{shard: p.shard, role: p.role, region: p.region, srv: s, args: args, spare: p.spare}, nil
}

// linkServer opens, with several regions, a WAN link from every other
// region to d and records it as the address that region dials d by.
func (b *Bed) linkServer(d *dbServer) error {
	if !b.multi() {
		return nil
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
	return nil
}

// setUpReplication creates the accounts on every server and the shard
// database on every primary, then (several regions) makes each replica
// replicate from its primary through the WAN link, with semi-sync, and
// waits until it has caught up and acknowledges.
func (b *Bed) setUpReplication(ctx context.Context) error {
	b.progress("creating accounts %q and %q on every server (sql_log_bin=0)", provision.BedAccounts.App.User, provision.BedAccounts.Repl.User)
	servers := b.serverList()
	err := provision.Parallel(len(servers), func(i int) error {
		d := servers[i]
		if err := provision.EnsureAccounts(ctx, d.srv.DSN(""), b.accounts()); err != nil {
			return fmt.Errorf("shard %d %s: %w", d.shard, d.role, err)
		}
		if d.role == RolePrimary {
			return d.srv.CreateDatabase(ctx, provision.BedAccounts.App.Database)
		}
		return nil
	})
	if err != nil || !b.multi() {
		return err
	}
	b.progress("replicating every shard to every other region (GTID, semi-sync AFTER_SYNC, one acknowledgement, no async fallback) through the WAN")
	var shards []uint32
	for _, d := range servers {
		if d.role == RolePrimary {
			shards = append(shards, d.shard)
		}
	}
	return provision.Parallel(len(shards), func(i int) error {
		return b.replicate(ctx, shards[i])
	})
}

// replicate sets shard's replicas up and waits until each is caught up
// and connected as a semi-sync replica, so the first application commit
// is acknowledged at once.
func (b *Bed) replicate(ctx context.Context, shard uint32) error {
	pd := b.server(shard, RolePrimary)
	var replicas []provision.Replica
	for _, rd := range b.replicasOf(shard) {
		replicas = append(replicas, provision.Replica{DSN: rd.srv.DSN(""), Region: rd.region, PrimaryVia: b.Via(rd.region, pd.srv.Addr())})
	}
	return provision.Replicate(ctx, shard, pd.srv.DSN(""), b.accounts().Repl, replicas, b.progress)
}

// writeShardMap writes the bootstrap shard map: every shard with its home
// region, primary and replicas, by their real addresses.
func (b *Bed) writeShardMap() error {
	m := shardmap.Map{Version: 1, Regions: b.cfg.Regions, Namespaces: []shardmap.Namespace{{Name: "default"}}}
	for _, d := range b.serverList() {
		if d.role != RolePrimary || d.spare {
			continue
		}
		s := shardmap.Shard{ID: d.shard, HomeRegion: d.region, Primary: d.srv.Addr(), Database: provision.BedAccounts.App.Database}
		for _, r := range b.replicasOf(d.shard) {
			s.Replicas = append(s.Replicas, r.srv.Addr())
			s.ReplicaRegions = append(s.ReplicaRegions, r.region)
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

// appMySQL is what a node of region uses to reach MariaDB: the
// application account (no DDL, no SUPER), its password read from a file
// of the bed's directory as a deployment would mount a secret, so the
// node config (and bed.json) carry only the file's name, over TLS with
// Config.MySQLTLS. Migrations fall
// back to the node's admin account, root without a password here.
func (b *Bed) appMySQL(region, passwordFile string) shardmap.Credentials {
	c := shardmap.Credentials{User: provision.BedAccounts.App.User, PasswordFile: passwordFile, TLS: b.mysqlTLS.client()}
	if len(b.via[region]) > 0 {
		c.DialVia = maps.Clone(b.via[region])
	}
	return c
}

// writeAppPassword writes the application account's password file into
// the bed's directory and returns its absolute path.
func (b *Bed) writeAppPassword() (string, error) {
	return b.writeSecret("mysql-app.password", provision.BedAccounts.App.Password)
}

// replAccount is the replication account as the controllers get it: its
// password in mysql-repl.password of the bed's directory, which it writes,
// so that no node config holds it.
func (b *Bed) replAccount() (shardmap.Account, error) {
	path, err := b.writeSecret("mysql-repl.password", provision.BedAccounts.Repl.Password)
	return shardmap.Account{User: provision.BedAccounts.Repl.User, PasswordFile: path}, err
}

// writeSecret writes secret into the file name of the bed's directory
// (0600) and returns its absolute path.
func (b *Bed) writeSecret(name, secret string) (string, error) {
	path, err := filepath.Abs(filepath.Join(b.cfg.Dir, name))
	if err != nil {
		return "", err
	}
	return path, os.WriteFile(path, []byte(secret+"\n"), 0o600)
}

func shardmapDuration(d time.Duration) shardmap.Duration { return shardmap.Duration(d) }
