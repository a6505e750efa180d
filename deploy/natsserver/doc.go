// Package natsserver runs an embedded NATS server with JetStream, for the
// local bed and for tests. Triage uses NATS as a buffer and control plane,
// never as the system of record; see the README for the fsync caveat.
//
// Config.Auth makes it require logins (auth.go): one for Triage's own
// processes, allowed the internal subjects (triage.>, JetStream, KV,
// replies), and client logins denied exactly those. Publishing on
// triage.> is how the roles hand each other enqueue batches, dequeue
// requests and commits, trusted as validated and authorized by a router;
// only Triage may do it. Permissions are per user in the global account,
// not separate accounts, because JetStream's streams and buckets must stay
// where every Triage process sees them.
package natsserver
