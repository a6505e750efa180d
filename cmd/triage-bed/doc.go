// Command triage-bed is Triage's development and test binary: the local
// bed (up, down), failover drills against it (drill) and the benchmarks
// (bench). `make up`, `make down`, `make drill` and `make bench` run it
// from .bin/; the e2e drill tests exec it as a user would.
//
// It is a binary of its own so that the production binary, cmd/triage,
// links none of what it needs: the bed (deploy/bed, which spawns mariadbd
// and NATS servers), the WAN proxies (deploy/wan, toxiproxy) and the
// bench. cmd/triage's TestServeDoesNotLinkTheBed holds that line. The bed
// itself runs the production node (cmd/triage/node) and sets its servers
// up with the production provisioning (cmd/triage/provision), so it
// differs from a deployment in where the processes run, not in how they
// are set up.
//
// The command line follows the conventions of cmd/internal/cli, shared
// with triage: exit status 2 for a usage error, `version` and
// `completion`.
package main
