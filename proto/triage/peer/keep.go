package peer

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// KeepKeyValue opens the bucket cfg.Bucket as EnsureKeyValue does and
// returns a handle whose writes (Put, Create, Update, Delete) make the
// bucket again when they find its stream gone, then write once more. A
// memory-backed bucket (sessions, claims, health) does not survive a
// restart of its NATS server, or of every server of its cluster, and
// nothing else makes it again: a dequeuer that could not refresh its
// session stopped serving every shard until it was restarted itself.
func KeepKeyValue(ctx context.Context, js jetstream.JetStream, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	kv, err := EnsureKeyValue(ctx, js, cfg)
	if err != nil {
		return nil, err
	}
	return &keptKV{KeyValue: kv, js: js, cfg: cfg}, nil
}

// keptKV is KeepKeyValue's handle. A handle names its stream, so once the
// stream is made again the same handle reads and writes it.
type keptKV struct {
	jetstream.KeyValue
	js  jetstream.JetStream
	cfg jetstream.KeyValueConfig

	mu   sync.Mutex
	made time.Time // when remake last ran
}

// remakeEvery paces remake: a write that fails every time (a cluster
// whose stream has no leader for a while answers as a missing stream
// does) costs one stream lookup a second, not one per write.
const remakeEvery = time.Second

// BucketGone tells an error of a KV call whose bucket's stream is
// missing: no stream answered a write, or the server says so.
func BucketGone(err error) bool {
	return errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, jetstream.ErrStreamNotFound) ||
		errors.Is(err, jetstream.ErrBucketNotFound)
}

// remake makes the bucket again after err, when err says it is gone; it
// reports whether the write is worth trying again.
func (k *keptKV) remake(ctx context.Context, err error) bool {
	if !BucketGone(err) {
		return false
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if time.Since(k.made) < remakeEvery {
		return false
	}
	k.made = time.Now()
	_, err = EnsureKeyValue(ctx, k.js, k.cfg)
	return err == nil
}

func (k *keptKV) Put(ctx context.Context, key string, value []byte) (uint64, error) {
	rev, err := k.KeyValue.Put(ctx, key, value)
	if err != nil && k.remake(ctx, err) {
		rev, err = k.KeyValue.Put(ctx, key, value)
	}
	return rev, err
}

func (k *keptKV) Create(ctx context.Context, key string, value []byte, opts ...jetstream.KVCreateOpt) (uint64, error) {
	rev, err := k.KeyValue.Create(ctx, key, value, opts...)
	if err != nil && k.remake(ctx, err) {
		rev, err = k.KeyValue.Create(ctx, key, value, opts...)
	}
	return rev, err
}

func (k *keptKV) Update(ctx context.Context, key string, value []byte, last uint64) (uint64, error) {
	rev, err := k.KeyValue.Update(ctx, key, value, last)
	if err != nil && k.remake(ctx, err) {
		rev, err = k.KeyValue.Update(ctx, key, value, last)
	}
	return rev, err
}

func (k *keptKV) Delete(ctx context.Context, key string, opts ...jetstream.KVDeleteOpt) error {
	err := k.KeyValue.Delete(ctx, key, opts...)
	if err != nil && k.remake(ctx, err) {
		err = k.KeyValue.Delete(ctx, key, opts...)
	}
	return err
}
