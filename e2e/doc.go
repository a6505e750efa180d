// Package e2e drives the real triage binary from outside, as a user and an
// operator would: it builds cmd/triage once, starts `triage serve`
// processes with role configs against spawned mariadbd shards and an
// embedded NATS server, and kills processes with SIGKILL mid-flight to show
// that no acknowledged enqueue is lost.
package e2e
