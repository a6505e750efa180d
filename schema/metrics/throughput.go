package metrics

import (
	"math"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// The series of a namespace's throughput.
const (
	RateEnqueued = iota
	RateDelivered
	RateAcked
	RateDeadLettered
	numSeries
)

// Interval is the width of one throughput interval, and Intervals how
// many a namespace's ring keeps: the last hour.
const (
	Interval  = 10 * time.Second
	Intervals = 360
)

// ring is a namespace's item counts per Interval over the last
// Intervals, indexed by interval number (Unix time / Interval) modulo
// Intervals. A slot whose number is not the one asked for counts an
// older interval and reads as zero; the first count of a new interval
// clears it. It costs 12 KB per namespace whatever the traffic.
type ring struct {
	mu     sync.Mutex
	number [Intervals]int64
	counts [Intervals][numSeries]uint64
}

func (r *ring) add(at time.Time, series int, n uint64) {
	k := at.UnixNano() / int64(Interval)
	i := k % Intervals
	r.mu.Lock()
	if r.number[i] != k {
		r.number[i] = k
		r.counts[i] = [numSeries]uint64{}
	}
	r.counts[i][series] += n
	r.mu.Unlock()
}

// Throughput is a namespace's items per second in each series, one rate
// per Interval from Start, oldest first; the last interval is the
// current one, averaged over the part of it that has passed.
type Throughput struct {
	Start    time.Time
	Interval time.Duration
	// Rates holds the series RateEnqueued, RateDelivered, RateAcked and
	// RateDeadLettered, each Intervals long.
	Rates [numSeries][]float64
}

func (r *ring) snapshot(now time.Time) Throughput {
	cur := now.UnixNano() / int64(Interval)
	first := cur - Intervals + 1
	t := Throughput{Start: time.Unix(0, first*int64(Interval)), Interval: Interval}
	for s := range t.Rates {
		t.Rates[s] = make([]float64, Intervals)
	}
	if r == nil {
		return t
	}
	// The current interval's elapsed part, at least a second so that a
	// count just made does not read as a burst.
	elapsed := max(now.Sub(time.Unix(0, cur*int64(Interval))), time.Second)
	r.mu.Lock()
	defer r.mu.Unlock()
	for j := range Intervals {
		k := first + int64(j)
		i := k % Intervals
		if r.number[i] != k {
			continue
		}
		width := Interval.Seconds()
		if k == cur {
			width = elapsed.Seconds()
		}
		for s := range numSeries {
			t.Rates[s][j] = float64(r.counts[i][s]) / width
		}
	}
	return t
}

// rateCounter is a Prometheus counter that also counts into a
// namespace's ring, so the console's chart needs no Prometheus: the
// callers that count deliveries, acks and dead letters keep calling Inc
// and Add on the counter they hold.
type rateCounter struct {
	prometheus.Counter
	ring   *ring
	series int
	now    func() time.Time
}

func (c rateCounter) Inc() {
	c.Counter.Inc()
	c.ring.add(c.now(), c.series, 1)
}

func (c rateCounter) Add(v float64) {
	c.Counter.Add(v) // panics when v < 0, as every counter does
	if n := math.Round(v); n >= 1 {
		c.ring.add(c.now(), c.series, uint64(n))
	}
}

// ringLocked returns ns's ring, made on first use; s.mu is held for
// writing.
func (s *Set) ringLocked(ns string) *ring {
	r := s.rings[ns]
	if r == nil {
		r = &ring{}
		s.rings[ns] = r
	}
	return r
}

// counting returns c counting series into ns's ring as well; s.mu is
// held for writing.
func (s *Set) counting(c prometheus.Counter, ns string, series int) prometheus.Counter {
	return rateCounter{Counter: c, ring: s.ringLocked(ns), series: series, now: s.now}
}

// Throughput returns ns's items per second over the last hour as this
// node counted them (its router's enqueues and acks, its dequeuer's
// deliveries, and the dead letters either made). Only ns's own counts go
// in: each namespace has its own ring. All zero for a namespace this node
// has not counted.
func (s *Set) Throughput(ns string) Throughput {
	s = s.or()
	s.mu.RLock()
	r := s.rings[ns]
	s.mu.RUnlock()
	return r.snapshot(s.now())
}
