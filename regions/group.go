package regions

import (
	"slices"
	"strings"
	"sync"

	"github.com/triage-queue/triage/shardmap"
)

// A group is the shards that fail over together: those whose primary is
// the same server, with the same replicas listed alike. Promotion is a
// server's (the replica stops replicating and turns read_only off for
// all its databases), and so are read_only and a replica's IO thread, so
// a server's shards move in one failover: one promotion, one fence
// publish and one publish of the new primary for all of them. Shards of
// one server whose replicas are listed otherwise form groups of their
// own.

// groupKey names s's group.
func groupKey(s shardmap.Shard) string {
	return s.Primary + "|" + strings.Join(s.Replicas, ",") + "|" + strings.Join(s.ReplicaRegions, ",")
}

// groups splits shards into their groups, each in ID order, the groups
// in the order of their first shard.
func groups(shards []shardmap.Shard) [][]shardmap.Shard {
	at := map[string]int{}
	var out [][]shardmap.Shard
	for _, s := range shards {
		k := groupKey(s)
		i, ok := at[k]
		if !ok {
			i = len(out)
			at[k] = i
			out = append(out, nil)
		}
		out[i] = append(out[i], s)
	}
	for _, g := range out {
		slices.SortFunc(g, func(a, b shardmap.Shard) int { return int(a.ID) - int(b.ID) })
	}
	return out
}

// groupOf returns the group of shard id in m, in ID order; nil if m has
// no such shard.
func groupOf(m *shardmap.Map, id uint32) []shardmap.Shard {
	s, ok := m.Shard(id)
	if !ok {
		return nil
	}
	k := groupKey(s)
	var g []shardmap.Shard
	for _, o := range m.Shards {
		if groupKey(o) == k {
			g = append(g, o)
		}
	}
	slices.SortFunc(g, func(a, b shardmap.Shard) int { return int(a.ID) - int(b.ID) })
	return g
}

func ids(g []shardmap.Shard) []uint32 {
	out := make([]uint32, len(g))
	for i, s := range g {
		out[i] = s.ID
	}
	return out
}

// withShards returns the next version of m with each of shards replacing
// the shard of its ID.
func withShards(m *shardmap.Map, shards []shardmap.Shard) (*shardmap.Map, error) {
	by := make(map[uint32]shardmap.Shard, len(shards))
	for _, s := range shards {
		by[s.ID] = s
	}
	next := shardmap.Map{Version: m.Version + 1, Regions: m.Regions, Namespaces: m.Namespaces, Retired: m.Retired}
	for _, old := range m.Shards {
		if s, ok := by[old.ID]; ok {
			old = s
		}
		next.Shards = append(next.Shards, old)
	}
	return shardmap.New(next)
}

// perShardParallel bounds the per-shard statements and KV requests a
// group failover runs at once (claims, epochs): a few hundred shards
// take a few rounds, not a few hundred.
const perShardParallel = 16

// eachShard runs f for every shard of g (and its index), perShardParallel
// at a time, and returns each one's error.
func eachShard(g []shardmap.Shard, f func(int, shardmap.Shard) error) []error {
	errs := make([]error, len(g))
	sem := make(chan struct{}, perShardParallel)
	var wg sync.WaitGroup
	for i, s := range g {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			errs[i] = f(i, s)
		})
	}
	wg.Wait()
	return errs
}
