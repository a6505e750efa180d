package compose

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/triage-queue/triage/deploy/drill"
)

// superviseDeposed does, after every heal, what the controller's alarm
// "deposed primary holds commits waiting for an acknowledgement and
// cannot be fenced; restart it with the rejoin arguments" asks an
// operator to do: a running MariaDB container the live shard map does not
// name primary that is writable, or holds commits waiting for a semi-sync
// acknowledgement, is crashed and started to rejoin
// (replication.RejoinArgs), whichever fault deposed it. A failover of a
// live primary (a latency spike the observers took for an outage) leaves
// such a server with no heal of its own, and once two of a shard's three
// servers are like it no failover has a candidate. Paused containers are
// their own heal's. It says what it did, or nothing.
func (b *Bed) superviseDeposed(ctx context.Context) string {
	var crash []container
	var parts []string
	for _, s := range drill.StillDeposed(ctx, b.deposedWritable, func(x, y deposedServer) bool { return x.c.ID == y.c.ID }) {
		crash = append(crash, s.c)
		parts = append(parts, fmt.Sprintf("%s, deposed from shard %d, was %s", s.c.Service, s.c.Shard, s.state))
	}
	if len(crash) == 0 {
		return ""
	}
	if _, err := kill(ctx, crash...); err != nil {
		return "supervisor: crash " + strings.Join(parts, ", ") + ": " + err.Error()
	}
	desc, err := b.startServers(ctx, crash, func(container) bool { return true })
	if err != nil {
		desc = "start failed: " + err.Error()
	}
	return "supervisor: " + strings.Join(parts, "; ") + "; crashed: " + desc
}

// deposedServer is a container superviseDeposed found deposed but
// writable or with commits waiting, and what it found.
type deposedServer struct {
	c     container
	state string
}

// deposedWritable lists the running MariaDB containers that the live
// shard map does not name primary and that are writable or hold commits
// waiting for an acknowledgement.
func (b *Bed) deposedWritable(ctx context.Context) []deposedServer {
	cs, err := b.containers(ctx)
	if err != nil {
		return nil
	}
	m, err := b.shardMap(ctx)
	if err != nil {
		return nil
	}
	var out []deposedServer
	for _, c := range cs {
		if p := primaryOf(m, c.Shard); c.Role != "mariadb" || c.State != "running" || p == "" || p == c.Addr {
			continue // a spare shard's server (not in the map) is a primary in waiting
		}
		dsn, err := b.adminDSN(ctx, c)
		if err != nil {
			continue
		}
		live, state, err := drill.DeposedState(ctx, dsn)
		if err != nil || !live {
			continue // unreachable, or a replica as it should be
		}
		out = append(out, deposedServer{c, state})
	}
	return out
}

// adminDSN is the admin account's DSN for c's MariaDB, at its address on
// the bed's networks.
func (b *Bed) adminDSN(ctx context.Context, c container) (string, error) {
	ip, err := docker(ctx, "inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}", c.ID)
	if err != nil || len(strings.Fields(ip)) == 0 {
		return "", fmt.Errorf("%s has no address: %v", c.Service, err)
	}
	mc := mysql.NewConfig()
	mc.User, mc.Passwd, mc.Net, mc.Addr = adminUser, adminPassword, "tcp", strings.Fields(ip)[0]+":3306"
	mc.Timeout, mc.ReadTimeout = 2*time.Second, 2*time.Second
	return mc.FormatDSN(), nil
}
