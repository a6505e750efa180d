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
	})
	if err != nil {
		return nil, fmt.Errorf("enqueue stream %s: %w", peer.EnqueueStream(region), err)
	}
	return s, nil
}
