package natstest

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/triage-queue/triage/cmd/triage/natsserver"
	"github.com/triage-queue/triage/deploy/freeport"
	"github.com/triage-queue/triage/proto/triage/peer"
)

// JetStream starts an embedded server with JetStream in a temporary
// directory, connects to it, and stops both when t ends. The connection
// replies under peer.InboxPrefix, as Triage's processes do.
func JetStream(t testing.TB) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	ns, err := natsserver.Start(natsserver.Config{StoreDir: t.TempDir()})
	if err != nil {
		t.Fatalf("natstest: %v", err)
	}
	t.Cleanup(ns.Shutdown)
	nc, err := nats.Connect(ns.ClientURL(), nats.CustomInboxPrefix(peer.InboxPrefix))
	if err != nil {
		t.Fatalf("natstest: connect: %v", err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("natstest: %v", err)
	}
	return nc, js
}

// Cluster starts n routed embedded servers with JetStream (named s0…),
// waits until JetStream has a meta leader, and stops them when t ends. It
// returns them with a connection to s0 (replying under peer.InboxPrefix)
// and its JetStream context, closed when t ends. Tests of what a replicated stream or consumer does when a
// server goes (leader elections, lost pull requests) shut one down with
// Shutdown.
func Cluster(t testing.TB, n int) ([]*server.Server, *nats.Conn, jetstream.JetStream) {
	t.Helper()
	ports := make([]int, n)
	routes := make([]string, n)
	for i := range ports {
		p, err := freeport.Pick()
		if err != nil {
			t.Fatalf("natstest: %v", err)
		}
		ports[i] = p
		routes[i] = "nats-route://127.0.0.1:" + strconv.Itoa(ports[i])
	}
	servers := make([]*server.Server, n)
	for i := range servers {
		s, err := natsserver.Start(natsserver.Config{Name: "s" + strconv.Itoa(i), StoreDir: t.TempDir(),
			ClusterName: "natstest", ClusterPort: ports[i], Routes: routes})
		if err != nil {
			t.Fatalf("natstest: %v", err)
		}
		t.Cleanup(s.Shutdown)
		servers[i] = s
	}
	nc, err := nats.Connect(servers[0].ClientURL(), nats.CustomInboxPrefix(peer.InboxPrefix))
	if err != nil {
		t.Fatalf("natstest: connect: %v", err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("natstest: %v", err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := js.AccountInfo(ctx)
		cancel()
		if err == nil {
			return servers, nc, js
		}
		if time.Now().After(deadline) {
			t.Fatalf("natstest: the cluster's JetStream is not ready after 30s: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
