// Package regions is Triage's multi-region control plane: health
// observers, and the failover controller that moves a shard's primary to
// another region when it dies (or when an operator asks).
//
// # Detection
//
// Every node runs an Observer: each half second it pings every shard
// primary (through the same links the node's writes would take) and
// stores the result in the NATS KV bucket triage_health under
// "s<shard>.<region>". A primary is declared dead only when observers in
// at least two regions have reported it down for Detect (default 2 s):
// one region losing its links, or one slow observer, moves nothing.
//
// # One leader
//
// Every node with the controller role campaigns for the key "leader" in
// the bucket triage_control (TTL 5 s, refreshed every second). Only the
// holder acts. A new leader resumes a failover the previous one left
// half-done (a shard still marked fenced).
//
// # Failover
//
//  1. Fence: publish the map with the shard's epoch + 1 and Fenced set.
//     Writers that see it stop writing to the shard (shardmap.Pool.Writer).
//  2. Make the old primary read-only if it can be reached (the
//     application user lacks READ ONLY ADMIN, so this stops every writer).
//     If it cannot be reached, wait shardmap.MaxStaleness plus the
//     semi-sync timeout: a writer cut off from the control plane has
//     stopped trusting its map by then, and its last commits have either
//     been acknowledged by the replica or fallen back to async, found the
//     writer stale, and gone unacknowledged. The old primary accepts no
//     write after this point, so none after the new primary is published.
//  3. Promote the most advanced replica (replication.MostAdvanced; the
//     promotion waits for the relay log with MASTER_GTID_WAIT) and turn on
//     semi-sync as a primary.
//  4. Publish the map with the new primary, the old one listed as a replica
//     to rejoin, Fenced cleared. Buffered enqueues drain to it; dequeuers
//     and enqueuers of the shard's home region serve it across regions.
//  5. Refuse another failover of that shard for Cooldown (default 60 s).
//
// A planned switchover (Admin.Failover with planned=true, `triage failover
// --shard N --to REGION`) takes the same steps, with the old primary
// read-only first, so it loses nothing and needs no staleness wait.
//
// # Rejoin
//
// Each leader pass looks at the shards' listed replicas: one that answers
// but does not replicate from the current primary (a deposed primary,
// restarted with replication.RejoinArgs so crash recovery discards what
// no replica acknowledged) is made read-only and rejoined as a replica
// (MASTER_DEMOTE_TO_SLAVE). It never serves as a second primary: the map
// names one primary, and the old one is read-only before it is repointed.
package regions
