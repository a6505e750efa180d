package routing

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/triage-queue/triage/routing/itemid"
)

// NodesBucket holds the claimed item-ID node numbers: key "node.<n>".
const NodesBucket = "triage_nodes"

// NodeClaim is a node number held in NATS KV. While it is held no other
// router allocates keys with it, so keys are unique without a database.
type NodeClaim struct {
	Node int
	kv   jetstream.KeyValue
	rev  uint64
	stop context.CancelFunc
	done chan struct{}
}

// ClaimNode takes a free node number and keeps it alive until Release.
// The bucket's TTL (one minute) frees the number of a process that died;
// the claim is refreshed every 10 s. If a refresh finds the claim taken,
// lost is called: the router must stop allocating.
func ClaimNode(ctx context.Context, js jetstream.JetStream, owner string, replicas int, lost func(error)) (*NodeClaim, error) {
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: NodesBucket, TTL: time.Minute,
		Storage: jetstream.FileStorage, Replicas: max(replicas, 1)})
	if err != nil {
		return nil, fmt.Errorf("open kv bucket %s: %w", NodesBucket, err)
	}
	start := rand.IntN(itemid.MaxNode + 1)
	for i := 0; i <= itemid.MaxNode; i++ {
		n := (start + i) % (itemid.MaxNode + 1)
		rev, err := kv.Create(ctx, "node."+strconv.Itoa(n), []byte(owner))
		if errors.Is(err, jetstream.ErrKeyExists) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("claim node id: %w", err)
		}
		cctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		c := &NodeClaim{Node: n, kv: kv, rev: rev, stop: cancel, done: make(chan struct{})}
		go c.keep(cctx, owner, lost)
		return c, nil
	}
	return nil, fmt.Errorf("claim node id: all %d node ids are taken", itemid.MaxNode+1)
}

func (c *NodeClaim) keep(ctx context.Context, owner string, lost func(error)) {
	defer close(c.done)
	t := time.NewTicker(10 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		rev, err := c.kv.Update(ctx, "node."+strconv.Itoa(c.Node), []byte(owner), c.rev)
		if err == nil {
			c.rev = rev
			continue
		}
		if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyNotFound) || strings.Contains(err.Error(), "wrong last sequence") {
			if lost != nil {
				lost(fmt.Errorf("node id %d claim lost: %w", c.Node, err))
			}
			return
		}
		// NATS unreachable: keep the number; nobody can claim it while the
		// bucket cannot be written either.
	}
}

// Release stops refreshing and frees the number.
func (c *NodeClaim) Release(ctx context.Context) {
	c.stop()
	<-c.done
	_ = c.kv.Delete(ctx, "node."+strconv.Itoa(c.Node), jetstream.LastRevision(c.rev))
}
