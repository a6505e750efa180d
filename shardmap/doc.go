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
// NATS KV bucket "triage_shardmap" under the key "current" (Create, so the
// first process wins and later restarts do not roll a failover back). Every
// router, enqueuer and dequeuer watches that key and swaps its snapshot when
// a higher version arrives. When NATS is out of reach the last good snapshot
// keeps serving (vitess srvtopo's resilient server does the same).
//
// # Credentials
//
// The map names a shard's primary as host:port and database only. User and
// password come from each process's own config, so the KV bucket never holds
// secrets.
package shardmap
