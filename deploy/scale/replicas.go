package scale

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

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

// replicaServerID is the server_id of servers[i]'s replica in
// replicaRegions[k]; servers[i] has i+1.
func replicaServerID(k, i int) int { return 1000*(k+1) + i + 1 }

// startReplicated starts the servers and a replica of each in every
// region of replicaRegions (read-only), creates the accounts on all of
// them with sql_log_bin=0, as deploy/bed does, and makes each replica
// replicate its whole server, with semi-sync on, before any shard
// database exists: the databases, their schema and grants reach the
// replicas through the binary log, so each holds every GTID of its
// server from the first one.
func (b *Bed) startReplicated(ctx context.Context) error {
	n, r := b.cfg.Servers, len(replicaRegions)
	b.progress("starting %d mariadbd servers in %s and a replica of each in %s", n, Region, strings.Join(replicaRegions[:], " and "))
	b.servers, b.replicas = make([]*mariadb.Server, n), make([][]*mariadb.Server, r)
	for k := range b.replicas {
		b.replicas[k] = make([]*mariadb.Server, n)
	}
	err := provision.Parallel((1+r)*n, func(j int) error {
		i, k := j%n, j/n-1 // k = -1: the primary server
		args := append(slices.Clone(serverArgs), semiSyncArgs...)
		id, dir, slot := i+1, fmt.Sprintf("mysql%d", i), &b.servers[i]
		if k >= 0 {
			args = append(args, "--read-only=ON")
			id, dir, slot = replicaServerID(k, i), fmt.Sprintf("mysql%d-%s", i, replicaRegions[k]), &b.replicas[k][i]
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
	b.progress("replicating each server to its %d replicas (GTID, semi-sync AFTER_SYNC, no async fallback)", r)
	return provision.Parallel(n, b.replicate(ctx))
}

// replicate returns the setup of servers[i]'s replication to its
// replicas, for provision.Parallel.
func (b *Bed) replicate(ctx context.Context) func(i int) error {
	return func(i int) error {
		p := b.servers[i]
		var rs []provision.Replica
		for k, region := range replicaRegions {
			rs = append(rs, provision.Replica{DSN: b.replicas[k][i].DSN(""), Region: region, PrimaryVia: p.Addr()})
		}
		if err := provision.Replicate(ctx, uint32(i+1), p.DSN(""), provision.BedAccounts.Repl, rs, nil); err != nil {
			return fmt.Errorf("server %s: %w", p.Addr(), err)
		}
		b.progress("  %s replicate %s", strings.Join(b.replicaAddrs(i), " and "), p.Addr())
		return nil
	}
}

// replicaAddrs are servers[i]'s replicas' addresses, in the order of
// replicaRegions.
func (b *Bed) replicaAddrs(i int) []string {
	addrs := make([]string, len(b.replicas))
	for k := range b.replicas {
		addrs[k] = b.replicas[k][i].Addr()
	}
	return addrs
}

// withReplicas lists s's replicas (Failover): its server's, one in each
// of replicaRegions, in that order for every shard, so that the shards
// of one server form one failover group (regions/group.go).
func (b *Bed) withReplicas(s shardmap.Shard) shardmap.Shard {
	if b.cfg.Failover {
		s.Replicas, s.ReplicaRegions = b.replicaAddrs(int(s.ID-1)%len(b.servers)), slices.Clone(replicaRegions[:])
	}
	return s
}

// addReplicas makes m the map of a bed with Failover: every region, and
// every shard listing its replicas. The replica regions home no shard
// and no namespace lists a shard there.
func (b *Bed) addReplicas(m *shardmap.Map) {
	m.Regions = append([]string{Region}, replicaRegions[:]...)
	for i := range m.Shards {
		m.Shards[i] = b.withReplicas(m.Shards[i])
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

// ReplicaPIDs are the mariadbd PIDs of the replicas in region
// (Failover), in server order.
func (b *Bed) ReplicaPIDs(region string) []int {
	var pids []int
	if k := slices.Index(replicaRegions[:], region); k >= 0 && k < len(b.replicas) {
		for _, s := range b.replicas[k] {
			if s != nil {
				pids = append(pids, s.PID())
			}
		}
	}
	return pids
}
