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

// MergeReady folds o, a notice of the same topic and shard, into r.
func MergeReady(r, o *peerv1.ItemsReady) {
	r.MinPriority = min(r.MinPriority, o.MinPriority)
	if r.MinDeliverAfterUs == 0 || o.MinDeliverAfterUs == 0 {
		r.MinDeliverAfterUs = 0
	} else {
		r.MinDeliverAfterUs = min(r.MinDeliverAfterUs, o.MinDeliverAfterUs)
	}
	r.Count += o.Count
}
