// Package natsserver runs an embedded NATS server with JetStream, for the
// local bed and for tests. Triage uses NATS as a buffer and control plane,
// never as the system of record; see the README for the fsync caveat.
package natsserver
