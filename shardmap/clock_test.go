package shardmap

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

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
	require.Equal(t, int32(1), queries.Load(), "measured again within ClockRefresh")

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
	measured := !c.byDB[db].local.IsZero()
	c.mu.Unlock()
	require.True(t, measured, "fell back to the local clock")
}
