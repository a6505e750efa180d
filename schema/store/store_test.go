package store

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	peerv1 "github.com/triage-queue/triage/proto/triage/peer/v1"
	"github.com/triage-queue/triage/schema/schematest"
)

const ns, topic = "ns", "t"

// fixture is a fresh shard database and its store, with the time every
// call of a test uses.
type fixture struct {
	t     *testing.T
	ctx   context.Context
	db    *sqlx.DB
	s     Store
	now   time.Time
	nowUS int64
}

func newFixture(t *testing.T) *fixture {
	t.Parallel()
	db := schematest.DB(t, nil)
	now := time.Now()
	return &fixture{t: t, ctx: t.Context(), db: db, s: New(db), now: now, nowUS: now.UnixMicro()}
}

// enqueue inserts items keyed ids, ready now, with priority = id % 3.
func (f *fixture) enqueue(batchID uint64, ids ...uint64) {
	f.t.Helper()
	b := &peerv1.EnqueueBatch{Namespace: ns, Topic: topic, BatchId: batchID, EnqueuedAtUs: f.nowUS}
	for _, id := range ids {
		b.Items = append(b.Items, &peerv1.BufferedItem{Key: id, Priority: int32(id % 3), DeliverAfterUs: f.nowUS - int64(id), LeaseMs: 30000})
	}
	out, err := f.s.ItemInsertBatch(f.ctx, ItemInsertBatchParams{Batches: []*peerv1.EnqueueBatch{b}, NowUS: f.nowUS})
	require.NoError(f.t, err)
	require.Empty(f.t, out[0].Error)
}

func (f *fixture) get(id uint64) *Item {
	f.t.Helper()
	row, err := f.s.ItemGet(f.ctx, ItemGetParams{Namespace: ns, ID: id})
	require.NoError(f.t, err)
	return row
}

func (f *fixture) count(q string, args ...any) int {
	f.t.Helper()
	var n int
	require.NoError(f.t, f.db.GetContext(f.ctx, &n, q, args...))
	return n
}

// readHead reads the whole topic's ready head.
func (f *fixture) readHead(p ItemReadHeadParams) []Item {
	f.t.Helper()
	p.Namespace, p.Topic = ns, topic
	if p.PriorityLo == 0 && p.PriorityHi == 0 {
		p.PriorityLo, p.PriorityHi = math.MinInt32, math.MaxInt32
	}
	if p.Limit == 0 {
		p.Limit = 100
	}
	p.NowUS = f.nowUS
	rows, _, err := f.s.ItemReadHead(f.ctx, p)
	require.NoError(f.t, err)
	return rows
}

// delivery is the delivery of a row read at its version, under token
// 1000+id.
func (f *fixture) delivery(r Item) Delivery {
	return Delivery{ID: r.ID, Token: 1000 + r.ID, UntilUS: f.nowUS + 30e6, Version: r.UpdatedAt}
}

// serve delivers rows as read, each under token 1000+id.
func (f *fixture) serve(rows []Item) map[uint64]bool {
	f.t.Helper()
	var ds []Delivery
	for _, r := range rows {
		ds = append(ds, f.delivery(r))
	}
	held, err := f.s.ItemServe(f.ctx, ItemServeParams{Deliveries: ds, NowUS: f.nowUS})
	require.NoError(f.t, err)
	return held
}

func versions(rows []Item) []RowVersion {
	out := make([]RowVersion, len(rows))
	for i, r := range rows {
		out[i] = RowVersion{ID: r.ID, Version: r.UpdatedAt}
	}
	return out
}

func ids(rows []Item) []uint64 {
	out := make([]uint64, len(rows))
	for i, r := range rows {
		out[i] = r.ID
	}
	return out
}

func TestInsertBatch(t *testing.T) {
	f := newFixture(t)
	b := &peerv1.EnqueueBatch{Namespace: ns, Topic: topic, BatchId: 1, EnqueuedAtUs: f.nowUS, Items: []*peerv1.BufferedItem{
		{Key: 1, DedupKey: "k", Payload: []byte("a")}, {Key: 2, DedupKey: "k"}, {Key: 3}}}
	out, err := f.s.ItemInsertBatch(f.ctx, ItemInsertBatchParams{Batches: []*peerv1.EnqueueBatch{b}, NowUS: f.nowUS})
	require.NoError(t, err)
	require.Equal(t, []uint64{0, 1, 0}, out[0].DuplicateOf, "the second item's dedup key is held by the first")
	require.Equal(t, []byte("a"), f.get(1).Payload)

	// A redelivery is answered with the first outcome and inserts nothing.
	out, err = f.s.ItemInsertBatch(f.ctx, ItemInsertBatchParams{Batches: []*peerv1.EnqueueBatch{b}, NowUS: f.nowUS})
	require.NoError(t, err)
	require.Equal(t, []uint64{0, 1, 0}, out[0].DuplicateOf)
	require.Equal(t, 2, f.count("SELECT COUNT(*) FROM items"))

	// Another batch under the same ID is never reported as applied.
	other := &peerv1.EnqueueBatch{Namespace: ns, Topic: topic, BatchId: 1, ReplySubject: "r", Items: []*peerv1.BufferedItem{{Key: 9}}}
	out, err = f.s.ItemInsertBatch(f.ctx, ItemInsertBatchParams{Batches: []*peerv1.EnqueueBatch{other}, NowUS: f.nowUS})
	require.NoError(t, err)
	require.Contains(t, out[0].Error, "collides")

	// Metadata the items table cannot hold: refused whole without
	// Isolate, dead-lettered with Isolate.
	big := &peerv1.EnqueueBatch{Namespace: ns, Topic: topic, BatchId: 5, Items: []*peerv1.BufferedItem{
		{Key: 5}, {Key: 6, Metadata: []byte(`{"k":"` + strings.Repeat("x", 70000) + `"}`)}}}
	_, err = f.s.ItemInsertBatch(f.ctx, ItemInsertBatchParams{Batches: []*peerv1.EnqueueBatch{big}, NowUS: f.nowUS})
	require.True(t, IsPermanent(err), "%v", err)
	out, err = f.s.ItemInsertBatch(f.ctx, ItemInsertBatchParams{Batches: []*peerv1.EnqueueBatch{big}, NowUS: f.nowUS, Isolate: true})
	require.NoError(t, err)
	require.Contains(t, out[0].Error, "dead letters")
	f.get(5)
	require.Equal(t, 1, f.count("SELECT COUNT(*) FROM dead_letters WHERE id = 6 AND attempts = 0"))
}

