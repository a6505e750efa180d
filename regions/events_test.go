package regions

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/triage-queue/triage/deploy/natsserver/natstest"
)

// TestEventsAnswer: the leader's answer on EventsSubject holds its last
// events, oldest first, up to the limit asked (100 by default); a
// controller keeps MaxEvents, and a failover's result still gets exactly
// its own steps once older ones are dropped.
func TestEventsAnswer(t *testing.T) {
	nc, _ := natstest.JetStream(t)
	c := &Controller{cfg: Config{ID: "ctl-test"}, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	sub, err := nc.Subscribe(EventsSubject, c.handleEvents)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	ask := func(limit int) EventsResult {
		t.Helper()
		data, _ := json.Marshal(EventsRequest{Limit: limit})
		msg, err := nc.Request(EventsSubject, data, 5*time.Second)
		require.NoError(t, err)
		var res EventsResult
		require.NoError(t, json.Unmarshal(msg.Data, &res))
		return res
	}
	res := ask(0)
	require.Equal(t, "ctl-test", res.Controller)
	require.Empty(t, res.Events)

	for i := range 150 {
		c.event(uint32(i%3+1), fmt.Sprintf("step-%d", i), "")
	}
	res = ask(0)
	require.Len(t, res.Events, 100)
	require.Equal(t, "step-50", res.Events[0].Step)
	require.Equal(t, "step-149", res.Events[99].Step)
	res = ask(2)
	require.Len(t, res.Events, 2)
	require.Equal(t, "step-148", res.Events[0].Step)
	require.Equal(t, uint32(149%3+1), res.Events[1].Shard)

	c.mu.Lock()
	first := c.nEvents
	c.mu.Unlock()
	for i := 150; i < MaxEvents+200; i++ {
		c.event(1, fmt.Sprintf("step-%d", i), "")
	}
	require.Len(t, c.Events(), MaxEvents, "the oldest events dropped")
	require.Equal(t, fmt.Sprintf("step-%d", 200), c.Events()[0].Step)
	since := c.eventsSince(first)
	require.Len(t, since, MaxEvents, "more steps than kept: all kept ones")
	c.mu.Lock()
	first = c.nEvents
	c.mu.Unlock()
	c.event(2, "fence", "epoch 2")
	c.event(2, "promote", "")
	since = c.eventsSince(first)
	require.Len(t, since, 2)
	require.Equal(t, "fence", since[0].Step)
	require.Equal(t, "promote", since[1].Step)
	require.Len(t, ask(1000).Events, MaxEvents)
}
