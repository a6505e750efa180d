package provision

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/triage-queue/triage/regions/replication"
)

// replicaWait bounds each wait of Replicate: a replica catching up, and
// the replicas connecting as semi-sync replicas.
const replicaWait = 30 * time.Second

// Replica is one replica for Replicate.
type Replica struct {
	// DSN is an admin DSN of the replica (TCP).
	DSN string
	// Region is the replica's region, for progress lines.
	Region string
	// PrimaryVia is the address the replica dials to reach the primary
	// (a WAN link of the local bed, or the primary's own address).
	PrimaryVia string
}

// Replicate turns semi-sync on for the primary of shard at primaryDSN
// (AFTER_SYNC, one acknowledgement, no fallback to async), makes each
// replica replicate from it with GTIDs as repl (over TLS when repl.TLS is
// set), waits until each has caught up, then until all are connected as
// semi-sync replicas, so the first application commit is acknowledged at
// once. progress, when not nil, receives a line per step (printf style).
func Replicate(ctx context.Context, shard uint32, primaryDSN string, repl replication.Credentials, replicas []Replica, progress func(format string, args ...any)) error {
	if progress == nil {
		progress = func(string, ...any) {}
	}
	pa, err := replication.Open(primaryDSN)
	if err != nil {
		return err
	}
	defer pa.Close()
	if err := pa.EnableSemiSync(ctx, true); err != nil {
		return err
	}
	for _, rd := range replicas {
		ra, err := replication.Open(rd.DSN)
		if err != nil {
			return err
		}
		err = ra.ReplicateFrom(ctx, rd.PrimaryVia, repl)
		if err == nil {
			err = waitReplica(ctx, pa, ra)
		}
		ra.Close()
		if err != nil {
			return fmt.Errorf("shard %d: replica %s in %s via %s: %w", shard, ra.Addr(), rd.Region, rd.PrimaryVia, err)
		}
		progress("  shard %d: %s replica %s replicates from %s via %s", shard, rd.Region, ra.Addr(), pa.Addr(), rd.PrimaryVia)
	}
	wctx, cancel := context.WithTimeout(ctx, replicaWait)
	defer cancel()
	var ss replication.SemiSync
	err = Poll(wctx, 100*time.Millisecond, func(ctx context.Context) error {
		var err error
		if ss, err = pa.SemiSyncStatus(ctx); err != nil {
			return err
		}
		if ss.Clients < len(replicas) || !ss.Active {
			return fmt.Errorf("semi-sync status %+v", ss)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("shard %d: %d semi-sync replicas did not connect within %v: %w", shard, len(replicas), replicaWait, err)
	}
	progress("  shard %d: semi-sync on with %d replicas", shard, ss.Clients)
	return nil
}

// waitReplica waits until ra has applied everything in pa's binary log.
func waitReplica(ctx context.Context, pa, ra *replication.Admin) error {
	ctx, cancel := context.WithTimeout(ctx, replicaWait)
	defer cancel()
	err := Poll(ctx, 100*time.Millisecond, func(ctx context.Context) error {
		ps, perr := pa.Status(ctx)
		rs, rerr := ra.Status(ctx)
		if err := errors.Join(perr, rerr); err != nil {
			return err
		}
		if rs.IORunning != "Yes" || !rs.SQLRunning || !rs.SlavePos.Covers(ps.BinlogPos) {
			return fmt.Errorf("replica %+v", rs)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("did not catch up within %v: %w", replicaWait, err)
	}
	return nil
}
