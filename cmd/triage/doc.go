// Command triage is Triage's one binary: the service roles (serve), the
// local bed (up, down), failover drills and benchmarks, and client verbs
// that talk to a router.
package main
