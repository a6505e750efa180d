// Package drill runs failover drills against a running bed (the process
// bed of `triage up` or the docker-compose bed): a workload of idempotent
// producers and consumers that ack, nack and sometimes crash holding a
// lease runs through every region's router (the
// faulted region's own included: a fault test watches both sides) while a
// fault is injected and later healed; then the queue is drained and the
// report says how long dequeues and enqueues were down (RTO), whether any
// acknowledged item was lost, every duplicate and its cause, early
// deliveries, priority inversions, and what became of the old primary.
//
// The drill reaches the bed through the Bed interface: its routers, and
// Inject, Heal and Fate of a fault. The process bed of `triage up` (deploy/bed
// Client) injects through its control endpoint (bed.json "control"), since
// the bed process owns the processes, links and NATS servers; the
// docker-compose bed (deploy/compose Bed) through the docker CLI, with real
// kills and network cuts. A scenario names what to break:
//
//	primary-kill   kill the primary of one of the region's shards
//	region-down    kill every process of the region (its mariadbds, NATS, node)
//	partition      cut every cross-region link of the region
//	nats-kill      stop the region's NATS server abruptly
//	dequeuer-kill  stop the region's dequeuer abruptly (no lease hand-back)
//	mariadb-pause  SIGSTOP one of the region's shard primaries past the
//	               clients' timeouts, then wake it (deposed, if it failed over)
//	enqueuer-kill  kill an enqueuer of the region alone
//	wan-spike      add hundreds of milliseconds to the region's WAN links
//
// # Live progress
//
// With Config.Report (on in `triage-bed drill` unless --no-report), every
// line the drill writes to Config.Progress also goes, with the drill's
// phase (starting, fault injected, failed over, healed, draining, done)
// and at the end its verdict and the report's lines, to Admin.ReportDrill
// of the first router that survives the fault, under the id scenario and
// start time; the web console's Drills page shows it live. A reporter in
// front of Progress hands each line to one goroutine through a small
// buffered channel and never waits for it: a full channel drops the line
// (the next report counts what was dropped), a failing call is printed
// once to Progress, and Run flushes what is queued at the end, for at most
// a few seconds. Reporting never fails a drill.
//
// # History
//
// The workload records every call with the time it was sent and the time
// it was answered, and the report is computed from that history alone
// (analyze is pure, and unit tested). The checks are sound on one clock
// (drill and bed share the machine): a violation is counted only when the
// order of events is certain from the client's side.
//
//   - lost: an enqueue answered ok whose item was never delivered.
//   - resurrected after ack: a delivery by a Dequeue sent after an ack of
//     the same item was answered ok. The ack deleted the row; nothing may
//     bring it back.
//   - nack undone: every nack merges metadata drill_nack=<sequence> into
//     the item. A delivery by a Dequeue sent after a nack was answered ok
//     must carry that sequence (or a later one); an older one or none
//     means the nack's write was thrown away and the item came back as it
//     was before it.
//   - early: delivered before the deliver_after asked at enqueue, or
//     before the sending time of a nack answered ok plus its delay.
//   - isolated writes (partition): enqueues, acks and nacks the cut-off
//     region's router answered ok after a surviving router's shard map
//     showed the new primary and before the heal was asked for. All links
//     of that region are cut in that window, so only the old primary can
//     have taken those writes, and the failover discards them.
//
// RTO is measured per router from the fault to the answer of the first
// successful call sent after it that touched a faulted shard (see
// Report.DequeueRTOMS). A primary-kill or mariadb-pause faults every
// shard whose primary is on the server, as the items spread over all the
// region's shards; the headline figure is the slowest surviving
// router. "The fault" is the moment it took effect, as the bed recorded
// it, never later (the compose bed: when it asked docker to kill, or the
// disconnect's event; docker's own record of a kill comes up to 1.8 s
// late), or else the moment the bed's Inject returned: a call sent while
// it was being injected might have been served before it took effect.
package drill
