package bed

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strings"
	"time"
)

// superviseRecheck is how long superviseDeposed waits before it looks at
// a suspect again: a server the controller is promoting is writable for
// a moment before the shard map it publishes names it primary.
const superviseRecheck = 10 * time.Second

// superviseDeposed does what the controller's alarm "deposed primary
// holds commits waiting for an acknowledgement and cannot be fenced;
// restart it with the rejoin arguments" asks an operator to do, after
// every heal: a server the live shard map does not name primary that is
// still writable, or holds commits waiting for a semi-sync
// acknowledgement, is crashed and restarted with replication.RejoinArgs
// (restartKilled), whichever fault deposed it. A failover of a live
// primary (a latency spike the observers took for an outage, a fault in
// effect while another healed) leaves such a server with no heal of its
// own; left alone it keeps the replicas' places in the map, and once two
// of three are like it no failover has a candidate. Paused servers are
// their own heal's. It says what it did, or nothing.
func (b *Bed) superviseDeposed(ctx context.Context) string {
	suspects := b.deposedWritable(ctx)
	if len(suspects) == 0 {
		return ""
	}
	select {
	case <-ctx.Done():
		return ""
	case <-time.After(superviseRecheck):
	}
	var parts []string
	for _, s := range b.deposedWritable(ctx) {
		if !slices.ContainsFunc(suspects, func(x deposedServer) bool { return x.d == s.d }) {
			continue
		}
		if err := s.d.srv.Kill(); err != nil {
			parts = append(parts, fmt.Sprintf("supervisor: crash %s: %v", s.d.srv.Addr(), err))
			continue
		}
		desc, err := b.restartKilled(ctx, s.d)
		if err != nil {
			desc = "restart failed: " + err.Error()
		}
		parts = append(parts, fmt.Sprintf("supervisor: %s, deposed from shard %d, was %s; crashed, %s",
			s.d.srv.Addr(), s.d.shard, s.state, strings.Replace(desc, "killed primary", "deposed primary", 1)))
	}
	return strings.Join(parts, "; ")
}

// deposedServer is a server superviseDeposed found deposed but writable
// or with commits waiting, and what it found.
type deposedServer struct {
	d     *dbServer
	state string
}

// deposedWritable lists the running servers, not paused, that the live
// shard map does not name primary and that are writable or hold commits
// waiting for an acknowledgement.
func (b *Bed) deposedWritable(ctx context.Context) []deposedServer {
	b.nem.mu.Lock()
	paused := map[*dbServer]bool{}
	for _, d := range b.nem.paused {
		paused[d] = true
	}
	b.nem.mu.Unlock()
	var out []deposedServer
	for _, d := range b.serverList() {
		if paused[d] || !b.inMap(d.shard) || b.currentPrimary(d.shard) == d {
			continue // a spare shard's server (not in the map) is a primary in waiting
		}
		readOnly, waiting, err := fenceState(ctx, d)
		if err != nil || readOnly && waiting == 0 {
			continue // dead, unreachable, or a replica as it should be
		}
		out = append(out, deposedServer{d, fmt.Sprintf("read_only=%t with %d commits waiting for a semi-sync ack", readOnly, waiting)})
	}
	return out
}

// fenceState reads d's read_only and the sessions waiting for a semi-sync
// acknowledgement.
func fenceState(ctx context.Context, d *dbServer) (readOnly bool, waiting int, err error) {
	db, err := sql.Open("mysql", d.srv.DSN(""))
	if err != nil {
		return false, 0, err
	}
	defer db.Close()
	qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	var w sql.NullInt64
	err = db.QueryRowContext(qctx, `SELECT @@global.read_only,
		(SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS WHERE VARIABLE_NAME = 'RPL_SEMI_SYNC_MASTER_WAIT_SESSIONS')`).Scan(&readOnly, &w)
	return readOnly, int(w.Int64), err
}

// inMap reports whether the live shard map (the newest a node holds)
// names shard.
func (b *Bed) inMap(shard uint32) bool {
	for _, r := range b.regions {
		if r.node == nil || r.dead {
			continue
		}
		if _, ok := r.node.ShardMap().Shard(shard); ok {
			return true
		}
	}
	return false
}
