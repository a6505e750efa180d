package dequeuer

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"

	"github.com/triage-queue/triage/cmd/triage/natsserver/natstest"
	"github.com/triage-queue/triage/deploy/mariadb/mariadbtest"
	"github.com/triage-queue/triage/shardmap"
)

// TestAdoptsOnlyAMigratedShard: a dequeuer adopts a shard of a region
// with no dequeuers only once the shard's schema is current. When regions
// start together, one region's dequeuer used to adopt another's shard
// before that region's node had migrated it, and swept and read tables
// that did not exist yet.
func TestAdoptsOnlyAMigratedShard(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	nc, js := natstest.JetStream(t)
	dsn, err := mysql.ParseDSN(mariadbtest.Database(t))
	require.NoError(t, err)
	maps := shardmap.NewHolder(dbShardMap(t, 1, "a", dsn))
	pool := shardmap.NewPool(shardmap.Credentials{User: dsn.User, Password: dsn.Passwd})
	defer pool.Close()
	s, err := New(Config{Region: "b", ID: "deq-b", Maps: maps, Pool: pool, NC: nc, JS: js,
		OwnerTTL: time.Second, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	require.NoError(t, s.Start(ctx))
	defer s.Stop()

	// Region a has no dequeuer, and shard 1 has no schema yet: claims come
	// every 250 ms, and none may take it.
	time.Sleep(1500 * time.Millisecond)
	require.False(t, s.owner.owns(1), "adopted a shard with no tables")

	migrateDB(t, dsn)
	require.Eventually(t, func() bool { return s.owner.owns(1) }, 5*time.Second, 20*time.Millisecond,
		"the migrated shard of a region without dequeuers is adopted")
}
