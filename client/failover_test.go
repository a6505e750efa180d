package client_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/triage-queue/triage/client"
	"github.com/triage-queue/triage/cmd/triage/node"
	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
)

// cutProxy forwards TCP to a router until cut, which closes the listener
// and every connection at once: what a client sees of a router killed
// with calls in flight.
type cutProxy struct {
	lis      net.Listener
	to       string
	mu       sync.Mutex
	conns    []net.Conn
	accepted atomic.Int32
}

func newCutProxy(t *testing.T, to string) *cutProxy {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &cutProxy{lis: lis, to: to}
	go p.serve()
	t.Cleanup(p.cut)
	return p
}

func (p *cutProxy) addr() string { return p.lis.Addr().String() }

func (p *cutProxy) serve() {
	for {
		in, err := p.lis.Accept()
		if err != nil {
			return
		}
		out, err := net.Dial("tcp", p.to)
		if err != nil {
			in.Close()
			continue
		}
		p.accepted.Add(1)
		p.mu.Lock()
		p.conns = append(p.conns, in, out)
		p.mu.Unlock()
		go func() { _, _ = io.Copy(out, in); out.Close() }()
		go func() { _, _ = io.Copy(in, out); in.Close() }()
	}
}

func (p *cutProxy) cut() {
	p.lis.Close()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetLinger(0) // RST, not a graceful FIN
		}
		c.Close()
	}
	p.conns = nil
}

// A worker whose preferred router is killed under it goes on through the
// other endpoint: nothing enqueued is lost (duplicates are allowed: a lease
// whose ack died with the router is redelivered), and enqueues with dedup
// keys fail over too.
func TestWorkerSurvivesRouterKill(t *testing.T) {
	b := newBed(t, bedOpts{shards: 2})
	// The preferred router runs no dequeuer: killing it kills only a
	// router. The client reaches it through a proxy that can cut every
	// connection at once.
	nb, err := b.StartNode(node.RoleRouter)
	require.NoError(t, err)
	require.NoError(t, b.waitServing(nb.GRPCAddr))
	proxy := newCutProxy(t, nb.GRPCAddr)

	c, err := client.DialEndpoints(t.Context(), []client.Endpoint{{Addr: b.Addr}, {Addr: proxy.addr(), Region: "us-east"}},
		client.WithRegion("us-east"), client.WithRetry(client.RetryPolicy{Initial: 20 * time.Millisecond}))
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })

	var calls counter
	var handled atomic.Int32
	w := newWorker(t, c, client.WorkerConfig{Lease: 2 * time.Second})
	w.Handle("t", func(ctx context.Context, it *client.Item) error {
		calls.add(string(it.Payload))
		handled.Add(1)
		time.Sleep(20 * time.Millisecond)
		return nil
	}, client.TopicOptions{Concurrency: 4})
	require.NoError(t, w.Start(t.Context()))
	stopAtCleanup(t, w)

	const batches, per = 30, 10
	var enqueued []string
	var killedAt int32
	for i := range batches {
		if i == batches/2 {
			require.Eventually(t, func() bool { return handled.Load() >= 20 }, 20*time.Second, 10*time.Millisecond)
			require.Positive(t, proxy.accepted.Load(), "the preferred region's router served the worker")
			proxy.cut()
			nb.Stop()
			killedAt = handled.Load()
		}
		var items []*triagev1.NewItem
		for j := range per {
			p := fmt.Sprintf("%d-%d", i, j)
			enqueued = append(enqueued, p)
			items = append(items, &triagev1.NewItem{Payload: []byte(p), DedupKey: p})
		}
		ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
		_, err := c.Enqueue(ctx, "default", "t", items...)
		cancel()
		require.NoError(t, err, "batch %d", i)
		time.Sleep(20 * time.Millisecond)
	}
	require.Eventually(t, func() bool { return len(calls.get()) == len(enqueued) }, 60*time.Second, 20*time.Millisecond,
		"every item handled through the surviving router")
	require.Greater(t, handled.Load(), killedAt, "progress after the kill")
	got := calls.get()
	for _, p := range enqueued {
		require.GreaterOrEqual(t, got[p], 1, p)
	}
	dups := 0
	for _, n := range got {
		dups += n - 1
	}
	t.Logf("%d items, %d handled after the kill, %d redeliveries", len(enqueued), handled.Load()-killedAt, dups)
	require.Eventually(t, func() bool { return stats(t, c, "t").Total == 0 }, 20*time.Second, 20*time.Millisecond, "all acked")
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	require.NoError(t, w.Stop(ctx))
}
