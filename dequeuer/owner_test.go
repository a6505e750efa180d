package dequeuer

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/triage-queue/triage/deploy/natsserver"
)

// TestOpenOwnersNeverDropsTheTTL: a process that opens the ownership
// bucket without an owner TTL (an enqueuer or router with owner_ttl unset)
// used to set the bucket's TTL to 0, so the claims of a dequeuer killed
// afterwards never expired and no other dequeuer took its shards (seen as
// a flaky e2e kill test).
func TestOpenOwnersNeverDropsTheTTL(t *testing.T) {
	ns, err := natsserver.Start(natsserver.Config{StoreDir: t.TempDir()})
	require.NoError(t, err)
	t.Cleanup(ns.Shutdown)
	nc, err := nats.Connect(ns.ClientURL())
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	_, err = OpenOwners(ctx, js, 2*time.Second, 1)
	require.NoError(t, err)
	kv, err := OpenOwners(ctx, js, 0, 1)
	require.NoError(t, err)
	st, err := kv.Status(ctx)
	require.NoError(t, err)
	require.Equal(t, DefaultOwnerTTL, st.TTL(), "an unset TTL means the default, never no expiry")
}
