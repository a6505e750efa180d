package drill

import (
	"context"
	"database/sql"
	"fmt"
	"time"
)

// SuperviseRecheck is how long a bed's supervisor waits before it looks at
// a suspect again: a server the controller is promoting is writable for a
// moment before the shard map it publishes names it primary.
const SuperviseRecheck = 10 * time.Second

// StillDeposed returns the deposed servers that find lists twice,
// SuperviseRecheck apart (same tells one server from another): what both
// beds' supervisors crash and restart with the rejoin arguments after a
// heal, as the controller's alarm asks an operator to. Nil when the first
// look finds none or ctx ends.
func StillDeposed[T any](ctx context.Context, find func(context.Context) []T, same func(a, b T) bool) []T {
	first := find(ctx)
	if len(first) == 0 {
		return nil
	}
	select {
	case <-ctx.Done():
		return nil
	case <-time.After(SuperviseRecheck):
	}
	var out []T
	for _, s := range find(ctx) {
		for _, f := range first {
			if same(s, f) {
				out = append(out, s)
				break
			}
		}
	}
	return out
}

// DeposedState reads, as dsn's account, whether a server the live shard
// map does not name primary is still live as one: writable, or holding
// commits that wait for a semi-sync acknowledgement. state says which, for
// the supervisor's report. An unreachable server is not (err).
func DeposedState(ctx context.Context, dsn string) (live bool, state string, err error) {
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		return false, "", err
	}
	defer db.Close()
	qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	var readOnly bool
	var w sql.NullInt64
	err = db.QueryRowContext(qctx, `SELECT @@global.read_only,
		(SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS WHERE VARIABLE_NAME = 'RPL_SEMI_SYNC_MASTER_WAIT_SESSIONS')`).Scan(&readOnly, &w)
	if err != nil || readOnly && w.Int64 == 0 {
		return false, "", err // a replica as it should be
	}
	return true, fmt.Sprintf("read_only=%t with %d commits waiting for a semi-sync ack", readOnly, w.Int64), nil
}
