// Package scale runs Triage's control plane at many shards on one machine
// and measures it (`triage-bed scale`, issue "Toward FOQS scale").
//
// # The bed
//
// A scale bed serves Shards logical shards as databases (triage_0001 ...)
// spread round-robin over Servers mariadbd processes: the shard map names a
// database per shard, so to Triage each is a shard like any other, while
// the machine holds a few servers instead of a thousand. Every database is
// migrated and granted to the application account before the nodes start,
// as an administrator would. One more database on the first server (the
// spare) is migrated but left out of the map, for the add-a-shard change.
//
// The map holds Namespaces namespaces (ns00000 ...), each on
// ShardsPerNamespace consecutive shards (so together they cover every
// shard), and Topics topic configurations spread evenly over them.
//
// The roles run as separate `triage serve` processes (router, enqueuer,
// controller, and Dequeuers dequeuers), so each one's CPU and memory are
// read from /proc by PID. NATS with JetStream runs embedded in the bed's
// own process, whose CPU is reported as "nats+bed".
//
// # The run
//
// Run brings a bed up, measures, and stops it: idle CPU and memory of each
// process; the shard map's stored size and parse time; the time from a
// namespace update and from an added shard until every process holds the
// new map (each node's /shardmap on its metrics listener); enqueue and
// dequeue at a fixed offered load spread over every shard, with p99; each
// node's /metrics size and scrape time; and the time until every shard a
// killed dequeuer owned is owned again. A Record holds one size's figures
// and the bounds it was checked against (Record.Check).
package scale
