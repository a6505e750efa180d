// Package dequeuer leases ready items to consumers.
//
// # Ownership
//
// Each shard's ready set has one owner at a time: the dequeuer holding the
// key "shard.<id>" in the NATS KV bucket triage_claims. A claim does not
// expire; it stands while its holder's session does, the key
// "session.<dequeuer>" in triage_owners, refreshed every OwnerTTL/4 and
// expiring after OwnerTTL when its holder dies, after which another
// dequeuer takes the claim by a compare-and-set on its revision. So a
// dequeuer writes one key a round however many shards it owns; a session
// made anew after it expired confirms every claim before serving. Only the
// owner reads the ready head, so it can read it without row locks and
// serve with one conditional UPDATE, where SELECT ... FOR UPDATE SKIP
// LOCKED would lock every row it passes. Correctness never rests on
// ownership: every serve is a compare-and-set on each row's updated_at
// (store.ItemServe, see Leases), so two owners overlapping during a
// takeover cannot deliver one row twice. A dequeuer that cannot refresh
// its session for 3/4 of the TTL stops serving its shards.
//
// A region's dequeuers split its shards (balance): each holds at most
// ceil(shards/dequeuers), its rank among the live sessions naming a
// contiguous block it claims first, so a namespace's consecutive shards
// mostly share an owner and its dequeues ask one dequeuer. A dequeuer over
// its quota releases the shards outside its block, the last first; one
// under it claims what is unowned. A start or a resignation (a session
// key that appears or is deleted) wakes every dequeuer's claim round, so
// shards move within a claim retry; a dequeuer that dies leaves its shards
// to the others once its session expires.
//
// A shard is owned in the region of its primary (Shard.PrimaryRegion, the
// home region until a failover moves it): each read is a round trip to
// the primary, and each serve one plus a semi-sync acknowledgement,
// so an owner across the WAN from its primary serves a fraction of the
// rate. Claims run on every shard-map change as well as every OwnerTTL/4
// (the loop takes the change channel before a round reads the map, so a
// map landing during a round wakes the next at once);
// after a failover the old owner hands the shard over (dropping its
// buffered rows) and the new region's dequeuer claims it within a claim
// retry (claimRetry). A request checks ownership on every round and every
// fetch, so a long poll parked at the old owner ends with ErrNotOwner at
// the hand-over (the router asks the new owner) instead of reading rows
// into a buffer nobody serves. An
// old owner that does not hand over within handOverGrace (1 s) — cut off
// from NATS by a partition, so it sees neither the map nor can refresh
// its session — has the claim taken over by a compare-and-set, rather
// than waited out for its session's TTL; dequeuer IDs start with their region, so a
// claim of the new primary's own region is never taken. A region
// with no dequeuer left has its shards adopted by another once their
// holders' sessions expire, and handed back when it returns.
//
// # Leases
//
// deliver_after is the item's visibility time. Buffering a row writes
// nothing: the owner reads the ready head with a plain SELECT (only it
// reads there) and keeps the rows in memory with the version each was
// read at, its updated_at, which every UPDATE of items moves forward
// (never back, whatever the writer's clock: store's bumpUpdatedAt). The
// row stays ready, in place, until it reaches a consumer:
//
//   - Serving stamps, in one UPDATE per shard, each row's own random token
//     (the receipt handle: one consumer's token never matches another's
//     item), leased_until and deliver_after = now + the request's lease (or
//     the item's own), and attempts+1, only where the row's updated_at is
//     still the version read (store.ItemServe): a compare-and-set. A row
//     deleted, updated, acked, nacked, served by another owner or band, or
//     expired since the read is left alone and never delivered stale; its
//     queue reads again before serving past it (Service.spend), since the
//     row may be ready at a new place in the order.
//   - A lapsed delivery lease makes the row ready again with no sweep,
//     because deliver_after moved with the lease.
//
// Nothing a dequeuer buffers is hidden from anyone: a buffer read costs
// no UPDATE and no commit, and a dequeuer that dies or hands a shard over
// leaves every row ready for the next owner at once. Two owners
// overlapping during a takeover, or two overlapping bands' buffers, may
// both hold a row; the compare-and-set lets only one serve find it
// unchanged.
//
// A read leaves out the rows its queue holds or has in flight (taken, not
// yet served), so a bounded recheck returns only rows the queue lacks;
// and a row served since a read's snapshot was taken is not buffered again
// at the version it was served at (shardQueue.served).
//
// A buffered copy can go stale without the dequeuer hearing of it: an ack
// or nack of a lapsed delivery lease (its token is still the row's, so it
// succeeds), a TTL that passes, another owner's serve during a takeover.
// The copy costs one failed serve and is dropped; the take is repeated to
// fill the answer (maxTakeRounds bounds only churn), so a buffer with
// stale copies at its head never answers short while ready rows wait
// behind them (the model-based test checks for short answers).
//
// attempts therefore counts deliveries. A delivery that never reaches its
// consumer (a reply that could not be sent, a multi-owner surplus the
// router does not keep, a serve whose answer was lost) is undone by
// store.ItemUnserve: token cleared, attempts-1, deliver_after restored to
// its value before the lease, so the item keeps its place in the order.
// Package handback runs it and, while the shard cannot be written (a
// failover), retries it by token until it lands. Rows an older version left under a
// prefetch lease (lease_token set, leased_until NULL) are ready once it
// lapses; at-most-once topics delete only rows whose delivery lease (with
// leased_until) lapsed.
//
// Ack deletes; nack clears the token and sets deliver_after to now + delay;
// extend moves the expiry. Nack and extend check the item's delivery token
// under a row lock in one transaction per batch; an ack is one such
// transaction sent in one round trip (a locking read, then a DELETE of the
// (id, token) pairs), and the acks of concurrent callers on a shard share
// it (store.Batcher, store.Store.ItemAckDelete). Items that leave items by ack,
// delete, dead-lettering, TTL expiry or at-most-once expiry keep their
// dedup key taken for the namespace's dedup window (dedup_tombstones).
//
// # Prefetch
//
// Per (namespace, topic) the owner keeps a small buffer per shard of rows
// it read (see Leases), sized to about 100 ms of the topic's
// observed dequeue rate (16..500 rows). Requests are served from memory by
// a k-way merge across the shards in (priority, deliver_after, id) order; a
// shard's queue must hold items or be known empty before the merge
// compares past it, so order holds across shards. A queue is fresh for
// recheckEvery (100 ms) after its last read, holding items or not: items
// that become ready because time passed (deliver_after reached, a lease
// lapsed, a nack's delay over) are announced by nobody, so a queue that
// holds items is read again that often, for rows that sort before its
// tail only (usually none; if the read comes back full, the buffered rows
// after the last row read are dropped so none is served out of order).
// One response lists a topic's items in that order even when a refill
// during the call brought more urgent ones.
//
// A queue is refilled in the background before it runs dry: when a take
// leaves a shard's queue below its low-water mark (half a fetch, so about
// 50 ms of the topic's observed rate) and its last full read was not
// short, a read of the rows after its tail is started (startRefills; of
// the head, when the queue is empty), and takes go on serving what the
// queue holds meanwhile. The rows before the tail are the ones the queue
// holds or ones its rechecks find, so the refill neither walks nor leaves
// out the held rows by version, which would cost a deep backlog a second
// index row read per row served. Only a take that finds the queue empty,
// or in need of a fresh read, waits for the refill (a second read beside
// it could merge rows read after the refill's unmerged ones and serve
// them first); a refill of the head counts as the take's fresh read, one
// after the tail does not. What the
// refill read merges like any fetch's rows, and, as for a full recheck,
// buffered rows after its last row are dropped when it came back full.
// Without it a consumer that emptied a buffer would wait a read round
// trip. halt waits for the refills in flight.
//
// A take that waits for another's fetch or a refill counts that read as
// its own when it began after the take did (pendingRead), as a read the
// take made itself counts for the rest of the call (readThisCall): it saw
// everything announced before the take began. Under a flood of enqueues a
// notice lands during every fetch, and without that consumers would form
// a convoy, each waiting for fetch after fetch until its own turn to
// read.
//
// Serving is batched too: the serve UPDATEs of concurrent takes on one
// shard go out as one statement (store.Batcher, Config.Writes), each
// delivery naming the version its row was read at, so sixteen consumers
// served at once cost one UPDATE and one commit rather than sixteen. The
// node gives its router the same Batcher, so the acks it has for the shard
// at the time ride in the serve's transaction (FOQS acks with the next
// lease): in steady state a delivery costs a share of two commits (its
// insert, its serve with an earlier delivery's ack) rather than three. Taken items that cannot be
// served (TTL passed while buffered, a copy whose row changed) are
// replaced from the buffer, so an answer is short only when nothing more
// is ready. Enqueuers, and routers for items a nack (no delay), update,
// unserve or redrive makes ready, announce them (ItemsReady), so buffers
// look again when an item may sort before their tail and parked long
// polls wake — the oldest waiters first, one per announced item. A
// notice of new enqueues carries their earliest deliver_after as well as
// their most urgent priority (peer.BatchReady), so new rows at the
// tail's priority that sort after it leave the buffer alone; a handed-back
// item keeps an old deliver_after, and its notice, which says none, counts
// at equal priority. A queue a notice made dirty still serves, without a
// read, the items that sort before every row the notices since its last
// read may be about (shardQueue.dirtyFrom); the first that may not waits
// for the read. Under a flood of enqueues into a backlog a notice arrives
// between any two takes, so a take that waited for every notice's read
// would wait for a read every time. Rows announced past the tail are
// left to a refill or to the read that drains the queue, and the queue
// no longer counts as holding every ready row (exhausted), nor does a
// read in flight that began before the notice (shardQueue.leaveUnread):
// taken for empty once drained, it would leave a row whose enqueue had
// answered unread until its recheck.
//
// A notice of a committed insert carries the rows themselves when the
// insert stored them just now and they are small (peer.CommittedReady,
// peer.MaxHandedBytes): the router announces a COMMITTED batch with the
// version its insert reported (EnqueueCommitted.version_us), the enqueue
// worker a BUFFERED one. The owner's buffers take the rows that are ready
// by the primary's clock in where a read would have put them
// (shardQueue.handIn): anywhere in a queue whose last full read found
// everything, before the tail of one that holds the head only; the rest
// is handled as a notice without rows. In steady state an item thus goes
// from its insert to a consumer with no read, rather than a read of the
// shard per insert, as many statements as the inserts themselves. A
// handed row is a copy at a version like a read one: an
// update or delete before its dequeue unbuffers it, and the serve's
// version check stops any copy that is stale.
//
// A Dequeue's serves on different shards run at once: each waits for a
// commit on its own primary.
//
// Buffers idle for IdleDrop are emptied (their rows were never hidden;
// this frees memory), and Stop does the same.
//
// A topic has one buffer per priority band it is dequeued with (the whole
// range, a weighted topic's bands, a request's min/max_priority). Where
// bands overlap, each buffer reads every ready row of its band, so two may
// hold the same row; the serve's compare-and-set delivers it once, and
// the other buffer's failed serve sends its queue to read again. A reply
// is bounded to peer.MaxReplyBytes (and the NATS max payload when
// forwarded): items that do not fit go back into the buffer, unserved.
//
// # Statements
//
// Every statement of the lease path (head read, serve, unserve, ack,
// nack, extend, dead-lettering, aging, the TTL sweep) lives in package
// schema/store, which keeps the index and lock rules they
// depend on in one place; routers run ack, nack, extend and unserve there
// directly. This package decides which rows to ask for and what to do
// with them in memory: ownership, buffers, merge order, timing.
//
// # Sweeps
//
// The TTL sweep deletes expired items through the ttl index in batches of
// 1000, so it touches only expired rows however large the backlog.
//
// Lock order: Service.mu, then topicBuf.mu, then ownership.mu or
// Service.refillMu (a leaf, taken under topicBuf.mu to count a refill);
// none is held across SQL or NATS calls.
//
// # Clocks
//
// A shard's lease arithmetic (deliver_after <= now for the ready head,
// serve stamps, leased_until, nack's now + delay, extend's now + lease,
// unserve, aging cutoffs, TTL) compares and writes times that several
// processes produce: the dequeuer for reads and serves, routers for
// nack, extend, update and unserve. They all take
// "now" from one clock per shard, the shard primary's, through
// shardmap.Clock (Config.Clock; the node builds one per process and gives
// it to every role). With each process's own time.Now, two hosts Δ apart
// would make a nack of 0 s invisible for Δ and an extend Δ too short or
// long.
//
// The primary's clock, rather than the alternatives: SQL's NOW(6) in every
// statement would need the statements rewritten and leaves the buffer's
// own comparisons (TTL filtering) on a local clock;
// requiring NTP only moves the failure to ops. shardmap.Clock measures the
// primary's UTC_TIMESTAMP(6) at most once a second per primary, corrects
// it by half the round trip and extrapolates with the local monotonic clock
// in between, so a jump of the local wall clock does not move it and the
// hot paths pay a map lookup. After a failover the new primary's pool is a
// new entry, measured on first use. Times that only one process compares
// with itself (waits, idle buffers, recheck pacing, quotas, request
// validation) stay on the local clock (Config.Now). The enqueue path's
// default deliver_after and expires_at are the router's local time.
//
// # Metrics
//
// Config.Metrics (schema/metrics) counts each delivery when serving
// stamps it (triage_dequeued_items_total by topic and band, the attempt
// number, and for a first delivery the time since enqueued_at on the
// primary's clock). A lease expiry is counted when a fetch reads a row
// whose delivery lease had lapsed (store.LeaseHeadCounts): there is no
// sweep to count them when they lapse, so an expired item nobody reads
// again is not counted yet. A prefetch hit is an item served without the
// request fetching or waiting for a fetch.
//
// # Tracing
//
// Config.Tracer traces each request served as a "dequeuer.dequeue" span
// (a long poll's wait included), the child of the router's
// "dequeue.forward": a request over NATS carries its trace context in a
// "traceparent" header (schema/tracing), a call in-process in its context.
package dequeuer
