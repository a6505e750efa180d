package enqueuer

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jmoiron/sqlx"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/triage-queue/triage/cmd/triage/natsserver/natstest"
	"github.com/triage-queue/triage/deploy/mariadb/mariadbtest"
	"github.com/triage-queue/triage/proto/triage/peer"
	peerv1 "github.com/triage-queue/triage/proto/triage/peer/v1"
	"github.com/triage-queue/triage/schema"
	"github.com/triage-queue/triage/schema/store"
	"github.com/triage-queue/triage/shardmap"
	"github.com/triage-queue/triage/shardmap/shardmaptest"
)

func TestMain(m *testing.M) { os.Exit(mariadbtest.MainCheckingLeaks(m)) }

type bundle struct {
	db  *sqlx.DB
	nc  *nats.Conn
	js  jetstream.JetStream
	svc *Service
}

func setup(t *testing.T) *bundle {
	t.Helper()
	nc, js := natstest.JetStream(t)
	return setupOn(t, nc, js, StreamConfig{}, io.Discard)
}

// setupOn starts an enqueuer for region "r" with one shard on a fresh
// database, on the NATS connection given, logging to logs.
func setupOn(t *testing.T, nc *nats.Conn, js jetstream.JetStream, stream StreamConfig, logs io.Writer, with ...func(*Config)) *bundle {
	t.Helper()
	dsn := mariadbtest.Database(t)
	c, err := mysql.ParseDSN(dsn)
	require.NoError(t, err)
	db := sqlx.MustConnect("mysql", dsn)
	t.Cleanup(func() { db.Close() })
	_, err = schema.Migrate(context.Background(), db.DB)
	require.NoError(t, err)
	m, err := shardmap.New(shardmap.Map{Version: 1, Regions: []string{"r"}, Shards: []shardmap.Shard{{ID: 1, HomeRegion: "r", Primary: c.Addr, Database: c.DBName}}})
	require.NoError(t, err)
	pool := shardmap.NewPool(shardmap.Credentials{})
	t.Cleanup(func() { pool.Close() })
	cfg := Config{Region: "r", Maps: shardmap.NewHolder(m), Pool: pool, NC: nc, JS: js, AckWait: time.Second,
		Stream: stream, Logger: slog.New(slog.NewTextHandler(logs, nil))}
	for _, f := range with {
		f(&cfg)
	}
	svc, err := New(cfg)
	require.NoError(t, err)
	require.NoError(t, svc.Start(context.Background()))
	t.Cleanup(svc.Stop)
	return &bundle{db: db, nc: nc, js: js, svc: svc}
}

func (b *bundle) publish(t *testing.T, batches ...*peerv1.EnqueueBatch) {
	t.Helper()
	data, err := proto.Marshal(&peerv1.EnqueueEnvelope{Batches: batches})
	require.NoError(t, err)
	_, err = b.js.Publish(context.Background(), peer.EnqueueSubject("r", 1), data)
	require.NoError(t, err)
}

func batch(id uint64, topic, reply string, keys ...uint64) *peerv1.EnqueueBatch {
	b := &peerv1.EnqueueBatch{Namespace: "default", Topic: topic, Shard: 1, BatchId: id, ReplySubject: reply, EnqueuedAtUs: time.Now().UnixMicro()}
	for _, k := range keys {
		b.Items = append(b.Items, &peerv1.BufferedItem{Key: k, LeaseMs: 30000, DeliverAfterUs: time.Now().UnixMicro()})
	}
	return b
}

func (b *bundle) count(t *testing.T) int { return b.rowsIn(t, "items") }

// rowsIn counts the rows of table.
func (b *bundle) rowsIn(t *testing.T, table string) int {
	var n int
	require.NoError(t, b.db.Get(&n, "SELECT COUNT(*) FROM "+table))
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
// than its column, which routers never send) is answered to its router as
// refused and kept in refused_items (dead_letters' topic column refuses it
// too), and the good batches waiting with it are inserted.
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
	var kept []uint64
	require.NoError(t, b.db.Select(&kept, "SELECT item_id FROM refused_items"))
	require.Equal(t, []uint64{1}, kept)
}

