package dequeuer

import (
	"context"
	"database/sql"
	"log/slog"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"

	"github.com/triage-queue/triage/deploy/mariadb/mariadbtest"
	"github.com/triage-queue/triage/deploy/natsserver/natstest"
	"github.com/triage-queue/triage/schema"
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
	m, err := shardmap.New(shardmap.Map{Version: 1, Regions: []string{"a", "b"},
		Namespaces: []shardmap.Namespace{{Name: "default"}},
		Shards: []shardmap.Shard{{ID: 1, HomeRegion: "a", PrimaryRegion: "a", Primary: dsn.Addr,
			Database: dsn.DBName, Replicas: []string{"127.0.0.1:1"}, ReplicaRegions: []string{"b"}}}})
	require.NoError(t, err)
	maps := shardmap.NewHolder(m)
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

	root := *dsn
	root.MultiStatements = true
	db, err := sql.Open("mysql", root.FormatDSN())
	require.NoError(t, err)
	defer db.Close()
	_, err = schema.Migrate(ctx, db)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return s.owner.owns(1) }, 5*time.Second, 20*time.Millisecond,
		"the migrated shard of a region without dequeuers is adopted")
}
