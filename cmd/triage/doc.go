// Command triage is Triage's binary: the service roles (serve), the
// local bed (up, down), failover drills and benchmarks, the verbs the
// compose bed's containers run (nats, bootstrap, probe), and client verbs
// that talk to a router.
//
// The command line is built on cobra through cmd/internal/cli, which
// gives every verb the same exit statuses, usage layout and flag errors,
// and adds `version` and `completion`. The client verbs share one
// prologue (clientFlags.runE): the common flags (--addr or TRIAGE_ADDR,
// --namespace, --region, --json, --timeout), the dial, and the mapping of
// what a verb returns to an exit status.
package main
