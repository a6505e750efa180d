package regions

import (
	"context"
	"encoding/json"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/triage-queue/triage/proto/triage/peer"
)

// The failover history outlives the controller that made it: every event
// a controller records is also published to HistoryStream (a replicated
// stream that keeps the last MaxEvents), and a controller that becomes
// leader loads it, so the console's history (EventsSubject) keeps the
// steps of the leaders before, e.g. across a region-down drill, which
// moves the leadership with the region. An event the old leader could not
// publish (it was cut off) is missing from it, as its log line is from the
// new leader's log.
const (
	HistoryStream  = "TRIAGE_FAILOVER_HISTORY"
	HistorySubject = "triage.ctl.history"
)

// historyBacklog bounds the events waiting to be published; past it the
// newest are kept in memory only (and logged).
const historyBacklog = 1024

// OpenHistory creates the history stream, or opens it as it is when its
// settings match (peer.EnsureStream: an update on every start raced
// consumer creation inside nats-server).
func OpenHistory(ctx context.Context, js jetstream.JetStream, replicas int) (jetstream.Stream, error) {
	return peer.EnsureStream(ctx, js, jetstream.StreamConfig{
		Name:        HistoryStream,
		Description: "Triage failover steps of every controller leader, the last MaxEvents",
		Subjects:    []string{HistorySubject},
		MaxMsgs:     MaxEvents,
		MaxMsgSize:  64 << 10,
		Discard:     jetstream.DiscardOld,
		Storage:     jetstream.FileStorage,
		Replicas:    max(replicas, 1),
	})
}

// keepHistory opens the history stream, trying again every historyRetry
// until it can or ctx ends, then persists events to it. A controller
// detects and fails over whether or not JetStream can place the stream
// yet (a new cluster: three controllers starting at once timed out
// creating it, and each exited); only its history waits, buffered.
func (c *Controller) keepHistory(ctx context.Context) {
	for attempt := 0; ; attempt++ {
		octx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := OpenHistory(octx, c.cfg.JS, c.cfg.KVReplicas)
		cancel()
		if err == nil {
			if attempt > 0 {
				c.log.Info("failover history stream open", "stream", HistoryStream)
			}
			break
		}
		if attempt == 0 {
			c.log.Warn("failover history stream not open yet; trying again", "stream", HistoryStream, "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(historyRetry):
		}
	}
	c.persist(ctx)
}

// historyRetry is the pause between two attempts to open the history
// stream.
const historyRetry = 2 * time.Second

// persist publishes recorded events to the history stream in order, until
// ctx ends. An event that cannot be published within a minute (no quorum
// for that long) is given up, with a warning.
func (c *Controller) persist(ctx context.Context) {
	for {
		var e Event
		select {
		case <-ctx.Done():
			return
		case e = <-c.hist:
		}
		data, _ := json.Marshal(e)
		for attempt := 0; ; attempt++ {
			pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			_, err := c.cfg.JS.Publish(pctx, HistorySubject, data)
			cancel()
			if err == nil || ctx.Err() != nil {
				break
			}
			if attempt == 30 {
				c.log.Warn("failover event not kept in the history stream", "shard", e.Shard, "step", e.Step, "err", err)
				break
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Second):
			}
		}
	}
}

// loadHistory merges the history stream's events into this controller's,
// in time order. It runs when the controller becomes leader. The read
// holds no lock: a leader elected because a region died finds JetStream
// electing new stream leaders too, and the read can take its whole bound
// (10 s), and holding busy for it would make the new leader's first
// failover wait behind the history for the console. Only the merge takes
// busy, so that no failover's eventsSince sees the list change under it.
func (c *Controller) loadHistory(ctx context.Context) {
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	loaded, err := readHistory(rctx, c.cfg.JS)
	cancel()
	if err != nil {
		c.log.Warn("failover history not loaded; the console shows this leader's steps only", "err", err)
		return
	}
	c.busy.Lock()
	defer c.busy.Unlock()
	c.mu.Lock()
	c.events = mergeEvents(loaded, c.events)
	c.mu.Unlock()
}

// readHistory reads every event the history stream keeps, oldest first.
func readHistory(ctx context.Context, js jetstream.JetStream) ([]Event, error) {
	s, err := js.Stream(ctx, HistoryStream)
	if err != nil {
		return nil, err
	}
	n := s.CachedInfo().State.Msgs
	if n == 0 {
		return nil, nil
	}
	cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		return nil, err
	}
	batch, err := cons.Fetch(int(min(n, MaxEvents)), jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		return nil, err
	}
	var out []Event
	for m := range batch.Messages() {
		var e Event
		if json.Unmarshal(m.Data(), &e) == nil {
			out = append(out, e)
		}
	}
	return out, batch.Error()
}

// mergeEvents returns a and b in time order without repeats (an event of
// this controller is both in memory and in the stream), the last MaxEvents.
func mergeEvents(a, b []Event) []Event {
	all := slices.Concat(a, b)
	slices.SortStableFunc(all, func(x, y Event) int { return x.At.Compare(y.At) })
	all = slices.CompactFunc(all, func(x, y Event) bool {
		return x.At.Equal(y.At) && x.Shard == y.Shard && x.Step == y.Step && x.Details == y.Details
	})
	return all[max(0, len(all)-MaxEvents):]
}
