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
// With Config.Failover (`triage-bed scale --failover`) the bed has two
// more regions, eu-west and ap-south, holding no shard: in each a replica
// of every server, started read-only, and a controller beside the first
// region's. Each server replicates to its two replicas as production does
// (deploy/bed): the accounts on every server with sql_log_bin=0, then
// GTID replication with semi-sync AFTER_SYNC and no asynchronous
// fallback, set up before any shard database exists, so each replica
// holds the whole server, every shard database of it, from its first
// GTID. The map lists, for every shard and the spare, its server's
// replicas, eu-west's then ap-south's, alike for every shard of a server,
// so the shards of one server form one failover group (regions/group.go);
// the three controllers observe the primaries and hold the replication
// account. Two replicas, as production has one in every other region: the
// controller repoints the one it does not promote to the one it does, so
// the new primary has a semi-sync replica at once. With one replica its
// only semi-sync replica would be the server that died, every commit
// there would wait for that server to rejoin, and the drill's RTO would
// be its hold.
//
// # The run
//
// Run brings a bed up, measures, and stops it: idle CPU and memory of each
// process; the shard map's stored size (and its head's) and load time;
// the time from a namespace update and from an added shard until every
// process holds the new map (each node's /shardmap on its metrics listener); enqueue and
// dequeue at a fixed offered load spread over every shard, measured after
// a warm-up of the same load (a shard's first enqueue opens every node's
// connection to it), with p99, each process's CPU and each server's
// statements a second; each
// node's /metrics size and scrape time; and the time until every shard a
// killed dequeuer owned is owned again. With Config.Failover, last, a
// primary-kill drill (deploy/drill) through the first region's router
// SIGKILLs the server holding shard 1's primary, and so the primaries of
// every shard on it, holds it down (Options.FailoverHold), then restarts
// it with replication.RejoinArgs: the record has how many shards it held,
// the time from the kill until the last of them was published on a new
// primary (all must move, to one server), and the drill's lost, undone
// and early items and its RTO, which must be under 10 s
// (FailoverRTOLimitSeconds); then what the other replica replicates from
// and how many semi-sync replicas the new primary has connected. A Record
// holds one size's figures and the bounds it was checked against
// (Record.Checks).
package scale
