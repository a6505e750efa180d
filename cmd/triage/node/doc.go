// Package node assembles Triage's roles (router, enqueuer, dequeuer,
// controller) into one process from a config file: it is the production
// composition root, and lives next to the binary that runs it. `triage
// serve` runs one node; the local bed (deploy/bed) runs one per region in
// its own process; e2e tests start nodes as separate `triage serve`
// processes to kill them.
//
// It sits under cmd/triage rather than in deploy/ because it is what the
// production binary is made of, while deploy/ holds what deploys and tests
// it (the beds, the bench, the WAN proxies). Its non-test code imports
// nothing from deploy/, so the `serve` binary does not link the bed, the
// bench or toxiproxy (cmd/triage's TestServeDoesNotLinkTheBed).
//
// Its tests are the integration tests of the whole queue: a real node
// against a spawned mariadbd and an embedded NATS server, driven through
// the gRPC and JSON APIs, including the model-based test against
// deploy/queuemodel.
package node
