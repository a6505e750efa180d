// Package routing is Triage's front door: the gRPC Queue and Admin services
// and their JSON gateway.
//
// # Requests
//
// A router validates a request against the current shard-map snapshot and
// the namespace's limits, then resolves where it goes with pure functions
// of that snapshot: namespace + region → shards for Enqueue, Dequeue,
// stats and topic listing; the shard inside an item ID for Ack, Nack,
// ExtendLease, GetItem, UpdateItem and DeleteItem (no lookup). A request
// that names no region uses the router's own.
//
// # Enqueue
//
// Item keys are allocated here (package itemid; the node number is claimed
// in NATS KV by ClaimNode), before anything is stored. Items with a dedup
// key go to the shard of the (topic, key)'s slot in the dedup slot table
// of the request's region (shardmap.Namespace.Slots, one table per
// region), so that one shard's unique index and tombstones see every copy
// enqueued with that region, and the item is stored in the region the
// producer chose, where a dequeue of that region reads it. Dedup is
// therefore exact per (namespace, topic, region): the same key enqueued
// with two region preferences gives two items. Deduplicating across
// regions would need a cross-region lookup on every enqueue, and would
// store an item outside the region its producer asked for. PutNamespace
// keeps the tables and the record of slots a drain moved, so a shard list
// change cannot move a key, and it
// refuses to drop a shard that a region's slots name (that shard may
// still hold the keys' items and tombstones).
// The rest of a request goes to one of the region's shards that is not
// draining, picked by weight. Each (request, shard) group is a batch, split so that each
// batch fits one NATS message (the server's max_payload); an item that
// cannot fit one alone is refused as INVALID_ARGUMENT before anything is
// published, and PutNamespace refuses a max_payload_bytes that could not
// fit. A per-shard
// publisher (publish.go) puts the batches of concurrent requests into one
// JetStream message (an envelope, never over max_payload) on the enqueue
// stream of the shard's home region, which is the request's region (its
// enqueuers drain it), with
// Nats-Msg-Id set to its first batch ID so a retried publish is stored
// once. A publish with no PubAck after 2 s is sent again, within 10 s in
// all: a stream leader that steps down or dies drops the publishes it
// has not stored without answering them (publishMsg). With COMMITTED durability (default) the router then waits on its
// inbox for the enqueuer's EnqueueCommitted, tells the dequeuers about the
// new items, and answers; with BUFFERED it answers once JetStream stored
// the envelope. Quotas (quota.go) are checked before any of this. A full stream is
// RESOURCE_EXHAUSTED; a commit not confirmed in time is DEADLINE_EXCEEDED
// with a message saying the batch is still buffered.
//
// While the process's CPU is saturated and consumers are being served,
// at most EnqueueConcurrency Enqueue calls (32 per core) run at once;
// the others wait their turn before anything is done for them
// (admission.go): on a saturated node every wake-up of a request queues
// for a core, and a flood of producers' requests otherwise starves the
// consumers' Dequeue and Ack calls, so the backlog grows without bound.
// A bulk load with no consumer, or enqueues slow for the WAN, are never
// held back.
//
// # Dequeue
//
// The router forwards a dequeue to the dequeuer that owns the region's
// shards (the triage_claims KV bucket, seen through OwnerView) by way of
// the Dequeuers interface: in-process when the owner is the LocalDequeuer,
// over NATS request/reply otherwise (NATSDequeuers). A peer reply carries
// its error's kind as a code (peer.ReplyCode), so "not the owner" is told
// from "down" without reading its message; either makes the ownership
// view re-read the shards, and the router asks again when the view
// changes (followOwners, up to HandOverWait within the call's long poll):
// a failover hands the shard to a dequeuer of the new primary's region in
// a few hundred milliseconds, and an UNAVAILABLE answer would add the
// client's retry backoff to that. When several dequeuers own parts of the shards
// it asks each for the full counts, merges by (priority, deliver_after,
// id), keeps the most urgent and hands the surplus back unserved
// (dequeuer/handback, retried through a failover).
//
// Acks of one shard that arrive while another of its transactions is
// being committed share the next one, with the serves the node's
// dequeuer has for the shard then (store.Batcher, Config.Writes); each is
// answered once its transaction committed.
//
// # Writes and failover
//
// Every write to a shard goes through shardmap.Pool.Writer (refused while
// the shard is fenced or the map is stale) and is re-checked after it
// committed (afterWrite): a write that landed on a primary deposed
// meanwhile is reported as unknown, never as done. A write whose COMMIT
// was sent and not answered is settled in the store, which does it again
// under row locks on a fresh connection and answers what took effect
// (store.ErrOutcomeUnknown, schema/store/settle.go); Ack, Nack,
// ExtendLease, UpdateItem and DeleteItem answer UNAVAILABLE with
// "outcome unknown" only when that failed too, saying that a retry with
// the same lease token is safe, and "nothing was changed" for a shard
// that could not be reached before anything was sent (writeOutcome).
// Admin.Failover forwards to the controller leader (package regions).
//
// # Growing and shrinking
//
// AddShard (after migrating the new primary's schema), AddNamespaceShard,
// SetShardWeight, DrainShard and RetireShard (shards.go) build the next
// map with package shardmap and publish it with compare-and-set
// (changeMap), re-applying the change, preconditions included, to the
// newer map when another writer won. Enqueues without a dedup key go to
// the namespace's shards that are not draining, by weight; a dedup key
// whose slot moved off a draining shard is first looked up there
// (movedHolder; the design is in shardmap's doc). A router refuses
// enqueues while its map is unconfirmed for over shardmap.MaxStaleness,
// so one that missed a drain stops publishing to the drained shard.
// RetireShard answers FAILED_PRECONDITION, saying what is left, until
// the shard drained for shardmap.DrainSettle, its enqueue-stream subject
// is empty and it holds no items, dead letters, live tombstones or
// refused items.
//
// # Pausing topics
//
// PauseTopic and ResumeTopic set shardmap.TopicConfig.Paused of the
// topic, published like any namespace change (changeMap: a
// compare-and-set, applied again to a newer map on a conflict), and the
// dequeuers read it on every dequeue round. The pause lives in the shard
// map because that is what every process of every region already holds
// and watches, survives restarts and failovers of nodes and shards
// alike, and is changed only by compare-and-set: a flag in a dequeuer's
// memory would be lost with it, one in NATS KV of its own would be a
// second source to watch, and a row on the shards would need every
// dequeue to read the database (and a failover to carry it). The cost is
// the map's size, so a pause of an unconfigured topic takes one of the
// namespace's MaxTopicConfigs configs (FAILED_PRECONDITION when none is
// left) and ResumeTopic removes a config that only held the pause.
// PutNamespace never changes a pause (keepPauses): a replace built from a
// GET that raced a pause, or by a tool that knows nothing of pauses,
// would otherwise resume a topic an operator stopped.
//
// The router filters nothing itself: the dequeuer that holds a long poll
// is the one that must notice the resume, and it re-reads the map every
// round (at most 100 ms apart). The node that published a pause applies
// it at once (its router and dequeuer share its map); other nodes when
// their map watch sees it, within a second.
//
// # Storage
//
// Item reads and changes (GetItem, UpdateItem, DeleteItem, Ack, Nack,
// ExtendLease, dead letters, stats, topic listing) call package
// schema/store on the shard's database chosen here; this package writes
// no SQL. ListDeadLetters, RedriveDeadLetters and DeleteDeadLetters go
// to every shard of the namespace in the region at once (eachShard), or
// with IDs only to the shards the IDs name; a purge deletes in bounded
// transactions (store.DeadLetterDelete), so a huge dead-letter queue
// never makes one giant transaction and a failure midway keeps what was
// deleted. DeleteDeadLetters refuses a request that names neither IDs
// nor all, so an empty list never means everything. ListItems pages
// through a topic's items in one state the same way: each shard reads
// its rows after the page token's (priority, deliver_after, key) in
// the ready index's order, and the merge keeps the first page of them
// all, so paging goes on across shards without gaps or repeats (keys
// are unique cluster-wide). GetThroughput answers from the node's own
// counters (metrics.Throughput), no database. UpdateItem's rules (what a lease forbids, priority history,
// taking back a row an older version prefetched) run in the store's
// transaction as a
// callback, under the row's lock.
//
// # Errors
//
// Packages and the Router's handlers return domain errors; toStatus in
// errors.go is the one place they become gRPC codes, applied by one
// interceptor next to the handlers (statusUnary) and by the gateway's
// error handler, which turns the codes into HTTP statuses.
// Every message says what was wrong and what is allowed, and names no
// server: toStatus replaces the addresses in a message (a driver's
// "dial tcp host:port", MariaDB's "user@host", a primary in our own text)
// with "[address withheld]", and the gRPC server and the gateway log the
// whole text. Messages about the request itself (INVALID_ARGUMENT,
// NOT_FOUND) are left as they are: they quote what the caller sent.
//
// The gateway takes a POST, PUT or PATCH only as application/json (415
// otherwise: browsers send text/plain and form POSTs cross-site without a
// CORS preflight), bounds every body (WithMaxBody), and with
// WithAuthenticate reads no more than MaxUnauthenticatedBody of a body
// before its caller is known.
//
// Metrics (Config.Metrics): items accepted per topic and band, call
// latency per namespace, ack and nack results, redrives, dead letters from
// nacks, and quota refusals by reason (rate, depth, buffer_full; a batch
// over the burst is bad input, not a refusal).
//
// Tracing (Config.Tracer): an Enqueue's publish to the enqueue buffer is
// an "enqueue.publish" span, and its traceparent rides in the JetStream
// message's header beside the batch (one value per batch of an envelope;
// schema/tracing), so the enqueuer's insert joins the request's trace. A
// Dequeue's request to each owning dequeuer is a "dequeue.forward" span,
// whose traceparent rides in the NATS request's header, so the dequeuer's
// "dequeuer.dequeue" joins the Dequeue's trace.
//
// ListFailoverEvents asks the controller leader over NATS for its recent
// failover steps (regions.EventsSubject), as Failover asks it to act. The
// leader's list holds its predecessors' steps too: controllers keep them
// in a replicated stream (regions.HistoryStream) and a new leader loads it.
//
// ReportDrill and ListDrills keep failover drills' progress (what
// `triage-bed drill` reports for the console's Drills page) in the NATS
// KV bucket peer.DrillsBucket (Config.Drills, OpenDrills): one key per
// drill, its value the Drill in protobuf's wire form (JSON would escape a
// text of control characters to six times its size, so a drill's bound
// would not bound its value), 24 h TTL. ReportDrill reads the drill, appends the request's
// events (keeping the last 200) and writes it back on the revision it
// read, reading again on a conflict, so concurrent reporters lose no
// event.
package routing
