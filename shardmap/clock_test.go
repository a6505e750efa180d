package shardmap

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/triage-queue/triage/deploy/mariadb/mariadbtest"
)

// TestClockFollowsThePrimary: a reading is the primary's time, whatever
// that is relative to the local clock, and advances with the local
// monotonic clock between measurements, which happen at most every
// ClockRefresh.
func TestClockFollowsThePrimary(t *testing.T) {
	t.Parallel()
	const ahead = 90 * time.Second // the primary's clock relative to ours
	var queries atomic.Int32
	c := &Clock{measure: func(context.Context, *sqlx.DB) (time.Time, error) {
		queries.Add(1)
		return time.Now().Add(ahead), nil
	}}
	db := &sqlx.DB{}
	got := c.Now(t.Context(), db)
	require.InDelta(t, float64(time.Now().Add(ahead).UnixMicro()), float64(got.UnixMicro()), float64(50*time.Millisecond/time.Microsecond))
	for range 100 {
		next := c.Now(t.Context(), db)
		require.False(t, next.Before(got), "a reading went back between measurements")
		got = next
	}
	require.Equal(t, int32(firstSamples), queries.Load(), "measured again within ClockRefresh")

	c.Skew = -time.Minute
	require.InDelta(t, float64(time.Now().Add(ahead-time.Minute).UnixMicro()), float64(c.Now(t.Context(), db).UnixMicro()),
		float64(50*time.Millisecond/time.Microsecond))
}

// TestClockReadsMariaDB: the real query returns the server's UTC time
// (the test's server runs on this host, so it matches the local clock).
func TestClockReadsMariaDB(t *testing.T) {
	t.Parallel()
	db := sqlx.MustConnect("mysql", mariadbtest.Database(t))
	t.Cleanup(func() { db.Close() })
	var c Clock
	got := c.Now(t.Context(), db)
	require.InDelta(t, float64(time.Now().UnixMicro()), float64(got.UnixMicro()), float64(time.Second/time.Microsecond))
	c.mu.Lock()
	measured := !c.readings[db].local.IsZero()
	c.mu.Unlock()
	require.True(t, measured, "fell back to the local clock")
}

// TestClockFirstReadingIsTheBestOfSeveral: an answer that waits 200 ms
// after the primary read its clock (for a core, on a loaded host) would
// set a first reading 100 ms behind, and a first reading is kept until a
// better one comes; the first measurement keeps its best sample.
func TestClockFirstReadingIsTheBestOfSeveral(t *testing.T) {
	t.Parallel()
	var queries atomic.Int32
	c := &Clock{measure: func(context.Context, *sqlx.DB) (time.Time, error) {
		now := time.Now()
		if queries.Add(1) == 1 {
			time.Sleep(200 * time.Millisecond)
		}
		return now, nil
	}}
	off := time.Until(c.Now(t.Context(), &sqlx.DB{}))
	require.Less(t, off.Abs(), 20*time.Millisecond, "the first reading is %s off", off)
}

// slowConnect opens connections after a delay, as a new pool's first
// connection to a remote primary takes its handshake and session set-up.
type slowConnect struct {
	driver.Connector
	delay time.Duration
}

func (s slowConnect) Connect(ctx context.Context) (driver.Conn, error) {
	time.Sleep(s.delay)
	return s.Connector.Connect(ctx)
}

// TestClockFirstReadingLeavesOutTheConnect: the first measurement of a
// new pool is not set off by the time its first connection took to
// open. Timed with the read, a 300 ms connect set the clock 150 ms
// ahead, and rows were served up to that long before their
// deliver_after, until the next refresh.
func TestClockFirstReadingLeavesOutTheConnect(t *testing.T) {
	t.Parallel()
	cfg, err := mysql.ParseDSN(mariadbtest.Database(t))
	require.NoError(t, err)
	conn, err := mysql.NewConnector(cfg)
	require.NoError(t, err)
	db := sqlx.NewDb(sql.OpenDB(slowConnect{Connector: conn, delay: 300 * time.Millisecond}), "mysql")
	t.Cleanup(func() { db.Close() })
	var c Clock
	got := c.Now(t.Context(), db)
	off := time.Until(got)
	require.Less(t, off.Abs(), 50*time.Millisecond, "the first reading is %s off the local clock (the server runs on this host)", off)
}

// TestClockRefreshesInTheBackground: once a primary was measured, no
// caller waits for a refresh, even one that takes long; pools that name
// one server share its readings.
func TestClockRefreshesInTheBackground(t *testing.T) {
	t.Parallel()
	var queries atomic.Int32
	slow := make(chan struct{})
	c := &Clock{measure: func(context.Context, *sqlx.DB) (time.Time, error) {
		if queries.Add(1) > firstSamples {
			<-slow
		}
		return time.Now(), nil
	}}
	a, b := &sqlx.DB{}, &sqlx.DB{}
	c.Server = func(*sqlx.DB) string { return "db1:3306" }
	c.Now(t.Context(), a)
	c.Now(t.Context(), b)
	require.Equal(t, int32(firstSamples), queries.Load(), "a second pool of the same server measured it again")

	c.mu.Lock()
	for _, r := range c.readings {
		r.tried = r.tried.Add(-ClockRefresh) // due for a refresh
	}
	c.mu.Unlock()
	done := make(chan time.Time)
	go func() { done <- c.Now(t.Context(), a) }()
	select {
	case got := <-done:
		require.Less(t, time.Until(got).Abs(), 50*time.Millisecond)
	case <-time.After(time.Second):
		t.Fatal("a caller waited for the refresh")
	}
	require.Eventually(t, func() bool { return queries.Load() == firstSamples+1 }, time.Second, time.Millisecond, "no refresh started")
	c.Now(t.Context(), b) // one refresh at a time
	close(slow)
	require.Never(t, func() bool { return queries.Load() > firstSamples+1 }, 100*time.Millisecond, 10*time.Millisecond)
}
