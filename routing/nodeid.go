package routing

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/triage-queue/triage/proto/triage/peer"
	"github.com/triage-queue/triage/schema/itemid"
)

// NodesBucket holds the claimed item-ID node numbers: key "node.<n>".
const NodesBucket = "triage_nodes"

// DefaultNodeTTL is how long a node number outlives its last refresh.
const DefaultNodeTTL = time.Minute

// NodeClaim is a node number held in NATS KV. While it is held no other
// router allocates keys with it, so keys are unique without a database.
//
// The number is refreshed every TTL/6. The bucket's TTL frees the number
// of a process that stopped refreshing, a process cut off from NATS
// included, and then another router may claim it. So the claim is only
// trusted while its last confirmed refresh is younger than TTL minus a
// margin of TTL/4 (Check): past that the router stops minting IDs, and
// once NATS answers again it re-creates the key if nobody took it
// meanwhile, or reports the number lost.
//
// The key's value is unique per claim (the owner and a random suffix), so
// a claim tells its own writes from another router's: after a refresh
// whose answer was lost (the write landed, the reply did not) the claim
// finds its own value at a newer revision and carries on, while a key that
// holds any other value, another router of the same region included, is
// someone else's and the number is lost.
type NodeClaim struct {
	Node int
	// Value is what the claim writes under its key: the owner and a
	// random suffix, unique per claim.
	Value string
	kv    jetstream.KeyValue
	ttl   time.Duration
	stop  context.CancelFunc
	done  chan struct{}

	mu     sync.Mutex
	rev    uint64
	proven time.Time // when the last successful write was sent
	lost   error
}

// NodeClaimConfig configures ClaimNodeWith.
type NodeClaimConfig struct {
	// Owner names the process for operators (e.g. router-us-east); the
	// key's value is Owner, "/" and a random suffix, so that it is unique
	// per claim.
	Owner string
	// Replicas of the bucket. Default 1.
	Replicas int
	// TTL of a claim without refresh. Default DefaultNodeTTL.
	TTL time.Duration
	// Lost is called once when the number turns out to be taken by
	// another router: the router must never mint with it again.
	Lost func(error)

	// firstNode, in tests, is the first number tried (default random).
	firstNode func() int
}

// ClaimNode takes a free node number and keeps it alive until Release,
// with DefaultNodeTTL. If the number is lost, lost is called.
func ClaimNode(ctx context.Context, js jetstream.JetStream, owner string, replicas int, lost func(error)) (*NodeClaim, error) {
	return ClaimNodeWith(ctx, js, NodeClaimConfig{Owner: owner, Replicas: replicas, Lost: lost})
}

// ClaimNodeWith is ClaimNode with every setting.
func ClaimNodeWith(ctx context.Context, js jetstream.JetStream, cfg NodeClaimConfig) (*NodeClaim, error) {
	if cfg.TTL <= 0 {
		cfg.TTL = DefaultNodeTTL
	}
	kv, err := peer.EnsureKeyValue(ctx, js, jetstream.KeyValueConfig{Bucket: NodesBucket, TTL: cfg.TTL,
		Storage: jetstream.FileStorage, Replicas: max(cfg.Replicas, 1)})
	if err != nil {
		return nil, fmt.Errorf("open kv bucket %s: %w", NodesBucket, err)
	}
	start := rand.IntN(itemid.MaxNode + 1)
	if cfg.firstNode != nil {
		start = cfg.firstNode()
	}
	value := cfg.Owner + "/" + nuid.Next()
	for i := 0; i <= itemid.MaxNode; i++ {
		n := (start + i) % (itemid.MaxNode + 1)
		sent := time.Now()
		rev, err := kv.Create(ctx, nodeKey(n), []byte(value))
		if errors.Is(err, jetstream.ErrKeyExists) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("claim node id: %w", err)
		}
		cctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		c := &NodeClaim{Node: n, Value: value, kv: kv, ttl: cfg.TTL, rev: rev, proven: sent, stop: cancel, done: make(chan struct{})}
		go c.keep(cctx, cfg.Lost)
		return c, nil
	}
	return nil, fmt.Errorf("claim node id: all %d node ids are taken", itemid.MaxNode+1)
}

func nodeKey(n int) string { return "node." + strconv.Itoa(n) }

// Check says whether IDs may be minted now: the claim was confirmed in
// NATS recently enough that nobody else can have taken the number.
func (c *NodeClaim) Check(now time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.lost != nil {
		return errorf(ErrUnavailable, "%v; this router allocates no more item IDs", c.lost)
	}
	if age := now.Sub(c.proven); age > c.ttl-c.ttl/4 {
		return errorf(ErrUnavailable, "item id node %d was last confirmed in NATS %s ago (its claim lapses after %s); enqueues resume once NATS answers again",
			c.Node, age.Round(time.Millisecond), c.ttl)
	}
	return nil
}

func (c *NodeClaim) keep(ctx context.Context, lost func(error)) {
	defer close(c.done)
	every := c.ttl / 6
	t := time.NewTimer(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		err := c.refresh(ctx)
		var lostErr *nodeLost
		if errors.As(err, &lostErr) {
			c.mu.Lock()
			c.lost = err
			c.mu.Unlock()
			if lost != nil {
				lost(err)
			}
			return
		}
		next := every
		if err != nil {
			// NATS out of reach: try again soon, so minting resumes
			// promptly when it is back.
			next = min(every, time.Second)
		}
		t.Reset(next)
	}
}

type nodeLost struct{ err error }

func (e *nodeLost) Error() string { return e.err.Error() }

// refresh confirms the claim: update at the known revision. When the key
// is not at that revision, reclaim finds out whose it is.
func (c *NodeClaim) refresh(ctx context.Context) error {
	c.mu.Lock()
	rev := c.rev
	c.mu.Unlock()
	sent := time.Now()
	rctx, cancel := context.WithTimeout(ctx, c.ttl/6)
	defer cancel()
	newRev, err := c.kv.Update(rctx, nodeKey(c.Node), []byte(c.Value), rev)
	if err != nil && (errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyNotFound) || strings.Contains(err.Error(), "wrong last sequence")) {
		newRev, err = c.reclaim(rctx)
	}
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.rev, c.proven = newRev, sent
	c.mu.Unlock()
	return nil
}

// reclaim handles a key that is not at the claim's revision. Gone (it
// lapsed through an outage longer than the TTL): create it again, which
// succeeds only if nobody claimed the number meanwhile. Holding the
// claim's own value: an earlier refresh landed but its answer was lost, so
// update at the revision found. Holding any other value: another router's.
func (c *NodeClaim) reclaim(ctx context.Context) (uint64, error) {
	key := nodeKey(c.Node)
	taken := func(by string) error {
		return &nodeLost{fmt.Errorf("node id %d claim lost: another router holds it (%s)", c.Node, by)}
	}
	e, err := c.kv.Get(ctx, key)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		rev, err := c.kv.Create(ctx, key, []byte(c.Value))
		if errors.Is(err, jetstream.ErrKeyExists) {
			return 0, taken("created it while this one was away")
		}
		return rev, err
	case err != nil:
		return 0, err
	case string(e.Value()) != c.Value:
		return 0, taken(string(e.Value()))
	default:
		return c.kv.Update(ctx, key, []byte(c.Value), e.Revision())
	}
}

// Release stops refreshing and frees the number.
func (c *NodeClaim) Release(ctx context.Context) {
	c.stop()
	<-c.done
	c.mu.Lock()
	rev := c.rev
	c.mu.Unlock()
	_ = c.kv.Delete(ctx, nodeKey(c.Node), jetstream.LastRevision(rev))
}
