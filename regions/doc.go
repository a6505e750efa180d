// Package regions is Triage's multi-region control plane: health
// observers, and the failover controller that moves a shard's primary to
// another region when it dies (or when an operator asks).
//
// # Detection
//
// Every node with the controller role runs an Observer that reports: every
// ObserveEvery (250 ms) it pings every primary server once (through the
// same links the node's writes would take), however many shards are
// databases on it, and stores the result in the NATS KV bucket
// triage_health under "a<address in hex>.<region>", and publishes it on
// core NATS (HealthSubject), which the controllers also follow: core NATS
// needs no stream leader, so a region going down with the health stream's
// leader does not blind the next controller leader. A thousand shards on
// four servers cost four pings a round, not a thousand; each shard's
// gauges are set from its server's report, and the controller finds a
// shard's verdict by its primary's address. A primary is declared dead
// only when observers in at least two regions have reported it down for
// Detect (default 1 s):
// one region losing its links, or one slow observer, moves nothing. When
// every one of those reports is a refused connection (the host answers,
// nothing listens: the server was killed or crashed), two rounds suffice
// (DetectRefused, default ObserveEvery): waiting out Detect would only add
// to the outage, which on a primary kill was a quarter of the RTO. The
// observers also raise two alarms: a primary with no semi-sync replica
// connected (its commits block: there is no async fallback) and a primary
// whose semi-sync is off, once per server, naming its shards.
//
// A region reports through its controller's node alone. Every node once
// reported, so a region of four single-role nodes (the compose bed)
// pinged each primary and wrote one replicated KV entry sixteen times a
// second, all under the same key: with three regions and three shards,
// 144 replicated writes and over 400 MySQL round trips a second, most
// across the WAN, while the queue was idle, and the bed's two cores had no
// time left for the Docker daemon. The other nodes still run an
// Observer for their own metrics (primary up, semi-sync, replica lag),
// every ObserveMetricsEvery (2 s), which reports nothing. A region whose
// controller is down reports nothing, so detection then needs the other
// two regions.
//
// # One leader
//
// Every node with the controller role campaigns for the key "leader" in
// the bucket triage_control (TTL LeaseTTL = 3 s, renewed every 0.5 s by
// a compare-and-set on its revision). Only the holder acts. Before each
// irreversible step of a failover (fence, read_only, promote, publish)
// the leader renews the lease again, unless it renewed it less than 300 ms
// before, and stops if that fails: the renewal is committed by the KV
// stream's Raft group, so a controller cut off from NATS (but not from
// MySQL) stops at its next step, while a new leader can only start
// LeaseTTL after the old one's last renewal. A new leader
// resumes a failover the previous one left half-done (a group with a
// shard still marked fenced), for the whole group.
//
// # Failover
//
// A failover moves a group: the shards whose primary is the same server,
// with the same replicas listed alike (many shards can be databases on
// one mariadbd). Read-only, a replica's IO thread and a promotion act on
// a server, not a database, so its shards move together, in one pass:
// one fence publish, one stop of the old primary's commits, one choice,
// one promotion, one publish of the new primary, whatever the group's
// size (a publish covers every shard of it, conditional on each one's
// epoch and fence state). Shards of one server whose replicas are listed
// otherwise form groups of their own, failed over one after the other;
// when their replica servers overlap, the later group can find the
// server the earlier one promoted "replicating from nobody" and stays
// fenced: list a server's shards with the same replicas. A request for
// one shard (automatic or an operator's) moves its group.
//
//  1. Fence: publish the map with each shard's epoch + 1 and Fenced set.
//     Writers that see it stop writing to the shard (shardmap.Pool.Writer);
//     writers that cannot see the control plane stop trusting their map
//     within shardmap.MaxStaleness.
//  2. Stop the old primary from completing commits. If it answers, make
//     it read-only (the application user lacks READ ONLY ADMIN) and read
//     its gtid_binlog_pos. If it does not, stop every replica's IO thread:
//     semi-sync never falls back to async, so a primary no replica
//     receives from can complete no commit, and the replicas' positions
//     are final. Every replica must answer then; one that does not may
//     hold the only copy of acknowledged commits, so the failover is
//     refused (alarm; the shard stays fenced and is retried). No wait for
//     stale writers is needed: whatever they send the old primary cannot
//     commit.
//  3. Choose the candidate. With a read-only old primary: a candidate that
//     applies the old primary's position within a bound (MASTER_GTID_WAIT;
//     5 s, 30 s when planned), else the failover is refused, the old
//     primary made writable again and the shard unfenced (alarm). With an
//     unreachable one: the most advanced replica (replication.MostAdvanced
//     over the replicas), or a ToRegion replica that covers it. Only a
//     server that replicates is a candidate: a listed one that replicates
//     from nobody is a deposed primary not rejoined yet, which lacks what
//     was written since and would fork the shard's history; the exception
//     is the server this epoch's failover already claimed and detached,
//     whose promotion is finished (replication.Admin.FinishPromotion).
//  4. Claim the promotion: the key promotion.s<shard>.e<epoch> in the
//     shard-map bucket is created once, for every shard of the group,
//     naming the same server; a controller resuming the group promotes
//     the server claimed for its shards fenced before (claims naming two
//     servers leave it fenced) or none, so each shard's epoch has one
//     promotion.
//  5. Promote (the relay log applied first; semi-sync as a primary before
//     read_only=0). The other replicas are repointed to the candidate once
//     it has applied what it received (Promote's prepare; earlier, one that
//     received more than the candidate had applied would ask for a
//     position missing from its binary log and stop on error 1236), and a
//     deposed primary among them rejoins; attached before the candidate's
//     first commit, they acknowledge it at once. The epoch goes into the candidate's
//     shard_meta table (shardmap.StoreEpoch; a writer with an older map
//     refuses that server) once it is detached and while it is still
//     read-only, before semi-sync as a primary is on (Promote's prepare):
//     that commit (one per shard) waits for no replica, so the map is not
//     held back while the repointed replicas connect across the WAN (a
//     second on the compose bed); the application's first commits wait
//     for them instead. Then publish the map with the new primary, the
//     old one listed as a replica to rejoin, Fenced cleared. Each publish
//     is conditional on each shard's stored epoch and fence state, so it
//     fails if another controller moved an epoch.
//  6. Refuse another automatic failover of the group for Cooldown
//     (default 60 s).
//
// A planned switchover (Admin.Failover with planned=true, `triage failover
// --shard N --to REGION`) takes the same steps; it requires the old
// primary to answer (read-only first), so it loses nothing.
//
// # Rejoin
//
// A leader loop of its own (every second, apart from the 100 ms detection
// tick, so a replica cut off and costing its connect timeout never holds
// detection back) looks at the servers the shards list as replicas, in
// parallel, each once a pass: one that answers
// but does not replicate from the current primary (a deposed primary,
// restarted with replication.RejoinArgs so crash recovery discards what
// no replica acknowledged) is made read-only and rejoined as a replica
// (MASTER_DEMOTE_TO_SLAVE); "rejoined" is reported once its IO and SQL
// threads both run, and a replica stopped on an error against the current
// primary (1236, or an SQL error: diverged) raises an alarm: it must be
// rebuilt. A deposed primary woken after its failover with a commit waiting
// for an acknowledgement cannot be fenced (read_only=1 waits for it; the
// fence gives up after 2 s) and raises an alarm too: restarted with
// RejoinArgs it rolls that commit back and rejoins. It never serves as a
// second primary: the map names one primary, and the old one is read-only
// before it is repointed.
//
// Like a failover, a rejoin acts on a server: its status, read_only and
// the primary it replicates from are the server's, whatever databases it
// holds. The loop groups the shards by the server listed as a replica and
// the primary it should follow, reads each server's status once a pass,
// rejoins it once for all the shards of its group, and logs and records
// "rejoined" once, naming them. Per shard, a server deposed with 26
// shards' primaries was given 26 rejoins at once, and 23 failed within
// 18 ms (a running replica, error 1198). Shards whose primary is in a
// failover (fenced or in flight) are left out until it is published. A
// server listed as a replica of two primaries, or as a replica while the
// map names it the primary of other shards, is left alone (alarm): it
// cannot follow both, and rejoining it would move it back and forth or
// demote a primary; list a server's shards with the same replicas.
//
// Rejoining is irreversible and a demotion of the real primary if the map
// it acts on is stale, so it acts only as the leader, only while its map
// is confirmed, and only once shardmap.LoadCurrent (a compare-and-set the
// bucket's leader commits, once per tick for all the tick's rejoins)
// proves the stored map still names that primary at that epoch for every
// shard of the group, unfenced, and names the server the primary of none.
// A direct get is not enough: a controller back from a partition read its
// own NATS server's lagging copy, which agreed with its stale map, and
// demoted the new primary.
//
// Metrics (Config.Metrics on the controller and the Observer): failovers
// by kind and result, the time each step of a failover took since the
// previous one, and from each observer the primary's reachability and
// semi-sync state and the lag of the replicas in its own region.
//
// # History
//
// Every failover step a controller records is logged once and published
// to a replicated stream (HistoryStream, the last MaxEvents steps); a
// controller that becomes leader loads the stream, so the history the
// console shows (EventsSubject) survives leader changes, as in a
// region-down drill. Publishing is asynchronous and retried for a minute:
// it never holds a failover back, and neither does loading, which takes
// the failover lock only to merge what it read (the read can wait out its
// 10 s bound while JetStream elects the stream's leader).
package regions