func TestGetNotFound(t *testing.T) {
	f := newFixture(t)
	f.enqueue(1, 1)
	_, err := f.s.ItemGet(f.ctx, ItemGetParams{Namespace: ns, ID: 2})
	require.ErrorIs(t, err, ErrNotFound)
	_, err = f.s.ItemGet(f.ctx, ItemGetParams{Namespace: "other", ID: 1})
	require.ErrorIs(t, err, ErrNotFound, "an ID does not reach across namespaces")
}

func TestLeaseServeAck(t *testing.T) {
	f := newFixture(t)
	f.enqueue(1, 1, 2, 3, 4, 5, 6)
	before := f.get(6)
	rows := f.readHead(ItemReadHeadParams{Limit: 4})
	require.Equal(t, []uint64{6, 3, 4, 1}, ids(rows), "ready index order: priority, deliver_after, id")
	require.Equal(t, before, f.get(6), "a read writes nothing")
	require.Equal(t, before.UpdatedAt, rows[0].UpdatedAt, "it returns the row's version")

	// With a tail, only rows before it; excluded rows are left out.
	tail := rows[3]
	require.Equal(t, []uint64{6, 3, 4}, ids(f.readHead(ItemReadHeadParams{Tail: &tail})))
	require.Equal(t, []uint64{4}, ids(f.readHead(ItemReadHeadParams{Tail: &tail, Exclude: versions(rows[:2])})))
	require.Equal(t, []uint64{1, 5, 2}, ids(f.readHead(ItemReadHeadParams{Exclude: versions(rows[:3]), Limit: 3})))
	// A row excluded at a version it no longer has is read: the caller's
	// copy is stale.
	stale := versions(rows[:2])
	stale[1].Version--
	require.Equal(t, []uint64{3, 4}, ids(f.readHead(ItemReadHeadParams{Tail: &tail, Exclude: stale})))

	held := f.serve(rows[:2])
	require.Equal(t, map[uint64]bool{6: true, 3: true}, held)
	got := f.get(6)
	require.Equal(t, uint64(1006), got.LeaseToken)
	require.Equal(t, int32(1), got.Attempts)
	require.Equal(t, f.nowUS+30e6, got.LeasedUntil.Int64)

	res, err := f.s.ItemAck(f.ctx, ItemAckParams{Namespace: ns, Now: f.now, DedupWindow: time.Minute,
		Refs: []LeaseRef{{Key: 6, Token: 1006}, {Key: 3, Token: 999}, {Key: 77, Token: 1}, {Key: 6, Token: 1006}}})
	require.NoError(t, err)
	require.Nil(t, res[0])
	require.ErrorIs(t, res[1], ErrStaleLease)
	require.ErrorIs(t, res[2], ErrNotFound)
	require.ErrorIs(t, res[3], ErrNotFound, "a second ref to an acked item finds it gone")
	_, err = f.s.ItemGet(f.ctx, ItemGetParams{Namespace: ns, ID: 6})
	require.ErrorIs(t, err, ErrNotFound)

	// Another namespace's ack does not see the item.
	res, err = f.s.ItemAck(f.ctx, ItemAckParams{Namespace: "other", Now: f.now, Refs: []LeaseRef{{Key: 3, Token: 1003}}})
	require.NoError(t, err)
	require.ErrorIs(t, res[0], ErrNotFound)
}

// TestServeSkipsChangedRows: a row updated, deleted, served elsewhere or
// nacked since it was read is not served from the copy read before.
func TestServeSkipsChangedRows(t *testing.T) {
	f := newFixture(t)
	f.enqueue(1, 3, 6, 9, 12, 15)
	rows := f.readHead(ItemReadHeadParams{})
	require.Equal(t, []uint64{15, 12, 9, 6, 3}, ids(rows))
	// An update by a writer whose clock is behind: updated_at still moves.
	_, err := f.s.ItemUpdate(f.ctx, ItemUpdateParams{Namespace: ns, ID: 3, Update: func(r *Item) error {
		r.Metadata = []byte(`{"v":"new"}`)
		r.UpdatedAt -= 5e6
		return nil
	}})
	require.NoError(t, err)
	require.Greater(t, f.get(3).UpdatedAt, rows[4].UpdatedAt, "a version never goes back")
	require.NoError(t, f.s.ItemDelete(f.ctx, ItemDeleteParams{Namespace: ns, ID: 6, Now: f.now}))
	// 9 is served by another owner, then nacked: ready again, at a new
	// version.
	require.Equal(t, map[uint64]bool{9: true}, f.serve(rows[2:3]))
	res, _, err := f.s.ItemNack(f.ctx, ItemNackParams{Namespace: ns, NowUS: f.nowUS, Nacks: []Nack{{LeaseRef: LeaseRef{Key: 9, Token: 1009}, Release: true}}})
	require.NoError(t, err)
	require.NoError(t, res[0])
	require.Equal(t, f.nowUS, f.get(9).DeliverAfter, "9 is ready again")
	held := f.serve(rows)
	require.Equal(t, map[uint64]bool{15: true, 12: true}, held)
	require.Zero(t, f.get(3).Attempts)
	require.Zero(t, f.get(9).Attempts, "the stale copy of 9 was not served")
	// Read again, 9 and 3 are served at their new versions.
	again := f.readHead(ItemReadHeadParams{})
	require.Equal(t, []uint64{3, 9}, ids(again), "9 ready since the nack (now), 3 since now-3")
	require.Equal(t, map[uint64]bool{9: true, 3: true}, f.serve(again))
}

