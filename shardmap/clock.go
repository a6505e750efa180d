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
	// Server, when set, names the server behind a pool (Pool.ServerOf):
	// pools of the databases of one server share its readings, so a
	// process measures each server, not each shard database on it.
	// Unset, or "" for a pool, readings are per pool.
	Server func(db *sqlx.DB) string
	// Skew, for tests, is added to every reading.
	Skew time.Duration
	// measure, for tests, replaces the database query.
	measure func(ctx context.Context, db *sqlx.DB) (time.Time, error)

	mu       sync.Mutex
	readings map[any]*clockReading // by server name, or by pool
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
// Pool). The first call for a primary measures it, and waits for that;
// later calls measure again at most every ClockRefresh, in the
// background, one at a time, while every caller goes on with the last
// measurement (a refresh corrects the drift of two oscillators over a
// second, at most half a millisecond, which no caller needs to wait for:
// at a thousand shards, callers that waited for their shard's refresh
// held up every ready notice of a dequeuer behind one query each). If a
// primary was never measured and cannot be reached, Now falls back to the
// local clock: the statement the caller runs next fails the same way.
func (c *Clock) Now(ctx context.Context, db *sqlx.DB) time.Time {
	var key any = db
	if c.Server != nil {
		if srv := c.Server(db); srv != "" {
			key = srv
		}
	}
	c.mu.Lock()
	if c.readings == nil {
		c.readings = map[any]*clockReading{}
	}
	r := c.readings[key]
	now := time.Now()
	if r == nil {
		c.prune(now)
		r = &clockReading{}
		c.readings[key] = r
	}
	r.usedAt = now
	switch {
	case r.local.IsZero():
		// Never measured: every caller measures (one that failed,
		// against a primary that did not answer, is no better).
		r.busy, r.tried = true, now
		c.mu.Unlock()
		t, sent, got, err := c.query(ctx, db, true)
		c.mu.Lock()
		c.keep(r, t, sent, got, err)
	case now.Sub(r.tried) >= ClockRefresh && !r.busy:
		r.busy, r.tried = true, now
		go func() {
			ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ClockRefresh)
			defer cancel()
			t, sent, got, err := c.query(ctx, db, false)
			c.mu.Lock()
			defer c.mu.Unlock()
			c.keep(r, t, sent, got, err)
		}()
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

// keep takes a measurement (t read between sent and got) as r's reading
// unless its error bound is worse than the last one's plus the drift
// since: a slow round trip on a loaded host would move the clock by up to
// half of it, back and forth between processes' readings. Caller holds
// c.mu.
func (c *Clock) keep(r *clockReading, t, sent, got time.Time, err error) {
	r.busy = false
	rtt := got.Sub(sent)
	if err == nil && (r.local.IsZero() || rtt/2 <= r.rtt/2+sent.Sub(r.local)/MaxDrift) {
		r.db, r.local, r.rtt = t, sent.Add(rtt/2), rtt
	}
}

// prune forgets primaries not asked about for a minute (pools Pool
// closed after a failover), so the map does not grow without bound.
func (c *Clock) prune(now time.Time) {
	for key, r := range c.readings {
		if !r.busy && now.Sub(r.usedAt) > time.Minute {
			delete(c.readings, key)
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
