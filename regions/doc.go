// Package regions will hold Triage's multi-region control plane: the
// failover controller (one leader via a NATS KV lease) that detects a dead
// shard primary from several observers, fences it (shard epoch + 1, old
// primary read-only), promotes the most advanced replica and publishes the
// new shard map; planned switchover; and rejoin of a deposed primary as a
// replica. See ARCHITECTURE.md, "Shards, shard map and regions".
//
// Nothing is implemented here yet: today every shard's primary stays where
// the shard map puts it, and the shard map carries the epoch and replica
// fields the controller will use.
package regions
