package regions

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/triage-queue/triage/cmd/triage/natsserver/natstest"
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

// TestHistorySurvivesLeaderChange: a controller's events reach the history
// stream, and another controller that becomes leader loads them, in time
// order with its own and without repeats, so the console's history keeps
// the steps of the leader before.
func TestHistorySurvivesLeaderChange(t *testing.T) {
	nc, js := natstest.JetStream(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	_, err := OpenHistory(ctx, js, 1)
	require.NoError(t, err)
	ctl := func(id string) *Controller {
		c := &Controller{cfg: Config{ID: id, NC: nc, JS: js}, log: slog.New(slog.NewTextHandler(io.Discard, nil)), hist: make(chan Event, historyBacklog)}
		go c.persist(ctx)
		return c
	}
	a := ctl("ctl-a")
	for _, step := range []string{"detected", "fenced", "promoted", "published"} {
		a.event(1, step, "by a")
	}
	stored := func(n uint64) func() bool {
		return func() bool {
			s, err := js.Stream(ctx, HistoryStream)
			return err == nil && s.CachedInfo().State.Msgs == n
		}
	}
	require.Eventually(t, stored(4), 10*time.Second, 20*time.Millisecond)

	b := ctl("ctl-b")
	b.event(2, "detected", "by b")
	require.Eventually(t, stored(5), 10*time.Second, 20*time.Millisecond)
	b.loadHistory(ctx)
	var got []string
	for _, e := range b.Events() {
		got = append(got, fmt.Sprint(e.Shard, " ", e.Step, " ", e.Details))
	}
	require.Equal(t, []string{"1 detected by a", "1 fenced by a", "1 promoted by a", "1 published by a", "2 detected by b"}, got)

	// a loads it back: nothing doubled.
	a.loadHistory(ctx)
	require.Len(t, a.Events(), 5)
	require.Equal(t, "by b", a.Events()[4].Details)
}

// TestHistoryLoadHoldsNoFailover: a new leader's history read, which can
// hang while JetStream elects stream leaders (a region died with the old
// controller leader), does not hold the failover lock. It did, and a
// region-down drill's new leader fenced the dead primary only when the
// read gave up, 10 s after detecting it.
func TestHistoryLoadHoldsNoFailover(t *testing.T) {
	nc, _ := natstest.JetStream(t)
	// A JetStream API nobody answers: the read hangs as it does while the
	// history stream has no leader.
	const prefix = "hung.API"
	asked := make(chan struct{})
	var once sync.Once
	sub, err := nc.Subscribe(prefix+".>", func(*nats.Msg) { once.Do(func() { close(asked) }) })
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	js, err := jetstream.NewWithAPIPrefix(nc, prefix)
	require.NoError(t, err)
	c := &Controller{cfg: Config{ID: "ctl-new", NC: nc, JS: js}, log: slog.New(slog.NewTextHandler(io.Discard, nil))}

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.loadHistory(ctx)
	}()
	select {
	case <-asked:
	case <-time.After(10 * time.Second):
		t.Fatal("the history read never asked JetStream")
	}
	// The read is in flight: a failover must be able to start now.
	locked := c.busy.TryLock()
	if locked {
		c.busy.Unlock()
	}
	cancel()
	<-done
	require.True(t, locked, "the history read holds the failover lock")
}
