package peer

import (
	"context"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Every process opens the buckets and the enqueue stream when it starts,
// while the processes already running create consumers on them (watches,
// the enqueue workers' pull consumers). nats-server v2.15.2 races there: a
// stream update (what CreateOrUpdate sends when the stream exists, also
// with an unchanged config) writes the file store's config while a
// consumer create reads it (fileStore.UpdateConfig against
// fileStore.ConsumerStore; a CI run's race detector caught it when the
// kill test started a replacement enqueuer). So an existing stream whose
// settings are already the ones asked for is opened as it is, and updated
// only when a setting differs, which happens when an operator changes one.

// EnsureKeyValue opens the bucket cfg.Bucket, creating it when missing
// and updating it only when its TTL, history, replicas or storage differ
// from cfg's (History 0 asks for 1, as CreateOrUpdateKeyValue reads it).
func EnsureKeyValue(ctx context.Context, js jetstream.JetStream, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	if kv, err := js.KeyValue(ctx, cfg.Bucket); err == nil {
		if st, err := kv.Status(ctx); err == nil {
			have := st.Config()
			if have.TTL == cfg.TTL && have.History == max(cfg.History, 1) && have.Replicas == max(cfg.Replicas, 1) && have.Storage == cfg.Storage {
				return kv, nil
			}
		}
	}
	return js.CreateOrUpdateKeyValue(ctx, cfg)
}

// EnsureStream opens the stream cfg.Name, creating it when missing and
// updating it only when a setting cfg names differs.
func EnsureStream(ctx context.Context, js jetstream.JetStream, cfg jetstream.StreamConfig) (jetstream.Stream, error) {
	if s, err := js.Stream(ctx, cfg.Name); err == nil && sameStream(s.CachedInfo().Config, cfg) {
		return s, nil
	}
	return js.CreateOrUpdateStream(ctx, cfg)
}

// sameStream compares the settings Triage's streams set, a zero in want
// read as the server's default (no limit; a two-minute duplicate window;
// for MaxConsumers, whatever the server chose).
func sameStream(have, want jetstream.StreamConfig) bool {
	orNone := func(v int64) int64 {
		if v == 0 {
			return -1
		}
		return v
	}
	dups := want.Duplicates
	if dups == 0 {
		dups = 2 * time.Minute
	}
	return have.Description == want.Description && sameStrings(have.Subjects, want.Subjects) &&
		have.Retention == want.Retention && have.Discard == want.Discard &&
		have.MaxBytes == orNone(want.MaxBytes) && have.MaxMsgs == orNone(want.MaxMsgs) &&
		int64(have.MaxMsgSize) == orNone(int64(want.MaxMsgSize)) &&
		have.Storage == want.Storage && have.Replicas == max(want.Replicas, 1) && have.Duplicates == dups &&
		(want.MaxConsumers == 0 || have.MaxConsumers == want.MaxConsumers)
}

func sameStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
