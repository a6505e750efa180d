package itemid

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Epoch is the zero of the key's timestamp: 1 January 2025, UTC. 41 bits of
// milliseconds last until 2094.
var Epoch = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

const (
	nodeBits = 10
	seqBits  = 12
	// MaxNode is the largest node ID.
	MaxNode = 1<<nodeBits - 1
	maxSeq  = 1<<seqBits - 1
)

// ID is a parsed item ID.
type ID struct {
	Shard uint32
	Key   uint64
}

// ErrInvalid is returned for a string that is not an item ID.
var ErrInvalid = errors.New("invalid item id")

// String returns the external form.
func (id ID) String() string {
	return fmt.Sprintf("%d-%016x", id.Shard, id.Key)
}

// Parse reads the external form. It accepts only what String produces.
func Parse(s string) (ID, error) {
	shardPart, keyPart, ok := strings.Cut(s, "-")
	if !ok || len(keyPart) != 16 || shardPart == "" || len(shardPart) > 10 ||
		(len(shardPart) > 1 && shardPart[0] == '0') {
		return ID{}, fmt.Errorf("%w %q: want <shard>-<16 hex digits>, as returned by Enqueue", ErrInvalid, s)
	}
	shard, err := strconv.ParseUint(shardPart, 10, 32)
	if err != nil || shardPart[0] == '+' {
		return ID{}, fmt.Errorf("%w %q: shard must be a decimal number", ErrInvalid, s)
	}
	for _, c := range keyPart {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return ID{}, fmt.Errorf("%w %q: key must be 16 lower-case hex digits", ErrInvalid, s)
		}
	}
	key, err := strconv.ParseUint(keyPart, 16, 64)
	if err != nil || key == 0 {
		return ID{}, fmt.Errorf("%w %q: key must be non-zero", ErrInvalid, s)
	}
	return ID{Shard: uint32(shard), Key: key}, nil
}

// KeyTime returns the allocation time encoded in a key.
func KeyTime(key uint64) time.Time {
	return Epoch.Add(time.Duration(key>>(nodeBits+seqBits)) * time.Millisecond)
}

// Generator allocates keys for one node. It is safe for concurrent use.
type Generator struct {
	node uint64
	now  func() time.Time

	mu     sync.Mutex
	lastMS int64
	seq    uint64
}

// NewGenerator returns a generator for node, which must be at most MaxNode.
func NewGenerator(node int) (*Generator, error) {
	if node < 0 || node > MaxNode {
		return nil, fmt.Errorf("node id %d out of range 0..%d", node, MaxNode)
	}
	return &Generator{node: uint64(node), now: time.Now}, nil
}

// Next returns a new key. When more than 4096 keys are asked for within one
// millisecond it borrows from the next millisecond rather than sleeping, so
// keys stay unique and increasing; the clock catches up within a burst.
func (g *Generator) Next() uint64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	ms := g.now().Sub(Epoch).Milliseconds()
	if ms > g.lastMS {
		g.lastMS, g.seq = ms, 0
	} else {
		g.seq++
		if g.seq > maxSeq {
			g.lastMS++
			g.seq = 0
		}
	}
	return uint64(g.lastMS)<<(nodeBits+seqBits) | g.node<<seqBits | g.seq
}