// TestReadLeavesReadyTime: a read writes nothing, so the stats' oldest
// ready age is the rows' own; rows an older version prefetched (lease
// token, no leased_until, ready_since kept) still count as ready since
// then.
func TestReadLeavesReadyTime(t *testing.T) {
	f := newFixture(t)
	f.enqueue(1, 1, 2, 4) // priorities 1, 2, 1; ready at now-1, now-2, now-4
	oldest := func(nowUS int64) map[int32]int64 {
		t.Helper()
		st, err := f.s.TopicStats(f.ctx, TopicStatsParams{Namespace: ns, Topic: topic, NowUS: nowUS})
		require.NoError(t, err)
		out := map[int32]int64{}
		for _, r := range st.Ready {
			require.Equal(t, int64(map[int32]int{1: 2, 2: 1}[r.Priority]), r.Ready, "priority %d", r.Priority)
			out[r.Priority] = r.Oldest
		}
		bands, _, err := f.s.ItemDepth(f.ctx, ItemDepthParams{NowUS: nowUS})
		require.NoError(t, err)
		for _, b := range bands {
			require.Equal(t, out[int32(b.Band)], b.Oldest, "band %d: the metrics agree with the stats", b.Band)
		}
		return out
	}
	want := map[int32]int64{1: f.nowUS - 4, 2: f.nowUS - 2}
	require.Equal(t, want, oldest(f.nowUS))
	require.Len(t, f.readHead(ItemReadHeadParams{}), 3)
	require.Equal(t, want, oldest(f.nowUS), "read rows are ready since they were")

	// Row 4 as an older version left it: prefetched until now+5 s.
	f.db.MustExecContext(f.ctx, "UPDATE items SET ready_since = deliver_after, deliver_after = ?, lease_token = 77 WHERE id = 4", f.nowUS+5e6)
	require.True(t, f.get(4).Prefetched())
	require.Equal(t, want, oldest(f.nowUS))
	later := f.nowUS + 6e6
	rows, _, err := f.s.ItemReadHead(f.ctx, ItemReadHeadParams{Namespace: ns, Topic: topic, PriorityLo: math.MinInt32, PriorityHi: math.MaxInt32,
		Limit: 10, NowUS: later})
	require.NoError(t, err)
	require.Equal(t, []uint64{1, 4, 2}, ids(rows), "its lapsed prefetch lease makes it ready, in its place after it")
}

// TestLeaseHeadRetires: rows out of attempts are dead-lettered and, on
// at-most-once topics, rows whose delivery lease lapsed are deleted; both
// keep their dedup keys taken.
func TestLeaseHeadRetires(t *testing.T) {
	f := newFixture(t)
	b := &peerv1.EnqueueBatch{Namespace: ns, Topic: topic, BatchId: 1, EnqueuedAtUs: f.nowUS, Items: []*peerv1.BufferedItem{
		{Key: 1, DedupKey: "a"}, {Key: 2, DedupKey: "b"}, {Key: 3}}}
	_, err := f.s.ItemInsertBatch(f.ctx, ItemInsertBatchParams{Batches: []*peerv1.EnqueueBatch{b}, NowUS: f.nowUS})
	require.NoError(t, err)
	// 1 was delivered 3 times; 2's delivery lease lapsed.
	_, err = f.db.ExecContext(f.ctx, "UPDATE items SET attempts = 3 WHERE id = 1")
	require.NoError(t, err)
	_, err = f.db.ExecContext(f.ctx, "UPDATE items SET attempts = 1, lease_token = 5, leased_until = ? WHERE id = 2", f.nowUS-1)
	require.NoError(t, err)

	ready3 := f.get(3).DeliverAfter
	rows := f.readHead(ItemReadHeadParams{MaxAttempts: 3, AtMostOnce: true, DedupWindow: time.Hour})
	require.Equal(t, []uint64{3}, ids(rows))
	require.Equal(t, 2, f.count("SELECT COUNT(*) FROM dedup_tombstones WHERE window_until = ?", f.nowUS+time.Hour.Microseconds()))
	require.Equal(t, 1, f.count("SELECT COUNT(*) FROM items"))

	dead, err := f.s.DeadLetterList(f.ctx, DeadLetterListParams{Namespace: ns, Topic: topic, Limit: 10})
	require.NoError(t, err)
	require.Len(t, dead, 1)
	require.Equal(t, uint64(1), dead[0].ID)
	require.Equal(t, "out of attempts: the last lease expired", dead[0].LastError.String)

	st, err := f.s.TopicStats(f.ctx, TopicStatsParams{Namespace: ns, Topic: topic, NowUS: f.nowUS})
	require.NoError(t, err)
	require.Equal(t, int64(1), st.DeadLetters)
	require.Equal(t, int64(1), st.Total)
	require.Equal(t, []PriorityReady{{Priority: 0, Ready: 1, Oldest: ready3}}, st.Ready, "a read row is ready since it was")

	n, err := f.s.DeadLetterRedrive(f.ctx, DeadLetterRedriveParams{Namespace: ns, Topic: topic, NowUS: f.nowUS})
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
	got := f.get(1)
	require.Zero(t, got.Attempts)
	require.Equal(t, f.nowUS, got.DeliverAfter)
	n, err = f.s.DeadLetterRedrive(f.ctx, DeadLetterRedriveParams{Namespace: ns, Topic: topic, Keys: []uint64{1}, NowUS: f.nowUS})
	require.NoError(t, err)
	require.Zero(t, n, "nothing left to redrive")
}

