package peer

import peerv1 "github.com/triage-queue/triage/proto/triage/peer/v1"

// BatchReady is the ItemsReady notice of an inserted enqueue batch: its
// most urgent priority and its earliest deliver_after, which lets a
// dequeuer's buffer skip a read for items that can only sort after what
// it holds (dequeuer.mayPrecede). b must hold items.
func BatchReady(b *peerv1.EnqueueBatch) *peerv1.ItemsReady {
	r := &peerv1.ItemsReady{Namespace: b.Namespace, Topic: b.Topic, Shard: b.Shard, MinPriority: b.Items[0].Priority,
		MinDeliverAfterUs: b.Items[0].DeliverAfterUs, Count: int32(len(b.Items))}
	for _, it := range b.Items {
		r.MinPriority = min(r.MinPriority, it.Priority)
		r.MinDeliverAfterUs = min(r.MinDeliverAfterUs, it.DeliverAfterUs)
	}
	if r.MinDeliverAfterUs <= 0 {
		r.MinDeliverAfterUs = 0 // unknown, never "before everything"
	}
	return r
}

// MaxHandedBytes bounds the payload and metadata bytes of the rows a
// notice carries (CommittedReady): enough for the few small items a
// steady-state batch holds, small beside NATS's 1 MiB message limit, and
// no burden on a dequeuer's memory. A larger batch is announced without
// its rows, and its dequeuer reads them.
const MaxHandedBytes = 64 << 10

// CommittedReady is BatchReady for a batch whose insert c answers, with
// the rows as stored when c says this insert stored them (c.VersionUs)
// and they fit MaxHandedBytes: every item but those c names duplicates
// of live ones (which stored nothing). A notice carries rows only when
// it carries every row it counts.
func CommittedReady(b *peerv1.EnqueueBatch, c *peerv1.EnqueueCommitted) *peerv1.ItemsReady {
	r := BatchReady(b)
	if c == nil || c.VersionUs == 0 || c.Error != "" {
		return r
	}
	var items []*peerv1.BufferedItem
	size := 0
	for i, it := range b.Items {
		if i < len(c.DuplicateOf) && c.DuplicateOf[i] != 0 {
			continue
		}
		size += len(it.Payload) + len(it.Metadata) + len(it.DedupKey)
		if size > MaxHandedBytes {
			return r
		}
		items = append(items, it)
	}
	if len(items) == 0 {
		return r
	}
	r.Items, r.VersionUs, r.EnqueuedAtUs, r.Count = items, c.VersionUs, b.EnqueuedAtUs, int32(len(items))
	return r
}

// Handed reports whether r carries every row it announces.
func Handed(r *peerv1.ItemsReady) bool {
	return r.VersionUs != 0 && len(r.Items) > 0 && len(r.Items) == int(r.Count)
}

// MergeReady folds o, a notice of the same topic and shard, into r. The
// result carries no rows: a notice's rows share one version and enqueue
// time.
func MergeReady(r, o *peerv1.ItemsReady) {
	r.Items, r.VersionUs, r.EnqueuedAtUs = nil, 0, 0
	r.MinPriority = min(r.MinPriority, o.MinPriority)
	if r.MinDeliverAfterUs == 0 || o.MinDeliverAfterUs == 0 {
		r.MinDeliverAfterUs = 0
	} else {
		r.MinDeliverAfterUs = min(r.MinDeliverAfterUs, o.MinDeliverAfterUs)
	}
	r.Count += o.Count
}
