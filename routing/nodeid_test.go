package routing

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/triage-queue/triage/cmd/triage/natsserver"
	"github.com/triage-queue/triage/cmd/triage/natsserver/natstest"
)

// TestNodeClaimStopsMintingThroughLongOutage: a router cut off from NATS
// for longer than its node number's TTL could keep minting while another
// router claimed the number. Check refuses once the claim is not
// confirmed with a margin before the TTL, and passes again once NATS is
// back and the number re-created.
func TestNodeClaimStopsMintingThroughLongOutage(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	srv, err := natsserver.Start(natsserver.Config{StoreDir: dir})
	require.NoError(t, err)
	port := srv.Addr().(*net.TCPAddr).Port
	url := srv.ClientURL()
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	const ttl = 3 * time.Second
	lost := make(chan error, 1)
	c, err := ClaimNodeWith(context.Background(), js, NodeClaimConfig{Owner: "test", TTL: ttl, Lost: func(err error) { lost <- err }})
	require.NoError(t, err)
	t.Cleanup(func() { c.Release(context.Background()) })
	require.NoError(t, c.Check(time.Now()))

	srv.Shutdown()
	srv.WaitForShutdown()
	require.Eventually(t, func() bool { return c.Check(time.Now()) != nil }, ttl, 20*time.Millisecond,
		"minting must stop before the claim can lapse")
	require.ErrorIs(t, c.Check(time.Now()), ErrUnavailable)
	time.Sleep(ttl) // the outage outlasts the TTL: the key lapses on the server

	srv, err = natsserver.Start(natsserver.Config{StoreDir: dir, Port: port})
	require.NoError(t, err)
	t.Cleanup(srv.Shutdown)
	require.Eventually(t, func() bool { return c.Check(time.Now()) == nil }, 10*time.Second, 20*time.Millisecond,
		"the number is re-created once NATS is back")
	select {
	case err := <-lost:
		t.Fatalf("claim reported lost: %v", err)
	default:
	}
}

// TestNodeClaimKeepsItsOwnLandedRefresh: a refresh whose write landed but
// whose answer was lost left the claim at an old revision; the next
// refresh found the key "taken" and reported its own number lost. The
// claim now recognises its own value (unique per claim) and carries on.
func TestNodeClaimKeepsItsOwnLandedRefresh(t *testing.T) {
	t.Parallel()
	_, js := natstest.JetStream(t)
	const ttl = 3 * time.Second
	lost := make(chan error, 1)
	c, err := ClaimNodeWith(context.Background(), js, NodeClaimConfig{Owner: "router-us-east", TTL: ttl, Lost: func(err error) { lost <- err }})
	require.NoError(t, err)
	t.Cleanup(func() { c.Release(context.Background()) })

	// The claim's own write, landed behind its back (as when the answer
	// to its refresh is lost).
	kv, err := js.KeyValue(context.Background(), NodesBucket)
	require.NoError(t, err)
	e, err := kv.Get(context.Background(), nodeKey(c.Node))
	require.NoError(t, err)
	landed, err := kv.Update(context.Background(), nodeKey(c.Node), e.Value(), e.Revision())
	require.NoError(t, err)

	// The claim refreshes past it and is not lost.
	deadline := time.Now().Add(10 * time.Second)
	for {
		select {
		case err := <-lost:
			t.Fatalf("claim reported lost after its own write: %v", err)
		default:
		}
		e, err := kv.Get(context.Background(), nodeKey(c.Node))
		require.NoError(t, err)
		if e.Revision() > landed {
			require.Equal(t, c.Value, string(e.Value()), "the claim's own refresh")
			require.True(t, strings.HasPrefix(c.Value, "router-us-east/"), c.Value)
			break
		}
		require.True(t, time.Now().Before(deadline), "no refresh after the landed write")
		time.Sleep(20 * time.Millisecond)
	}
	require.NoError(t, c.Check(time.Now()))
}

