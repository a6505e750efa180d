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

// TestKeptBucketIsMadeAgain: a write through KeepKeyValue's handle to a
// bucket whose stream is gone (a memory bucket after a NATS restart) makes
// the bucket again and lands; a plain handle's write fails.
func TestKeptBucketIsMadeAgain(t *testing.T) {
	t.Parallel()
	_, js := natstest.JetStream(t)
	ctx := t.Context()
	cfg := jetstream.KeyValueConfig{Bucket: "kept_test", TTL: time.Minute, Storage: jetstream.MemoryStorage}
	kept, err := peer.KeepKeyValue(ctx, js, cfg)
	require.NoError(t, err)
	plain, err := js.KeyValue(ctx, cfg.Bucket)
	require.NoError(t, err)
	for name, write := range map[string]func() error{
		"put":    func() error { _, err := kept.Put(ctx, "k", []byte("v")); return err },
		"create": func() error { _, err := kept.Create(ctx, "c", []byte("v")); return err },
		"update": func() error { _, err := kept.Update(ctx, "k", []byte("v2"), 1); return err },
		"delete": func() error { return kept.Delete(ctx, "k") },
	} {
		require.NoError(t, js.DeleteKeyValue(ctx, cfg.Bucket))
		_, err := plain.Put(ctx, "p", []byte("v"))
		require.True(t, peer.BucketGone(err), "a plain write to the lost bucket: %v", err)
		time.Sleep(time.Second) // remake is paced at one a second
		err = write()
		if name == "update" {
			// The bucket made again holds no key k at revision 1: the
			// compare-and-set reached it and failed as it should.
			require.ErrorIs(t, err, jetstream.ErrKeyExists, name)
		} else {
			require.NoError(t, err, name)
		}
		st, err := kept.Status(ctx)
		require.NoError(t, err)
		require.Equal(t, cfg.TTL, st.TTL(), "made again with its settings")
	}
}
