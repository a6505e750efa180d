// Package dequeuer leases ready items to consumers.
//
// # Ownership
//
// Each shard's ready set has one owner at a time: the dequeuer holding the
// key "shard.<id>" in the NATS KV bucket triage_owners, refreshed every
// OwnerTTL/4 and expiring after OwnerTTL when its holder dies. Only the
// owner reads the ready head, so it can read it without row locks and lease
// with one conditional UPDATE; measured on the development box that is twice
// the rate of SELECT ... FOR UPDATE SKIP LOCKED. Correctness never rests on
// ownership: every lease is "UPDATE ... WHERE id IN (...) AND deliver_after
// <= now", so two owners overlapping during a takeover cannot lease one row
// twice. A dequeuer that cannot refresh its claim for 3/4 of the TTL stops
// serving the shard.
//
// # Leases
//
// deliver_after is the item's visibility time. Leasing sets a random batch
// token, counts the delivery (attempts+1) and moves deliver_after to the
// lease's expiry, so an expired lease makes the item ready again with no
// sweep, and the old token no longer matches once it is leased again. Ack
// deletes; nack clears the token and sets deliver_after to now + delay;
// extend moves the expiry. Each checks the token under a row lock in one
// transaction per batch.
//
// # Prefetch
//
// Per (namespace, topic) the owner keeps a small buffer per shard of rows
// it has already leased, sized to about 100 ms of the topic's observed
// dequeue rate (16..500 rows). Requests are served from memory by a k-way
// merge across the shards in (priority, deliver_after, id) order; a shard's
// queue must hold items or be known empty before the merge compares past
// it, so order holds across shards. Serving re-stamps the lease (one UPDATE
// per batch) only when the request asks for a different lease or the item
// waited in the buffer long enough to matter. Enqueuers announce new items
// (ItemsReady) so buffers refill when more urgent items arrive and parked
// long polls wake — the oldest waiters first, one per announced item.
// Buffers idle for IdleRelease hand their leases back (attempts-1), and
// Stop does the same. An item whose prefetch lease lapses in a buffer is
// dropped and leased again later, with one extra attempt counted.
//
// # Sweeps
//
// The TTL sweep deletes expired items through the ttl index in batches of
// 1000, so it touches only expired rows however large the backlog.
//
// Lock order: Service.mu, then topicBuf.mu, then ownership.mu; none is held
// across SQL or NATS calls.
package dequeuer
