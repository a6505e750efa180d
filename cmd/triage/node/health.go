package node

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/triage-queue/triage/shardmap"
)

// Healthy reports nil when the node can do its work: it has not stopped,
// its NATS connection is up, its shard map was confirmed by the store
// within shardmap.MaxStaleness, and (for the roles that touch MySQL) the
// current primary of each of its region's shards answers a ping within
// ctx. Otherwise it says which dependency failed. A container health check
// (triage serve --health) serves it.
func (n *Node) Healthy(ctx context.Context) error {
	select {
	case <-n.done:
		return errors.New("node is stopping")
	default:
	}
	if st := n.nc.Status(); st != nats.CONNECTED {
		return fmt.Errorf("nats %s: connection %s", n.cfg.NATS, st)
	}
	if age := n.maps.Age(); age > shardmap.MaxStaleness {
		return fmt.Errorf("shard map not confirmed by NATS KV for %s", age.Round(time.Millisecond))
	}
	if n.GRPCAddr == "" && n.enq == nil && n.deq == nil {
		return nil // a controller alone reaches MySQL only while it leads
	}
	// One ping per primary server, through the pool of its first shard:
	// many shards are often databases on one server, and a ping a second
	// per shard was most of an idle node's CPU at a thousand shards.
	m := n.maps.Current()
	pinged := map[string]bool{}
	for _, id := range m.RegionShards(n.cfg.Region) {
		s, _ := m.Shard(id)
		if pinged[s.Primary] {
			continue
		}
		pinged[s.Primary] = true
		db, s, err := n.pool.Primary(m, id)
		if err != nil {
			return err
		}
		if err := db.PingContext(ctx); err != nil {
			return fmt.Errorf("shard %d primary %s: %w", id, s.Primary, err)
		}
	}
	return nil
}