func TestDeadLetterListAndRedriveKeys(t *testing.T) {
	f := newFixture(t)
	for id := uint64(1); id <= 5; id++ {
		_, err := f.db.ExecContext(f.ctx, `INSERT INTO dead_letters (id, namespace, topic, priority, enqueued_at, lease_ms, attempts, dedup_key, payload, died_at)
			VALUES (?, ?, ?, 0, 0, 1000, 3, ?, '', ?)`, id, ns, topic, fmt.Sprint("k", id), 100-id)
		require.NoError(t, err)
	}
	// A live item holds dead letter 4's dedup key: that one stays.
	b := &peerv1.EnqueueBatch{Namespace: ns, Topic: topic, BatchId: 1, Items: []*peerv1.BufferedItem{{Key: 10, DedupKey: "k4"}}}
	_, err := f.s.ItemInsertBatch(f.ctx, ItemInsertBatchParams{Batches: []*peerv1.EnqueueBatch{b}, NowUS: f.nowUS})
	require.NoError(t, err)
	page, err := f.s.DeadLetterList(f.ctx, DeadLetterListParams{Namespace: ns, Topic: topic, Limit: 2})
	require.NoError(t, err)
	require.Equal(t, []uint64{5, 4}, []uint64{page[0].ID, page[1].ID}, "oldest first")
	page, err = f.s.DeadLetterList(f.ctx, DeadLetterListParams{Namespace: ns, Topic: topic, AfterDiedAt: page[1].DiedAt, AfterID: page[1].ID, Limit: 10})
	require.NoError(t, err)
	require.Len(t, page, 3)

	n, err := f.s.DeadLetterRedrive(f.ctx, DeadLetterRedriveParams{Namespace: ns, Topic: topic, Keys: []uint64{4, 5}, NowUS: f.nowUS})
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
	require.Equal(t, 4, f.count("SELECT COUNT(*) FROM dead_letters"))
	require.Equal(t, int32(0), f.get(5).Attempts)
}

func TestNack(t *testing.T) {
	f := newFixture(t)
	f.enqueue(1, 1, 2, 3)
	rows := f.readHead(ItemReadHeadParams{})
	f.serve(rows)
	_, err := f.db.ExecContext(f.ctx, "UPDATE items SET attempts = 5 WHERE id = 3")
	require.NoError(t, err)
	backoffs := 0
	res, readyNow, err := f.s.ItemNack(f.ctx, ItemNackParams{Namespace: ns, NowUS: f.nowUS,
		Retry: func(string) RetryPolicy {
			return RetryPolicy{MaxAttempts: 5, Backoff: func(int) time.Duration { backoffs++; return time.Minute }}
		},
		Nacks: []Nack{
			{LeaseRef: LeaseRef{Key: 2, Token: 1}},
			{LeaseRef: LeaseRef{Key: 1, Token: 1001}, Error: "boom", Metadata: map[string]string{"a": "b"}},
			{LeaseRef: LeaseRef{Key: 2, Token: 1002}, Backoff: true},
			{LeaseRef: LeaseRef{Key: 3, Token: 1003}},
			{LeaseRef: LeaseRef{Key: 9, Token: 1}},
		}})
	require.NoError(t, err)
	require.Equal(t, []string{"", topic, "", "", ""}, readyNow, "ready again at once: the nack without delay")
	require.ErrorIs(t, res[0], ErrStaleLease)
	require.Nil(t, res[1])
	require.Nil(t, res[2])
	require.Nil(t, res[3])
	require.ErrorIs(t, res[4], ErrNotFound)
	require.Equal(t, 1, backoffs)
	one := f.get(1)
	require.Zero(t, one.LeaseToken)
	require.Equal(t, "boom", one.LastError.String)
	require.JSONEq(t, `{"a":"b"}`, string(one.Metadata))
	require.Equal(t, f.nowUS+time.Minute.Microseconds(), f.get(2).DeliverAfter)
	require.Equal(t, 1, f.count("SELECT COUNT(*) FROM dead_letters WHERE id = 3 AND last_error = 'nacked after 5 deliveries'"))

	// A merge too large refuses the whole batch.
	rows = f.readHead(ItemReadHeadParams{})
	require.Equal(t, []uint64{1}, ids(rows))
	f.serve(rows)
	_, _, err = f.s.ItemNack(f.ctx, ItemNackParams{Namespace: ns, NowUS: f.nowUS, Nacks: []Nack{
		{LeaseRef: LeaseRef{Key: 1, Token: 1001}, Metadata: map[string]string{"big": strings.Repeat("x", MaxMetadataBytes)}}}})
	require.ErrorIs(t, err, ErrMetadataTooLarge)
	require.Equal(t, uint64(1001), f.get(1).LeaseToken, "nothing changed")
}

