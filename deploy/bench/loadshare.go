package bench

import (
	"context"
	"fmt"
	"os"
	"runtime/pprof"

	"github.com/google/pprof/profile"
)

// The profiler label every scenario runs under, so that a profile tells
// the load generators' CPU from the node's (the package doc, Reading the
// numbers, says why and how to read it).
const (
	loadLabelKey   = "bench"
	loadLabelValue = "load"
)

// asLoad runs fn with the load label on this goroutine.
func asLoad(ctx context.Context, fn func(ctx context.Context)) {
	pprof.Do(ctx, pprof.Labels(loadLabelKey, loadLabelValue), fn)
}

// withoutLoadLabel runs fn on this goroutine without profiler labels, so
// that what it starts (a bed's nodes) is not counted as load, and puts
// ctx's labels back.
func withoutLoadLabel(ctx context.Context, fn func()) {
	pprof.SetGoroutineLabels(context.Background())
	defer pprof.SetGoroutineLabels(ctx)
	fn()
}

// loadShare reads a CPU profile and returns the share of its CPU time
// spent on goroutines labelled as load.
func loadShare(path string) (float64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	p, err := profile.Parse(f)
	if err != nil {
		return 0, err
	}
	cpu := -1
	for i, st := range p.SampleType {
		if st.Type == "cpu" {
			cpu = i
		}
	}
	if cpu < 0 {
		return 0, fmt.Errorf("%s: no cpu samples", path)
	}
	var load, all int64
	for _, s := range p.Sample {
		v := s.Value[cpu]
		all += v
		if vs := s.Label[loadLabelKey]; len(vs) == 1 && vs[0] == loadLabelValue {
			load += v
		}
	}
	if all == 0 {
		return 0, nil
	}
	return float64(load) / float64(all), nil
}
