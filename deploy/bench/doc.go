// Package bench is `make bench`: Triage's throughput and latency, side by
// side with what MariaDB itself can do, with the queue people write by
// hand on a SQL table, and with River, the job queue on Postgres a Go user
// would pick instead, every one run in the same process on the same box.
//
// Run starts a private bed (bed.Start in a temp dir, free ports, so a bed
// from `make up` is left alone), runs the scenarios below (River's on a
// private Postgres started once the bed is stopped, the three-region one
// on a private three-region bed started after that), prints progress and
// a table, writes <Dir>/bench.json ({"machine": ..., "run": ...,
// "scenarios": [...]}) and stops everything it started. Quick mode runs
// every scenario for a second or two on small backlogs: a CI smoke test
// whose numbers mean little.
//
// # Scenarios
//
// Every item carries a 128-byte payload and a priority 0-9. Every write is
// committed with the bed's durability (innodb_flush_log_at_trx_commit=1,
// sync_binlog=1, ROW binlog); machine.durability in bench.json holds the
// values read from the server.
//
//   - ceiling-insert: multi-row INSERT batches with literal values, each its
//     own transaction, straight into a copy of Triage's items table
//     (database bench_raw, schema from package schema) — the enqueue limit.
//     Best of a few writer counts and batch sizes, on one shard and on all
//     of the bed's shards at once (the shards share the box's cores and
//     disk, so the best of both is the box's limit). The table is emptied
//     before each trial.
//   - ceiling-lease-ack: raw batched lease + ack on the same table — the
//     dequeue limit. Two strategies: one owner per shard reading the ready
//     head without row locks and leasing with a conditional
//     UPDATE ... WHERE id IN (...) AND deliver_after <= now, with ack
//     workers deleting by primary key (Triage's design); and
//     SELECT ... FOR UPDATE SKIP LOCKED + UPDATE by primary key, then a
//     DELETE. Best of both, a few batch sizes and worker counts, one shard
//     and all shards. Each shard leases from as many ready rows as
//     triage-dequeue-ack's deep backlog puts on it (2.5M of the 5M on two
//     shards), settled as triage-backlog's fill is: the head of the ready
//     index takes each priority from every page of the table, so a table
//     larger than the buffer pool is read from disk once per priority and
//     one that fits is read once, and a ceiling on a shallower table
//     would measure the buffer pool instead of Triage. It runs after
//     Triage's enqueue scenarios and the mixed load, just before
//     triage-backlog: its deep table's drop and purge slowed what ran
//     after it.
//   - naive-enqueue, naive-dequeue-ack: the seeds' single-table queue on one
//     shard (database bench_naive, same table and indexes): one autocommit
//     INSERT per item; per item SELECT ... ORDER BY priority, deliver_after,
//     id LIMIT 1 FOR UPDATE SKIP LOCKED + UPDATE in a transaction and a later
//     DELETE. Same concurrency as the matching Triage scenario: each client
//     or consumer count Triage is measured with, best of them.
//   - triage-enqueue-batch1, -batch100: closed-loop Enqueue RPCs over gRPC
//     (four client connections), COMMITTED durability; single items from
//     64, 256 and 512 clients (best reported: the router coalesces
//     concurrent requests, so more clients batch better), or 100 items from
//     32 clients. Shards' items tables are emptied first.
//   - triage-enqueue-json: as -batch100 through the JSON gateway (POST
//     /v1/namespaces/default/topics/{topic}/items, base64 payloads).
//   - triage-dequeue-ack: consumers Dequeue (count 100) and Ack the batch,
//     from a backlog of 5M items (quick: 200k) written straight into the
//     shards' items tables, rows shaped as the enqueuer writes them, with
//     keys from a node number the bench claims in NATS KV as a router does.
//     Best of 8, 16 and 32 consumers.
//   - triage-steady: single-item COMMITTED producers (64, then 512) and 16
//     consumers (Dequeue count 10 with a 250 ms long poll, each carrying
//     the acks of the items of the one before, DequeueRequest.acks) at
//     once, closed loop, for 20 s each, on a table emptied first: how a
//     queue runs in production, backlog near zero. Reported: the items/s
//     delivered, end-to-end latency (enqueue sent to the Dequeue answer
//     carrying the item, from a send time in the payload) and, per trial,
//     enqueued/s, delivered/s, the backlog left when the load stopped, and
//     where the slowest 1% of items waited (trail.go: router, commit,
//     queued and answer legs, from the items' own stamps). Its figures are
//     the trial that kept up least.
//   - triage-mixed: first a closed-loop probe (single-item producers and
//     the consumers at once) measures the sustainable rate of the mix,
//     since enqueue and dequeue share the box; then producers offer half
//     that rate open loop: each item has an intended send time, a pool of
//     senders sends it then, and latency counts from the intended time, so
//     a slow server cannot slow the load and hide its latency. The payload
//     carries the item's sequence number. 16 consumers Dequeue (count 10)
//     and Ack. Reported: end-to-end latency (intended send to the Dequeue
//     answer carrying the item) as p50/p99/p99.9, enqueue p99 (intended
//     send to the committed answer), dequeue p99 (non-waiting Dequeue
//     calls; a consumer that finds nothing parks in a 250 ms long poll,
//     whose waiting is not service time), priority inversions, and where
//     the slowest 1% waited, as triage-steady reports it (its router leg
//     starts at the intended send time, so it holds the wait for a free
//     sender).
//   - triage-backlog: the same consumer load (8 consumers, count 10, ack)
//     with 10k items waiting and with 5M waiting (quick: 200k); a round
//     consumes 5k items, the shallow topic is topped up between rounds, a
//     warm-up round is not recorded. Reported: dequeue latency with the deep
//     backlog, the shallow one's p99 and the ratio in notes.
//   - triage-enqueue-3region: -batch100 and -batch1 (its largest client
//     count) on the three-region bed, started after the one-region bed is
//     stopped: region us-east's shards (as many as Config.Shards; one in
//     quick mode) each have a replica in eu-west behind the bed's WAN link
//     (20 ms one way), commits wait for the replica's semi-sync
//     acknowledgement (AFTER_SYNC), and the enqueue stream is replicated
//     across the regions' NATS servers. items/s and latencies are
//     batch 100's; batch 1's and both ratios to one region are in notes, as
//     are the commits the replica acknowledged and those that fell back to
//     async (which would not be zero-RPO).
//
// River's rows run River (github.com/riverqueue/river, pgx v5 driver) on a
// private Postgres (package deploy/postgres: Debian's postgresql-15,
// installed with apt-get when missing and the bench runs as root; fsync=on,
// synchronous_commit=on, full_page_writes=on, shared_buffers 256 MB as the
// shards' buffer pool), started once the one-region bed is stopped, so
// River has the box to itself as each bed does, and stopped after them.
// Jobs carry the same 128-byte payload, spread over River's priorities
// 1-4. Inserting clients use a pool of 64 connections; a working client
// (MaxWorkers 160, as many jobs in hand as triage-steady's 16 consumers x
// count 10; FetchCooldown 10 ms, since with River's default, 100 ms, a job
// can wait up to 100 ms for the next fetch; a pool of its own, 16
// connections) is
// started for a measurement and stopped after it; its workers do nothing
// but count. machine.postgres in bench.json holds the server's version
// and settings, read from it. Where Postgres cannot be installed the rows
// are reported skipped, with the reason.
//
//   - river-insert-many: closed-loop InsertMany of 100 jobs (one
//     transaction each) from 8 goroutines into an emptied job table —
//     beside triage-enqueue-batch100.
//   - river-steady: triage-steady's method: single-job Insert producers (64,
//     then 512), each Insert its own transaction, closed loop, beside the
//     working client, for 20 s each (quick: 64 producers for 1.5 s) on an
//     emptied job table. Reported: jobs worked per second (Work started),
//     end-to-end latency (Insert sent to Work start, from a send time in
//     the job's args) and, per trial, inserted/s, worked/s and the backlog
//     left when the load stopped; its figures are the trial that kept up
//     least, and a trial kept up when it worked >= 0.95x what it inserted.
//   - river-backlog: 100k jobs (quick: 5k) inserted first with InsertMany
//     of 1,000 and a CHECKPOINT, then the working client started: jobs/s
//     from its start to the last job's Work start. Notes say when every
//     job was completed (River writes completions in batches) — beside
//     triage-backlog and triage-dequeue-ack.
//
// At the end of the run each baseline is measured once more at its best
// configuration and the better of its two measurements is reported: other
// work on a shared box can depress a baseline during its one window, which
// would flatter Triage's ratios.
//
// Every scenario's notes end with where the box's CPU went while it ran:
// this process (Triage node, NATS, load generators; for River's rows the
// River clients and load generators), the mariadbd processes (for River's
// rows the Postgres processes), other processes, idle and iowait — the
// first thing to read when asking what limited a number.
//
// ratio_vs_naive and ratio_vs_ceiling compare items/s with the matching
// baselines: enqueue scenarios with naive-enqueue and ceiling-insert,
// dequeue scenarios with naive-dequeue-ack and ceiling-lease-ack.
// ratio_vs_river compares a Triage row's items/s with its River peer,
// named by river_peer, and the table prints both ("1.25x
// river-insert-many"): triage-enqueue-batch100 with river-insert-many,
// triage-steady with river-steady (its notes and vs_river_p<N>_* metrics
// also compare each producer count's delivered rate and end-to-end p99),
// triage-backlog and triage-dequeue-ack with river-backlog.
//
// # Targets
//
// The run checks the targets of issue 11 ("keep up in steady state") and
// of issue 39 (beside River), and prints each under "Targets" as met or
// MISSED with the figure it was judged on (bench.json: each scenario's
// targets):
//
//   - triage-steady: delivered >= 0.95x enqueued in its worst trial (the
//     backlog stays flat), and >= 0.5x triage-enqueue-batch1 delivered by
//     the trial that delivered most while keeping up (metric
//     sustained_delivered_per_sec; 0, and missed, when none kept up).
//     Beside river-steady: an end-to-end p99 no longer than River's at
//     River's own rate (the fewest producers both ran), and, delivered
//     while keeping up, at least twice the most River worked in a trial.
//   - triage-mixed: non-waiting dequeue p99 <= 10 ms, enqueue p99 <= 25
//     ms, end-to-end p99 <= 50 ms (metric e2e_p99_ms), zero priority
//     inversions.
//   - triage-dequeue-ack: >= 0.7x ceiling-lease-ack (its best trial);
//     Dequeue and Ack p99 both <= 100 ms at the first trial's
//     configuration (16 consumers x count 100), whichever trial is
//     fastest, so the latency target compares one load from run to run.
//   - triage-enqueue-batch1 >= 2x naive-enqueue; triage-enqueue-batch100
//     >= 0.65x ceiling-insert and >= 1x river-insert-many.
//   - triage-enqueue-3region: COMMITTED enqueue p50 <= 3 WAN round trips
//     (metric wan_rtt_ms, twice the link's one-way latency), for batch 100
//     and for batch 1.
//
// A target whose scenarios did not run (--only, a failure) is left out.
//
// # Priority inversions
//
// A delivery of item d counts as an inversion when a more urgent item u
// had been ready for at least 5 ms when d's Dequeue was sent, and u was
// still waiting when d's answer arrived. Ready counts from u's enqueue
// answer (u was committed before it) and waiting lasts until the Dequeue
// that delivered u was sent, and only if that was after d's answer: both
// bounds err towards not counting, so each inversion counted is real.
//
// # Reading the numbers
//
// Everything shares one box: the shards' mariadbd processes, the embedded
// NATS server, the Triage node and the load generators. On two cores the
// Triage numbers are CPU-bound (gRPC, JetStream publish/ack and the
// service's SQL share the cores with MariaDB), the baselines are bound by
// MariaDB's CPU and by fsync per commit (group commit helps the batched
// ones), and the naive dequeue by row locks and one commit per item. The
// run records the box's load average at its start and end: other work on
// the box shows there, and moves every number.
//
// Config.ProfileDir writes a CPU profile of this process (load generators,
// Triage node, NATS; not mariadbd) per scenario, for tuning hot paths.
// Config.TraceDir (--trace) writes an execution trace of each scenario's
// last 3 s, from a flight recorder, for latency on a saturated box: there
// a request mostly waits to be scheduled, not on its statements, and
// `go tool trace -pprof=sched` shows which wake-ups those waits follow.
// By the code a consumer's Dequeue + Ack cycle has about ten such
// wake-ups (the gRPC server's handler, the serve and ack batches' replies,
// the client's response), as does an enqueue; routing's enqueue admission
// rests on that reading (deploy/bench/README.md has the figures).
//
// The load generators run in this process and take CPU the node does not
// get; nothing keeps them from it (a second process would share the same
// two cores). What the run does is measure it: every scenario runs under
// the profiler label bench=load, which the goroutines it starts inherit,
// the gRPC clients' transports included, while the nodes start unlabelled
// (loadshare.go). With a profile, each scenario's notes and its metric
// load_cpu_share say what share of this process's CPU the load took, and
// `go tool pprof -tagignore=bench=load` shows the node's part alone.
package bench
