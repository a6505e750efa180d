package peer_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/triage-queue/triage/cmd/triage/natsserver/natstest"
	"github.com/triage-queue/triage/proto/triage/peer"
)

// TestEnsureUpdatesOnlyWhatDiffers: opening a bucket or stream whose
// settings are already the asked ones sends no stream update (the update
// races consumer creates inside nats-server; see jetstream.go); a changed
// setting is applied.
func TestEnsureUpdatesOnlyWhatDiffers(t *testing.T) {
	t.Parallel()
	nc, js := natstest.JetStream(t)
	ctx := t.Context()
	var updates atomic.Int32
	sub, err := nc.Subscribe("$JS.API.STREAM.UPDATE.*", func(*nats.Msg) { updates.Add(1) })
	require.NoError(t, err)
	defer sub.Unsubscribe()
	settled := func() int32 { require.NoError(t, nc.Flush()); time.Sleep(50 * time.Millisecond); return updates.Load() }

	kvCfg := jetstream.KeyValueConfig{Bucket: "ensure_test", TTL: time.Minute, Storage: jetstream.MemoryStorage}
	_, err = peer.EnsureKeyValue(ctx, js, kvCfg)
	require.NoError(t, err)
	before := settled()
	kv, err := peer.EnsureKeyValue(ctx, js, kvCfg)
	require.NoError(t, err)
	require.Equal(t, before, settled(), "an unchanged bucket is opened, not updated")
	kvCfg.TTL = 2 * time.Minute
	_, err = peer.EnsureKeyValue(ctx, js, kvCfg)
	require.NoError(t, err)
	require.Equal(t, before+1, settled(), "a changed TTL is applied")
	st, err := kv.Status(ctx)
	require.NoError(t, err)
	require.Equal(t, 2*time.Minute, st.TTL())

	sCfg := jetstream.StreamConfig{Name: "ENSURE_TEST", Subjects: []string{"ensure.>"}, Retention: jetstream.WorkQueuePolicy,
		MaxMsgSize: 1 << 20, Storage: jetstream.FileStorage, Duplicates: time.Minute}
	_, err = peer.EnsureStream(ctx, js, sCfg)
	require.NoError(t, err)
	before = settled()
	_, err = peer.EnsureStream(ctx, js, sCfg)
	require.NoError(t, err)
	require.Equal(t, before, settled(), "an unchanged stream is opened, not updated")
	sCfg.MaxMsgs = 10
	s, err := peer.EnsureStream(ctx, js, sCfg)
	require.NoError(t, err)
	require.Equal(t, before+1, settled())
	require.EqualValues(t, 10, s.CachedInfo().Config.MaxMsgs)
}