func mustValue(t *testing.T, kv jetstream.KeyValue, node int) string {
	t.Helper()
	e, err := kv.Get(context.Background(), nodeKey(node))
	require.NoError(t, err)
	return string(e.Value())
}

// cutDialer is a NATS dialer that can cut its client off (failure
// injection): cut closes its connections and refuses new ones until heal.
type cutDialer struct {
	mu    sync.Mutex
	cut   bool
	conns []net.Conn
}

func (d *cutDialer) Dial(network, address string) (net.Conn, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cut {
		return nil, errors.New("cut off by the test")
	}
	c, err := net.Dial(network, address)
	if err == nil {
		d.conns = append(d.conns, c)
	}
	return c, err
}

func (d *cutDialer) setCut(cut bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.cut = cut
	for _, c := range d.conns {
		if cut {
			_ = c.Close()
		}
	}
	d.conns = nil
}

// TestNodeClaimsOfOneRegionNeverShare: two routers of one region wrote the
// same value ("router-<region>"), so a claim could not tell another
// router's key from its own. Router A is cut off past its TTL, router B of
// the same region claims A's number; when A is back it must see the
// number lost and never mint with it again, while B keeps it.
func TestNodeClaimsOfOneRegionNeverShare(t *testing.T) {
	t.Parallel()
	srv, err := natsserver.Start(natsserver.Config{StoreDir: t.TempDir()})
	require.NoError(t, err)
	t.Cleanup(srv.Shutdown)
	dial := &cutDialer{}
	ncA, err := nats.Connect(srv.ClientURL(), nats.SetCustomDialer(dial), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	require.NoError(t, err)
	t.Cleanup(ncA.Close)
	ncB, err := nats.Connect(srv.ClientURL())
	require.NoError(t, err)
	t.Cleanup(ncB.Close)
	jsA, err := jetstream.New(ncA)
	require.NoError(t, err)
	jsB, err := jetstream.New(ncB)
	require.NoError(t, err)

	const ttl = 3 * time.Second
	const node = 7
	lostA := make(chan error, 1)
	cfg := NodeClaimConfig{Owner: "router-us-east", TTL: ttl, firstNode: func() int { return node }}
	cfgA := cfg
	cfgA.Lost = func(err error) { lostA <- err }
	a, err := ClaimNodeWith(context.Background(), jsA, cfgA)
	require.NoError(t, err)
	t.Cleanup(func() { a.Release(context.Background()) })
	require.Equal(t, node, a.Node)

	// A is cut off until its key lapses; B of the same region claims the
	// number.
	dial.setCut(true)
	require.Eventually(t, func() bool { return a.Check(time.Now()) != nil }, ttl, 20*time.Millisecond)
	kvB, err := jsB.KeyValue(context.Background(), NodesBucket)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		_, err := kvB.Get(context.Background(), nodeKey(node))
		return errors.Is(err, jetstream.ErrKeyNotFound)
	}, 3*ttl, 20*time.Millisecond, "A's key lapses")
	lostB := make(chan error, 1)
	cfgB := cfg
	cfgB.Lost = func(err error) { lostB <- err }
	b, err := ClaimNodeWith(context.Background(), jsB, cfgB)
	require.NoError(t, err)
	t.Cleanup(func() { b.Release(context.Background()) })
	require.Equal(t, node, b.Node)
	require.NotEqual(t, a.Value, b.Value, "values are unique per claim")

	// A is back: it must report the number lost, and never mint again.
	dial.setCut(false)
	select {
	case err := <-lostA:
		require.ErrorContains(t, err, "another router holds it")
	case <-time.After(10 * time.Second):
		t.Fatal("A never noticed that B holds its number")
	}
	require.ErrorIs(t, a.Check(time.Now()), ErrUnavailable)
	require.NoError(t, b.Check(time.Now()))
	require.Equal(t, b.Value, mustValue(t, kvB, node))
	select {
	case err := <-lostB:
		t.Fatalf("B reported lost: %v", err)
	default:
	}
}