// TestRefusedBufferedItemIsDeadLettered: a BUFFERED batch was acknowledged
// when JetStream stored it, so an item the items table refuses (metadata
// over the BLOB column) goes to the dead letters with the database's
// reason, and the rest of its batch is inserted; nothing is dropped.
func TestRefusedBufferedItemIsDeadLettered(t *testing.T) {
	t.Parallel()
	b := setup(t)
	bad := batch(10, "t", "", 10, 11, 12)
	bad.Items[1].Metadata = []byte(`{"k":"` + strings.Repeat("x", 70000) + `"}`)
	b.publish(t, bad)
	require.Eventually(t, func() bool { return b.count(t) == 2 }, 10*time.Second, 20*time.Millisecond)
	var ids []uint64
	require.NoError(t, b.db.Select(&ids, "SELECT id FROM items ORDER BY id"))
	require.Equal(t, []uint64{10, 12}, ids)
	var dead struct {
		ID       uint64 `db:"id"`
		Metadata []byte `db:"metadata"`
		Err      string `db:"last_error"`
	}
	require.Eventually(t, func() bool {
		return b.db.Get(&dead, "SELECT id, metadata, last_error FROM dead_letters") == nil
	}, 10*time.Second, 20*time.Millisecond)
	require.Equal(t, uint64(11), dead.ID)
	require.Equal(t, bad.Items[1].Metadata, dead.Metadata)
	require.Contains(t, dead.Err, "Data too long for column 'metadata'")
}

// reply waits for one EnqueueCommitted on replies.
func reply(t *testing.T, replies chan *nats.Msg) *peerv1.EnqueueCommitted {
	t.Helper()
	select {
	case m := <-replies:
		var c peerv1.EnqueueCommitted
		require.NoError(t, proto.Unmarshal(m.Data, &c))
		return &c
	case <-time.After(15 * time.Second):
		t.Fatal("no reply")
		return nil
	}
}

func (b *bundle) replies(t *testing.T, subject string) chan *nats.Msg {
	t.Helper()
	ch := make(chan *nats.Msg, 8)
	sub, err := b.nc.ChanSubscribe(subject, ch)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	require.NoError(t, b.nc.Flush())
	return ch
}

// TestRedeliveredBatchAnswersItsStoredOutcome: a COMMITTED batch whose
// item was a duplicate is answered with the original's ID again when
// JetStream redelivers it (the first answer may have been lost), not
// with zeros that the router would turn into IDs of items that do not
// exist.
func TestRedeliveredBatchAnswersItsStoredOutcome(t *testing.T) {
	t.Parallel()
	b := setup(t)
	replies := b.replies(t, "reply.dup")
	first := batch(1, "t", "", 1)
	first.Items[0].DedupKey = "k"
	b.publish(t, first)
	require.Eventually(t, func() bool { return b.count(t) == 1 }, 10*time.Second, 20*time.Millisecond)
	dup := batch(2, "t", "reply.dup", 2, 3)
	dup.Items[0].DedupKey = "k"
	b.publish(t, dup)
	require.Equal(t, []uint64{1, 0}, reply(t, replies).DuplicateOf)
	b.publish(t, dup) // the redelivery: same bytes
	again := reply(t, replies)
	require.Equal(t, uint64(2), again.BatchId)
	require.Equal(t, []uint64{1, 0}, again.DuplicateOf)
	require.Equal(t, 2, b.count(t))
}

// TestCollidingBatchIDIsNotReportedApplied: a different batch that carries
// an applied batch's ID (two routers minting with one node number) is
// answered with an error, never as applied, and kept.
func TestCollidingBatchIDIsNotReportedApplied(t *testing.T) {
	t.Parallel()
	b := setup(t)
	replies := b.replies(t, "reply.*")
	b.publish(t, batch(5, "t", "reply.a", 5))
	require.Empty(t, reply(t, replies).Error)
	other := batch(5, "t", "reply.b", 5)
	other.Items[0].Payload = []byte("another item")
	b.publish(t, other)
	c := reply(t, replies)
	require.Contains(t, c.Error, "collides")
	other.ReplySubject = "" // BUFFERED: acknowledged already, so kept
	b.publish(t, other)
	require.Eventually(t, func() bool {
		var n int
		return b.db.Get(&n, "SELECT COUNT(*) FROM refused_items WHERE item_id = 5") == nil && n == 1
	}, 10*time.Second, 20*time.Millisecond)
	require.Equal(t, 1, b.count(t))
}

