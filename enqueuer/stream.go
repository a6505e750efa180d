package enqueuer

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
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

// StreamName returns the enqueue stream of region.
func StreamName(region string) string {
	return "TRIAGE_ENQ_" + strings.ToUpper(strings.NewReplacer(".", "_", "-", "_").Replace(region))
}

// Subject returns the subject of shard's batches in region.
func Subject(region string, shard uint32) string {
	return fmt.Sprintf("triage.enq.%s.%d", region, shard)
}

// ReadySubject is where enqueuers announce new items of a namespace. The
// namespace is one subject token: a name may contain '.', which would split
// it into several and miss the dequeuers' "triage.ready.*" subscription,
// so '.' is written as '~', which names cannot contain (shardmap.ValidName).
func ReadySubject(namespace string) string {
	return "triage.ready." + strings.ReplaceAll(namespace, ".", "~")
}

// EnsureStream creates or updates region's enqueue stream.
func EnsureStream(ctx context.Context, js jetstream.JetStream, region string, cfg StreamConfig) (jetstream.Stream, error) {
	if cfg.MaxBytes == 0 {
		cfg.MaxBytes = 1 << 30
	}
	if cfg.MaxMsgs == 0 {
		cfg.MaxMsgs = 1_000_000
	}
	s, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:        StreamName(region),
		Description: "Triage enqueue buffer of region " + region,
		Subjects:    []string{"triage.enq." + region + ".*"},
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
		return nil, fmt.Errorf("enqueue stream %s: %w", StreamName(region), err)
	}
	return s, nil
}
