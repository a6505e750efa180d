package shardmap

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestAddDrainRetire(t *testing.T) {
	t.Parallel()
	m, err := Parse([]byte(twoShards))
	require.NoError(t, err)
	now := time.Now()
	before, _ := m.Namespace("default")
	keys := map[string]uint32{}
	for i := range 500 {
		k := string(rune('a'+i%26)) + string(rune('a'+i/26))
		s, from, ok := before.DedupRoute("us-east", "t", k)
		require.True(t, ok)
		require.Zero(t, from)
		keys[k] = s
	}

	// Add shard 4 with weight 3: default takes it (no list for us-east), pinned does not.
	m2, err := m.WithNewShard(Shard{ID: 4, HomeRegion: "us-east", Primary: "127.0.0.1:3311", Weight: 3})
	require.NoError(t, err)
	require.Equal(t, m.Version+1, m2.Version)
	ids, w, err := m2.EnqueueShards("default", "us-east")
	require.NoError(t, err)
	require.Equal(t, []uint32{1, 2, 4}, ids)
	require.Equal(t, []uint32{1, 1, 3}, w)
	counts := map[uint32]int{}
	for n := range uint64(500) {
		counts[PickWeighted(ids, w, n)]++
	}
	require.Equal(t, map[uint32]int{1: 100, 2: 100, 4: 300}, counts)
	ids, _, err = m2.EnqueueShards("pinned", "us-east")
	require.NoError(t, err)
	require.Equal(t, []uint32{2}, ids)
	// A new shard takes no dedup keys.
	ns2, _ := m2.Namespace("default")
	for k, s := range keys {
		got, from, _ := ns2.DedupRoute("us-east", "t", k)
		require.Equal(t, s, got)
		require.Zero(t, from)
	}

	_, err = m2.WithNewShard(Shard{ID: 4, HomeRegion: "us-east", Primary: "x:1"})
	require.Error(t, err)
	_, err = m2.WithNamespaceShard("pinned", "eu-west", 4)
	require.ErrorContains(t, err, "homed in")
	m3, err := m2.WithNamespaceShard("pinned", "us-east", 4)
	require.NoError(t, err)
	_, err = m3.WithNamespaceShard("pinned", "us-east", 4)
	require.ErrorIs(t, err, ErrShardState)

	// Drain shard 2 (pinned's other shard is 4 now): its slots move to 1 and 4, remembering 2.
	_, err = m2.WithDrain(2, now)
	require.ErrorIs(t, err, ErrShardState, "pinned's only shard in us-east")
	m4, err := m3.WithDrain(2, now)
	require.NoError(t, err)
	ids, _, err = m4.EnqueueShards("default", "us-east")
	require.NoError(t, err)
	require.Equal(t, []uint32{1, 4}, ids)
	all, _ := m4.ShardsFor("default", "us-east")
	require.Equal(t, []uint32{1, 2, 4}, all, "dequeues still read the draining shard")
	ns4, _ := m4.Namespace("default")
	for k, s := range keys {
		got, from, _ := ns4.DedupRoute("us-east", "t", k)
		if s == 2 {
			require.Contains(t, []uint32{1, 4}, got)
			require.Equal(t, uint32(2), from)
		} else {
			require.Equal(t, s, got, "keys of other shards stay")
			require.Zero(t, from)
		}
	}
	_, err = m4.WithDrain(2, now)
	require.ErrorIs(t, err, ErrShardState)
	// The map survives a JSON round trip with its moves.
	data, err := m4.Marshal()
	require.NoError(t, err)
	back, err := Parse(data)
	require.NoError(t, err)
	nsb, _ := back.Namespace("default")
	require.Equal(t, ns4.SlotsFrom, nsb.SlotsFrom)
	// Shard 4 holds slots moved from 2: it cannot drain before 2 is retired.
	_, err = m4.WithDrain(4, now)
	require.ErrorIs(t, err, ErrShardState)

	_, err = m3.WithoutShard(2)
	require.ErrorIs(t, err, ErrShardState, "not draining")
	m5, err := m4.WithoutShard(2)
	require.NoError(t, err)
	_, ok := m5.Shard(2)
	require.False(t, ok)
	require.Equal(t, []uint32{2}, m5.Retired)
	ns5, _ := m5.Namespace("default")
	require.Nil(t, ns5.SlotsFrom)
	_, err = m5.WithNewShard(Shard{ID: 2, HomeRegion: "us-east", Primary: "x:1"})
	require.ErrorContains(t, err, "retired")
	_, err = m5.WithoutShard(9)
	require.ErrorIs(t, err, ErrUnknownShard)
	_, err = m5.WithWeight(4, 0)
	require.Error(t, err)
	m6, err := m5.WithWeight(4, 1)
	require.NoError(t, err)
	_, w, _ = m6.EnqueueShards("default", "us-east")
	require.Equal(t, []uint32{1, 1}, w)
}
