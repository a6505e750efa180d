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
// One worker per shard whose primary runs in the region holds a pull consumer on the
// shard's subject, with four insert loops in flight. A loop takes the first
// waiting message, then everything else already buffered (up to a size
// cap), and writes them all with one multi-row INSERT in one transaction:
// group commit, so one fsync covers many requests. When a region has no
// enqueuer left, the others drain its stream too (Presence). After COMMIT it acks the messages, answers each waiting
// router on the batch's reply subject, and tells dequeuers which topics got
// new items (ItemsReady).
//
// A worker follows its shard's primary: after a failover moved the primary
// to another region, that region's enqueuers start a worker for the shard
// on the home region's stream (same durable consumer), and the old worker
// goes on for 10 s (handOver) before it stops. It holds the batches it
// pulled while the shard was fenced and inserts them into the new primary
// the moment the map names it; stopped at once, it nacked them, and they
// waited for the new worker to make its consumer across the WAN (the
// compose bed's primary-kill drill: enqueues resumed 1.5-1.9 s after the
// publication).
//
// A draining shard (shardmap.Shard.Draining) keeps its worker: routers
// publish nothing new to it, and what its buffer still holds is inserted
// as usual; a retired shard leaves the map only with its subject empty,
// and its worker stops with the next reconcile.
//
// # Fast copies
//
// With replicated streams (a node sets Config.FastCopies when streams
// have more than one replica), routers also send each envelope the stream
// acknowledged to the shard's worker over core NATS
// (triage.enqnow.<region>.<shard>, a queue group), and the worker inserts
// it at once: a replicated consumer delivers only after its delivered
// state has a Raft quorum, a WAN round trip on every COMMITTED enqueue
// (nats-server 2.11, PR #6792). The stream stays the record: the copy is
// a hint, dropped when the worker's channel is full or its batches are in
// flight, and the stream's copy is acked without a statement when a fast
// copy inserted its batches, waits (a nak of 500 ms) while one inserts
// them, and is inserted as always otherwise. When both race to the
// database anyway, enqueue_batches makes the second an answer from the
// record. See fast.go.
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
// enqueue_batches keeps each batch's outcome (which items were duplicates
// of which, which were refused) and a hash of its content. A redelivered
// batch is answered with the stored outcome, so a router whose first
// answer was lost still returns the IDs that exist. A batch whose ID is
// taken by a different content (two routers minting with one node number)
// is never reported as applied: a waiting router gets an error, and a
// BUFFERED one is kept in refused_items. Each worker prunes its shard's
// enqueue_batches rows older than Config.BatchRetention (a day by
// default: longer than any redelivery short of a day-long outage),
// a thousand rows per statement through the applied index.
//
// # Refused items
//
// Routers refuse before the acknowledgement whatever the tables cannot
// hold (sizes measured as stored). Should the database still refuse a
// batch for its data, the worker places each batch alone, row by row in
// one transaction (store.ItemInsertBatch with Isolate): the rows the shard takes are inserted,
// and each refused item moves to dead_letters with the database's reason
// as last_error and 0 attempts, where ListDeadLetters shows it and redrive
// can bring it back. dead_letters' metadata column is MEDIUMBLOB, so it
// takes the metadata the items table's BLOB refused. An item that
// dead_letters refuses too (a name longer than its column, which only a
// foreign publisher can send) is kept as its encoded batch in
// refused_items with both reasons: no acknowledged item is ever dropped.
// A router waiting on a COMMITTED batch is told which items were refused.
//
// # Statements
//
// The insert transaction, dedup settlement, enqueue_batches records and
// their pruning are package schema/store's (ItemInsertBatch,
// EnqueueBatchPrune), with every other statement on the queue tables, so
// that the dedup tombstones it reads and the acks that write them follow
// one set of lock rules. This package decides what to insert when, and
// what to tell routers and dequeuers afterwards.
//
// # Failures
//
// When a shard's inserts fail, or the shard is not writable (fenced for a
// failover, or the shard map is stale), the worker holds the batches it
// pulled (their ack wait reset, nothing nacked) and tries again after a
// backoff of 50 ms doubling up to 250 ms, or at once when a new shard map
// arrives: a failover's publication sends them to the new primary without
// waiting out a delay. The other batches wait in the buffer.
//
// A worker's pull requests expire every 5 s (not the client library's
// 30 s), so a pull lost with its consumer leader's server is noticed by
// the library's missed heartbeats within seconds; after the errors the
// library does not recover from by itself (the consumer deleted, its
// leader's server shut down, no leader to take the pull), the worker
// makes its consumer again, waits for it to have a leader, and pulls
// anew. The insert loops go on meanwhile. A starting worker whose first
// pull cannot be made yet (JetStream electing its leaders at a cluster's
// start, a stream not made yet) says so at Info for its first 10 s
// (pullQuiet); a pull lost after it ran, or failing for longer, is a
// warning. A pull that ends, lost or
// stopped, is drained rather than stopped: the batches the client library
// received but had not passed on yet go to the insert loops (or, when
// the worker stops, back to the stream at once), where a stop dropped
// them and JetStream redelivered them only after the ack wait, 30 s.
//
// Metrics (Config.Metrics): items inserted and insert time per shard, and
// every 2 s per shard the envelopes pending or unacknowledged on its
// consumer and the age of the oldest unacknowledged one (a direct get of
// the first message of the shard's subject after the ack floor).
//
// Tracing (Config.Tracer): each insert transaction is an
// "enqueuer.insert" span in the traces of the Enqueue requests whose
// batches it stores, read from the messages' traceparent headers (one
// value per batch; schema/tracing.StartLinked).
package enqueuer