// TestInsertSeesTombstoneOfConcurrentAck: an ack deletes the item holding
// a dedup key and writes its tombstone in one transaction. An insert of a
// new item with that key that runs while the ack is open must come out as
// a duplicate of the acked item, not as a second item: the tombstone is
// read after the insert, with a locking read, instead of before it.
func TestInsertSeesTombstoneOfConcurrentAck(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	first := batch(1, "t", "", 1)
	first.Items[0].DedupKey = "k"
	_, err := store.New(b.db).ItemInsertBatch(ctx, store.ItemInsertBatchParams{Batches: []*peerv1.EnqueueBatch{first}, NowUS: time.Now().UnixMicro()})
	require.NoError(t, err)

	// The ack, held open.
	ackTx, err := b.db.Beginx()
	require.NoError(t, err)
	defer ackTx.Rollback()
	_, err = ackTx.Exec("DELETE FROM items WHERE id = 1")
	require.NoError(t, err)
	_, err = ackTx.Exec(`INSERT INTO dedup_tombstones (namespace, topic, dedup_key, item_id, window_until, expires_at) VALUES ('default', 't', 'k', 1, ?, ?)`,
		time.Now().Add(time.Hour).UnixMicro(), time.Now().Add(time.Hour).UnixMicro())
	require.NoError(t, err)

	second := batch(2, "t", "", 2)
	second.Items[0].DedupKey = "k"
	type result struct {
		out []*peerv1.EnqueueCommitted
		err error
	}
	done := make(chan result, 1)
	go func() {
		out, err := store.New(b.db).ItemInsertBatch(ctx, store.ItemInsertBatchParams{Batches: []*peerv1.EnqueueBatch{second}, NowUS: time.Now().UnixMicro()})
		done <- result{out, err}
	}()
	// Let the insert reach the lock the ack holds (it stays in the process
	// list), then commit the ack.
	require.Eventually(t, func() bool {
		var n int
		err := b.db.Get(&n, `SELECT COUNT(*) FROM information_schema.PROCESSLIST
			WHERE DB = DATABASE() AND INFO LIKE 'INSERT INTO items%' AND TIME_MS > 100`)
		return err == nil && n > 0
	}, 10*time.Second, 5*time.Millisecond)
	require.NoError(t, ackTx.Commit())
	res := <-done
	require.NoError(t, res.err)
	require.Equal(t, []uint64{1}, res.out[0].DuplicateOf, "a duplicate of the acked item")
	require.Equal(t, 0, b.count(t), "no second item holds the key")
}

// TestPruneBatches: enqueue_batches grew forever. Records older than the
// retention go, in bounded statements; recent ones stay.
func TestPruneBatches(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// Older than an hour; younger than the running workers' retention (a
	// day), so only this call removes them.
	old := time.Now().Add(-2 * time.Hour).UnixMicro()
	for id := 1; id <= 5; id++ {
		_, err := b.db.Exec("INSERT INTO enqueue_batches (batch_id, applied_at) VALUES (?, ?)", id, old)
		require.NoError(t, err)
	}
	_, err := b.db.Exec("INSERT INTO enqueue_batches (batch_id, applied_at) VALUES (6, ?)", time.Now().UnixMicro())
	require.NoError(t, err)
	n, err := store.New(b.db).EnqueueBatchPrune(context.Background(), store.EnqueueBatchPruneParams{BeforeUS: time.Now().Add(-time.Hour).UnixMicro(), Limit: 2})
	require.NoError(t, err)
	require.Equal(t, int64(5), n)
	var left []uint64
	require.NoError(t, b.db.Select(&left, "SELECT batch_id FROM enqueue_batches"))
	require.Equal(t, []uint64{6}, left)
}

// TestHeldBatchRetriesOnNewMap: batches held back because their shard is
// fenced go in as soon as a shard map unfencing it arrives, not a backoff
// later: that wait added up to the backoff cap to every failover's
// enqueue RTO. Not parallel: it lengthens the package's backoff cap.
func TestHeldBatchRetriesOnNewMap(t *testing.T) {
	defer func(cap, floor time.Duration) { retryCap, retryFloor = cap, floor }(retryCap, retryFloor)
	retryCap, retryFloor = time.Minute, time.Minute // a retry by backoff would come far too late
	b, maps, shard := holdBatch(t, []string{"r"}, time.Second)
	require.Zero(t, b.count(t))

	shard.Fenced = false
	offer(t, maps, 2, []string{"r"}, shard)
	require.Eventually(t, func() bool { return b.count(t) == 2 }, 10*time.Second, 20*time.Millisecond,
		"the held batch must be inserted once the map unfences its shard, without waiting out the backoff")
}

