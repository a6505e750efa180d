package store

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/triage-queue/triage/schema/store/cuttest"
)

// proxied is a fixture whose store reaches the shard through a
// cuttest.Proxy, which loses answers on purpose;
// f.db stays direct, for checking rows.
func proxied(t *testing.T) (*fixture, *cuttest.Proxy) {
	f := newFixture(t)
	var dbName string
	require.NoError(t, f.db.GetContext(f.ctx, &dbName, "SELECT DATABASE()"))
	cfg := mysql.NewConfig()
	cfg.Net, cfg.User, cfg.DBName = "tcp", "root", dbName
	cfg.InterpolateParams, cfg.MultiStatements, cfg.ParseTime = true, true, true
	var port int
	require.NoError(t, f.db.GetContext(f.ctx, &port, "SELECT @@port"))
	p := cuttest.Start(t, net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	cfg.Addr = p.Addr()
	db, err := sqlx.Open("mysql", cfg.FormatDSN())
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	f.s = New(db)
	return f, p
}

func isAckAtOnce(q string) bool { return strings.Contains(q, "@triage_acked") }

// TestAckWithLostAnswerIsSettled: an ack whose COMMIT took effect and
// whose answer was lost answers acked, not an error; a retry with the
// same tokens answers "item not found", which says the same (the item is
// gone). An ack whose COMMIT never reached the server is done by the
// settle itself.
func TestAckWithLostAnswerIsSettled(t *testing.T) {
	for _, c := range []struct {
		name    string
		deliver bool
		match   func(string) bool
		ack     func(f *fixture, p ItemAckParams) ([]error, error)
	}{
		{"one round trip, committed", true, isAckAtOnce, func(f *fixture, p ItemAckParams) ([]error, error) { return f.s.ItemAckDelete(f.ctx, p) }},
		{"one round trip, never sent", false, isAckAtOnce, func(f *fixture, p ItemAckParams) ([]error, error) { return f.s.ItemAckDelete(f.ctx, p) }},
		{"transaction, committed", true, cuttest.IsCommit, func(f *fixture, p ItemAckParams) ([]error, error) { return f.s.ItemAck(f.ctx, p) }},
		{"transaction, never sent", false, cuttest.IsCommit, func(f *fixture, p ItemAckParams) ([]error, error) { return f.s.ItemAck(f.ctx, p) }},
		{"batcher, committed", true, isAckAtOnce, func(f *fixture, p ItemAckParams) ([]error, error) {
			var b Batcher
			return b.Ack(f.ctx, f.s.db, p)
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			f, proxy := proxied(t)
			f.enqueue(1, 1, 2, 3)
			f.serve(f.readHead(ItemReadHeadParams{}))
			p := ItemAckParams{Namespace: ns, Now: f.now, Refs: []LeaseRef{{Key: 1, Token: 1001}, {Key: 2, Token: 1002}}}
			proxy.Arm(c.deliver, c.match)
			res, err := c.ack(f, p)
			proxy.Cut()
			require.NoError(t, err)
			require.Equal(t, []error{nil, nil}, res)
			require.Equal(t, 1, f.count("SELECT COUNT(*) FROM items"), "1 and 2 are acked, 3 is not")

			res, err = c.ack(f, p)
			require.NoError(t, err, "a retry with the same tokens")
			require.ErrorIs(t, res[0], ErrNotFound)
			require.ErrorIs(t, res[1], ErrNotFound)
		})
	}
}

// TestAckWithLostAnswerKeepsItsRefusals: the settle answers each ref as
// the state it finds says: a stale token stays refused, and when one of
// the lost ack's rows is still there the lost ack did not commit.
func TestAckWithLostAnswerKeepsItsRefusals(t *testing.T) {
	f, proxy := proxied(t)
	f.enqueue(1, 1, 2)
	f.serve(f.readHead(ItemReadHeadParams{}))
	proxy.Arm(true, isAckAtOnce)
	res, err := f.s.ItemAckDelete(f.ctx, ItemAckParams{Namespace: ns, Now: f.now,
		Refs: []LeaseRef{{Key: 1, Token: 1001}, {Key: 2, Token: 7}, {Key: 9, Token: 1}}})
	proxy.Cut()
	require.NoError(t, err)
	require.Nil(t, res[0])
	require.ErrorIs(t, res[1], ErrStaleLease)
	require.ErrorIs(t, res[2], ErrNotFound)
	require.Equal(t, []uint64{2}, f.ids("SELECT id FROM items"))
}

func (f *fixture) ids(q string) []uint64 {
	f.t.Helper()
	var out []uint64
	require.NoError(f.t, f.db.SelectContext(f.ctx, &out, q))
	return out
}

// TestNackWithLostAnswerIsSettled: a nack whose answer was lost answers
// done, keeps its delay and error, and takes back a release's attempt
// once, whether its COMMIT took effect or never reached the server; a
// retry with the same token is refused as stale and changes nothing.
func TestNackWithLostAnswerIsSettled(t *testing.T) {
	for _, deliver := range []bool{true, false} {
		t.Run(map[bool]string{true: "committed", false: "never sent"}[deliver], func(t *testing.T) {
			f, proxy := proxied(t)
			f.enqueue(1, 1, 2)
			f.serve(f.readHead(ItemReadHeadParams{}))
			_, err := f.db.ExecContext(f.ctx, "UPDATE items SET attempts = 3")
			require.NoError(t, err)
			deadLettered := 0
			p := ItemNackParams{Namespace: ns, NowUS: f.nowUS, Retry: maxAttempts(5),
				OnDeadLetter: func(string) { deadLettered++ },
				Nacks: []Nack{
					{LeaseRef: LeaseRef{Key: 1, Token: 1001}, Delay: time.Hour, Error: "boom"},
					{LeaseRef: LeaseRef{Key: 2, Token: 1002}, Release: true, Delay: time.Minute},
				}}
			proxy.Arm(deliver, cuttest.IsCommit)
			res, readyNow, err := f.s.ItemNack(f.ctx, p)
			proxy.Cut()
			require.NoError(t, err)
			require.Equal(t, []error{nil, nil}, res)
			require.Equal(t, []string{"", ""}, readyNow)
			check := func() {
				one, two := f.get(1), f.get(2)
				require.Zero(t, one.LeaseToken)
				require.Equal(t, f.nowUS+time.Hour.Microseconds(), one.DeliverAfter, "the nack's delay")
				require.Equal(t, "boom", one.LastError.String)
				require.Equal(t, int32(3), one.Attempts)
				require.Zero(t, two.LeaseToken)
				require.Equal(t, f.nowUS+time.Minute.Microseconds(), two.DeliverAfter)
				require.Equal(t, int32(2), two.Attempts, "the release took its delivery's attempt back once")
			}
			check()

			res, _, err = f.s.ItemNack(f.ctx, p)
			require.NoError(t, err)
			require.ErrorIs(t, res[0], ErrStaleLease)
			require.ErrorIs(t, res[1], ErrStaleLease)
			check()
			require.Zero(t, deadLettered)
		})
	}
}

// TestNackWithLostAnswerDeadLetters: a lost nack that dead-lettered its
// item is settled as done, and reports the dead letter once.
func TestNackWithLostAnswerDeadLetters(t *testing.T) {
	f, proxy := proxied(t)
	f.enqueue(1, 1)
	f.serve(f.readHead(ItemReadHeadParams{}))
	var dead []string
	proxy.Arm(true, cuttest.IsCommit)
	res, _, err := f.s.ItemNack(f.ctx, ItemNackParams{Namespace: ns, NowUS: f.nowUS, Retry: maxAttempts(1),
		OnDeadLetter: func(topic string) { dead = append(dead, topic) },
		Nacks:        []Nack{{LeaseRef: LeaseRef{Key: 1, Token: 1001}, Error: "last"}}})
	proxy.Cut()
	require.NoError(t, err)
	require.Equal(t, []error{nil}, res)
	require.Equal(t, []string{topic}, dead)
	require.Equal(t, 1, f.count("SELECT COUNT(*) FROM dead_letters WHERE id = 1 AND last_error = 'last'"))
}

// TestExtendUpdateDeleteWithLostAnswerAreSettled: each answers what took
// effect, not an error.
func TestExtendUpdateDeleteWithLostAnswerAreSettled(t *testing.T) {
	f, proxy := proxied(t)
	f.enqueue(1, 1, 2)
	f.serve(f.readHead(ItemReadHeadParams{}))

	proxy.Arm(true, cuttest.IsCommit)
	until, err := f.s.ItemExtend(f.ctx, ItemExtendParams{Namespace: ns, Ref: LeaseRef{Key: 1, Token: 1001}, Lease: time.Hour, Now: f.now})
	proxy.Cut()
	require.NoError(t, err)
	require.Equal(t, f.now.Add(time.Hour).UnixMicro(), until.UnixMicro())
	require.Equal(t, until.UnixMicro(), f.get(1).LeasedUntil.Int64)

	proxy.Arm(true, cuttest.IsCommit)
	row, err := f.s.ItemUpdate(f.ctx, ItemUpdateParams{Namespace: ns, ID: 2, Update: func(r *Item) error {
		r.Priority = 7
		return nil
	}})
	proxy.Cut()
	require.NoError(t, err)
	require.Equal(t, int32(7), row.Priority)
	require.Equal(t, int32(7), f.get(2).Priority)

	proxy.Arm(true, cuttest.IsCommit)
	err = f.s.ItemDelete(f.ctx, ItemDeleteParams{Namespace: ns, ID: 2, Now: f.now})
	proxy.Cut()
	require.NoError(t, err)
	require.Equal(t, 0, f.count("SELECT COUNT(*) FROM items WHERE id = 2"))
}

// TestLostAnswerUnsettledIsOutcomeUnknown: when the shard cannot be
// reached again to settle a lost answer, the write answers
// ErrOutcomeUnknown; a write that failed before it was sent (the shard
// refused the connection) does not.
func TestLostAnswerUnsettledIsOutcomeUnknown(t *testing.T) {
	f, proxy := proxied(t)
	f.enqueue(1, 1, 2)
	f.serve(f.readHead(ItemReadHeadParams{}))

	// The ack goes on the pool's one connection, open already; the
	// settle needs a new one, which the shard refuses.
	f.s.db.SetMaxOpenConns(1)
	proxy.Refuse(true)
	proxy.Arm(true, isAckAtOnce)
	_, err := f.s.ItemAckDelete(f.ctx, ItemAckParams{Namespace: ns, Now: f.now, Refs: []LeaseRef{{Key: 1, Token: 1001}}})
	proxy.Cut()
	require.ErrorIs(t, err, ErrOutcomeUnknown)
	require.Contains(t, err.Error(), "outcome unknown")

	_, _, err = f.s.ItemNack(f.ctx, ItemNackParams{Namespace: ns, NowUS: f.nowUS, Nacks: []Nack{{LeaseRef: LeaseRef{Key: 2, Token: 1002}}}})
	require.Error(t, err)
	require.False(t, errors.Is(err, ErrOutcomeUnknown), "refused before anything was sent: %v", err)
	require.Equal(t, 1, f.count("SELECT COUNT(*) FROM items WHERE id = 2 AND lease_token = 1002"), "nothing changed")
}

// TestBatcherAckCallerGoneIsOutcomeUnknown: a caller that leaves while
// its batch is in flight hears that the outcome is unknown, and the batch
// still acks.
func TestBatcherAckCallerGoneIsOutcomeUnknown(t *testing.T) {
	f := newFixture(t)
	f.enqueue(1, 1)
	f.serve(f.readHead(ItemReadHeadParams{}))
	ctx, cancel := context.WithCancel(f.ctx)
	cancel()
	var b Batcher
	_, err := b.Ack(ctx, f.db, ItemAckParams{Namespace: ns, Refs: []LeaseRef{{Key: 1, Token: 1001}}})
	require.ErrorIs(t, err, ErrOutcomeUnknown)
	require.ErrorIs(t, err, context.Canceled)
	require.Eventually(t, func() bool { return f.count("SELECT COUNT(*) FROM items") == 0 }, 10*time.Second, 10*time.Millisecond)
}

// The settle's context outlives the caller's, bounded.
func TestSettleCtx(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	sctx, scancel := settleCtx(ctx)
	defer scancel()
	require.NoError(t, sctx.Err())
	d, ok := sctx.Deadline()
	require.True(t, ok)
	require.WithinDuration(t, time.Now().Add(settleTimeout), d, time.Second)
}

// maxAttempts is a retry policy of n deliveries for every topic, no
// backoff.
func maxAttempts(n int) func(string) RetryPolicy {
	return func(string) RetryPolicy { return RetryPolicy{MaxAttempts: n} }
}

// TestAckAndServeWithLostAnswerAreSettled: a shared transaction of acks
// and serves whose answer was lost settles both: the acks as an ack's
// lost answer is, the serves by reading which rows carry their tokens, so
// a serve that committed is delivered and one that never reached the
// server leaves its rows ready and undelivered.
func TestAckAndServeWithLostAnswerAreSettled(t *testing.T) {
	for _, deliver := range []bool{true, false} {
		t.Run(fmt.Sprintf("committed=%v", deliver), func(t *testing.T) {
			f, proxy := proxied(t)
			f.enqueue(1, 1, 2, 3)
			f.serve(pick(f.readHead(ItemReadHeadParams{}), 1))
			fresh := pick(f.readHead(ItemReadHeadParams{}), 2, 3)
			require.Len(t, fresh, 2)
			a := &ackPart{ns: ns, refs: []LeaseRef{{Key: 1, Token: 1001}}}
			sv := &serveBatch{ds: []Delivery{f.delivery(fresh[0]), f.delivery(fresh[1])}, nowUS: f.nowUS}
			proxy.Arm(deliver, isAckAtOnce)
			f.s.writeAtOnce(f.ctx, []*ackPart{a}, sv, f.now)
			proxy.Cut()
			require.ErrorIs(t, a.lost, ErrOutcomeUnknown)
			res, err := a.answer(f.ctx, f.s, 0, 1)
			require.NoError(t, err)
			require.Equal(t, []error{nil}, res)
			require.Equal(t, []uint64{2, 3}, f.ids("SELECT id FROM items ORDER BY id"), "1 is acked")
			require.NoError(t, sv.err)
			if deliver {
				require.Equal(t, map[uint64]bool{2: true, 3: true}, sv.held)
				require.Equal(t, int32(1), f.get(2).Attempts)
			} else {
				require.Empty(t, sv.held)
				require.Zero(t, f.get(2).Attempts)
				require.Zero(t, f.get(3).LeaseToken)
			}
		})
	}
}
