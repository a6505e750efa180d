package bench

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/google/pprof/profile"
)

func TestLoadShareCountsLabelledCPU(t *testing.T) {
	fn := &profile.Function{ID: 1, Name: "f"}
	loc := &profile.Location{ID: 1, Line: []profile.Line{{Function: fn}}}
	sample := func(nanos int64, labels map[string][]string) *profile.Sample {
		return &profile.Sample{Location: []*profile.Location{loc}, Value: []int64{nanos / 1e7, nanos}, Label: labels}
	}
	p := &profile.Profile{
		SampleType: []*profile.ValueType{{Type: "samples", Unit: "count"}, {Type: "cpu", Unit: "nanoseconds"}},
		Function:   []*profile.Function{fn},
		Location:   []*profile.Location{loc},
		Sample: []*profile.Sample{
			sample(300e6, map[string][]string{loadLabelKey: {loadLabelValue}}),
			sample(600e6, nil),
			sample(100e6, map[string][]string{loadLabelKey: {"other"}}),
		},
	}
	path := filepath.Join(t.TempDir(), "cpu.pprof")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Write(f); err != nil {
		t.Fatal(err)
	}
	f.Close()
	share, err := loadShare(path)
	if err != nil {
		t.Fatal(err)
	}
	if share < 0.2999 || share > 0.3001 {
		t.Fatalf("load share %.4f, want 0.3 (300 ms of 1 s labelled bench=load)", share)
	}
	if _, err := loadShare(filepath.Join(t.TempDir(), "missing.pprof")); err == nil {
		t.Fatal("a missing profile gave no error")
	}
}
