package enqueuer

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/triage-queue/triage/proto/triage/peer"
)

// Leader placement. A replicated stream and each of its consumers elect
// their Raft leaders wherever an election happens to land, and across
// regions that costs every enqueue: a router's publish goes to the
// stream's leader and waits for its quorum, and the worker's pull is
// answered by the consumer's leader. With both in another region, a
// single COMMITTED enqueue pays about one WAN round trip more than with
// both on the worker's own server, where only the publish's quorum and
// the insert's semi-sync acknowledgement cross the WAN.
//
// So a worker that drains its own region's stream moves the stream's
// leader and its consumer's to the NATS server it is connected to (the
// routers publishing to a region's stream are mostly that region's). A
// worker draining another region's stream after a failover moves nothing:
// the stream stays with its region's producers, and a stepdown in the
// middle of a failover would only add an election to the outage. The
// move is a leader stepdown with that server as the preferred successor,
// asked only of a leader elsewhere, while the server holds a current
// replica, and at most once per leaderMoveEvery for each group by a
// process: with several NATS servers in a region, workers connected to
// different ones would otherwise trade the leader back and forth; at this
// pace they cost a sub-second stepdown every few minutes. A stepdown is
// the same election JetStream runs after a leader is lost, but planned:
// publishes and pulls in flight are retried by the routers (Nats-Msg-Id)
// and by the client library.

// leaderCheckEvery is how often a worker looks at where its leaders are;
// the first look is leaderCheckFirst after it starts.
const (
	leaderCheckFirst = 2 * time.Second
	leaderCheckEvery = 30 * time.Second
	leaderMoveEvery  = 5 * time.Minute
)

// keepLeadersNear runs placeLeaders until ctx ends.
func (w *worker) keepLeadersNear(ctx context.Context) {
	var moved time.Time // the consumer's leader, last
	t := time.NewTimer(leaderCheckFirst)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		w.placeLeaders(ctx, &moved)
		t.Reset(leaderCheckEvery)
	}
}

// placeLeaders moves the stream's leader and the consumer's to the
// connected server when the worker drains its own region's stream (see
// Leader placement). consumerMoved is when this worker last moved its
// consumer's; the stream's, which every worker of the region shares, is
// the service's, and one worker at a time looks at it, so workers that
// start together do not ask for a stepdown each.
func (w *worker) placeLeaders(ctx context.Context, consumerMoved *time.Time) {
	cfg := w.svc.cfg
	here := cfg.NC.ConnectedServerName()
	if here == "" || w.home != cfg.Region {
		return
	}
	stream := peer.EnqueueStream(w.home)
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	w.svc.streamMu.Lock()
	if s, err := cfg.JS.Stream(cctx, stream); err == nil {
		w.moveLeader(cctx, &w.svc.streamMoved, "stream", s.CachedInfo().Cluster, here,
			"$JS.API.STREAM.LEADER.STEPDOWN."+stream)
	}
	w.svc.streamMu.Unlock()
	if c, err := cfg.JS.Consumer(cctx, stream, w.durable()); err == nil {
		w.moveLeader(cctx, consumerMoved, "consumer", c.CachedInfo().Cluster, here,
			"$JS.API.CONSUMER.LEADER.STEPDOWN."+stream+"."+w.durable())
	}
}

// moveLeader asks the leader of a Raft group (described by cluster) to
// step down in favour of here, when it is elsewhere, here holds a current
// replica, and the group was last moved (*moved) leaderMoveEvery ago or
// more.
func (w *worker) moveLeader(ctx context.Context, moved *time.Time, what string, cluster *jetstream.ClusterInfo, here, subject string) {
	if cluster == nil || cluster.Leader == "" || cluster.Leader == here || time.Since(*moved) < leaderMoveEvery {
		return
	}
	if !slices.ContainsFunc(cluster.Replicas, func(p *jetstream.PeerInfo) bool { return p.Name == here && p.Current && !p.Offline }) {
		return
	}
	*moved = time.Now()
	req, _ := json.Marshal(map[string]any{"placement": map[string]string{"preferred": here}})
	msg, err := w.svc.cfg.NC.RequestWithContext(ctx, subject, req)
	if err == nil {
		err = stepdownError(msg.Data)
	}
	if err != nil {
		w.log.Warn("could not move an enqueue buffer leader to this process's NATS server", "of", what, "from", cluster.Leader, "to", here, "err", err)
		return
	}
	w.log.Info("moved an enqueue buffer leader to this process's NATS server", "of", what, "from", cluster.Leader, "to", here)
}

// stepdownError reads a stepdown response: nil on success.
func stepdownError(data []byte) error {
	var resp struct {
		Success bool `json:"success"`
		Error   *struct {
			Code        int    `json:"code"`
			Description string `json:"description"`
		} `json:"error"`
	}
	if err := json.Unmarshal(data, &resp); err != nil {
		return fmt.Errorf("stepdown response: %w", err)
	}
	if resp.Error != nil {
		return fmt.Errorf("stepdown refused (%d): %s", resp.Error.Code, resp.Error.Description)
	}
	if !resp.Success {
		return fmt.Errorf("stepdown not done: %s", data)
	}
	return nil
}
