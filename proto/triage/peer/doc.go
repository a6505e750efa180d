// Package peer is the Go side of the protocol Triage's roles speak to each
// other over NATS, beside the messages generated in peer/v1: the subjects
// and bucket names they meet on, the limits a reply keeps to, the errors
// one role reports to another, and the conversion of a delivered item back
// into what the shard needs to undo its delivery.
//
// It is a leaf: routing, enqueuer and dequeuer import it (and the store),
// never each other, so a role can change its insides without the others
// following. A name here is a wire contract: processes of different
// versions must agree on it during a rolling upgrade.
package peer