func TestNackDeadLetterAndRelease(t *testing.T) {
	f := newFixture(t)
	f.enqueue(1, 1, 2, 3)
	rows := f.readHead(ItemReadHeadParams{})
	f.serve(rows)
	// 3 is on its last attempt: a release must not dead-letter it.
	_, err := f.db.ExecContext(f.ctx, "UPDATE items SET attempts = 5 WHERE id = 3")
	require.NoError(t, err)
	backoffs := 0
	res, readyNow, err := f.s.ItemNack(f.ctx, ItemNackParams{Namespace: ns, NowUS: f.nowUS,
		Retry: func(string) RetryPolicy {
			return RetryPolicy{MaxAttempts: 5, Backoff: func(int) time.Duration { backoffs++; return time.Minute }}
		},
		Nacks: []Nack{
			{LeaseRef: LeaseRef{Key: 1, Token: 1001}, DeadLetter: true, Backoff: true},
			{LeaseRef: LeaseRef{Key: 2, Token: 1002}, Release: true, Backoff: true},
			{LeaseRef: LeaseRef{Key: 3, Token: 1003}, Release: true, Delay: time.Hour, Error: "snoozed"},
		}})
	require.NoError(t, err)
	require.Equal(t, []error{nil, nil, nil}, res)
	require.Equal(t, []string{"", topic, ""}, readyNow, "a release without delay is ready at once")
	require.Zero(t, backoffs, "neither a dead letter nor a release backs off")
	require.Equal(t, 1, f.count("SELECT COUNT(*) FROM dead_letters WHERE id = 1 AND attempts = 1 AND last_error = 'dead-lettered by the consumer after 1 deliveries'"))
	two := f.get(2)
	require.Zero(t, two.Attempts, "the released delivery is not counted")
	require.Equal(t, f.nowUS, two.DeliverAfter)
	three := f.get(3)
	require.Equal(t, int32(4), three.Attempts)
	require.Equal(t, f.nowUS+time.Hour.Microseconds(), three.DeliverAfter)
	require.Equal(t, "snoozed", three.LastError.String)
	require.Equal(t, 1, f.count("SELECT COUNT(*) FROM dead_letters"))
}

func TestExtend(t *testing.T) {
	f := newFixture(t)
	f.enqueue(1, 1)
	rows := f.readHead(ItemReadHeadParams{})
	f.serve(rows)
	until, err := f.s.ItemExtend(f.ctx, ItemExtendParams{Namespace: ns, Ref: LeaseRef{Key: 1, Token: 1001}, Now: f.now})
	require.NoError(t, err)
	require.Equal(t, f.now.Add(30*time.Second).UnixMicro(), until.UnixMicro(), "the item's own lease")
	require.Equal(t, until.UnixMicro(), f.get(1).LeasedUntil.Int64)
	_, err = f.s.ItemExtend(f.ctx, ItemExtendParams{Namespace: ns, Ref: LeaseRef{Key: 1, Token: 1}, Lease: time.Hour, Now: f.now})
	require.Equal(t, ErrStaleLease, err, "bare: routing reports the message as is")
	_, err = f.s.ItemExtend(f.ctx, ItemExtendParams{Namespace: ns, Ref: LeaseRef{Key: 2, Token: 1}, Now: f.now})
	require.Equal(t, ErrNotFound, err)
}

func TestUnserve(t *testing.T) {
	f := newFixture(t)
	f.enqueue(1, 1, 2)
	before := f.get(1).DeliverAfter
	rows := f.readHead(ItemReadHeadParams{})
	f.serve(rows)
	require.NoError(t, f.s.ItemUnserve(f.ctx, ItemUnserveParams{Namespace: ns, NowUS: f.nowUS, Items: []Undelivered{
		{LeaseRef: LeaseRef{Key: 1, Token: 1001}, DeliverAfterUS: before},
		{LeaseRef: LeaseRef{Key: 2, Token: 7}, DeliverAfterUS: 0}}}))
	one := f.get(1)
	require.Zero(t, one.LeaseToken)
	require.Zero(t, one.Attempts, "the delivery's attempt is taken back")
	require.Equal(t, before, one.DeliverAfter)
	require.Equal(t, uint64(1002), f.get(2).LeaseToken, "another token's delivery is left alone")
	require.NoError(t, f.s.ItemUnserve(f.ctx, ItemUnserveParams{Namespace: ns}))
}

func TestUpdateAndDelete(t *testing.T) {
	f := newFixture(t)
	b := &peerv1.EnqueueBatch{Namespace: ns, Topic: topic, BatchId: 1, Items: []*peerv1.BufferedItem{{Key: 1, DedupKey: "k", Priority: 4}}}
	_, err := f.s.ItemInsertBatch(f.ctx, ItemInsertBatchParams{Batches: []*peerv1.EnqueueBatch{b}, NowUS: f.nowUS})
	require.NoError(t, err)

	mine := errors.New("refused")
	_, err = f.s.ItemUpdate(f.ctx, ItemUpdateParams{Namespace: ns, ID: 1, Update: func(*Item) error { return mine }})
	require.Equal(t, mine, err, "the callback's error, as it is")
	_, err = f.s.ItemUpdate(f.ctx, ItemUpdateParams{Namespace: ns, ID: 2, Update: func(*Item) error { return nil }})
	require.Equal(t, ErrNotFound, err)

	row, err := f.s.ItemUpdate(f.ctx, ItemUpdateParams{Namespace: ns, ID: 1, Update: func(r *Item) error {
		r.Priority, r.UpdatedAt = 1, 77
		return nil
	}})
	require.NoError(t, err)
	require.Equal(t, int32(1), row.Priority)
	require.Equal(t, f.nowUS+1, f.get(1).UpdatedAt, "a version never goes back, whatever the writer's clock")
	require.Equal(t, f.nowUS+1, row.UpdatedAt, "the row as written")

	require.Equal(t, ErrNotFound, f.s.ItemDelete(f.ctx, ItemDeleteParams{Namespace: "other", ID: 1, Now: f.now}))
	require.NoError(t, f.s.ItemDelete(f.ctx, ItemDeleteParams{Namespace: ns, ID: 1, DedupWindow: time.Minute, Now: f.now}))
	require.Equal(t, 1, f.count("SELECT COUNT(*) FROM dedup_tombstones WHERE dedup_key = 'k' AND item_id = 1 AND window_until = ?",
		f.now.Add(time.Minute).UnixMicro()))
	require.Equal(t, ErrNotFound, f.s.ItemDelete(f.ctx, ItemDeleteParams{Namespace: ns, ID: 1, Now: f.now}))

	// The tombstone makes a new item with the key a duplicate.
	b = &peerv1.EnqueueBatch{Namespace: ns, Topic: topic, BatchId: 2, Items: []*peerv1.BufferedItem{{Key: 2, DedupKey: "k"}}}
	out, err := f.s.ItemInsertBatch(f.ctx, ItemInsertBatchParams{Batches: []*peerv1.EnqueueBatch{b}, NowUS: f.nowUS})
	require.NoError(t, err)
	require.Equal(t, []uint64{1}, out[0].DuplicateOf)
	require.Zero(t, f.count("SELECT COUNT(*) FROM items"))
}

