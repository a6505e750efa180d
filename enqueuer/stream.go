package enqueuer

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/triage-queue/triage/proto/triage/peer"
)

// StreamConfig sizes a region's enqueue buffer.
type StreamConfig struct {
	// MaxBytes bounds the buffer. Default 1 GiB.
	MaxBytes int64
	// MaxMsgs bounds the number of buffered batches. Default 1,000,000.
	MaxMsgs int64
	// Replicas of the stream. Default 1.
	Replicas int
}

// MaxShardsPerRegion bounds the shards homed in one region: the enqueue
// stream of a region holds one consumer per shard (see EnsureStream).
const MaxShardsPerRegion = 100_000

// EnsureStream creates or updates region's enqueue stream.
func EnsureStream(ctx context.Context, js jetstream.JetStream, region string, cfg StreamConfig) (jetstream.Stream, error) {
	if cfg.MaxBytes == 0 {
		cfg.MaxBytes = 1 << 30
	}
	if cfg.MaxMsgs == 0 {
		cfg.MaxMsgs = 1_000_000
	}
	s, err := peer.EnsureStream(ctx, js, jetstream.StreamConfig{
		Name:        peer.EnqueueStream(region),
		Description: "Triage enqueue buffer of region " + region,
		Subjects:    []string{peer.EnqueueSubjects(region)},
		Retention:   jetstream.WorkQueuePolicy,
		Discard:     jetstream.DiscardNew,
		MaxBytes:    cfg.MaxBytes,
		MaxMsgs:     cfg.MaxMsgs,
		MaxMsgSize:  64 << 20,
		Storage:     jetstream.FileStorage,
		Replicas:    max(cfg.Replicas, 1),
		// Routers set Nats-Msg-Id, so a publish retried after a lost PubAck
		// is stored once.
		Duplicates: 2 * time.Minute,
		// One durable consumer per shard homed in the region (plus the
		// handover's second during a move). nats-server 2.15 caps a
		// stream at 1,000 consumers unless the stream sets its own limit
		// (0 or -1 reads as that default): the 1,001st shard's enqueuer
		// was refused its consumer and its enqueues waited out.
		MaxConsumers: MaxShardsPerRegion,
	})
	if err != nil {
		return nil, fmt.Errorf("enqueue stream %s: %w", peer.EnqueueStream(region), err)
	}
	return s, nil
}
