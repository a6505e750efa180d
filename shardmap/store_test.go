package shardmap_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/triage-queue/triage/cmd/triage/natsserver/natstest"
	"github.com/triage-queue/triage/shardmap"
)

// tenants is a one-region map of n namespaces, each with a topic config.
func tenants(t *testing.T, n int) *shardmap.Map {
	t.Helper()
	m := shardmap.Map{Version: 1, Regions: []string{"a"}, Shards: []shardmap.Shard{{ID: 1, HomeRegion: "a", Primary: "db1:3306"}, {ID: 2, HomeRegion: "a", Primary: "db2:3306"}}}
	for i := range n {
		m.Namespaces = append(m.Namespaces, shardmap.Namespace{Name: fmt.Sprintf("t.%d", i), Topics: map[string]shardmap.TopicConfig{"jobs": {MaxAttempts: 3}}})
	}
	out, err := shardmap.New(m)
	require.NoError(t, err)
	return out
}

// watched runs Watch into a new holder serving m until the test ends.
func watched(t *testing.T, js jetstream.JetStream, kv jetstream.KeyValue, m *shardmap.Map) *shardmap.Holder {
	t.Helper()
	h := shardmap.NewHolder(m)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		shardmap.Watch(ctx, js, kv, h, slog.New(slog.NewTextHandler(io.Discard, nil)))
	}()
	return h
}

// revisions returns each namespace key's latest revision.
func revisions(t *testing.T, kv jetstream.KeyValue, m *shardmap.Map) map[string]uint64 {
	t.Helper()
	out := map[string]uint64{}
	for _, ns := range m.Namespaces {
		e, err := kv.Get(t.Context(), shardmap.NamespaceKey(ns.Name))
		require.NoError(t, err)
		out[ns.Name] = e.Revision()
	}
	return out
}

// TestPublishWritesOnlyTheChangedNamespace: a namespace update rewrites
// that namespace's key and the head, no other namespace's value, and a
// watching process and a fresh load both serve it.
func TestPublishWritesOnlyTheChangedNamespace(t *testing.T) {
	ctx := t.Context()
	_, js := natstest.JetStream(t)
	kv, err := shardmap.OpenBucket(ctx, js, 1)
	require.NoError(t, err)
	v1, err := shardmap.Bootstrap(ctx, kv, tenants(t, 20))
	require.NoError(t, err)
	h := watched(t, js, kv, v1)
	before := revisions(t, kv, v1)

	v2 := withDepth(t, v1, "t.7", 77)
	require.NoError(t, shardmap.Publish(ctx, kv, v1, v2))

	after := revisions(t, kv, v2)
	for name, rev := range before {
		if name == "t.7" {
			require.Greater(t, after[name], rev, "the changed namespace was written")
		} else {
			require.Equal(t, rev, after[name], "namespace %s was written again", name)
		}
	}
	require.Eventually(t, func() bool { return h.Current().Version == 2 }, 5*time.Second, 10*time.Millisecond)
	for _, m := range []*shardmap.Map{h.Current(), mustLoad(t, kv)} {
		got, err := m.Namespace("t.7")
		require.NoError(t, err)
		require.EqualValues(t, 77, got.MaxDepth)
		require.Len(t, m.Namespaces, 20)
		other, err := m.Namespace("t.8")
		require.NoError(t, err)
		require.Equal(t, 3, other.Topic("jobs").MaxAttempts)
	}

	// A publish based on the map Publish returned needs no read: it
	// compare-and-sets on the revision it wrote.
	require.NoError(t, shardmap.Publish(ctx, kv, v2, withDepth(t, v2, "t.7", 78)))
	require.Eventually(t, func() bool { return h.Current().Version == 3 }, 5*time.Second, 10*time.Millisecond)
}

// withDepth is the next version of m with namespace name's max_depth set.
func withDepth(t *testing.T, m *shardmap.Map, name string, depth int64) *shardmap.Map {
	t.Helper()
	ns, err := m.Namespace(name)
	require.NoError(t, err)
	c := *ns
	c.MaxDepth = depth
	next, err := m.WithNamespace(c)
	require.NoError(t, err)
	return next
}

func mustLoad(t *testing.T, kv jetstream.KeyValue) *shardmap.Map {
	t.Helper()
	m, err := shardmap.Load(t.Context(), kv)
	require.NoError(t, err)
	return m
}

// TestALosingPublishLeavesTheNamedValue: two changes of one namespace
// based on the same map; the second loses the head's compare-and-set, but
// its namespace value was written first. Every reader still builds the
// map the head names (the first change), not the latest value of the key.
func TestALosingPublishLeavesTheNamedValue(t *testing.T) {
	ctx := t.Context()
	_, js := natstest.JetStream(t)
	kv, err := shardmap.OpenBucket(ctx, js, 1)
	require.NoError(t, err)
	v1, err := shardmap.Bootstrap(ctx, kv, tenants(t, 3))
	require.NoError(t, err)
	h := watched(t, js, kv, v1)
	require.NoError(t, shardmap.Publish(ctx, kv, v1, withDepth(t, v1, "t.1", 10)))
	require.ErrorIs(t, shardmap.Publish(ctx, kv, v1, withDepth(t, v1, "t.1", 20)), shardmap.ErrConflict)
	latest, err := kv.Get(ctx, shardmap.NamespaceKey("t.1"))
	require.NoError(t, err)
	require.Contains(t, string(latest.Value()), `"max_depth":20`, "the losing publish wrote its value")

	require.Eventually(t, func() bool { return h.Current().Version == 2 }, 5*time.Second, 10*time.Millisecond)
	fresh := watched(t, js, kv, v1) // its watch starts with the losing value as the key's latest
	require.Eventually(t, func() bool { return fresh.Current().Version == 2 }, 5*time.Second, 10*time.Millisecond)
	for _, m := range []*shardmap.Map{h.Current(), fresh.Current(), mustLoad(t, kv)} {
		ns, err := m.Namespace("t.1")
		require.NoError(t, err)
		require.EqualValues(t, 10, ns.MaxDepth)
	}
}

