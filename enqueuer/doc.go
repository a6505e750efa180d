// Package enqueuer drains a region's JetStream enqueue buffer into MySQL
// shards.
//
// # Buffer
//
// Routers publish EnqueueEnvelope messages — the (request, shard) batches
// of concurrent requests bound for one shard, coalesced — to the region's
// stream (EnsureStream), on subject triage.enq.<region>.<shard>.
// The stream is a work queue: a message is deleted once an enqueuer acks it.
// It has hard limits with DiscardNew, so a full buffer refuses the publish
// (the router answers RESOURCE_EXHAUSTED) instead of dropping anything.
//
// # Workers
//
// One worker per shard homed in the region holds a pull consumer on the
// shard's subject, with four insert loops in flight. A loop takes the first
// waiting message, then everything else already buffered (up to a size
// cap), and writes them all with one multi-row INSERT in one transaction:
// group commit, so one fsync covers many requests. When a region has no
// enqueuer left, the others drain its stream too (Presence). After COMMIT it acks the messages, answers each waiting
// router on the batch's reply subject, and tells dequeuers which topics got
// new items (ItemsReady).
//
// # Idempotency
//
// JetStream redelivers a message whose ack was lost. The insert is
// idempotent twice over: ON DUPLICATE KEY on the router-allocated item ID,
// and the enqueue_batches table, which records every applied batch in the
// same transaction, so a batch whose items were inserted, consumed and
// deleted is not inserted again. A dedup key that matches a live item makes
// the new item a duplicate of that one; the router returns its ID.
//
// # Failures
//
// When a shard's inserts fail, or the shard is not writable (fenced for a
// failover, or the shard map is stale), the worker naks the messages with a
// delay and backs off up to a second (a per-shard circuit breaker): the items wait in the buffer and
// drain once the shard, or its new primary after a failover, accepts writes.
package enqueuer
