package natsserver_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/triage-queue/triage/cmd/triage/natsserver"
	"github.com/triage-queue/triage/cmd/triage/natsserver/natstest"
)

// TestRaftHeartbeatIsTuned: the embedded servers run nats-server's Raft
// with the heartbeat natsserver sets, so its elections time out at the
// matching 1.5-3.5 s rather than 4-9 s. Seen from the outside: a group
// leader hears from its followers about every RaftHeartbeat, where with
// nats-server's default (1 s) the last contact reaches about a second.
func TestRaftHeartbeatIsTuned(t *testing.T) {
	servers, _, js := natstest.Cluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "RAFT", Subjects: []string{"raft"}, Replicas: 3})
	require.NoError(t, err)
	var leader *server.Server
	require.Eventually(t, func() bool {
		info, err := s.Info(ctx)
		if err != nil || info.Cluster == nil {
			return false
		}
		for _, srv := range servers {
			if srv.Name() == info.Cluster.Leader {
				leader = srv
			}
		}
		return leader != nil
	}, 20*time.Second, 50*time.Millisecond)

	// The most a follower of the stream's group (in the stream's account;
	// the meta group is in $SYS) has been silent, over several heartbeats.
	var longest time.Duration
	seen := 0
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(37 * time.Millisecond) {
		for _, groups := range *leader.Raftz(&server.RaftzOptions{AccountFilter: "$G"}) {
			for _, g := range groups {
				if g.State != "LEADER" {
					continue
				}
				for _, p := range g.Peers {
					if d, err := time.ParseDuration(p.LastSeen); err == nil {
						longest = max(longest, d)
						seen++
					}
				}
			}
		}
	}
	require.Positive(t, seen, "the leader reports no follower")
	t.Logf("longest follower silence %v over %d samples (heartbeat %v)", longest, seen, natsserver.RaftHeartbeat)
	require.Less(t, longest, 3*natsserver.RaftHeartbeat, "followers are heard from about every heartbeat")
}
