// Command triage is Triage's production binary: the service roles
// (serve), a new API key and its keys file entry (key create), the verbs
// the compose bed's containers run (nats, bootstrap, probe), and the
// client verbs that talk to a router (enqueue, dequeue, ack, ...,
// namespace get|put|patch, failover), plus version and completion.
//
// The local bed, the drills and the benchmarks are another binary,
// cmd/triage-bed, so that this one links none of the bed, the bench, the
// WAN proxies (toxiproxy) or the test libraries: TestServeDoesNotLinkTheBed
// holds that line with go list -deps. What the binary is made of lives
// beside it: the composition root that serve runs (cmd/triage/node) and
// the provisioning bootstrap runs (cmd/triage/provision).
//
// # Command line
//
// The command tree is cobra's, with the conventions of cmd/internal/cli
// shared by both binaries (exit statuses, usage layout, flag errors,
// version, completion). The client verbs are a table (clientVerbs): each
// declares its arguments, summary and flags and returns the function that
// makes its call; one prologue (clientFlags.runE) gives every verb the
// common flags (--addr or TRIAGE_ADDR, --namespace/-n, --region, --json,
// --timeout), the dial, and the mapping of what the verb returns to an
// exit status. A verb whose name has a space ("namespace get") is a
// sub-command of a group that holds the common flags, so they may come
// before the sub-command's name. serve and bootstrap share the
// --config/--log-level prologue (cli.ConfigFile).
package main
