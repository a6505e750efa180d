// Package peerv1 holds the generated Go code of the messages Triage's own
// processes exchange over NATS (enqueue envelopes and batches, commit
// answers, forwarded dequeues). They are internal: clients never publish
// them. Edit proto/triage/peer/v1/peer.proto and run `make generate`.
package peerv1
