package enqueuer

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/triage-queue/triage/shardmap"
)

// TestDrainsFollowThePrimary: an enqueue buffer is drained in the region
// its shard's primary runs in, from the home region's stream: after a
// failover moved shard 1's primary from a to b, b drains it and a stops
// (before, a kept inserting across the WAN). A region without enqueuers
// has its shards' buffers adopted.
func TestDrainsFollowThePrimary(t *testing.T) {
	t.Parallel()
	m, err := shardmap.New(shardmap.Map{Version: 2, Regions: []string{"a", "b", "c"}, Shards: []shardmap.Shard{
		{ID: 1, HomeRegion: "a", PrimaryRegion: "b", Primary: "127.0.0.1:1", Database: "d", Epoch: 1,
			Replicas: []string{"127.0.0.1:2"}, ReplicaRegions: []string{"a"}},
		{ID: 2, HomeRegion: "b", Primary: "127.0.0.1:3", Database: "d", Replicas: []string{"127.0.0.1:4"}, ReplicaRegions: []string{"c"}},
		{ID: 3, HomeRegion: "c", Primary: "127.0.0.1:5", Database: "d", Replicas: []string{"127.0.0.1:6"}, ReplicaRegions: []string{"a"}},
	}})
	require.NoError(t, err)
	none := func(string) bool { return false }
	require.Empty(t, drains(m, "a", none), "a's only shard has its primary in b")
	require.Equal(t, map[uint32]string{1: "a", 2: "b"}, drains(m, "b", none), "shard 1 from a's stream")
	require.Equal(t, map[uint32]string{3: "c"}, drains(m, "c", none))
	// c has no enqueuers left: a adopts its shard.
	require.Equal(t, map[uint32]string{3: "c"}, drains(m, "a", func(r string) bool { return r == "c" }))
}
