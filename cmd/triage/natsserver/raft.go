package natsserver

import (
	"sync"
	"time"
	_ "unsafe" // go:linkname

	_ "github.com/nats-io/nats-server/v2/server" // the variables below
)

// nats-server's Raft timing. A JetStream stream's leader that dies is
// replaced only after a follower's election timeout, a random 4-9 s by
// default, and a leader cut into a minority notices the lost quorum only
// after 10 s. Triage's control plane sits on those streams: the shard map
// bucket (every writer's freshness probe commits there, MaxStaleness 2 s),
// the controller's lease and the enqueue buffers. So when a region dies
// with the leaders of those streams, every region stops writing until the
// elections end, and a region-down or partition failover cannot begin
// before them: the drills measured 5-15 s, against a 10 s target, with
// most of it waiting for elections.
//
// nats-server offers no option for these; they are package variables its
// own test suite sets (jetstream_helpers_test.go) for the same reason.
// The embedded servers set them through go:linkname to the values that
// suite runs its clusters with, but with a heartbeat of 250 ms rather than
// 50 ms: six missed heartbeats start an election, which a loaded 2-core
// machine under -race does not miss by accident, and the heartbeats of
// every stream and consumer group cost a quarter of what 50 ms would. A
// nats-server upgrade that renames one fails the build at link time, not
// silently.
//
// They are process-wide: every embedded server of the process (the
// process bed runs all three regions' servers in one) uses them.
var (
	//go:linkname raftHeartbeat github.com/nats-io/nats-server/v2/server.hbInterval
	raftHeartbeat time.Duration
	//go:linkname raftMinElection github.com/nats-io/nats-server/v2/server.minElectionTimeout
	raftMinElection time.Duration
	//go:linkname raftMaxElection github.com/nats-io/nats-server/v2/server.maxElectionTimeout
	raftMaxElection time.Duration
	//go:linkname raftLostQuorum github.com/nats-io/nats-server/v2/server.lostQuorumInterval
	raftLostQuorum time.Duration
	//go:linkname raftLostQuorumCheck github.com/nats-io/nats-server/v2/server.lostQuorumCheck
	raftLostQuorumCheck time.Duration
)

// The values set (see above).
const (
	RaftHeartbeat       = 250 * time.Millisecond
	RaftMinElection     = 1500 * time.Millisecond
	RaftMaxElection     = 3500 * time.Millisecond
	RaftLostQuorum      = 5 * time.Second
	RaftLostQuorumCheck = 4 * RaftHeartbeat
)

var raftOnce sync.Once

// tuneRaft sets the Raft timing once, before the process's first server
// starts (the server's goroutines read the variables unsynchronised).
func tuneRaft() {
	raftOnce.Do(func() {
		raftHeartbeat, raftMinElection, raftMaxElection = RaftHeartbeat, RaftMinElection, RaftMaxElection
		raftLostQuorum, raftLostQuorumCheck = RaftLostQuorum, RaftLostQuorumCheck
	})
}
