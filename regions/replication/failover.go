package replication

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
)

// ReplicateFrom makes the server a replica of primaryAddr: it fences the
// server (read_only=1) before anything else, so no application write lands
// between its last role and its new one, then points it at the primary
// with MASTER_USE_GTID=slave_pos and MASTER_CONNECT_RETRY=1 (and, when
// repl.TLS is set, MASTER_SSL=1 with its CA) and starts replication. It
// serves new replicas and repointing surviving replicas after a failover.
// It returns once replication is started; watch Status for the IO thread
// connecting (a wrong password, address or certificate shows up as
// LastIOError there).
//
// A relay log left from a previous primary is discarded; the new primary,
// being the most advanced, serves those transactions again.
//
// It refuses, with ErrLocalTransactions, a server whose binary log holds
// transactions it did not replicate: that is a deposed primary, which must
// come back through RejoinAsReplica.
func (a *Admin) ReplicateFrom(ctx context.Context, primaryAddr string, repl Credentials) error {
	return a.replicate(ctx, primaryAddr, repl, false)
}

// RejoinAsReplica brings a recovered old primary back as a replica of the
// new one. Start its mariadbd with RejoinArgs first, so that crash
// recovery drops the transactions no replica acknowledged and the server
// comes up read-only. Then, like ReplicateFrom, it sets read_only=1 first;
// where its binary log is ahead of its replica position (it wrote as a
// primary), it adds MASTER_DEMOTE_TO_SLAVE=1, which moves its own
// transactions into gtid_slave_pos so that it resumes after them.
//
// If the old primary kept a transaction the new primary never received
// (committed after semi-sync fell back to async), the new primary's binary
// log cannot serve it and Status shows IO error 1236; such a server must be
// rebuilt from a copy of the new primary, never promoted or written to.
func (a *Admin) RejoinAsReplica(ctx context.Context, newPrimaryAddr string, repl Credentials) error {
	return a.replicate(ctx, newPrimaryAddr, repl, true)
}

func (a *Admin) replicate(ctx context.Context, primaryAddr string, repl Credentials, rejoin bool) error {
	host, port, err := splitAddr(primaryAddr)
	if err != nil {
		return err
	}
	if err := repl.validate("replication"); err != nil {
		return err
	}
	f := a.flavor
	return a.session(ctx, func(c *sql.Conn) error {
		if err := a.fence(ctx, c); err != nil {
			return err
		}
		if err := a.exec(ctx, c, "stop replica", f.StopReplica()); err != nil {
			return err
		}
		st, err := a.status(ctx, c)
		if err != nil {
			return err
		}
		demote := !st.SlavePos.Covers(st.BinlogPos)
		if demote && !rejoin {
			return fmt.Errorf("%w: %s has binary log position %s beyond its replica position %s; "+
				"it wrote as a primary, so restart it with RejoinArgs and use RejoinAsReplica",
				ErrLocalTransactions, a.addr, st.BinlogPos, st.SlavePos)
		}
		if err := a.exec(ctx, c, "point replica at "+primaryAddr, f.ChangePrimary(host, port, repl, demote)); err != nil {
			return err
		}
		// A replica acknowledges and never waits for acknowledgements: a
		// deposed primary keeping rpl_semi_sync_master_enabled would make
		// its applier wait, with no fallback, for replicas it has none of.
		return a.exec(ctx, c, "semi-sync as a replica, start replica", append(f.SemiSync(false, NoFallback), f.StartReplica())...)
	})
}

