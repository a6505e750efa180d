package scale

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/triage-queue/triage/cmd/triage/provision"
	"github.com/triage-queue/triage/deploy/mariadb"
	"github.com/triage-queue/triage/regions/replication"
	"github.com/triage-queue/triage/shardmap"
)

// semiSyncArgs are the semi-sync settings every server of a bed with
// Config.Failover starts with, as the local bed's (deploy/bed): a replica
// acknowledges from its first connection, and a primary never falls back
// to asynchronous replication, so a commit the client was told of is on
// the replica. Only provision.Replicate and the controller turn
// rpl_semi_sync_master_enabled on, for the server they make primary.
var semiSyncArgs = []string{
	"--rpl-semi-sync-master-wait-point=AFTER_SYNC",
	fmt.Sprintf("--rpl-semi-sync-master-timeout=%d", replication.NoFallback.Milliseconds()),
	"--rpl-semi-sync-master-wait-no-slave=ON",
	"--rpl-semi-sync-slave-enabled=ON",
}

// replicaServerID is the server_id of servers[i]'s replica; servers[i]
// has i+1.
func replicaServerID(i int) int { return 1000 + i + 1 }

// startReplicated starts the servers and a replica of each in
// ReplicaRegion (read-only), creates the accounts on all of them with
// sql_log_bin=0, as deploy/bed does, and makes each replica replicate its
// whole server, with semi-sync on, before any shard database exists: the
// databases, their schema and grants reach the replica through the binary
// log, so it holds every GTID of its server from the first one.
func (b *Bed) startReplicated(ctx context.Context) error {
	n := b.cfg.Servers
	b.progress("starting %d mariadbd servers in %s and a replica of each in %s", n, Region, ReplicaRegion)
	b.servers, b.replicas = make([]*mariadb.Server, n), make([]*mariadb.Server, n)
	err := provision.Parallel(2*n, func(j int) error {
		i, replica := j%n, j >= n
		args := append(slices.Clone(serverArgs), semiSyncArgs...)
		id, dir, slot := i+1, fmt.Sprintf("mysql%d", i), &b.servers[i]
		if replica {
			args = append(args, "--read-only=ON")
			id, dir, slot = replicaServerID(i), fmt.Sprintf("mysql%d-%s", i, ReplicaRegion), &b.replicas[i]
		}
		s, err := mariadb.Start(ctx, mariadb.Config{Dir: filepath.Join(b.tmp, dir), ServerID: id, ExtraArgs: args, Logger: b.cfg.Logger})
		if err != nil {
			return err
		}
		*slot = s
		return provision.EnsureAccounts(ctx, s.DSN(""), provision.BedAccounts)
	})
	if err != nil {
		return err
	}
	b.progress("replicating each server to its replica (GTID, semi-sync AFTER_SYNC, no async fallback)")
	return provision.Parallel(n, func(i int) error {
		p, r := b.servers[i], b.replicas[i]
		err := provision.Replicate(ctx, uint32(i+1), p.DSN(""), provision.BedAccounts.Repl,
			[]provision.Replica{{DSN: r.DSN(""), Region: ReplicaRegion, PrimaryVia: p.Addr()}}, nil)
		if err != nil {
			return fmt.Errorf("server %s to %s: %w", p.Addr(), r.Addr(), err)
		}
		b.progress("  %s replicates %s", r.Addr(), p.Addr())
		return nil
	})
}

// replica is the replica of the server shard id (1-based) lives on.
func (b *Bed) replica(id uint32) *mariadb.Server { return b.replicas[int(id-1)%len(b.replicas)] }

// withReplica lists s's replica (Failover): the replica of its server.
func (b *Bed) withReplica(s shardmap.Shard) shardmap.Shard {
	if b.cfg.Failover {
		s.Replicas, s.ReplicaRegions = []string{b.replica(s.ID).Addr()}, []string{ReplicaRegion}
	}
	return s
}

// addReplicas makes m the map of a bed with Failover: both regions, and
// every shard listing its replica. ReplicaRegion homes no shard and no
// namespace lists a shard there.
func (b *Bed) addReplicas(m *shardmap.Map) {
	m.Regions = []string{Region, ReplicaRegion}
	for i := range m.Shards {
		m.Shards[i] = b.withReplica(m.Shards[i])
	}
}

// replAccount is the replication account as the controllers get it: its
// password in mysql-repl.password of the bed's directory, which it
// writes, so that no node config holds it.
func (b *Bed) replAccount() (shardmap.Account, error) {
	path, err := filepath.Abs(filepath.Join(b.cfg.Dir, "mysql-repl.password"))
	if err != nil {
		return shardmap.Account{}, err
	}
	acc := shardmap.Account{User: provision.BedAccounts.Repl.User, PasswordFile: path}
	return acc, os.WriteFile(path, []byte(provision.BedAccounts.Repl.Password+"\n"), 0o600)
}

// ReplicaPIDs are the replicas' mariadbd PIDs (Failover), in server order.
func (b *Bed) ReplicaPIDs() []int {
	var pids []int
	for _, s := range b.replicas {
		if s != nil {
			pids = append(pids, s.PID())
		}
	}
	return pids
}
