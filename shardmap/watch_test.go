package shardmap

import (
	"context"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/triage-queue/triage/cmd/triage/natsserver/natstest"
)

// hungFirstWatch is a bucket whose first watch never delivers anything,
// as one whose consumer was placed on a server that is cut off.
type hungFirstWatch struct {
	jetstream.KeyValue
	watches atomic.Int32
	// stop, when set, holds the hung watch's Stop (see hungWatcher).
	stop <-chan struct{}
}

func (k *hungFirstWatch) WatchFiltered(ctx context.Context, keys []string, opts ...jetstream.WatchOpt) (jetstream.KeyWatcher, error) {
	if k.watches.Add(1) == 1 {
		return hungWatcher{stop: k.stop}, nil
	}
	return k.KeyValue.WatchFiltered(ctx, keys, opts...)
}

// slowFirstStart is a bucket whose first watch does not start until its
// context ends, as one whose consumer's creation waits for a server that
// is cut off or electing.
type slowFirstStart struct {
	jetstream.KeyValue
	watches atomic.Int32
}

func (k *slowFirstStart) WatchFiltered(ctx context.Context, keys []string, opts ...jetstream.WatchOpt) (jetstream.KeyWatcher, error) {
	if k.watches.Add(1) == 1 {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return k.KeyValue.WatchFiltered(ctx, keys, opts...)
}

// hungWatcher delivers nothing. Its Stop returns at once, or, with stop
// set, when stop is closed or 10 s have passed, as nats.go's does when the
// consumer's server is cut off (it deletes the consumer with a JetStream
// API request and waits out the client's timeout).
type hungWatcher struct{ stop <-chan struct{} }

func (hungWatcher) Updates() <-chan jetstream.KeyValueEntry { return nil }

func (w hungWatcher) Stop() error {
	if w.stop != nil {
		t := time.NewTimer(10 * time.Second)
		defer t.Stop()
		select {
		case <-w.stop:
		case <-t.C:
		}
	}
	return nil
}

// TestWatchRestartsAWatchThatNeverGoesLive: a watch that delivers no
// initial values is restarted after watchLiveWithin, so the process is
// confirmed by the next one. Only a live watch's probes could count as
// stuck, so nothing restarted it and the process stayed unconfirmed (in a
// partition drill, for seconds, until the NATS client's heartbeat check).
func TestWatchRestartsAWatchThatNeverGoesLive(t *testing.T) {
	kv := &hungFirstWatch{}
	watchConfirms(t, func(bucket jetstream.KeyValue) jetstream.KeyValue { kv.KeyValue = bucket; return kv },
		"the hung watch was never replaced")
	require.GreaterOrEqual(t, kv.watches.Load(), int32(2))
}

// TestWatchRestartIsNotHeldByTheOldWatchsStop: stopping a watch whose
// consumer's server is cut off takes nats.go the client's timeout (5 s).
// Watch waited for it before starting the next watch: in a partition and
// a region-down drill, a surviving region's node got the new map 5.2 s
// after it restarted its watch, 1.6 s after the map was published.
func TestWatchRestartIsNotHeldByTheOldWatchsStop(t *testing.T) {
	stop := make(chan struct{})
	t.Cleanup(func() { close(stop) }) // runs after Watch has ended
	kv := &hungFirstWatch{stop: stop}
	watchConfirms(t, func(bucket jetstream.KeyValue) jetstream.KeyValue { kv.KeyValue = bucket; return kv },
		"the next watch waited for the hung watch's Stop")
}

// TestWatchRestartsAWatchThatDoesNotStart: a watch whose start hangs is
// given up on after watchLiveWithin and started again. Before, Watch
// waited for the start, and no timer ran meanwhile: the process stayed
// unconfirmed for as long as the start took (5.4 s in a compose partition
// drill; here, for ever).
func TestWatchRestartsAWatchThatDoesNotStart(t *testing.T) {
	kv := &slowFirstStart{}
	watchConfirms(t, func(bucket jetstream.KeyValue) jetstream.KeyValue { kv.KeyValue = bucket; return kv },
		"the watch that did not start was never replaced")
	require.Equal(t, int32(2), kv.watches.Load())
}

// watchConfirms runs Watch on a bootstrapped bucket as wrap wraps it, and
// requires the holder to be confirmed within watchLiveWithin + 5 s. Watch
// has ended when the test's cleanups are done.
func watchConfirms(t *testing.T, wrap func(jetstream.KeyValue) jetstream.KeyValue, msg string) {
	t.Helper()
	ctx := t.Context()
	_, js := natstest.JetStream(t)
	bucket, err := OpenBucket(ctx, js, 1)
	require.NoError(t, err)
	m, err := Parse([]byte(twoShards))
	require.NoError(t, err)
	_, err = Bootstrap(ctx, bucket, m)
	require.NoError(t, err)
	h := NewHolder(m)
	wctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		Watch(wctx, js, wrap(bucket), h, slog.New(slog.NewTextHandler(io.Discard, nil)))
	}()
	cctx, ccancel := context.WithTimeout(ctx, watchLiveWithin+5*time.Second)
	defer ccancel()
	require.NoError(t, h.WaitConfirmed(cctx), msg)
}
