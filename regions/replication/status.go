package replication

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"
)

// Role is what a server currently does in its shard.
type Role string

const (
	// RolePrimary: the server replicates from nobody. It may still be
	// read-only (a fenced or deposed primary, or one restarted with
	// RejoinArgs and not yet rejoined).
	RolePrimary Role = "primary"
	// RoleReplica: the server has a primary configured.
	RoleReplica Role = "replica"
)

// Status is one server's replication state.
type Status struct {
	// Addr is the address the Admin was given.
	Addr     string
	ServerID uint32
	Role     Role
	ReadOnly bool
	// CurrentPos is @@gtid_current_pos, BinlogPos @@gtid_binlog_pos
	// (everything in this server's binary log, replicated transactions
	// included thanks to log_slave_updates) and SlavePos @@gtid_slave_pos
	// (the last transactions applied as a replica).
	CurrentPos, BinlogPos, SlavePos GTIDList

	// The fields below are zero on a primary.

	// PrimaryAddr is the configured primary, host:port.
	PrimaryAddr string
	// TLS is Master_SSL_Allowed = "Yes": the replica connects to its
	// primary over TLS (ReplicateFrom with Credentials.TLS).
	TLS bool
	// IORunning is Slave_IO_Running: "Yes", "Connecting" (retrying a lost
	// primary every MASTER_CONNECT_RETRY second), "Preparing" or "No".
	IORunning string
	// SQLRunning is Slave_SQL_Running = "Yes".
	SQLRunning bool
	// IOPos is Gtid_IO_Pos: the last complete transaction received into
	// the relay log, applied or not.
	IOPos GTIDList
	// Lag is Seconds_Behind_Master, LagKnown false when it is NULL (SQL
	// thread stopped, or IO thread not connected).
	Lag      time.Duration
	LagKnown bool
	// Last errors of the IO thread (connecting to and reading from the
	// primary) and of the SQL thread (applying), 0 and "" if none.
	LastIOErrno  int
	LastIOError  string
	LastSQLErrno int
	LastSQLError string
}

// IOThreadRunning reports whether the IO thread is running, connected or
// still trying to connect.
func (s Status) IOThreadRunning() bool {
	return s.IORunning == "Yes" || s.IORunning == "Connecting" || s.IORunning == "Preparing"
}

// Received is how far the server got as a replica: per domain, the later
// of what it received (Gtid_IO_Pos) and what it applied (gtid_slave_pos).
// This, not the applied position, ranks promotion candidates, because
// Promote applies the relay log before taking writes.
func (s Status) Received() GTIDList { return s.IOPos.Merge(s.SlavePos) }

// Status reads the server's role, fence and positions.
func (a *Admin) Status(ctx context.Context) (Status, error) {
	return a.status(ctx, a.db)
}

func (a *Admin) status(ctx context.Context, q queryer) (Status, error) {
	st := Status{Addr: a.addr, Role: RolePrimary}
	var cur, binlog, slave string
	if err := q.QueryRowContext(ctx, a.flavor.Positions()).Scan(&st.ServerID, &st.ReadOnly, &cur, &binlog, &slave); err != nil {
		return Status{}, fmt.Errorf("replication: read positions of %s: %w", a.addr, err)
	}
	var errs []error
	parse := func(name, s string) GTIDList {
		l, err := ParseGTIDList(s)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", name, err))
		}
		return l
	}
	st.CurrentPos = parse("gtid_current_pos", cur)
	st.BinlogPos = parse("gtid_binlog_pos", binlog)
	st.SlavePos = parse("gtid_slave_pos", slave)

	row, err := a.replicaRow(ctx, q)
	if err != nil {
		return Status{}, err
	}
	if row != nil {
		n := a.flavor.Names()
		num := func(col string) int {
			v, err := strconv.Atoi(row[col].String)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s = %q: %w", col, row[col].String, err))
			}
			return v
		}
		for _, col := range []string{n.PrimaryHost, n.PrimaryPort, n.IORunning, n.SQLRunning, n.IOPos, n.SecondsBehind,
			n.LastIOErrno, n.LastIOError, n.LastSQLErrno, n.LastSQLError} {
			if _, ok := row[col]; !ok {
				errs = append(errs, fmt.Errorf("%s has no column %s", a.flavor.ReplicaStatus(), col))
			}
		}
		st.Role = RoleReplica
		st.PrimaryAddr = net.JoinHostPort(row[n.PrimaryHost].String, row[n.PrimaryPort].String)
		st.TLS = row[n.PrimaryTLS].String == "Yes"
		st.IORunning = row[n.IORunning].String
		st.SQLRunning = row[n.SQLRunning].String == "Yes"
		st.IOPos = parse(n.IOPos, row[n.IOPos].String)
		if lag := row[n.SecondsBehind]; lag.Valid {
			st.Lag, st.LagKnown = time.Duration(num(n.SecondsBehind))*time.Second, true
		}
		st.LastIOErrno, st.LastIOError = num(n.LastIOErrno), row[n.LastIOError].String
		st.LastSQLErrno, st.LastSQLError = num(n.LastSQLErrno), row[n.LastSQLError].String
	}
	if err := errors.Join(errs...); err != nil {
		return Status{}, fmt.Errorf("replication: status of %s: %w", a.addr, err)
	}
	return st, nil
}

// replicaRow returns SHOW SLAVE STATUS as a column map, nil if the server
// replicates from nobody. Columns are looked up by name because their
// number and order change between versions.
func (a *Admin) replicaRow(ctx context.Context, q queryer) (map[string]sql.NullString, error) {
	rows, err := q.QueryContext(ctx, a.flavor.ReplicaStatus())
	if err != nil {
		return nil, fmt.Errorf("replication: replica status of %s: %w", a.addr, err)
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		return nil, fmt.Errorf("replication: replica status of %s: %w", a.addr, err)
	}
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("replication: replica status of %s: %w", a.addr, err)
		}
		return nil, nil
	}
	vals := make([]sql.NullString, len(cols))
	ptrs := make([]any, len(cols))
	for i := range vals {
		ptrs[i] = &vals[i]
	}
	if err := rows.Scan(ptrs...); err != nil {
		return nil, fmt.Errorf("replication: replica status of %s: %w", a.addr, err)
	}
	m := make(map[string]sql.NullString, len(cols))
	for i, c := range cols {
		m[c] = vals[i]
	}
	return m, nil
}