// TestHandedOverWorkerInsertsWhatItHeld: a worker whose shard's primary
// moves to another region goes on for handOver, so the batches it held
// while the shard was fenced reach the new primary the moment the map
// names it, not after the new region's worker made its consumer (it used
// to be cancelled at once and nak them). Then it stops.
func TestHandedOverWorkerInsertsWhatItHeld(t *testing.T) {
	defer func(cap, floor, h time.Duration) { retryCap, retryFloor, handOver = cap, floor, h }(retryCap, retryFloor, handOver)
	retryCap, retryFloor = time.Minute, time.Minute
	handOver = 6 * time.Second // longer than the insert may take below
	regions := []string{"r", "s"}
	b, maps, shard := holdBatch(t, regions, time.Minute)

	// Failed over to region s, which has no enqueuer here: only the
	// handed-over worker can insert the held batch (a nak would leave it
	// in the buffer, and the ack wait is a minute).
	shard.Fenced, shard.PrimaryRegion = false, "s"
	offer(t, maps, 2, regions, shard)
	require.Eventually(t, func() bool { return b.count(t) == 2 }, 5*time.Second, 20*time.Millisecond,
		"the held batch must be inserted into the new primary by the handed-over worker")
	workers := func() int {
		b.svc.mu.Lock()
		defer b.svc.mu.Unlock()
		return len(b.svc.workers)
	}
	require.Eventually(t, func() bool { return workers() == 0 }, handOver+5*time.Second, 50*time.Millisecond,
		"the worker stops handOver after its shard's primary left the region")
}

