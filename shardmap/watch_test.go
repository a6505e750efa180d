package shardmap

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
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
// requires the holder to be confirmed within watchLiveWithin + 5 s.
func watchConfirms(t *testing.T, wrap func(jetstream.KeyValue) jetstream.KeyValue, msg string) {
	t.Helper()
	_, _, h := watching(t, 0, wrap)
	cctx, ccancel := context.WithTimeout(t.Context(), watchLiveWithin+5*time.Second)
	defer ccancel()
	require.NoError(t, h.WaitConfirmed(cctx), msg)
}

// watching bootstraps a bucket with twoShards and namespaces more
// namespaces (ns000, ns001, ...) and runs Watch on it, as wrap wraps it,
// into a holder of the bootstrapped map; it returns the bucket, that map
// and the holder. Watch has ended when the test's cleanups are done.
func watching(t *testing.T, namespaces int, wrap func(jetstream.KeyValue) jetstream.KeyValue) (jetstream.KeyValue, *Map, *Holder) {
	t.Helper()
	ctx := t.Context()
	_, js := natstest.JetStream(t)
	bucket, err := OpenBucket(ctx, js, 1)
	require.NoError(t, err)
	m, err := Parse([]byte(twoShards))
	require.NoError(t, err)
	for i := range namespaces {
		m, err = m.WithNamespace(Namespace{Name: fmt.Sprintf("ns%03d", i)})
		require.NoError(t, err)
	}
	m, err = Bootstrap(ctx, bucket, m)
	require.NoError(t, err)
	h := NewHolder(m)
	wctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		Watch(wctx, js, wrap(bucket), h, slog.New(slog.NewTextHandler(io.Discard, nil)))
	}()
	return bucket, m, h
}

// probeLosingWatches is a bucket whose first lossy watches lose every
// probe once live, as a watch whose deliveries lag under load does, so
// Watch restarts them; it counts what each watch delivers before it goes
// live.
type probeLosingWatches struct {
	jetstream.KeyValue
	lossy   int32
	hang    int32 // the watch of this number delivers nothing (hungWatcher)
	watches atomic.Int32
	mu      sync.Mutex
	initial []int // per watch, entries delivered before the live marker
}

func (k *probeLosingWatches) WatchFiltered(ctx context.Context, keys []string, opts ...jetstream.WatchOpt) (jetstream.KeyWatcher, error) {
	n := k.watches.Add(1)
	k.mu.Lock()
	k.initial = append(k.initial, 0)
	k.mu.Unlock()
	if n == k.hang {
		return hungWatcher{}, nil
	}
	w, err := k.KeyValue.WatchFiltered(ctx, keys, opts...)
	if err != nil {
		return nil, err
	}
	out := make(chan jetstream.KeyValueEntry)
	go func() {
		defer close(out)
		live := false
		for e := range w.Updates() {
			switch {
			case e == nil:
				live = true
			case !live:
				k.mu.Lock()
				k.initial[n-1]++
				k.mu.Unlock()
			case n <= k.lossy && e.Key() == ConfirmKey:
				continue
			}
			select {
			case out <- e:
			case <-ctx.Done():
				return
			}
		}
	}()
	return relayWatcher{KeyWatcher: w, out: out}, nil
}

func (k *probeLosingWatches) initialCounts() []int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return slices.Clone(k.initial)
}

type relayWatcher struct {
	jetstream.KeyWatcher
	out chan jetstream.KeyValueEntry
}

func (w relayWatcher) Updates() <-chan jetstream.KeyValueEntry { return w.out }

// TestSlowWatchResumesWhereItStopped: a watch restarted because its
// probes did not come back goes on after the last message the one before
// delivered, rather than delivering every namespace's value again (4.7 MB
// at 10,000 namespaces: under load the fresh watch was slow again, and
// each restart left the process unconfirmed and refusing writes for
// seconds). A resumed watch that does not go live is resumed again; one
// that goes live but loses the probes too gives way to a fresh one. Either
// way the maps published meanwhile all arrive.
func TestSlowWatchResumesWhereItStopped(t *testing.T) {
	for _, c := range []struct{ lossy, hang int32 }{{1, 0}, {2, 0}, {1, 2}} {
		lossy := c.lossy
		t.Run(fmt.Sprintf("lossy=%d,hang=%d", c.lossy, c.hang), func(t *testing.T) {
			ctx := t.Context()
			const namespaces = 200
			kv := &probeLosingWatches{lossy: lossy, hang: c.hang}
			bucket, m, h := watching(t, namespaces, func(b jetstream.KeyValue) jetstream.KeyValue { kv.KeyValue = b; return kv })
			// A change while the lossy watches run, one after.
			next, err := m.WithNamespace(Namespace{Name: "ns007", MaxPayloadBytes: 4096})
			require.NoError(t, err)
			require.NoError(t, Publish(ctx, bucket, m, next))
			require.Eventually(t, func() bool { return kv.watches.Load() > max(lossy, c.hang) }, 20*time.Second, 10*time.Millisecond)
			cctx, ccancel := context.WithTimeout(ctx, 10*time.Second)
			defer ccancel()
			require.NoError(t, h.WaitConfirmed(cctx))
			last, err := LoadCurrent(ctx, bucket, nil)
			require.NoError(t, err)
			after, err := last.WithNamespace(Namespace{Name: "ns150", MaxPayloadBytes: 2048})
			require.NoError(t, err)
			require.NoError(t, Publish(ctx, bucket, last, after))
			require.Eventually(t, func() bool {
				ns7, err7 := h.Current().Namespace("ns007")
				ns150, err150 := h.Current().Namespace("ns150")
				return err7 == nil && err150 == nil && ns7.MaxPayloadBytes == 4096 && ns150.MaxPayloadBytes == 2048
			}, 10*time.Second, 10*time.Millisecond, "both changes arrived")

			counts := kv.initialCounts()
			require.GreaterOrEqual(t, counts[0], namespaces, "the first watch delivers every namespace")
			require.Less(t, counts[1], namespaces/4, "the second resumes after the first: %v", counts)
			switch {
			case lossy == 2:
				require.GreaterOrEqual(t, counts[2], namespaces, "a resumed watch that lost the probes too gives way to a fresh one: %v", counts)
			case c.hang == 2:
				require.Less(t, counts[2], namespaces/4, "a resumed watch that did not go live is resumed again: %v", counts)
			}
		})
	}
}
