package bootstrap

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/triage-queue/triage/shardmap"
)

// TestPlanProvisionsSparesOutsideTheMap: spare shards are replicated and
// their servers provisioned, after the map's and marked spare (migrated,
// not published); a spare that reuses a shard ID or a server of the map, or
// of another spare, is refused before anything is touched.
func TestPlanProvisionsSparesOutsideTheMap(t *testing.T) {
	m := &shardmap.Map{Shards: []shardmap.Shard{
		{ID: 1, HomeRegion: "a", Primary: "s1a:3306", Database: "triage", Replicas: []string{"s1b:3306"}, ReplicaRegions: []string{"b"}},
	}}
	spare := shardmap.Shard{ID: 2, HomeRegion: "b", Primary: "s2b:3306", Replicas: []string{"s2a:3306"}, ReplicaRegions: []string{"a"}}
	shards, servers, err := plan(m, []shardmap.Shard{spare})
	require.NoError(t, err)
	require.Equal(t, []uint32{1, 2}, []uint32{shards[0].ID, shards[1].ID})
	require.Equal(t, "triage", shards[1].Database, "the default database")
	type got struct {
		shard          uint32
		addr           string
		primary, spare bool
	}
	var list []got
	for _, s := range servers {
		list = append(list, got{s.shard.ID, s.addr, s.primary, s.spare})
	}
	require.Equal(t, []got{{1, "s1a:3306", true, false}, {1, "s1b:3306", false, false}, {2, "s2b:3306", true, true}, {2, "s2a:3306", false, true}}, list)

	_, servers, err = plan(m, nil)
	require.NoError(t, err)
	require.Len(t, servers, 2, "no spares: the map's servers only")

	for name, bad := range map[string][]shardmap.Shard{
		"the map's shard ID":        {{ID: 1, Primary: "s9:3306"}},
		"the map's primary":         {{ID: 2, Primary: "s1a:3306"}},
		"the map's replica":         {{ID: 2, Primary: "s2:3306", Replicas: []string{"s1b:3306"}, ReplicaRegions: []string{"b"}}},
		"another spare's ID":        {spare, {ID: 2, Primary: "s9:3306"}},
		"another spare's server":    {spare, {ID: 3, Primary: "s2a:3306"}},
		"no primary":                {{ID: 2}},
		"replicas without a region": {{ID: 2, Primary: "s2:3306", Replicas: []string{"s2x:3306"}}},
	} {
		_, _, err := plan(m, bad)
		require.Error(t, err, name)
	}
}
