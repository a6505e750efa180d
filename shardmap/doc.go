// Package shardmap holds Triage's shard map: which MySQL shards serve which
// namespace in which region, where each shard's primary is, and its epoch.
//
// # Snapshots
//
// A Map is an immutable, versioned snapshot. Readers take the current one
// from a Holder (an atomic pointer) and use it for the whole request, so a
// request never sees half of an update. Writers build a new Map and publish
// it; nothing mutates a published Map.
//
// # Source of truth
//
// The map is loaded from a JSON config file at bootstrap and published to the
// NATS KV bucket "triage_shardmap" (Create, so the first process wins and
// later restarts do not roll a failover back). Each namespace's config is
// the value of its own key ("ns.<name>"); the head, key "current", holds the
// version, regions and shards and names each namespace's key at a revision
// (store.go). A change writes the namespaces it changed, then the head with
// compare-and-set, so it moves and parses kilobytes, not the whole map, and
// no single value bounds the number of namespaces. Every router, enqueuer
// and dequeuer watches those keys and swaps its snapshot when a head of a
// higher version arrives, built from the values the head names. When NATS
// is out of reach the last good snapshot keeps serving (vitess srvtopo's
// resilient server does the same).
//
// # Dedup slot tables
//
// Each namespace carries one dedup slot table per region (Namespace.Slots,
// "dedup_slots" in JSON): 256 slots, each naming one of the namespace's
// shards in that region. A dedup key hashes to a slot, so every copy of a
// key enqueued with a region meets the same shard's unique index and
// tombstones, and the item stays in the region the request chose. Dedup
// is per (namespace, topic, region); a key enqueued with two regions is
// two items, because deduplicating across regions would need a
// cross-region lookup on every enqueue. A region's table is filled once
// (from the region's shards, sorted: slot i names the (i mod n)th) when
// the namespace first has shards there, including when a stored map has
// no tables yet, and is kept across shard-list changes; a change that
// drops a shard a table names is refused. Only a drain moves slots (see
// "Changing shards online").
//
// A table that repeats a cycle of shard IDs, as every table New fills
// does until a slot moves, is written as {"cycle": [IDs]}: written out in
// full the tables made up nearly all of a namespace's config. A whole map
// (Marshal, a bootstrap file) also lists each distinct table once
// ("slot_tables") and a namespace names its tables by index
// ("dedup_slot_refs").
//
// # Changing shards online
//
// Shards are added, weighed, drained and retired by new map versions
// (change.go: WithNewShard, WithNamespaceShard, WithWeight, WithDrain,
// WithoutShard), each published with compare-and-set on the stored
// version (Publish), so two admins changing the map at once are applied
// one after the other, each on the map the other left, or refused.
//
// Weight gives a shard its share of new enqueues without a dedup key
// (PickWeighted, interleaved), so a new shard can take more until it is
// balanced. Draining shards take no new enqueues (EnqueueShards) but stay
// in ShardsFor, so dequeues, stats and item calls go on until they are
// empty; merging by priority across a region's shards therefore still
// includes them.
//
// Dedup must stay exact: a key's shard must not change while the key's
// item or tombstone lives. A new shard takes no dedup slots. Slots move
// only off a draining shard, and remember where they came from
// (Namespace.SlotsFrom): a router looks a moved key up on the old shard
// (live item, or tombstone within the window) before it enqueues the key
// on the new one, and answers with the old item's ID when it is there.
// That lookup is exact once nothing can insert the key on the old shard
// any more: routers refuse enqueues when their map is unconfirmed for
// MaxStaleness (Holder.Unconfirmed), so DrainSettle after the drain no
// router publishes to it, and once its subject in the enqueue stream is
// empty every batch published before is inserted. Until then a moved
// key's enqueue waits (at most DrainSettle plus the buffer's drain, once
// per drained shard and router). Two routers that both miss the key on
// the old shard meet on the new shard's unique index. We chose this over
// a key → shard record in NATS KV (a KV write per dedup enqueue,
// forever) and over copying rows with the slot (item IDs name their
// shard, so a copied item would change its ID under a consumer's lease).
// A slot remembers one old shard, so a shard that holds slots moved from
// a shard not yet retired cannot be drained (ErrShardState).
//
// Retiring removes a draining shard only when it holds nothing and its
// buffer is drained (the router's RetireShard checks; the map cannot),
// keeps its ID in Retired so it is never reused (an item ID names its
// shard), and clears the slots' memory of it.
//
// # Writing only with a current map
//
// A shard that can fail over is written only through Pool.Writer, which
// refuses (ErrNotWritable) unless three things hold:
//
//   - the shard is not Fenced in the map;
//   - the map was confirmed within MaxStaleness. Confirmation is a probe
//     the bucket's Raft group must commit, seen coming back through the
//     ordered watch that also carries the map's key, so every map stored
//     before it was offered first (see prober in kv.go): reads cannot
//     prove it, because a direct get is answered by any replica, also a
//     cut-off one, and a cut-off stream leader keeps answering for seconds
//     after the majority elected another. A process in a minority
//     partition thus stops writing within MaxStaleness. Processes start
//     their roles only after the first confirmation (WaitConfirmed). A
//     watch that does not start, or deliver its initial values, within
//     a second (doubling to 8 s while watches keep missing it), or whose
//     committed probes do not come back within MaxStaleness/2, is
//     restarted: after a partition, a watch's consumer may sit on the
//     cut-off server, and its creation may wait on one. Such a restart
//     resumes after the last message the slow watch delivered, since a
//     fresh watch delivers every namespace's value again (seconds under
//     load at 10,000 namespaces, unconfirmed all along); a resumed watch
//     through which no probe comes back gives way to a fresh one;
//   - the primary is not at a later failover epoch than the map. The
//     controller stores the epoch in the shard's shard_meta table
//     (StoreEpoch, migration 0006) on the promoted primary before it
//     publishes the map naming it; Writer reads it per (primary, epoch)
//     pair at most every EpochRecheck. A process that missed a failover
//     therefore cannot write to a server that is primary again under a
//     newer epoch. We chose a table over a per-connection session
//     variable or a check inside every statement: one indexed read a
//     second per shard costs nothing, and the statements of the store
//     stay the same.
//
// # The application account's pool
//
// The router, enqueuer and dequeuer reach primaries through NewAppPool's
// pool, the admin account (migrations) through NewPool's. The application
// pool assumes no user (ErrNoAppUser), checks every connection it opens
// and refuses an account that can write through read_only
// (schema.CheckGrants), since read_only is the fence of a deposed
// primary, and sets innodb_lock_wait_timeout and max_statement_time on
// each session below the driver's read timeout, so that a statement the
// process gave up on has already failed on the server and committed
// nothing (see "Timeouts" in package schema).
//
// # Credentials
//
// The map names a shard's primary as host:port and database only. User and
// password come from each process's own config, so the KV bucket never holds
// secrets; there [Credentials] name the password's file or environment
// variable rather than hold it ([Secret]), and [NATSLogin] does the same
// for the NATS login, [Account] for the replication account. [NATSTLS]
// names the CA a process verifies the NATS servers with and, optionally,
// its client certificate; there is no TLS-less fallback: a process given
// a CA refuses a server that does not speak TLS. [MySQLTLS] does the same
// for the MySQL servers: Credentials.Resolve registers it with the driver
// (mysql.RegisterTLSConfig, under a name derived from the files' content)
// and Apply names it in every DSN the pools build (tls=<name>), so the
// application pool, the admin pool, the observer and the controller's
// replication admin connections all verify the servers against its CA.
package shardmap