// TestAMapBeyondOneMessage: the map as a whole may outgrow one NATS
// message (the head names its namespaces, each its own value); a single
// namespace that outgrows one is refused as ErrTooLarge, saying what was
// too large, not as a conflict (which callers retry), and the stored map
// stays.
func TestAMapBeyondOneMessage(t *testing.T) {
	ctx := t.Context()
	nc, js := natstest.JetStream(t)
	kv, err := shardmap.OpenBucket(ctx, js, 1)
	require.NoError(t, err)
	base := tenants(t, 0)
	v1, err := shardmap.Bootstrap(ctx, kv, base)
	require.NoError(t, err)
	h := watched(t, js, kv, v1)

	// 64 topic configs with long names make each namespace about 10 KB.
	big := shardmap.Map{Version: 2, Regions: base.Regions, Shards: base.Shards}
	for n := range int(nc.MaxPayload()/8_000) + 20 {
		ns := shardmap.Namespace{Name: fmt.Sprintf("tenant-%d", n), Topics: map[string]shardmap.TopicConfig{}}
		for k := range 64 {
			ns.Topics[fmt.Sprintf("%0120d", k)] = shardmap.TopicConfig{Policy: shardmap.PolicyStrict}
		}
		big.Namespaces = append(big.Namespaces, ns)
	}
	v2, err := shardmap.New(big)
	require.NoError(t, err)
	data, err := v2.Marshal()
	require.NoError(t, err)
	require.Greater(t, int64(len(data)), nc.MaxPayload(), "the map outgrows one message")
	require.NoError(t, shardmap.Publish(ctx, kv, v1, v2))
	require.Len(t, mustLoad(t, kv).Namespaces, len(big.Namespaces))
	require.Eventually(t, func() bool { return h.Current().Version == 2 }, 10*time.Second, 10*time.Millisecond)
	require.Len(t, h.Current().Namespaces, len(big.Namespaces))

	huge := shardmap.Namespace{Name: "huge", Topics: map[string]shardmap.TopicConfig{}}
	for k := range int(nc.MaxPayload()/120) + 10 {
		huge.Topics[fmt.Sprintf("%0120d", k)] = shardmap.TopicConfig{Policy: shardmap.PolicyStrict}
	}
	v3, err := v2.WithNamespace(huge)
	require.NoError(t, err)
	err = shardmap.Publish(ctx, kv, v2, v3)
	require.ErrorIs(t, err, shardmap.ErrTooLarge)
	require.NotErrorIs(t, err, shardmap.ErrConflict)
	require.ErrorContains(t, err, "more than one NATS message carries")
	cur, err := shardmap.LoadCurrent(ctx, kv, v2)
	require.NoError(t, err)
	require.Equal(t, uint64(2), cur.Version)
}

// TestAWholeStoredMapIsRead: a store that holds the map as one value
// (written before namespaces had keys of their own) is loaded and
// watched as it is, and the next publish over it writes the split form.
func TestAWholeStoredMapIsRead(t *testing.T) {
	ctx := t.Context()
	_, js := natstest.JetStream(t)
	kv, err := shardmap.OpenBucket(ctx, js, 1)
	require.NoError(t, err)
	v1 := tenants(t, 4)
	whole, err := v1.Marshal()
	require.NoError(t, err)
	_, err = kv.Create(ctx, shardmap.Key, whole)
	require.NoError(t, err)
	stored, err := shardmap.Bootstrap(ctx, kv, tenants(t, 1))
	require.NoError(t, err)
	require.Len(t, stored.Namespaces, 4, "the stored map wins over the bootstrap one")
	h := watched(t, js, kv, stored)

	v2 := withDepth(t, stored, "t.2", 5)
	require.NoError(t, shardmap.Publish(ctx, kv, stored, v2))
	head, err := kv.Get(ctx, shardmap.Key)
	require.NoError(t, err)
	require.False(t, strings.Contains(string(head.Value()), `"topics"`), "the head holds no namespace configs: %s", head.Value())
	require.Eventually(t, func() bool { return h.Current().Version == 2 }, 5*time.Second, 10*time.Millisecond)
	for _, m := range []*shardmap.Map{h.Current(), mustLoad(t, kv)} {
		require.Len(t, m.Namespaces, 4)
		got, err := m.Namespace("t.2")
		require.NoError(t, err)
		require.EqualValues(t, 5, got.MaxDepth)
	}
}