// TestStoppedWorkerHandsBackWhatItPulled: a worker that stops hands back
// every batch it pulled, at once: those its insert loop held, those in its
// channel, and those the client library had received but not passed on
// (the pull's buffer), so the next worker inserts them all without waiting
// out the ack wait (a minute here). The pull's buffer is handed back
// through the callback, which naks once the worker stops; this test
// passed before the pull was drained instead of stopped, since the
// callback emptied the buffer before the stop landed. What draining adds
// is for a lost pull (see pull), whose buffer a stop dropped.
func TestStoppedWorkerHandsBackWhatItPulled(t *testing.T) {
	const batches = 12
	b, maps, shard := holdBatch(t, []string{"r"}, time.Minute, func(c *Config) {
		c.MaxBatchMessages, c.InFlight = 4, 1 // a small channel: the pull's buffer fills behind it
	})
	for i := uint64(2); i <= batches; i++ {
		b.publish(t, batch(i, "t", "", 10*i))
	}
	info := func() *jetstream.ConsumerInfo {
		ci, err := consumerInfo(t.Context(), b.js, peer.EnqueueStream("r"), "enq-1")
		require.NoError(t, err)
		return ci
	}
	// Wait until the worker has pulled more than its insert loop (the
	// first batch, held), its channel (4) and the callback blocked on the
	// channel (1) hold: the rest sits in the pull's buffer.
	require.Eventually(t, func() bool { return info().NumAckPending > 6 }, 10*time.Second, 20*time.Millisecond)
	pulled := info().NumAckPending
	b.svc.Stop()

	shard.Fenced = false
	offer(t, maps, 2, []string{"r"}, shard)
	next, err := New(Config{Region: "r", Maps: maps, Pool: b.svc.cfg.Pool, NC: b.nc, JS: b.js, AckWait: time.Minute,
		Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	require.NoError(t, next.Start(context.Background()))
	t.Cleanup(next.Stop)
	require.Eventually(t, func() bool { return b.count(t) == batches+1 }, 10*time.Second, 20*time.Millisecond,
		"every batch (%d pulled by the stopped worker) inserted by the next one well within the ack wait", pulled)
}

// TestWorkerStartsOnAMapThatLandsDuringAReconcile: a map that arrives
// while a reconcile runs (after it read the map) starts the next one at
// once. The loop used to ask for the change channel after each
// reconcile, so such a change waited for the next tick: the worker of a
// shard whose primary just moved into the region started up to a second
// late.
func TestWorkerStartsOnAMapThatLandsDuringAReconcile(t *testing.T) {
	defer func(d time.Duration) { reconcileEvery = d }(reconcileEvery)
	reconcileEvery = time.Minute // no tick within the test
	dsn := mariadbtest.Database(t)
	c, err := mysql.ParseDSN(dsn)
	require.NoError(t, err)
	nc, js := natstest.JetStream(t)
	regions := []string{"r", "s"}
	shard := shardmap.Shard{ID: 1, HomeRegion: "s", PrimaryRegion: "s", Primary: c.Addr, Database: c.DBName}
	away, err := shardmap.New(shardmap.Map{Version: 1, Regions: regions, Shards: []shardmap.Shard{shard}})
	require.NoError(t, err)
	maps := &shardmaptest.LandsDuringRead{Holder: shardmap.NewHolder(away)}
	pool := shardmap.NewPool(shardmap.Credentials{})
	t.Cleanup(func() { pool.Close() })
	svc, err := New(Config{Region: "r", Maps: maps, Pool: pool, NC: nc, JS: js, AckWait: time.Second,
		Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	// The primary moves to r right after Start's reconcile reads the map.
	shard.PrimaryRegion = "r"
	here, err := shardmap.New(shardmap.Map{Version: 2, Regions: regions, Shards: []shardmap.Shard{shard}})
	require.NoError(t, err)
	maps.Arm(here)
	require.NoError(t, svc.Start(context.Background()))
	t.Cleanup(svc.Stop)
	require.Eventually(t, func() bool {
		svc.mu.Lock()
		defer svc.mu.Unlock()
		return len(svc.workers) == 1
	}, 5*time.Second, 20*time.Millisecond, "the worker starts on the change, not at the next tick")
}

// holdBatch starts region r's enqueuer on a fresh database with shard 1
// (primary in r) fenced at epoch 2, publishes one batch of two items and
// waits until the worker holds it, refused by the fenced shard. It
// returns the map holder and the shard, for the test's next map.
func holdBatch(t *testing.T, regions []string, ackWait time.Duration, with ...func(*Config)) (*bundle, *shardmap.Holder, shardmap.Shard) {
	t.Helper()
	dsn := mariadbtest.Database(t)
	c, err := mysql.ParseDSN(dsn)
	require.NoError(t, err)
	db := sqlx.MustConnect("mysql", dsn)
	t.Cleanup(func() { db.Close() })
	_, err = schema.Migrate(context.Background(), db.DB)
	require.NoError(t, err)
	nc, js := natstest.JetStream(t)
	shard := shardmap.Shard{ID: 1, HomeRegion: "r", PrimaryRegion: "r", Primary: c.Addr, Database: c.DBName, Fenced: true, Epoch: 2}
	fenced, err := shardmap.New(shardmap.Map{Version: 1, Regions: regions, Shards: []shardmap.Shard{shard}})
	require.NoError(t, err)
	maps := shardmap.NewHolder(fenced)
	pool := shardmap.NewPool(shardmap.Credentials{})
	t.Cleanup(func() { pool.Close() })
	logs := &syncBuffer{}
	cfg := Config{Region: "r", Maps: maps, Pool: pool, NC: nc, JS: js, AckWait: ackWait,
		Logger: slog.New(slog.NewTextHandler(logs, nil))}
	for _, f := range with {
		f(&cfg)
	}
	svc, err := New(cfg)
	require.NoError(t, err)
	require.NoError(t, svc.Start(context.Background()))
	t.Cleanup(svc.Stop)
	b := &bundle{db: db, nc: nc, js: js, svc: svc}

	b.publish(t, batch(1, "t", "", 1, 2))
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "insert failed") }, 10*time.Second, 20*time.Millisecond,
		"the fenced shard must refuse the first try")
	return b, maps, shard
}

// offer installs a map of version with shard as its only shard.
func offer(t *testing.T, maps *shardmap.Holder, version uint64, regions []string, shard shardmap.Shard) {
	t.Helper()
	m, err := shardmap.New(shardmap.Map{Version: version, Regions: regions, Shards: []shardmap.Shard{shard}})
	require.NoError(t, err)
	require.True(t, maps.Offer(m))
}

// syncBuffer is a log sink the test can read while workers write to it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestWorkerPullsFromANewConsumerLeader: when the server leading a
// replicated shard consumer shuts down, the worker's pull request goes
// with it (the client library hears "server shutdown" and sends no new
// one of its own); the worker must pull again from the next leader, and
// must not stall while the cluster elects it (the consumer cannot even be
// looked up until then). The client library's heartbeats would notice a
// silently lost pull only after two missed beats, a minute with its 30 s
// default expiry; the worker's pulls expire every pullExpiry.
func TestWorkerPullsFromANewConsumerLeader(t *testing.T) {
	t.Parallel()
	servers, nc, js := natstest.Cluster(t, 3)
	logs := &syncBuffer{}
	b := setupOn(t, nc, js, StreamConfig{Replicas: 3}, logs)
	b.publish(t, batch(1, "t", "", 1))
	require.Eventually(t, func() bool { return b.count(t) == 1 }, 20*time.Second, 20*time.Millisecond)

	// Take down the consumer's leader; not the server the worker is
	// connected to, which would make this a reconnect test.
	ctx := context.Background()
	var leader string
	require.Eventually(t, func() bool {
		info, err := js.Consumer(ctx, peer.EnqueueStream("r"), "enq-1")
		if err != nil {
			return false
		}
		ci, err := info.Info(ctx)
		if err != nil || ci.Cluster == nil || ci.Cluster.Leader == "" {
			return false
		}
		if leader = ci.Cluster.Leader; leader == servers[0].Name() {
			_, _ = nc.Request("$JS.API.CONSUMER.LEADER.STEPDOWN."+peer.EnqueueStream("r")+".enq-1", nil, time.Second)
			return false
		}
		return true
	}, 20*time.Second, 100*time.Millisecond, "a consumer leader other than the worker's server")
	for _, s := range servers {
		if s.Name() == leader {
			s.Shutdown()
		}
	}

	// The publish waits out the stream's own election, if it had its
	// leader there too.
	data, err := proto.Marshal(&peerv1.EnqueueEnvelope{Batches: []*peerv1.EnqueueBatch{batch(2, "t", "", 2)}})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		_, err := js.Publish(pctx, peer.EnqueueSubject("r", 1), data, jetstream.WithMsgID("batch-2"))
		return err == nil
	}, 30*time.Second, 100*time.Millisecond)
	require.Eventually(t, func() bool { return b.count(t) == 2 }, 15*time.Second, 50*time.Millisecond,
		"the batch published after the consumer leader went must be inserted once a new leader is elected, not after the pull's heartbeats lapse; logs:\n%s", logs)
}