func TestSweepExpired(t *testing.T) {
	f := newFixture(t)
	b := &peerv1.EnqueueBatch{Namespace: ns, Topic: topic, BatchId: 1, Items: []*peerv1.BufferedItem{
		{Key: 1, DedupKey: "k", ExpiresAtUs: f.nowUS - 1}, {Key: 2, ExpiresAtUs: f.nowUS - 1}, {Key: 3, ExpiresAtUs: f.nowUS + 1e9}, {Key: 4}}}
	_, err := f.s.ItemInsertBatch(f.ctx, ItemInsertBatchParams{Batches: []*peerv1.EnqueueBatch{b}, NowUS: f.nowUS})
	require.NoError(t, err)
	_, err = f.db.ExecContext(f.ctx, `INSERT INTO dedup_tombstones (namespace, topic, dedup_key, item_id, expires_at) VALUES (?, ?, 'old', 9, ?)`, ns, topic, f.nowUS-1)
	require.NoError(t, err)
	window := func(string) time.Duration { return time.Minute }
	n, err := f.s.ItemSweepExpired(f.ctx, ItemSweepExpiredParams{NowUS: f.nowUS, Limit: 1, Window: window})
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
	n, err = f.s.ItemSweepExpired(f.ctx, ItemSweepExpiredParams{NowUS: f.nowUS, Limit: 10, Window: window})
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
	require.Equal(t, 2, f.count("SELECT COUNT(*) FROM items"))
	require.Equal(t, 1, f.count("SELECT COUNT(*) FROM dedup_tombstones WHERE dedup_key = 'k'"), "the expired item's key stays taken")
	require.Zero(t, f.count("SELECT COUNT(*) FROM dedup_tombstones WHERE dedup_key = 'old'"), "a tombstone past its window goes")
}

func TestAging(t *testing.T) {
	f := newFixture(t)
	f.enqueue(1, 1, 2, 4, 5) // priorities 1, 2, 1, 2
	next, err := f.s.ItemNextPriority(f.ctx, ItemNextPriorityParams{Namespace: ns, Topic: topic, Above: 0})
	require.NoError(t, err)
	require.Equal(t, int32(1), next.Int32)
	next, err = f.s.ItemNextPriority(f.ctx, ItemNextPriorityParams{Namespace: ns, Topic: topic, Above: 2})
	require.NoError(t, err)
	require.False(t, next.Valid)

	rows, err := f.s.ItemAgingCandidates(f.ctx, ItemAgingCandidatesParams{Namespace: ns, Topic: topic, Priority: 2, CutoffUS: f.nowUS, Limit: 1})
	require.NoError(t, err)
	require.Equal(t, []uint64{5}, ids(rows), "oldest deliver_after first")
	rows, err = f.s.ItemAgingCandidates(f.ctx, ItemAgingCandidatesParams{Namespace: ns, Topic: topic, Priority: 2, CutoffUS: f.nowUS,
		AfterDeliverAfter: rows[0].DeliverAfter, AfterID: rows[0].ID, Limit: 10})
	require.NoError(t, err)
	require.Equal(t, []uint64{2}, ids(rows))

	n, err := f.s.ItemAge(f.ctx, ItemAgeParams{IDs: []uint64{2, 5, 1}, Priority: 2, CutoffUS: f.nowUS, NowUS: f.nowUS})
	require.NoError(t, err)
	require.Equal(t, int64(2), n, "1 is not at level 2")
	got := f.get(5)
	require.Equal(t, int32(1), got.Priority)
	require.Equal(t, int32(2), got.OrigPriority.Int32)
	require.Equal(t, "aging", got.ChangedBy.String)
}

func TestTopicListAndCount(t *testing.T) {
	f := newFixture(t)
	f.enqueue(1, 1, 2)
	b := &peerv1.EnqueueBatch{Namespace: ns, Topic: "u", BatchId: 2, Items: []*peerv1.BufferedItem{{Key: 3}}}
	_, err := f.s.ItemInsertBatch(f.ctx, ItemInsertBatchParams{Batches: []*peerv1.EnqueueBatch{b}, NowUS: f.nowUS})
	require.NoError(t, err)
	// Dead letters: two of topic "u" and one of "dl", a topic whose every
	// item died (listed all the same).
	for id, tp := range map[uint64]string{20: "u", 21: "u", 22: "dl"} {
		_, err := f.db.ExecContext(f.ctx, `INSERT INTO dead_letters (id, namespace, topic, priority, enqueued_at, lease_ms, attempts, payload, died_at)
			VALUES (?, ?, ?, 0, 0, 1000, 3, '', 1)`, id, ns, tp)
		require.NoError(t, err)
	}
	list, err := f.s.TopicList(f.ctx, TopicListParams{Namespace: ns, Limit: 10})
	require.NoError(t, err)
	require.Equal(t, []TopicCount{{"dl", 0, 1}, {topic, 2, 0}, {"u", 1, 2}}, list)
	list, err = f.s.TopicList(f.ctx, TopicListParams{Namespace: ns, After: "dl", Limit: 10})
	require.NoError(t, err)
	require.Equal(t, []TopicCount{{topic, 2, 0}, {"u", 1, 2}}, list)
	list, err = f.s.TopicList(f.ctx, TopicListParams{Namespace: ns, Limit: 2})
	require.NoError(t, err)
	require.Equal(t, []TopicCount{{"dl", 0, 1}, {topic, 2, 0}}, list, "a page of two")
	n, err := f.s.ItemCountNamespace(f.ctx, ItemCountNamespaceParams{Namespace: ns, Limit: 2})
	require.NoError(t, err)
	require.Equal(t, int64(2), n, "capped")
}

