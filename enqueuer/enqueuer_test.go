package enqueuer

import (
	"context"
	"io"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jmoiron/sqlx"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/triage-queue/triage/deploy/mariadb/mariadbtest"
	"github.com/triage-queue/triage/deploy/natsserver"
	peerv1 "github.com/triage-queue/triage/proto/triage/peer/v1"
	"github.com/triage-queue/triage/schema"
	"github.com/triage-queue/triage/shardmap"
)

func TestMain(m *testing.M) { os.Exit(mariadbtest.Main(m)) }

type bundle struct {
	db  *sqlx.DB
	nc  *nats.Conn
	js  jetstream.JetStream
	svc *Service
}

func setup(t *testing.T) *bundle {
	t.Helper()
	dsn := mariadbtest.Database(t)
	c, err := mysql.ParseDSN(dsn)
	require.NoError(t, err)
	db := sqlx.MustConnect("mysql", dsn)
	t.Cleanup(func() { db.Close() })
	_, err = schema.Migrate(context.Background(), db.DB)
	require.NoError(t, err)
	ns, err := natsserver.Start(natsserver.Config{StoreDir: t.TempDir()})
	require.NoError(t, err)
	t.Cleanup(ns.Shutdown)
	nc, err := nats.Connect(ns.ClientURL())
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	m, err := shardmap.New(shardmap.Map{Version: 1, Regions: []string{"r"}, Shards: []shardmap.Shard{{ID: 1, HomeRegion: "r", Primary: c.Addr, Database: c.DBName}}})
	require.NoError(t, err)
	pool := shardmap.NewPool(shardmap.Credentials{})
	t.Cleanup(func() { pool.Close() })
	svc, err := New(Config{Region: "r", Maps: shardmap.NewHolder(m), Pool: pool, NC: nc, JS: js, AckWait: time.Second,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	require.NoError(t, svc.Start(context.Background()))
	t.Cleanup(svc.Stop)
	return &bundle{db: db, nc: nc, js: js, svc: svc}
}

func (b *bundle) publish(t *testing.T, batches ...*peerv1.EnqueueBatch) {
	t.Helper()
	data, err := proto.Marshal(&peerv1.EnqueueEnvelope{Batches: batches})
	require.NoError(t, err)
	_, err = b.js.Publish(context.Background(), Subject("r", 1), data)
	require.NoError(t, err)
}

func batch(id uint64, topic, reply string, keys ...uint64) *peerv1.EnqueueBatch {
	b := &peerv1.EnqueueBatch{Namespace: "default", Topic: topic, Shard: 1, BatchId: id, ReplySubject: reply, EnqueuedAtUs: time.Now().UnixMicro()}
	for _, k := range keys {
		b.Items = append(b.Items, &peerv1.BufferedItem{Key: k, LeaseMs: 30000, DeliverAfterUs: time.Now().UnixMicro()})
	}
	return b
}

func (b *bundle) count(t *testing.T) int {
	var n int
	require.NoError(t, b.db.Get(&n, "SELECT COUNT(*) FROM items"))
	return n
}

// TestRedeliveredBatchIsNotInsertedAgain: a batch published twice (as a
// JetStream redelivery would) after its items were consumed is recorded as
// applied and not inserted again.
func TestRedeliveredBatchIsNotInsertedAgain(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.publish(t, batch(100, "t", "", 100, 101))
	require.Eventually(t, func() bool { return b.count(t) == 2 }, 10*time.Second, 20*time.Millisecond)
	_, err := b.db.Exec("DELETE FROM items") // consumed and acked
	require.NoError(t, err)
	b.publish(t, batch(100, "t", "", 100, 101))
	b.publish(t, batch(200, "t", "", 200))
	require.Eventually(t, func() bool { return b.count(t) == 1 }, 10*time.Second, 20*time.Millisecond)
	var ids []uint64
	require.NoError(t, b.db.Select(&ids, "SELECT id FROM items"))
	require.Equal(t, []uint64{200}, ids)
}

// TestPoisonBatchIsIsolated: a batch the database refuses (a topic longer
// than its column, which routers never send) is terminated with an answer
// to its router, and the good batches waiting with it are inserted.
func TestPoisonBatchIsIsolated(t *testing.T) {
	t.Parallel()
	b := setup(t)
	replies := make(chan *nats.Msg, 4)
	sub, err := b.nc.ChanSubscribe("reply.*", replies)
	require.NoError(t, err)
	defer sub.Unsubscribe()
	require.NoError(t, b.nc.Flush())
	b.publish(t, batch(1, strings.Repeat("x", 200), "reply.bad", 1), batch(2, "fine", "reply.good", 2, 3))
	b.publish(t, batch(4, "fine", "reply.later", 4))
	got := map[string]*peerv1.EnqueueCommitted{}
	for len(got) < 3 {
		select {
		case m := <-replies:
			var c peerv1.EnqueueCommitted
			require.NoError(t, proto.Unmarshal(m.Data, &c))
			got[m.Subject] = &c
		case <-time.After(15 * time.Second):
			t.Fatalf("replies so far: %v", got)
		}
	}
	require.Contains(t, got["reply.bad"].Error, "refused")
	require.Empty(t, got["reply.good"].Error, "the good batch in the same envelope is inserted")
	require.Empty(t, got["reply.later"].Error)
	var ids []uint64
	require.NoError(t, b.db.Select(&ids, "SELECT id FROM items ORDER BY id"))
	require.Equal(t, []uint64{2, 3, 4}, ids)
}
