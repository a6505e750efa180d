package shardmap

import (
	"context"
	"sync"
	"time"

	"github.com/jmoiron/sqlx"
)

// ClockRefresh is how often Clock measures a primary's time again. Between
// measurements it extrapolates with the local monotonic clock, so a refresh
// only corrects the drift of the two oscillators.
const ClockRefresh = time.Second

// MaxDrift bounds how fast two hosts' oscillators drift apart, as 1/rate
// (2000: 500 ppm, what NTP slews at most): the error a measurement's age
// adds to it.
const MaxDrift = 2000

// Clock tells the time of shard primaries: the one clock every process
// uses for lease arithmetic on a shard's rows (deliver_after, leased_until,
// prefetch and serve stamps, nack and extend), so that two hosts whose
// wall clocks disagree, or one whose clock jumps, agree on when a row is
// ready or a lease lapses. See dequeuer/doc.go, "# Clocks".
//
// A reading is the primary's UTC_TIMESTAMP(6) at the last measurement,
// corrected by half the round trip, plus the local monotonic time elapsed
// since; the local wall clock is never read. The zero value is ready to
// use.
type Clock struct {
	// Skew, for tests, is added to every reading.
	Skew time.Duration
	// measure, for tests, replaces the database query.
	measure func(ctx context.Context, db *sqlx.DB) (time.Time, error)

	mu   sync.Mutex
	byDB map[*sqlx.DB]*clockReading
}

type clockReading struct {
	db     time.Time     // the primary's time at local
	local  time.Time     // carries the monotonic reading
	rtt    time.Duration // of the measurement: its error is at most rtt/2
	tried  time.Time     // last measurement, kept or not
	busy   bool          // a refresh is under way
	usedAt time.Time
}

// Now returns the current time of the primary behind db (a pool of
// Pool, one per primary and database). The first call for a primary
// measures it; later calls measure again at most every ClockRefresh, one
// caller at a time while the others use the last measurement. If a primary
// was never measured and cannot be reached, Now falls back to the local
// clock: the statement the caller runs next fails the same way.
func (c *Clock) Now(ctx context.Context, db *sqlx.DB) time.Time {
	c.mu.Lock()
	if c.byDB == nil {
		c.byDB = map[*sqlx.DB]*clockReading{}
	}
	r := c.byDB[db]
	now := time.Now()
	if r == nil {
		c.prune(now)
		r = &clockReading{}
		c.byDB[db] = r
	}
	r.usedAt = now
	stale := r.local.IsZero() || now.Sub(r.tried) >= ClockRefresh
	if stale && (!r.busy || r.local.IsZero()) {
		r.busy, r.tried = true, now
		c.mu.Unlock()
		t, sent, got, err := c.query(ctx, db, r.local.IsZero())
		c.mu.Lock()
		r.busy = false
		// A measurement replaces the last one unless its error bound is
		// worse than the last one's plus the drift since (a slow round
		// trip on a loaded host would move the clock by up to half of
		// it, back and forth between processes' readings).
		rtt := got.Sub(sent)
		if err == nil && (r.local.IsZero() || rtt/2 <= r.rtt/2+sent.Sub(r.local)/MaxDrift) {
			r.db, r.local, r.rtt = t, sent.Add(rtt/2), rtt
		}
	}
	var out time.Time
	if r.local.IsZero() {
		out = time.Now() // never measured: see above
	} else {
		out = r.db.Add(time.Since(r.local))
	}
	c.mu.Unlock()
	return out.Round(0).Add(c.Skew)
}

// prune forgets primaries not asked about for a minute (pools Pool
// closed after a failover), so the map does not grow without bound.
func (c *Clock) prune(now time.Time) {
	for db, r := range c.byDB {
		if !r.busy && now.Sub(r.usedAt) > time.Minute {
			delete(c.byDB, db)
		}
	}
}

// query reads the primary's time, and when the read was sent and its
// answer came. The connection is taken before the read is timed: a new
// pool's first read would otherwise include opening a connection (the
// handshake, the session's settings and the account check), and the
// midpoint correction would set the clock ahead by half of that, until
// a better measurement replaced it a ClockRefresh later: rows would be
// served that long before their deliver_after.
//
// The first measurement of a primary keeps the best of firstSamples
// reads: later ones replace a reading only with a better one, but the
// first is kept however bad, and on a loaded host an answer that waits
// for a core sets the clock behind by half the wait (a row a router
// has just stamped ready is then not ready yet).
func (c *Clock) query(ctx context.Context, db *sqlx.DB, first bool) (t, sent, got time.Time, err error) {
	read := func(context.Context) (time.Time, error) { return c.measure(ctx, db) }
	if c.measure == nil {
		conn, err := db.Connx(ctx)
		if err != nil {
			return time.Time{}, time.Time{}, time.Time{}, err
		}
		defer conn.Close()
		read = func(ctx context.Context) (time.Time, error) {
			// Microseconds since the epoch in UTC, independent of the
			// session's time zone (UNIX_TIMESTAMP(NOW(6)) is ambiguous
			// in a DST fold).
			var us int64
			err := conn.GetContext(ctx, &us, "SELECT TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))")
			return time.UnixMicro(us), err
		}
	}
	samples := 1
	if first {
		samples = firstSamples
	}
	for i := range samples {
		s := time.Now()
		ti, err := read(ctx)
		g := time.Now()
		if err != nil {
			if i == 0 {
				return time.Time{}, time.Time{}, time.Time{}, err
			}
			break
		}
		if i == 0 || g.Sub(s) < got.Sub(sent) {
			t, sent, got = ti, s, g
		}
	}
	return t, sent, got, nil
}

// firstSamples is how many reads the first measurement of a primary
// takes (see query).
const firstSamples = 3