// TestInTxRetriesDeadlocks: a transaction rolled back by a deadlock or a
// lock wait timeout runs again from the start; other errors are returned
// at once.
func TestInTxRetriesDeadlocks(t *testing.T) {
	f := newFixture(t)
	calls := 0
	err := inTx(f.ctx, f.db, func(tx *sqlx.Tx) error {
		calls++
		if _, err := tx.ExecContext(f.ctx, "INSERT INTO dedup_tombstones (namespace, topic, dedup_key, item_id, expires_at) VALUES ('n', 't', ?, 1, 1)", calls); err != nil {
			return err
		}
		if calls < 3 {
			return &mysql.MySQLError{Number: uint16(1213 - 8*(calls-1))} // 1213 deadlock, then 1205 lock wait timeout
		}
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, 3, calls)
	require.Equal(t, 1, f.count("SELECT COUNT(*) FROM dedup_tombstones"), "the failed attempts were rolled back")

	calls = 0
	other := errors.New("no")
	err = inTx(f.ctx, f.db, func(*sqlx.Tx) error { calls++; return other })
	require.Equal(t, other, err)
	require.Equal(t, 1, calls)
}

// TestAckRetriesRealDeadlock: an ack that InnoDB picks as a deadlock's
// victim is run again and succeeds. The other transaction locks a
// tombstone the ack will write, then waits for the row the ack holds.
func TestAckRetriesRealDeadlock(t *testing.T) {
	f := newFixture(t)
	b := &peerv1.EnqueueBatch{Namespace: ns, Topic: topic, BatchId: 1, Items: []*peerv1.BufferedItem{{Key: 1, DedupKey: "k"}}}
	_, err := f.s.ItemInsertBatch(f.ctx, ItemInsertBatchParams{Batches: []*peerv1.EnqueueBatch{b}, NowUS: f.nowUS})
	require.NoError(t, err)
	rows := f.readHead(ItemReadHeadParams{})
	f.serve(rows)

	other, err := f.db.BeginTxx(f.ctx, nil)
	require.NoError(t, err)
	defer other.Rollback()
	// The other transaction holds the tombstone's key first ...
	_, err = other.ExecContext(f.ctx, "INSERT INTO dedup_tombstones (namespace, topic, dedup_key, item_id, expires_at) VALUES (?, ?, 'k', 9, 1)", ns, topic)
	require.NoError(t, err)
	done := make(chan error, 1)
	var res []error
	go func() {
		// ... the ack locks the item, then waits for the tombstone ...
		var err error
		res, err = f.s.ItemAck(f.ctx, ItemAckParams{Namespace: ns, Refs: []LeaseRef{{Key: 1, Token: 1001}}, DedupWindow: time.Hour, Now: f.now})
		done <- err
	}()
	require.Eventually(t, func() bool {
		return f.count(`SELECT COUNT(*) FROM information_schema.PROCESSLIST
			WHERE DB = DATABASE() AND INFO LIKE 'INSERT INTO dedup_tombstones%' AND TIME_MS > 100`) > 0
	}, 10*time.Second, 5*time.Millisecond)
	// ... and the other transaction now waits for the item: a deadlock.
	// InnoDB rolls back the smaller transaction; whichever it is, the
	// ack must end up done.
	_, otherErr := other.ExecContext(f.ctx, "SELECT id FROM items WHERE id = 1 FOR UPDATE")
	if otherErr == nil {
		require.NoError(t, other.Rollback())
	}
	require.NoError(t, <-done)
	require.Nil(t, res[0])
	require.Zero(t, f.count("SELECT COUNT(*) FROM items"))
}

// TestReadAfterStartsAtTheTail: a read of the rows after a buffered tail
// returns the rows that follow it in delivery order, ties on priority and
// deliver_after broken by id, and its index scan starts at the tail
// instead of walking the rows before it, as a read that leaves those out
// by version does (the refill of a deep backlog's buffer, dequeuer's
// startRefills).
func TestReadAfterStartsAtTheTail(t *testing.T) {
	f := newFixture(t)
	var keys []uint64
	for id := uint64(1); id <= 600; id++ {
		keys = append(keys, id)
	}
	f.enqueue(1, keys...)
	// Rows that tie with row 300 on priority and deliver_after.
	tie := &peerv1.EnqueueBatch{Namespace: ns, Topic: topic, BatchId: 2, EnqueuedAtUs: f.nowUS}
	for id := uint64(1000); id < 1004; id++ {
		tie.Items = append(tie.Items, &peerv1.BufferedItem{Key: id, Priority: 300 % 3, DeliverAfterUs: f.nowUS - 300, LeaseMs: 30000})
	}
	_, err := f.s.ItemInsertBatch(f.ctx, ItemInsertBatchParams{Batches: []*peerv1.EnqueueBatch{tie}, NowUS: f.nowUS})
	require.NoError(t, err)
	all := f.readHead(ItemReadHeadParams{Limit: 1000})
	require.Len(t, all, 604)

	// One connection, so that its session counters are the reads'.
	f.db.SetMaxOpenConns(1)
	readNext := func() int {
		var k string
		var n int
		require.NoError(t, f.db.QueryRowContext(f.ctx, "SHOW SESSION STATUS LIKE 'Handler_read_next'").Scan(&k, &n))
		return n
	}
	for _, at := range []int{0, 1, 449, 560} {
		tail := all[at]
		if tail.ID == 300 {
			t.Fatalf("row %d is a tie; the tie case is the next row", at)
		}
		n0 := readNext()
		got := f.readHead(ItemReadHeadParams{After: &tail, Limit: 100})
		scanned := readNext() - n0
		want := all[at+1 : min(at+101, len(all))]
		require.Equal(t, ids(want), ids(got), "the rows after row %d (%d)", at, tail.ID)
		require.LessOrEqual(t, scanned, 100+5, "rows after %d: the scan starts at the tail", at)
	}
	// The tie: after row 300 come the rows that share its place, by id.
	at := slices.IndexFunc(all, func(r Item) bool { return r.ID == 300 })
	got := f.readHead(ItemReadHeadParams{After: &all[at], Limit: 3})
	require.Equal(t, []uint64{1000, 1001, 1002}, ids(got))

	// What the read after the tail saves: leaving out the 450 rows before
	// it walks them all.
	n0 := readNext()
	got = f.readHead(ItemReadHeadParams{Exclude: versions(all[:450]), Limit: 100})
	require.Equal(t, ids(all[450:550]), ids(got))
	require.Greater(t, readNext()-n0, 450, "the excluding read walks the rows it leaves out")
}

// TestRetriesInOneGroupAllAnswerTheGoneItem: two envelopes of one dedup
// key land in one insert group after the key's item was acked (a primary
// that came back after a pause, with a producer's retries queued behind
// it). The first is inserted and undone again for the tombstone; the
// second, which lost its insert to the first, must be answered with the
// item the tombstone names too, not with the first's, which the same
// transaction deletes: a producer told that ID finds nothing.
func TestRetriesInOneGroupAllAnswerTheGoneItem(t *testing.T) {
	f := newFixture(t)
	first := &peerv1.EnqueueBatch{Namespace: ns, Topic: topic, BatchId: 1, EnqueuedAtUs: f.nowUS - 10, Items: []*peerv1.BufferedItem{{Key: 1, DedupKey: "k"}}}
	_, err := f.s.ItemInsertBatch(f.ctx, ItemInsertBatchParams{Batches: []*peerv1.EnqueueBatch{first}, NowUS: f.nowUS})
	require.NoError(t, err)
	require.NoError(t, f.s.ItemDelete(f.ctx, ItemDeleteParams{Namespace: ns, ID: 1, Now: f.now}))

	retries := []*peerv1.EnqueueBatch{
		{Namespace: ns, Topic: topic, BatchId: 2, EnqueuedAtUs: f.nowUS - 8, Items: []*peerv1.BufferedItem{{Key: 2, DedupKey: "k"}}},
		{Namespace: ns, Topic: topic, BatchId: 3, EnqueuedAtUs: f.nowUS - 6, Items: []*peerv1.BufferedItem{{Key: 3, DedupKey: "k"}}},
	}
	out, err := f.s.ItemInsertBatch(f.ctx, ItemInsertBatchParams{Batches: retries, NowUS: f.nowUS + 1,
		RetryWindow: func(string) time.Duration { return time.Minute }})
	require.NoError(t, err)
	require.Equal(t, []uint64{1}, out[0].DuplicateOf, "the first retry is a duplicate of the acked item")
	require.Equal(t, []uint64{1}, out[1].DuplicateOf, "so is the second, which lost its insert to the first")
	require.Zero(t, f.count("SELECT COUNT(*) FROM items"))
}

// TestNackFollowsEachTopicsRetryPolicy: one nack batch of items of two
// topics applies each topic's max attempts and backoff, and the error it
// records is read back with the item's head, for its next consumer.
func TestNackFollowsEachTopicsRetryPolicy(t *testing.T) {
	f := newFixture(t)
	f.enqueue(1, 1, 2)
	f.serve(f.readHead(ItemReadHeadParams{}))
	_, err := f.db.ExecContext(f.ctx, "UPDATE items SET attempts = 2, topic = IF(id = 2, 'u', topic)")
	require.NoError(t, err)
	policies := map[string]RetryPolicy{
		topic: {MaxAttempts: 2, Backoff: func(int) time.Duration { return time.Minute }},
		"u":   {MaxAttempts: 5, Backoff: func(n int) time.Duration { return time.Duration(n) * time.Hour }},
	}
	res, _, err := f.s.ItemNack(f.ctx, ItemNackParams{Namespace: ns, NowUS: f.nowUS,
		Retry: func(topic string) RetryPolicy { return policies[topic] },
		Nacks: []Nack{
			{LeaseRef: LeaseRef{Key: 1, Token: 1001}, Backoff: true, Error: "one"},
			{LeaseRef: LeaseRef{Key: 2, Token: 1002}, Backoff: true, Error: "two"},
		}})
	require.NoError(t, err)
	require.NoError(t, errors.Join(res...))
	require.Equal(t, 1, f.count("SELECT COUNT(*) FROM dead_letters WHERE id = 1"), "topic t allows 2 deliveries")
	require.Equal(t, f.nowUS+2*time.Hour.Microseconds(), f.get(2).DeliverAfter, "topic u waits its own backoff after 2 deliveries")

	_, err = f.db.ExecContext(f.ctx, "UPDATE items SET deliver_after = ?, topic = ? WHERE id = 2", f.nowUS, topic)
	require.NoError(t, err)
	rows := f.readHead(ItemReadHeadParams{})
	require.Len(t, rows, 1)
	require.Equal(t, "two", rows[0].LastError.String, "the head read carries the last error to the next consumer")
}