// TestWorkerRecreatesADeletedConsumer: a deleted consumer (an operator's
// slip, or a stream restored from a backup) ends the worker's pull for
// good in the client library; the worker must make its consumer again
// and go on draining, not sit on a dead subscription.
func TestWorkerRecreatesADeletedConsumer(t *testing.T) {
	t.Parallel()
	nc, js := natstest.JetStream(t)
	logs := &syncBuffer{}
	b := setupOn(t, nc, js, StreamConfig{}, logs)
	b.publish(t, batch(1, "t", "", 1))
	require.Eventually(t, func() bool { return b.count(t) == 1 }, 10*time.Second, 20*time.Millisecond)
	require.NoError(t, js.DeleteConsumer(context.Background(), peer.EnqueueStream("r"), "enq-1"))
	b.publish(t, batch(2, "t", "", 2))
	require.Eventually(t, func() bool { return b.count(t) == 2 }, 15*time.Second, 50*time.Millisecond,
		"the worker must drain again after its consumer was deleted; logs:\n%s", logs)
	require.Contains(t, logs.String(), `level=WARN msg="enqueue buffer pull lost; pulling again"`, "a pull lost after it ran is a warning")
}

// TestStartingWorkerWaitsQuietlyForItsStream: a worker whose first pull
// cannot be made yet (here: it drains another region's stream, which
// does not exist yet; on a clustered bed's start, JetStream electing its
// leaders) says so at Info, not Warn, for pullQuiet, and drains the
// stream once it is there.
func TestStartingWorkerWaitsQuietlyForItsStream(t *testing.T) {
	t.Parallel()
	nc, js := natstest.JetStream(t)
	logs := &syncBuffer{}
	b := setupOn(t, nc, js, StreamConfig{}, logs, func(c *Config) {
		cur := c.Maps.Current()
		shards := slices.Clone(cur.Shards)
		shards[0].HomeRegion, shards[0].PrimaryRegion = "far", "r" // failed over to r
		sm, err := shardmap.New(shardmap.Map{Version: cur.Version, Regions: []string{"r", "far"}, Shards: shards})
		require.NoError(t, err)
		c.Maps = shardmap.NewHolder(sm)
	})
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "enqueue buffer not reachable yet") }, 10*time.Second, 20*time.Millisecond)
	require.NotContains(t, logs.String(), "level=WARN")

	ctx := context.Background()
	_, err := EnsureStream(ctx, js, "far", StreamConfig{})
	require.NoError(t, err)
	data, err := proto.Marshal(&peerv1.EnqueueEnvelope{Batches: []*peerv1.EnqueueBatch{batch(1, "t", "", 1)}})
	require.NoError(t, err)
	_, err = js.Publish(ctx, peer.EnqueueSubject("far", 1), data)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return b.count(t) == 1 }, 10*time.Second, 20*time.Millisecond, "logs:\n%s", logs)
	require.NotContains(t, logs.String(), "level=WARN")
}

