// Package e2e holds the integration tests of the whole queue: real nodes
// (cmd/triage/node) against real mariadbd shards and an embedded NATS
// server, driven through the gRPC and JSON APIs as clients and operators
// drive them. It has no code of its own besides these tests, which sit in
// one package, on one harness, because they all need the same region of
// shards, NATS and shard map, and differ only in where the nodes run.
//
// The harness (harness_test.go) makes a region in one place: shard
// databases on the package's shared mariadbd (mariadbtest), an embedded
// NATS server (cmd/triage/natsserver) and the shard map file the nodes
// bootstrap from. On a region:
//
//   - a bed runs nodes in the test's process. Most tests use it: ordering,
//     delivery with acks, leases, dedup, namespaces and quotas, bad input,
//     authentication and authorization over gRPC and HTTPS, NATS and MySQL
//     logins and TLS, metrics, readiness, tracing, the console (also in
//     headless Chromium), and the model-based test against
//     deploy/queuemodel (-model.seed, -model.duration). What they set or
//     read inside a node goes through node.Config.Seams, Node.Dequeuer and
//     Node.ShardOwner.
//   - a cluster runs nodes as `triage serve` processes and kills them with
//     SIGKILL mid-flight, to show that no acknowledged enqueue is lost, and
//     grows and shrinks a namespace's shards under load.
//
// The cluster and the drills run the binaries, cmd/triage and
// cmd/triage-bed, built with -race once per run by the first test that
// needs them; a run of in-process tests alone builds nothing. Tests of a
// failover across regions start the three-region local bed (deploy/bed),
// in the test's process or with triage-bed.
//
// The drill tests start the three-region bed with `triage-bed up
// --multi-region` and run `triage-bed drill --json` against it, with clients on
// all three routers, and assert the report's figures one by one (lost,
// resurrected after ack, nacks undone, the isolated side's writes, RTO), so
// one run names every figure that is off. A failing drill test prints the
// drill's report and progress and the tail of the bed's log; the drill runs
// under a deadline inside the test's, so a hung drill is reported rather
// than ending the test binary with nothing printed. With go test
// -artifacts -outputdir DIR, the report (JSON and text), the progress and
// the bed's whole log are kept under DIR. TestNemesis runs the nemesis on
// that bed, and TestCompose the compose bed (deploy/compose) from nothing:
// drilled, grown, removed.
package e2e
