package shardmap_test

import (
	"fmt"
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
	_, err = shardmap.LoadCurrent(ctx, kv)
	require.ErrorIs(t, err, shardmap.ErrConflict)

	kv.Lag.Store(0)
	cur, err := shardmap.LoadCurrent(ctx, kv)
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

// TestPublishTooLargeIsNotAConflict: a map larger than one NATS message
// carries is refused as ErrTooLarge, saying its size, not as a conflict
// (which callers retry, to the same refusal), and the stored map stays.
func TestPublishTooLargeIsNotAConflict(t *testing.T) {
	ctx := t.Context()
	nc, js := natstest.JetStream(t)
	bucket, err := shardmap.OpenBucket(ctx, js, 1)
	require.NoError(t, err)
	base := shardmap.Map{Version: 1, Regions: []string{"a"}}
	for i := uint32(1); i <= 300; i++ {
		base.Shards = append(base.Shards, shardmap.Shard{ID: i, HomeRegion: "a", Primary: fmt.Sprintf("db%d:3306", i)})
	}
	v1, err := shardmap.New(base)
	require.NoError(t, err)
	_, err = shardmap.Bootstrap(ctx, bucket, v1)
	require.NoError(t, err)
	// Namespaces share their slot tables in the stored map; 64 topic
	// configs with long names make each about 10 KB.
	big := base
	big.Version = 2
	for n := range int(nc.MaxPayload()/8_000) + 20 {
		ns := shardmap.Namespace{Name: fmt.Sprintf("tenant-%d", n), Topics: map[string]shardmap.TopicConfig{}}
		for k := range 64 {
			ns.Topics[fmt.Sprintf("%0120d", k)] = shardmap.TopicConfig{Policy: shardmap.PolicyStrict}
		}
		big.Namespaces = append(big.Namespaces, ns)
	}
	v2, err := shardmap.New(big)
	require.NoError(t, err)
	data, err := v2.Marshal()
	require.NoError(t, err)
	require.Greater(t, int64(len(data)), nc.MaxPayload(), "the map outgrows one message")
	err = shardmap.Publish(ctx, bucket, v1, v2)
	require.ErrorIs(t, err, shardmap.ErrTooLarge)
	require.NotErrorIs(t, err, shardmap.ErrConflict)
	require.ErrorContains(t, err, "more than one NATS message carries")
	cur, err := shardmap.LoadCurrent(ctx, bucket)
	require.NoError(t, err)
	require.Equal(t, uint64(1), cur.Version)
}