// Promote turns a replica into a primary without losing what it received:
// STOP SLAVE IO_THREAD (nothing more arrives from the old primary), then
// MASTER_GTID_WAIT(<Gtid_IO_Pos>, timeout) until the SQL thread has applied
// the relay log, then STOP SLAVE, RESET SLAVE ALL and read_only=0. It
// returns @@gtid_current_pos as promoted: every transaction the replica
// received. Choose the replica with MostAdvanced and fence the old primary
// first. Semi-sync as a primary (no async fallback) is on before
// read_only=0, so the first application commit already waits for a
// replica: repoint the others with ReplicateFrom.
//
// A stopped SQL thread without an error is started first, while the IO
// thread still runs: once both threads are stopped, MariaDB in GTID mode
// discards the relay log at the next start of either. For the same reason
// Promote refuses (ErrRelayLogNotApplied) a replica whose threads are both
// stopped with transactions received but not applied, and one whose SQL
// thread stopped on an error. If the relay log does not drain within
// timeout it also returns ErrRelayLogNotApplied, leaving the server a
// read-only replica with its IO thread stopped: call Promote again, or
// promote another replica.
//
// prepare, if not nil, runs once the server replicates from nobody and
// before semi-sync as a primary is on: its writes (on the Admin's pool,
// DB, so they are binlogged) commit at once, read_only notwithstanding
// for the admin account, and wait for no replica. The failover stores
// the shard's epoch there: waiting for a replica's acknowledgement, that
// first commit waited for a repointed replica's IO thread to connect
// across the WAN (a dozen round trips: half a second on the process bed,
// a second on the compose bed), and the map was published only then.
// Nothing an application wrote can be in it: read_only is still on.
//
// It refuses, with ErrNotReplica, a server that replicates from nobody.
func (a *Admin) Promote(ctx context.Context, timeout time.Duration, prepare func(context.Context) error) (gtid string, err error) {
	if timeout <= 0 {
		return "", fmt.Errorf("replication: Promote timeout %v: want more than 0", timeout)
	}
	f := a.flavor
	err = a.session(ctx, func(c *sql.Conn) error {
		st, err := a.status(ctx, c)
		if err != nil {
			return err
		}
		if st.Role != RoleReplica {
			return fmt.Errorf("%w: %s has no primary configured", ErrNotReplica, a.addr)
		}
		if st.LastSQLErrno != 0 {
			return fmt.Errorf("%w: SQL thread of %s stopped with error %d: %s", ErrRelayLogNotApplied, a.addr, st.LastSQLErrno, st.LastSQLError)
		}
		if !st.SQLRunning {
			if !st.IOThreadRunning() && !st.SlavePos.Covers(st.IOPos) {
				return fmt.Errorf("%w: both replication threads of %s are stopped, with transactions received up to %s but applied only up to %s; "+
					"starting either thread would discard the relay log (MariaDB, GTID mode)", ErrRelayLogNotApplied, a.addr, st.IOPos, st.SlavePos)
			}
			if st.IOThreadRunning() {
				if err := a.exec(ctx, c, "start SQL thread", f.StartReplicaSQL()); err != nil {
					return err
				}
			}
		}
		if err := a.exec(ctx, c, "stop IO thread", f.StopReplicaIO()); err != nil {
			return err
		}
		// Gtid_IO_Pos is final now, and only ever counts complete
		// transactions, so waiting for it cannot wait for a torn one.
		if st, err = a.status(ctx, c); err != nil {
			return err
		}
		target := st.Received()
		var reached sql.NullInt64
		if err := c.QueryRowContext(ctx, f.WaitForPosition(), target.String(), timeout.Seconds()).Scan(&reached); err != nil {
			return fmt.Errorf("replication: wait for %s to apply %s: %w", a.addr, target, err)
		}
		if !reached.Valid || reached.Int64 != 0 {
			now, _ := a.status(ctx, c)
			return fmt.Errorf("%w: %s applied up to %s of the received %s within %v (SQL thread running: %t, last error %d: %s)",
				ErrRelayLogNotApplied, a.addr, now.SlavePos, target, timeout, now.SQLRunning, now.LastSQLErrno, now.LastSQLError)
		}
		if err := a.exec(ctx, c, "detach from old primary", f.StopReplica(), f.ResetReplicaAll()); err != nil {
			return err
		}
		if prepare != nil {
			if err := prepare(ctx); err != nil {
				return fmt.Errorf("replication: prepare %s to take writes: %w", a.addr, err)
			}
		}
		// Semi-sync as a primary before the first application write can
		// land: no commit of the new primary is ever acknowledged before a
		// replica has it.
		// In order, stopping at the first that fails (one round trip
		// when the connection takes several statements).
		if err := a.exec(ctx, c, "semi-sync as a primary, unfence (read_only=0)", append(f.SemiSync(true, NoFallback), f.SetReadOnly(false))...); err != nil {
			return err
		}
		if st, err = a.status(ctx, c); err != nil {
			return err
		}
		if !st.CurrentPos.Covers(target) {
			return fmt.Errorf("replication: %s promoted at %s, which lacks the received %s", a.addr, st.CurrentPos, target)
		}
		gtid = st.CurrentPos.String()
		return nil
	})
	if err != nil {
		return "", err
	}
	return gtid, nil
}

