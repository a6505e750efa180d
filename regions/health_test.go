package regions

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/triage-queue/triage/deploy/natsserver/natstest"
	"github.com/triage-queue/triage/shardmap"
)

// TestHealthReportsReachTheControllerWithoutTheBucket: an observer's
// report reaches the controller's health view over core NATS even when
// the health bucket delivers nothing (here: the observer writes to a
// bucket nobody watches; in a region-down, the bucket's stream has no
// leader for seconds), so detection does not wait for the stream.
func TestHealthReportsReachTheControllerWithoutTheBucket(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	nc, js := natstest.JetStream(t)
	hkv, err := OpenHealth(ctx, js, 1)
	require.NoError(t, err)
	view, err := watchHealth(ctx, hkv, nc)
	require.NoError(t, err)

	// A bucket the view does not watch stands for one that delivers
	// nothing.
	elsewhere, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "elsewhere", Storage: jetstream.MemoryStorage})
	require.NoError(t, err)
	m, err := shardmap.New(shardmap.Map{Version: 1, Regions: []string{"a", "b"}, Shards: []shardmap.Shard{
		{ID: 1, HomeRegion: "a", Primary: "127.0.0.1:1", Database: "d", Replicas: []string{"127.0.0.1:2"}, ReplicaRegions: []string{"b"}},
	}})
	require.NoError(t, err)
	o := &Observer{Region: "b", Maps: shardmap.NewHolder(m), Dial: func(a string) string { return a }, KV: elsewhere, NC: nc, Logger: discard()}
	octx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	go o.Run(octx)

	s, _ := m.Shard(1)
	require.Eventually(t, func() bool {
		_, down := view.verdict(s, time.Now(), 3*time.Second)
		return len(down) == 1 && down[0] == "b"
	}, 10*time.Second, 50*time.Millisecond, "the controller must hear the observer's report of a dead primary")
}
