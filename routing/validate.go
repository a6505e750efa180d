package routing

import (
	"strconv"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
	"github.com/triage-queue/triage/schema/store"
	"github.com/triage-queue/triage/shardmap"
)

// Request limits. README's limits table lists them; keep the two in step.
const (
	MaxItemsPerEnqueue  = 1000
	MaxTopicsPerDequeue = 64
	MaxDequeueCount     = 1000
	MaxWait             = 20 * time.Second
	MaxRefsPerCall      = 1000
	MaxDedupKeyBytes    = 255
	MaxMetadataKeys     = 64
	MaxMetadataBytes    = store.MaxMetadataBytes
	MaxTTL              = 366 * 24 * time.Hour
	MaxDeliverDelay     = 366 * 24 * time.Hour
	MaxNackDelay        = 366 * 24 * time.Hour
	MaxErrorBytes       = 4 << 10
)

func checkName(what, s string) error {
	if !shardmap.ValidName(s) {
		return invalid("%s %q: use 1-128 letters, digits, '_', '.' or '-', starting with a letter or digit", what, s)
	}
	return nil
}

func checkLease(what string, d *durationpb.Duration, allowZero bool) error {
	if d == nil {
		return nil
	}
	if err := d.CheckValid(); err != nil {
		return invalid("%s: %v", what, err)
	}
	v := d.AsDuration()
	if v == 0 && allowZero {
		return nil
	}
	if v < shardmap.MinLeaseDuration || v > shardmap.MaxLeaseDuration {
		return invalid("%s %s is out of range: allowed %s to %s", what, v, shardmap.MinLeaseDuration, shardmap.MaxLeaseDuration)
	}
	return nil
}

// checkMetadata measures metadata as stored: the JSON object
// MarshalMetadata writes, quotes, separators and escapes included, so what
// passes here always fits the column.
func checkMetadata(m map[string]string) error {
	if len(m) > MaxMetadataKeys {
		return invalid("metadata has %d keys; at most %d allowed", len(m), MaxMetadataKeys)
	}
	for k := range m {
		if k == "" {
			return invalid("metadata keys must not be empty")
		}
	}
	if len(m) == 0 {
		return nil
	}
	stored, err := MarshalMetadata(m)
	if err != nil {
		return invalid("metadata: %v", err)
	}
	if len(stored) > MaxMetadataBytes {
		return invalid("metadata is %d bytes stored as a JSON object (quotes and escapes count); at most %d allowed", len(stored), MaxMetadataBytes)
	}
	return nil
}

func checkTimestamp(what string, ts *timestamppb.Timestamp, now time.Time, maxAhead time.Duration) error {
	if ts == nil {
		return nil
	}
	if err := ts.CheckValid(); err != nil {
		return invalid("%s: %v", what, err)
	}
	if ts.AsTime().After(now.Add(maxAhead)) {
		return invalid("%s is more than %s in the future", what, maxAhead)
	}
	return nil
}

// validateEnqueue checks a request against the namespace's limits.
func validateEnqueue(req *triagev1.EnqueueRequest, ns *shardmap.Namespace, now time.Time) error {
	if err := checkName("topic", req.Topic); err != nil {
		return err
	}
	if len(req.Items) == 0 {
		return invalid("items is empty: send 1 to %d items", MaxItemsPerEnqueue)
	}
	if len(req.Items) > MaxItemsPerEnqueue {
		return invalid("%d items in one request; at most %d allowed", len(req.Items), MaxItemsPerEnqueue)
	}
	switch req.Durability {
	case triagev1.Durability_DURABILITY_UNSPECIFIED, triagev1.Durability_COMMITTED, triagev1.Durability_BUFFERED:
	default:
		return invalid("durability %d: allowed COMMITTED or BUFFERED", req.Durability)
	}
	for i, it := range req.Items {
		if len(it.Payload) > ns.MaxPayloadBytes {
			return invalid("items[%d]: payload is %d bytes; namespace %q allows at most %d", i, len(it.Payload), ns.Name, ns.MaxPayloadBytes)
		}
		if err := checkTimestamp("items["+strconv.Itoa(i)+"].deliver_after", it.DeliverAfter, now, MaxDeliverDelay); err != nil {
			return err
		}
		if err := checkLease("items["+strconv.Itoa(i)+"].lease_duration", it.LeaseDuration, true); err != nil {
			return err
		}
		if it.Ttl != nil {
			if err := it.Ttl.CheckValid(); err != nil || it.Ttl.AsDuration() < 0 || it.Ttl.AsDuration() > MaxTTL {
				return invalid("items[%d].ttl must be between 0 (none) and %s", i, MaxTTL)
			}
		}
		if len(it.DedupKey) > MaxDedupKeyBytes || !utf8.ValidString(it.DedupKey) {
			return invalid("items[%d].dedup_key must be valid UTF-8 of at most %d bytes", i, MaxDedupKeyBytes)
		}
		if err := checkMetadata(it.Metadata); err != nil {
			return err
		}
	}
	return nil
}

func validateDequeue(req *triagev1.DequeueRequest) error {
	if len(req.Topics) == 0 {
		return invalid("topics is empty: ask for 1 to %d (topic, count) pairs", MaxTopicsPerDequeue)
	}
	if len(req.Topics) > MaxTopicsPerDequeue {
		return invalid("%d topics in one dequeue; at most %d allowed", len(req.Topics), MaxTopicsPerDequeue)
	}
	seen := map[string]bool{}
	for _, tc := range req.Topics {
		if err := checkName("topic", tc.Topic); err != nil {
			return err
		}
		if seen[tc.Topic] {
			return invalid("topic %q listed twice", tc.Topic)
		}
		seen[tc.Topic] = true
		if tc.Count < 1 || tc.Count > MaxDequeueCount {
			return invalid("count %d for topic %q: allowed 1 to %d", tc.Count, tc.Topic, MaxDequeueCount)
		}
	}
	if err := checkLease("lease_duration", req.LeaseDuration, true); err != nil {
		return err
	}
	if req.Wait != nil {
		if err := req.Wait.CheckValid(); err != nil || req.Wait.AsDuration() < 0 || req.Wait.AsDuration() > MaxWait {
			return invalid("wait must be between 0s and %s", MaxWait)
		}
	}
	return nil
}
