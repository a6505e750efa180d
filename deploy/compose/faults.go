package compose

import (
	"context"
	"fmt"
	"maps"
	"time"

	"github.com/triage-queue/triage/deploy/drill"
	"github.com/triage-queue/triage/deploy/wan"
	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
)

// The nemesis's faults beyond the drills' on the compose bed (Inject and
// Heal dispatch to them; enqueuer-kill is docker kill of the region's
// enqueuer container, its only one, next to nats-kill and dequeuer-kill):
//
//   - mariadb-pause: docker pause of the shard's current primary (the
//     cgroup freezer: every process of the container stopped, its
//     connections left open). The heal is docker unpause; the server runs
//     awake for thawWindow with the sessions and transactions it had open,
//     and then, if the shard failed over from it, is crashed (docker kill)
//     and started with replication.RejoinArgs, as a killed primary is, so
//     crash recovery drops what no replica acknowledged and the controller
//     rejoins it.
//   - wan-spike: SIGUSR1 to the region's WAN gateway (docker kill
//     --signal), which adds its configured spike (wan.DefaultSpike unless
//     the gateway's config says) to every connection between the region
//     and the others, both ways; SIGUSR2 ends it.

// thawWindow is how long a paused primary runs awake before the heal
// crashes it for its rejoin.
const thawWindow = 5 * time.Second

// injectMore injects mariadb-pause and wan-spike, with the containers cs
// and the shard map m Inject read; of finds the region's container of a
// role.
func (b *Bed) injectMore(ctx context.Context, f drill.Fault, cs []container, m *triagev1.ShardMap, of func(string) (container, error)) (drill.Injection, error) {
	switch f.Scenario {
	case "mariadb-pause":
		b.remember(cs, m, "", f.Shard)
		b.mu.Lock()
		c, ok := b.before[f.Shard]
		b.mu.Unlock()
		if !ok {
			return drill.Injection{}, fmt.Errorf("shard %d: no container of the bed is its primary %q", f.Shard, primaryOf(m, f.Shard))
		}
		asked := time.Now()
		_, err := docker(ctx, "pause", c.ID)
		return drill.Injection{At: asked, Description: fmt.Sprintf("docker pause of shard %d's primary %s (container %s, region %s, started as %s): connections open, nothing answers",
			f.Shard, c.Addr, c.Service, c.Region, c.StartedAs)}, err
	case "wan-spike":
		gw, err := of("wan")
		if err != nil {
			return drill.Injection{}, err
		}
		asked := time.Now()
		_, err = docker(ctx, "kill", "--signal", "USR1", gw.ID)
		return drill.Injection{At: asked, Description: fmt.Sprintf("SIGUSR1 to %s: its latency spike (default %s one way) on every connection between %s and the other regions",
			gw.Service, wan.DefaultSpike, f.Region)}, err
	}
	return drill.Injection{}, fmt.Errorf("compose: no such fault %q", f.Scenario)
}

// healMore heals mariadb-pause and wan-spike.
func (b *Bed) healMore(ctx context.Context, f drill.Fault) (string, error) {
	switch f.Scenario {
	case "mariadb-pause":
		b.mu.Lock()
		c, ok := b.before[f.Shard]
		b.mu.Unlock()
		if !ok {
			return "", fmt.Errorf("shard %d: no mariadb-pause to heal", f.Shard)
		}
		if _, err := docker(ctx, "unpause", c.ID); err != nil {
			return "", err
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(thawWindow):
		}
		m, err := b.shardMap(ctx)
		if err != nil {
			return "", err
		}
		if primaryOf(m, f.Shard) == c.Addr {
			return fmt.Sprintf("docker unpause of %s: still shard %d's primary, no failover", c.Service, f.Shard), nil
		}
		// Crashed, not stopped: a clean shutdown would complete the
		// commits waiting for a semi-sync acknowledgement, which no
		// replica has.
		if _, err := kill(ctx, c); err != nil {
			return "", err
		}
		b.mu.Lock()
		before := maps.Clone(b.before)
		b.mu.Unlock()
		deposed := func(x container) bool {
			p, ok := before[x.Shard]
			return ok && p.ID == x.ID && primaryOf(m, x.Shard) != x.Addr
		}
		desc, err := b.startServers(ctx, []container{c}, deposed)
		return fmt.Sprintf("docker unpause of %s; deposed, %s awake, then crashed: %s", c.Service, thawWindow, desc), err
	case "wan-spike":
		gw, err := b.service(ctx, gateway(f.Region))
		if err != nil {
			return "", err
		}
		if _, err := docker(ctx, "kill", "--signal", "USR2", gw.ID); err != nil {
			return "", err
		}
		return "SIGUSR2 to " + gw.Service + ": the spike is over", nil
	}
	return "", fmt.Errorf("compose: no such fault %q", f.Scenario)
}
