package dequeuer

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/triage-queue/triage/cmd/triage/natsserver/natstest"
	"github.com/triage-queue/triage/deploy/mariadb/mariadbtest"
	peerv1 "github.com/triage-queue/triage/proto/triage/peer/v1"
	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
	"github.com/triage-queue/triage/schema/store"
	"github.com/triage-queue/triage/shardmap"
)

// TestServeWithLostAnswerIsHandedBack: a serve whose UPDATE committed but
// whose answer was lost fails the Dequeue, and the item is handed back
// (ready, its attempt taken back) long before its lease would lapse, then
// delivered to the next consumer as its first attempt.
func TestServeWithLostAnswerIsHandedBack(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	nc, js := natstest.JetStream(t)
	dsn, err := mysql.ParseDSN(mariadbtest.Database(t))
	require.NoError(t, err)
	migrateDB(t, dsn)
	maps := shardmap.NewHolder(dbShardMap(t, 1, "a", dsn))
	touched := confirmMaps(ctx, maps)
	defer func() { cancel(); <-touched }()
	pool := shardmap.NewPool(shardmap.Credentials{User: dsn.User, Password: dsn.Passwd})
	defer pool.Close()

	var lose atomic.Bool
	lose.Store(true)
	s, err := New(Config{Region: "a", ID: "deq-a", Maps: maps, Pool: pool, NC: nc, JS: js,
		OwnerTTL: time.Minute, Logger: slog.New(slog.DiscardHandler),
		AfterServe: func(uint32) error {
			if lose.Load() {
				return errors.New("injected: the serve's answer was lost")
			}
			return nil
		}})
	require.NoError(t, err)
	require.NoError(t, s.Start(ctx))
	defer s.Stop()
	require.Eventually(t, func() bool { return s.owner.owns(1) }, 5*time.Second, 10*time.Millisecond)

	db, err := pool.Writer(maps, 1)
	require.NoError(t, err)
	const key = 77
	_, err = store.New(db).ItemInsertBatch(ctx, store.ItemInsertBatchParams{NowUS: time.Now().UnixMicro(),
		Batches: []*peerv1.EnqueueBatch{{Namespace: "default", Topic: "t", Shard: 1, BatchId: 1, EnqueuedAtUs: time.Now().UnixMicro(),
			Items: []*peerv1.BufferedItem{{Key: key, Payload: []byte("x"), LeaseMs: 60_000}}}}})
	require.NoError(t, err)

	req := &triagev1.DequeueRequest{Namespace: "default", Topics: []*triagev1.TopicCount{{Topic: "t", Count: 1}}}
	items, err := s.Dequeue(ctx, req, []uint32{1})
	require.Error(t, err, "the serve's answer was lost")
	require.Empty(t, items)

	row := func() store.Item {
		var it store.Item
		require.NoError(t, sqlx.GetContext(ctx, db, &it, "SELECT id, attempts, lease_token, leased_until FROM items WHERE id = ?", key))
		return it
	}
	require.Eventually(t, func() bool {
		it := row()
		return it.LeaseToken == 0 && !it.LeasedUntil.Valid && it.Attempts == 0
	}, 5*time.Second, 20*time.Millisecond, "handed back with its attempt taken back, not leased to nobody for 60 s: %+v", row())

	lose.Store(false)
	req.Wait = nil
	require.Eventually(t, func() bool {
		items, err = s.Dequeue(ctx, req, []uint32{1})
		require.NoError(t, err)
		return len(items) == 1
	}, 5*time.Second, 50*time.Millisecond)
	require.Equal(t, int32(1), items[0].Attempts, "the lost serve did not count")
}
