package shardmap

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

const (
	// Bucket is the NATS KV bucket that stores the map.
	Bucket = "triage_shardmap"
	// Key is the key of the current map in Bucket.
	Key = "current"
)

// OpenBucket creates or opens the shard-map bucket with replicas copies
// (one per region in a multi-region cluster, so losing a region keeps it).
func OpenBucket(ctx context.Context, js jetstream.JetStream, replicas int) (jetstream.KeyValue, error) {
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:   Bucket,
		History:  16,
		Replicas: max(replicas, 1),
		Storage:  jetstream.FileStorage,
	})
	if err != nil {
		return nil, fmt.Errorf("open kv bucket %s: %w", Bucket, err)
	}
	return kv, nil
}

// Bootstrap stores m unless a map is stored already, and returns the stored
// map. Restarting a process with its old config file therefore never rolls
// back a map that failovers have moved on.
func Bootstrap(ctx context.Context, kv jetstream.KeyValue, m *Map) (*Map, error) {
	data, err := m.Marshal()
	if err != nil {
		return nil, err
	}
	if _, err := kv.Create(ctx, Key, data); err == nil {
		return m, nil
	} else if !errors.Is(err, jetstream.ErrKeyExists) {
		return nil, fmt.Errorf("bootstrap shard map: %w", err)
	}
	return Load(ctx, kv)
}

// Load reads the stored map.
func Load(ctx context.Context, kv jetstream.KeyValue) (*Map, error) {
	e, err := kv.Get(ctx, Key)
	if err != nil {
		return nil, fmt.Errorf("load shard map: %w", err)
	}
	return Parse(e.Value())
}

// ErrConflict means the stored map moved on since the one a change was
// based on; reload and retry.
var ErrConflict = errors.New("shard map changed concurrently")

// Publish stores next if the stored map is still at version prev (optimistic
// concurrency: two controllers cannot both publish over the same map).
// next.Version must be greater than prev.
func Publish(ctx context.Context, kv jetstream.KeyValue, prev *Map, next *Map) error {
	if next.Version <= prev.Version {
		return fmt.Errorf("publish shard map: version %d is not above %d", next.Version, prev.Version)
	}
	e, err := kv.Get(ctx, Key)
	if err != nil {
		return fmt.Errorf("publish shard map: %w", err)
	}
	stored, err := Parse(e.Value())
	if err != nil {
		return err
	}
	if stored.Version != prev.Version {
		return fmt.Errorf("%w: stored version %d moved past %d", ErrConflict, stored.Version, prev.Version)
	}
	data, err := next.Marshal()
	if err != nil {
		return err
	}
	if _, err := kv.Update(ctx, Key, data, e.Revision()); err != nil {
		return fmt.Errorf("%w: %v", ErrConflict, err)
	}
	return nil
}

// Watch feeds every newer map stored in kv to h until ctx ends. It
// re-establishes the watch after NATS errors; meanwhile h keeps its last
// good snapshot. Every second it also reads the stored map from the
// bucket's stream leader, and marks h fresh when that works: the watch
// alone cannot tell a quiet store from a lost one, and a follower cut off
// from the leader would answer a direct get from stale state.
func Watch(ctx context.Context, js jetstream.JetStream, kv jetstream.KeyValue, h *Holder, logger *slog.Logger) {
	go confirm(ctx, js, h)
	for ctx.Err() == nil {
		w, err := kv.Watch(ctx, Key)
		if err != nil {
			logger.Warn("shard map watch failed; serving last good map", "err", err)
			sleepCtx(ctx, time.Second)
			continue
		}
		for e := range w.Updates() {
			if e == nil || e.Operation() != jetstream.KeyValuePut {
				continue
			}
			m, err := Parse(e.Value())
			if err != nil {
				logger.Error("ignoring bad shard map from kv", "err", err)
				continue
			}
			if h.Offer(m) {
				logger.Info("shard map updated", "version", m.Version)
			}
		}
		_ = w.Stop()
		sleepCtx(ctx, 200*time.Millisecond)
	}
}

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

func confirm(ctx context.Context, js jetstream.JetStream, h *Holder) {
	t := time.NewTicker(MaxStaleness / 5)
	defer t.Stop()
	var stream jetstream.Stream
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		rctx, cancel := context.WithTimeout(ctx, time.Second)
		var err error
		if stream == nil {
			stream, err = js.Stream(rctx, "KV_"+Bucket)
		}
		var msg *jetstream.RawStreamMsg
		if err == nil {
			msg, err = stream.GetLastMsgForSubject(rctx, "$KV."+Bucket+"."+Key)
		}
		cancel()
		if err != nil {
			continue
		}
		if m, err := Parse(msg.Data); err == nil {
			h.Offer(m)
			if m.Version <= h.Current().Version {
				h.Touch()
			}
		}
	}
}
