package shardmap

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/triage-queue/triage/cmd/triage/natsserver"
	"github.com/triage-queue/triage/deploy/freeport"
	"github.com/triage-queue/triage/deploy/wan"
)

func freePort(t *testing.T) int {
	p, err := freeport.Pick()
	require.NoError(t, err)
	return p
}

// cluster3 starts three clustered NATS servers n0, n1, n2.
func cluster3(t *testing.T) []*server.Server { return cluster3WAN(t, 0) }

// cluster3WAN starts three clustered NATS servers n0, n1, n2 whose routes
// run through WAN links delaying each direction by latency (none when 0),
// as the bed's do.
func cluster3WAN(t *testing.T, latency time.Duration) []*server.Server {
	ports := []int{freePort(t), freePort(t), freePort(t)}
	routes := make([][]string, 3)
	var wnet *wan.Net
	if latency > 0 {
		wnet = wan.New(slog.New(slog.NewTextHandler(io.Discard, nil)))
		t.Cleanup(wnet.Close)
	}
	for i := range ports {
		for j, p := range ports {
			addr := fmt.Sprintf("127.0.0.1:%d", p)
			if wnet != nil {
				if i == j {
					continue
				}
				var err error
				addr, err = wnet.Link(fmt.Sprintf("n%d>n%d", i, j), fmt.Sprintf("n%d", i), fmt.Sprintf("n%d", j), addr, latency)
				require.NoError(t, err)
			}
			routes[i] = append(routes[i], "nats://"+addr)
		}
	}
	srvs := make([]*server.Server, 3)
	for i := range srvs {
		cfg := natsserver.Config{Name: fmt.Sprintf("n%d", i), StoreDir: t.TempDir(),
			ClusterName: "c", ClusterPort: ports[i], Routes: routes[i]}
		if wnet != nil {
			// Advertise nothing reachable, so the WAN links stay the only
			// routes (see deploy/bed's unreachableRoute).
			cfg.ClusterAdvertise, cfg.NoAdvertise = "127.0.0.1:1", true
		}
		s, err := natsserver.Start(cfg)
		require.NoError(t, err)
		t.Cleanup(s.Shutdown)
		srvs[i] = s
	}
	for _, s := range srvs {
		require.Eventually(t, func() bool { return s.JetStreamIsCurrent() && s.NumRoutes() >= 2 }, 30*time.Second, 50*time.Millisecond)
	}
	return srvs
}

// TestConfirmStopsInAMinority: a process whose NATS server is cut off from
// the rest of the cluster must stop trusting its map within MaxStaleness,
// whether that server was the map stream's leader (a cut-off leader keeps
// believing it leads for many seconds) or a follower (which answers direct
// gets from its stale copy).
func TestConfirmStopsInAMinority(t *testing.T) {
	for _, tc := range []struct {
		name   string
		leader bool
	}{{"follower", false}, {"leader", true}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			srvs := cluster3(t)
			nc, err := nats.Connect(srvs[0].ClientURL())
			require.NoError(t, err)
			t.Cleanup(nc.Close)
			js, err := jetstream.New(nc)
			require.NoError(t, err)
			var kv jetstream.KeyValue
			require.Eventually(t, func() bool {
				kv, err = OpenBucket(ctx, js, 3)
				return err == nil
			}, 30*time.Second, 100*time.Millisecond)
			m, err := Parse([]byte(twoShards))
			require.NoError(t, err)
			_, err = Bootstrap(ctx, kv, m)
			require.NoError(t, err)

			// Put (or keep) the stream's leader away from, or on, n0.
			stream, err := js.Stream(ctx, "KV_"+Bucket)
			require.NoError(t, err)
			require.Eventually(t, func() bool {
				info, err := stream.Info(ctx)
				if err != nil || info.Cluster == nil || info.Cluster.Leader == "" {
					return false
				}
				if (info.Cluster.Leader == "n0") == tc.leader {
					return true
				}
				_, _ = nc.Request("$JS.API.STREAM.LEADER.STEPDOWN.KV_"+Bucket, nil, time.Second)
				return false
			}, 60*time.Second, 500*time.Millisecond)

			h := NewHolder(m)
			wctx, cancel := context.WithCancel(context.Background())
			t.Cleanup(cancel)
			go Watch(wctx, js, kv, h, slog.New(slog.NewTextHandler(io.Discard, nil)))
			// Fresh while the cluster is whole (shard 3 has a replica, so it
			// is the one staleness fences).
			for range 10 {
				time.Sleep(MaxStaleness / 4)
				require.NoError(t, h.Writable(3))
			}

			srvs[1].Shutdown()
			srvs[2].Shutdown()
			cut := time.Now()
			require.Eventually(t, func() bool { return h.Writable(3) != nil }, MaxStaleness+3*time.Second, 20*time.Millisecond,
				"n0 is in a minority; its process must stop confirming the map")
			t.Logf("stale after %s", time.Since(cut).Round(time.Millisecond))
			require.ErrorIs(t, h.Writable(3), ErrNotWritable)
		})
	}
}

// TestConfirmUnderContention: many processes probe the same map key at
// once, as every node of a bed does. On a replicated stream the leader
// refuses a conditional write while another one on the same key is in
// flight; that refusal must not leave a process unconfirmed (it did: each
// collision was taken for a newer map, and a loaded bed's nodes stayed
// unconfirmed for many seconds and refused every write).
func TestConfirmUnderContention(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	srvs := cluster3WAN(t, 40*time.Millisecond) // a commit takes a WAN round trip, as on the bed
	var kv jetstream.KeyValue
	var m *Map
	const procs = 12
	holders := make([]*Holder, procs)
	wctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	for i := range holders {
		nc, err := nats.Connect(srvs[i%3].ClientURL())
		require.NoError(t, err)
		t.Cleanup(nc.Close)
		js, err := jetstream.New(nc)
		require.NoError(t, err)
		if kv == nil {
			require.Eventually(t, func() bool {
				kv, err = OpenBucket(ctx, js, 3)
				return err == nil
			}, 30*time.Second, 100*time.Millisecond)
			m, err = Parse([]byte(twoShards))
			require.NoError(t, err)
			_, err = Bootstrap(ctx, kv, m)
			require.NoError(t, err)
		}
		pkv, err := js.KeyValue(ctx, Bucket)
		require.NoError(t, err)
		holders[i] = NewHolder(m)
		go Watch(wctx, js, pkv, holders[i], slog.New(slog.NewTextHandler(io.Discard, nil)))
	}
	for i, h := range holders {
		require.NoError(t, h.WaitConfirmed(ctx), "holder %d", i)
	}
	// Every process must stay confirmed, round after round.
	deadline := time.Now().Add(4 * MaxStaleness)
	for time.Now().Before(deadline) {
		for i, h := range holders {
			require.NoError(t, h.Writable(3), "holder %d", i)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
