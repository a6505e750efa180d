package bench

import (
	"context"
	"fmt"
	"io"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/triage-queue/triage/schema"
)

// window is a measurement window. Work that completes inside it counts;
// work that completes during the warm-up before it or the drain after it
// does not.
type window struct{ from, to time.Time }

func (w window) has(t time.Time) bool { return !t.Before(w.from) && t.Before(w.to) }

func (w window) seconds() float64 { return w.to.Sub(w.from).Seconds() }

// sampler collects what one worker observed inside a window. Each worker
// owns one, so recording takes no lock; merge combines them at the end.
type sampler struct {
	w     window
	items int64
	ops   int64
	errs  int64
	err   error // first error seen
	lat   map[string][]time.Duration
}

func newSampler(w window) *sampler { return &sampler{w: w, lat: map[string][]time.Duration{}} }

// observe records latency d of metric for an operation that ended at end,
// if end is inside the window.
func (s *sampler) observe(metric string, end time.Time, d time.Duration) {
	if s.w.has(end) {
		s.lat[metric] = append(s.lat[metric], d)
	}
}

// done counts an operation of n items that ended at end.
func (s *sampler) done(end time.Time, n int) {
	if s.w.has(end) {
		s.items += int64(n)
		s.ops++
	}
}

// fail counts a failed operation. Errors count whatever the window, so a
// broken scenario cannot hide in its warm-up.
func (s *sampler) fail(err error) {
	s.errs++
	if s.err == nil {
		s.err = err
	}
}

func merge(w window, ss []*sampler) *sampler {
	out := newSampler(w)
	for _, s := range ss {
		out.items += s.items
		out.ops += s.ops
		out.errs += s.errs
		if out.err == nil {
			out.err = s.err
		}
		for k, v := range s.lat {
			out.lat[k] = append(out.lat[k], v...)
		}
	}
	for _, v := range out.lat {
		slices.Sort(v)
	}
	return out
}

func (s *sampler) rate() float64 { return float64(s.items) / s.w.seconds() }

// perOp is the mean number of items an operation completed.
func (s *sampler) perOp() float64 {
	if s.ops == 0 {
		return 0
	}
	return float64(s.items) / float64(s.ops)
}

// pct returns the p-th percentile (0..100) of metric in milliseconds, by
// nearest rank, or 0 when nothing was observed. merge sorts the samples.
func (s *sampler) pct(metric string, p float64) float64 { return percentile(s.lat[metric], p) }

func percentile(sorted []time.Duration, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(p/100*float64(len(sorted))+0.999999) - 1
	i = min(max(i, 0), len(sorted)-1)
	return ms(sorted[i])
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// errNote describes a sampler's errors for a scenario's notes, or "".
func (s *sampler) errNote() string {
	if s.errs == 0 {
		return ""
	}
	return fmt.Sprintf("%d failed operations (first: %v)", s.errs, s.err)
}

// loadSpec is a closed-loop load: workers each run op back to back.
type loadSpec struct {
	workers int
	warmup  time.Duration
	measure time.Duration
	// op runs one operation and returns how many items it completed. It
	// records its own latencies in s (the runner records "op" for the whole
	// call). No new op starts after the window, and ops are not cancelled
	// when it ends, so a dequeue+ack op always acks what it leased.
	op func(ctx context.Context, worker int, s *sampler) (int, error)
}

// progress prints a line per interval with the rate of items counted on
// items since the last line.
type progress struct {
	out   io.Writer
	label string
	items atomic.Int64
	stop  chan struct{}
	wg    sync.WaitGroup
}

func startProgress(out io.Writer, label string, every time.Duration) *progress {
	p := &progress{out: out, label: label, stop: make(chan struct{})}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		t := time.NewTicker(every)
		defer t.Stop()
		last, lastAt := int64(0), time.Now()
		for {
			select {
			case <-p.stop:
				return
			case now := <-t.C:
				n := p.items.Load()
				fmt.Fprintf(p.out, "%s: %s items/s\n", p.label, human((float64(n-last))/now.Sub(lastAt).Seconds()))
				last, lastAt = n, now
			}
		}
	}()
	return p
}

func (p *progress) close() {
	close(p.stop)
	p.wg.Wait()
}

// runLoad runs spec and returns the merged samples of its window. It
// returns when every worker has finished its last operation; a worker
// whose op keeps failing backs off briefly so a broken path does not spin.
func runLoad(ctx context.Context, spec loadSpec, prog *progress) *sampler {
	start := time.Now()
	w := window{from: start.Add(spec.warmup), to: start.Add(spec.warmup + spec.measure)}
	ss := make([]*sampler, spec.workers)
	var wg sync.WaitGroup
	for i := range spec.workers {
		ss[i] = newSampler(w)
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := ss[i]
			for ctx.Err() == nil && time.Now().Before(w.to) {
				t0 := time.Now()
				n, err := spec.op(ctx, i, s)
				end := time.Now()
				if err != nil {
					if ctx.Err() != nil {
						return
					}
					s.fail(err)
					schema.Sleep(ctx, 10*time.Millisecond)
					continue
				}
				s.observe("op", end, end.Sub(t0))
				s.done(end, n)
				if prog != nil {
					prog.items.Add(int64(n))
				}
			}
		}()
	}
	wg.Wait()
	return merge(w, ss)
}

// human formats a rate: 950, 12.3k, 1.25M.
func human(v float64) string {
	switch {
	case v >= 1e6:
		return fmt.Sprintf("%.2fM", v/1e6)
	case v >= 1e4:
		return fmt.Sprintf("%.1fk", v/1e3)
	case v >= 1e3:
		return fmt.Sprintf("%.2fk", v/1e3)
	default:
		return fmt.Sprintf("%.0f", v)
	}
}