// MostAdvanced returns the index of the replica that received the most of
// the dead primary's transactions: the one whose received position
// (Gtid_IO_Pos merged with gtid_slave_pos, see Status.Received) covers
// every other's, comparing sequence numbers per domain. Ties go to the
// lowest index, so order replicas by preference (the shard map's order).
//
// Every replica must answer. A replica that cannot be reached may hold the
// only acknowledgement of the last commits, so leaving it out is the
// controller's decision to make and log, by passing a shorter slice. It
// returns ErrDiverged when no replica covers all others (each has
// transactions the other lacks: someone wrote to a replica).
func MostAdvanced(ctx context.Context, replicas []*Admin) (int, error) {
	if len(replicas) == 0 {
		return -1, errors.New("replication: MostAdvanced: no replicas given")
	}
	pos := make([]GTIDList, len(replicas))
	errs := make([]error, len(replicas))
	var wg sync.WaitGroup
	for i, r := range replicas {
		wg.Go(func() {
			st, err := r.Status(ctx)
			if err != nil {
				errs[i] = fmt.Errorf("replica %d: %w", i, err)
				return
			}
			pos[i] = st.Received()
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return -1, fmt.Errorf("replication: MostAdvanced: %w", err)
	}
	for i := range pos {
		best := true
		for j := range pos {
			if !pos[i].Covers(pos[j]) {
				best = false
				break
			}
		}
		if best {
			return i, nil
		}
	}
	desc := make([]string, len(pos))
	for i, p := range pos {
		desc[i] = fmt.Sprintf("%s at %q", replicas[i].addr, p)
	}
	return -1, fmt.Errorf("%w: no replica has every transaction of the others: %s", ErrDiverged, strings.Join(desc, ", "))
}

// RejoinArgs are the extra mariadbd arguments for restarting a deposed
// primary, so that it never comes back as a second primary:
//
//   - --init-rpl-role=SLAVE makes crash recovery roll back and cut from the
//     binary log the transactions that were written but still waiting for
//     a semi-sync acknowledgement (AFTER_SYNC), which no client was told
//     were committed and the new primary may not have (MariaDB 10.11.9+,
//     MDEV-33465). It does not fence the server by itself.
//   - --read-only=ON is the fence from the first connection on, before the
//     controller gets to RejoinAsReplica.
//   - --skip-slave-start keeps it from replicating from whatever primary
//     its stale configuration names; RejoinAsReplica points it.
//   - --rpl-semi-sync-slave-enabled=ON: it rejoins as a semi-sync replica.
//
// Use them only for a server that is to rejoin as a replica: a primary
// restarted with them may cut transactions its replicas already applied.
func RejoinArgs() []string {
	return []string{
		"--init-rpl-role=SLAVE",
		"--read-only=ON",
		"--skip-slave-start",
		"--rpl-semi-sync-slave-enabled=ON",
	}
}

// WaitApplied waits, up to timeout, until the server has applied every
// transaction of pos (MASTER_GTID_WAIT), e.g. the gtid_binlog_pos of a
// primary that was just made read-only, so that promoting this server
// loses nothing the old primary acknowledged. It returns
// ErrRelayLogNotApplied, with both positions, when the time runs out.
func (a *Admin) WaitApplied(ctx context.Context, pos GTIDList, timeout time.Duration) error {
	if timeout <= 0 {
		return fmt.Errorf("replication: WaitApplied timeout %v: want more than 0", timeout)
	}
	var reached sql.NullInt64
	if err := a.db.QueryRowContext(ctx, a.flavor.WaitForPosition(), pos.String(), timeout.Seconds()).Scan(&reached); err != nil {
		return fmt.Errorf("replication: wait for %s to apply %s: %w", a.addr, pos, err)
	}
	if !reached.Valid || reached.Int64 != 0 {
		now, _ := a.Status(ctx)
		return fmt.Errorf("%w: %s applied up to %s, not %s, within %v (IO thread %q, last IO error %d: %s)",
			ErrRelayLogNotApplied, a.addr, now.SlavePos, pos, timeout, now.IORunning, now.LastIOErrno, now.LastIOError)
	}
	return nil
}

// StopReceiving stops the replica's IO thread, leaving its SQL thread to
// apply what it received. Done on every replica of a shard whose primary
// cannot be reached, it fences that primary from the replica side: with
// semi-sync and no async fallback, a primary no replica receives from can
// complete no commit, and the replicas' received positions are final, so
// MostAdvanced ranks them for good. A server that replicates from nobody
// is left alone.
func (a *Admin) StopReceiving(ctx context.Context) error {
	st, err := a.Status(ctx)
	if err != nil {
		return err
	}
	if st.Role != RoleReplica {
		return nil
	}
	return a.session(ctx, func(c *sql.Conn) error {
		if !st.SQLRunning && st.IOThreadRunning() && st.LastSQLErrno == 0 {
			// Start the applier while the IO thread still runs (see Promote).
			if err := a.exec(ctx, c, "start SQL thread", a.flavor.StartReplicaSQL()); err != nil {
				return err
			}
		}
		return a.exec(ctx, c, "stop IO thread", a.flavor.StopReplicaIO())
	})
}
