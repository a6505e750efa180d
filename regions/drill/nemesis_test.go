package drill

import (
	"bytes"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestScheduleReplaysItsSeed: a seed gives the same faults at the same
// offsets every time, within the duration, one at a time, primary kills on
// the items' shards, and region-down only as the last fault; another
// seed gives another schedule.
func TestScheduleReplaysItsSeed(t *testing.T) {
	t.Parallel()
	regions := []string{"us-east", "eu-west", "ap-south"}
	home := []uint32{1, 2}
	kinds := map[string]int{}
	for seed := range uint64(40) {
		a := Schedule(seed, 3*time.Minute, regions, "us-east", home)
		require.Equal(t, a, Schedule(seed, 3*time.Minute, regions, "us-east", home), "seed %d", seed)
		require.NotEmpty(t, a)
		end := time.Duration(0)
		for i, f := range a {
			kinds[f.Fault.Scenario]++
			require.GreaterOrEqual(t, f.After, end+2*time.Second, "seed %d fault %d starts after the last heal", seed, i)
			end = f.After + f.Hold
			require.LessOrEqual(t, end, 3*time.Minute)
			require.Contains(t, regions, f.Fault.Region)
			if f.Fault.Scenario == "primary-kill" {
				require.Contains(t, home, f.Fault.Shard)
				require.Equal(t, "us-east", f.Fault.Region)
			}
			if f.Fault.Scenario == "region-down" {
				require.Equal(t, len(a)-1, i, "seed %d: region-down only last", seed)
			}
		}
	}
	for _, k := range Scenarios {
		require.Positive(t, kinds[k], "%s is drawn by some seed", k)
	}
	require.NotEqual(t, Schedule(1, 3*time.Minute, regions, "us-east", home), Schedule(2, 3*time.Minute, regions, "us-east", home))
}

// TestNemesisReportPrintsTheSeedOnFailure: a failing run says how to
// replay it, and what became of each item it counts lost.
func TestNemesisReportPrintsTheSeedOnFailure(t *testing.T) {
	t.Parallel()
	r := &NemesisReport{Seed: 42, Region: "us-east", Faults: map[string]int{"partition": 1},
		Timeline: []NemesisEvent{{AtMS: 2000, Action: "inject", Scenario: "partition", Region: "us-east", Detail: "cut"}},
		Checks: &Report{Lost: 1, LostIDs: []string{"1-00000000000000ff"},
			LostState: map[string]string{"1-00000000000000ff": "still stored: READY, 0 attempts (via eu-west)"}},
		Violations: []string{"1 acknowledged items lost"}}
	var out bytes.Buffer
	r.Print(&out)
	require.Contains(t, out.String(), "replay: --seed 42")
	require.Contains(t, out.String(), "partition us-east")
	require.Contains(t, out.String(), "1-00000000000000ff: still stored: READY", "a lost item says where it is")
}
