package routing

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/triage-queue/triage/cmd/triage/natsserver/natstest"
	"github.com/triage-queue/triage/proto/triage/peer"
	peerv1 "github.com/triage-queue/triage/proto/triage/peer/v1"
)

// TestPublishThroughLeaderStepdowns publishes envelopes from four
// goroutines to a replicated enqueue stream on a three-server cluster
// while its leader steps down every 250 ms. A leader that steps down drops
// the publishes it had not stored without answering them; before
// publishMsg sent them again, each such envelope failed after the whole
// publishTimeout (10 s) and was never stored. Every publish must succeed
// within one lost attempt, and the stream must hold each envelope once.
func TestPublishThroughLeaderStepdowns(t *testing.T) {
	t.Parallel()
	_, nc, js := natstest.Cluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	stream := peer.EnqueueStream("us-east")
	_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{peer.EnqueueSubjects("us-east")},
		Replicas: 3, Duplicates: 2 * time.Minute, Storage: jetstream.FileStorage})
	require.NoError(t, err)
	r := &Router{cfg: Config{NC: nc, JS: js}}

	var downs atomic.Int64
	var wg sync.WaitGroup
	end := time.Now().Add(4 * time.Second)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for time.Now().Before(end) {
			time.Sleep(250 * time.Millisecond)
			if _, err := nc.Request("$JS.API.STREAM.LEADER.STEPDOWN."+stream, nil, 2*time.Second); err == nil {
				downs.Add(1)
			}
		}
	}()
	var published, slow atomic.Uint64
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(end) {
				k := published.Add(1)
				start := time.Now()
				err := r.publishEnvelope("us-east", 1, &peerv1.EnqueueEnvelope{Batches: []*peerv1.EnqueueBatch{{BatchId: k, Items: []*peerv1.BufferedItem{{Key: k}}}}}, []string{""})
				d := time.Since(start)
				if !assert.NoError(t, err, "envelope %d after %v", k, d) {
					return
				}
				if d > publishAttempt {
					slow.Add(1)
				}
				if d > publishAttempt+time.Second {
					assert.Failf(t, "slow publish", "envelope %d took %v: more than one lost attempt", k, d)
				}
			}
		}()
	}
	wg.Wait()
	require.Positive(t, downs.Load(), "no stepdown was answered")
	s, err := js.Stream(ctx, stream)
	require.NoError(t, err)
	info, err := s.Info(ctx)
	require.NoError(t, err)
	require.Equal(t, published.Load(), info.State.Msgs, "every envelope stored once")
	t.Logf("%d envelopes through %d stepdowns, %d sent again", published.Load(), downs.Load(), slow.Load())
}
