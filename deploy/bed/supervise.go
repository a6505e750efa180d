package bed

import (
	"context"
	"fmt"
	"strings"

	"github.com/triage-queue/triage/deploy/drill"
)

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
	var parts []string
	for _, s := range drill.StillDeposed(ctx, b.deposedWritable, func(x, y deposedServer) bool { return x.d == y.d }) {
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
		live, state, err := drill.DeposedState(ctx, d.srv.DSN(""))
		if err != nil || !live {
			continue // dead, unreachable, or a replica as it should be
		}
		out = append(out, deposedServer{d, state})
	}
	return out
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