// TestWorkerMovesItsLeadersToItsServer: a worker draining its own
// region's stream moves the stream's and its consumer's Raft leaders to
// the NATS server it is connected to, so an enqueue's publish and pull
// cross no WAN (on the three-region bed a single COMMITTED enqueue took
// 170 ms at p50 with both leaders in another region, 128 ms with them
// local), and moves them no more than once per leaderMoveEvery.
func TestWorkerMovesItsLeadersToItsServer(t *testing.T) {
	t.Parallel()
	servers, nc, js := natstest.Cluster(t, 3)
	here, there := servers[0].Name(), servers[1].Name()
	logs := &syncBuffer{}
	b := setupOn(t, nc, js, StreamConfig{Replicas: 3}, logs) // PlaceLeaders off: the test moves them
	b.publish(t, batch(1, "t", "", 1))
	require.Eventually(t, func() bool { return b.count(t) == 1 }, 20*time.Second, 20*time.Millisecond)

	ctx := context.Background()
	stream := peer.EnqueueStream("r")
	leaders := func() string {
		s, err := js.Stream(ctx, stream)
		if err != nil || s.CachedInfo().Cluster == nil {
			return ""
		}
		c, err := js.Consumer(ctx, stream, "enq-1")
		if err != nil || c.CachedInfo().Cluster == nil {
			return ""
		}
		return s.CachedInfo().Cluster.Leader + "," + c.CachedInfo().Cluster.Leader
	}
	moveAway := func() {
		req := []byte(`{"placement":{"preferred":"` + there + `"}}`)
		require.Eventually(t, func() bool {
			if leaders() == there+","+there {
				return true
			}
			_, _ = nc.Request("$JS.API.STREAM.LEADER.STEPDOWN."+stream, req, 5*time.Second)
			_, _ = nc.Request("$JS.API.CONSUMER.LEADER.STEPDOWN."+stream+".enq-1", req, 5*time.Second)
			return false
		}, 20*time.Second, 200*time.Millisecond, "put both leaders on %s", there)
	}
	moveAway()
	w := &worker{svc: b.svc, shard: 1, home: "r", log: b.svc.cfg.Logger}
	var moved time.Time
	w.placeLeaders(ctx, &moved)
	require.Eventually(t, func() bool { return leaders() == here+","+here }, 10*time.Second, 50*time.Millisecond,
		"leaders (stream, consumer) not moved to %s; logs:\n%s", here, logs)

	moveAway()
	w.placeLeaders(ctx, &moved)
	require.Never(t, func() bool { return leaders() != there+","+there }, time.Second, 100*time.Millisecond,
		"moved again within leaderMoveEvery")

	// Enqueues go on through the moves.
	b.publish(t, batch(2, "t", "", 2))
	require.Eventually(t, func() bool { return b.count(t) == 2 }, 20*time.Second, 20*time.Millisecond)
}
