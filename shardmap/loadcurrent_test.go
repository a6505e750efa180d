package shardmap_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/triage-queue/triage/cmd/triage/natsserver/natstest"
	"github.com/triage-queue/triage/shardmap"
	"github.com/triage-queue/triage/shardmap/shardmaptest"
)

// TestLoadCurrentRefusesALaggingRead: LoadCurrent returns the stored map
// only when the bucket's leader proves the revision it read is the latest;
// a read answered from an older revision (a NATS server catching up) is a
// conflict, where Load returns the old map as if it were current. Proving
// changes no map.
func TestLoadCurrentRefusesALaggingRead(t *testing.T) {
	ctx := t.Context()
	_, js := natstest.JetStream(t)
	bucket, err := shardmap.OpenBucket(ctx, js, 1)
	require.NoError(t, err)
	v1, err := shardmap.New(shardmap.Map{Version: 1, Regions: []string{"a"}, Shards: []shardmap.Shard{{ID: 1, HomeRegion: "a", Primary: "old:3306"}}})
	require.NoError(t, err)
	_, err = shardmap.Bootstrap(ctx, bucket, v1)
	require.NoError(t, err)
	first, err := bucket.Get(ctx, shardmap.Key)
	require.NoError(t, err)
	v2, err := shardmap.New(shardmap.Map{Version: 2, Regions: []string{"a"}, Shards: []shardmap.Shard{{ID: 1, HomeRegion: "a", Primary: "new:3306", Epoch: 1}}})
	require.NoError(t, err)
	require.NoError(t, shardmap.Publish(ctx, bucket, v1, v2))

	kv := &shardmaptest.LaggingKV{KeyValue: bucket}
	kv.Lag.Store(first.Revision())
	stale, err := shardmap.Load(ctx, kv)
	require.NoError(t, err)
	require.Equal(t, uint64(1), stale.Version, "the lagging read answers the old map")
	_, err = shardmap.LoadCurrent(ctx, kv, nil)
	require.ErrorIs(t, err, shardmap.ErrConflict)

	kv.Lag.Store(0)
	cur, err := shardmap.LoadCurrent(ctx, kv, nil)
	require.NoError(t, err)
	require.Equal(t, uint64(2), cur.Version)
	s, _ := cur.Shard(1)
	require.Equal(t, "new:3306", s.Primary)
	stored, err := shardmap.Load(ctx, bucket)
	require.NoError(t, err)
	require.Equal(t, uint64(2), stored.Version, "proving changed the map")
	s, _ = stored.Shard(1)
	require.Equal(t, "new:3306", s.Primary)
}
