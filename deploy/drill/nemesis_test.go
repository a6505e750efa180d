package drill

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestScheduleReplaysItsSeed: a seed gives the same faults at the same
// offsets every time, within the duration; a fault starts after every
// earlier one healed, or overlaps the one before it as a light fault
// (nats-kill, dequeuer-kill, enqueuer-kill, wan-spike) of another kind
// and region, never a third; primary kills and pauses hit the items'
// shards, a pause holds past the clients' 30 s timeouts; region-down
// comes only last and alone; every scenario, and overlaps, are drawn by
// some seed; another seed gives another schedule.
func TestScheduleReplaysItsSeed(t *testing.T) {
	t.Parallel()
	regions := []string{"us-east", "eu-west", "ap-south"}
	home := []uint32{1, 2}
	kinds := map[string]int{}
	overlaps := 0
	light := map[string]bool{"nats-kill": true, "dequeuer-kill": true, "enqueuer-kill": true, "wan-spike": true}
	for seed := range uint64(40) {
		a := Schedule(seed, 3*time.Minute, regions, "us-east", home)
		require.Equal(t, a, Schedule(seed, 3*time.Minute, regions, "us-east", home), "seed %d", seed)
		require.NotEmpty(t, a)
		end := time.Duration(0) // when every fault before the current one healed
		for i, f := range a {
			kinds[f.Fault.Scenario]++
			if f.After < end {
				overlaps++
				prev := a[i-1]
				require.True(t, light[f.Fault.Scenario], "seed %d fault %d: only a light fault overlaps: %+v", seed, i, f)
				require.NotEqual(t, prev.Fault.Scenario, f.Fault.Scenario, "seed %d fault %d", seed, i)
				require.NotEqual(t, prev.Fault.Region, f.Fault.Region, "seed %d fault %d", seed, i)
				require.GreaterOrEqual(t, f.After, prev.After, "seed %d fault %d: in injection order", seed, i)
				require.Less(t, f.After, prev.After+prev.Hold, "seed %d fault %d: during the other's hold", seed, i)
				if i >= 2 {
					require.GreaterOrEqual(t, f.After, a[i-2].After+a[i-2].Hold, "seed %d fault %d: never three at once", seed, i)
				}
			} else {
				require.GreaterOrEqual(t, f.After, end+2*time.Second, "seed %d fault %d starts 2 s after the last heal", seed, i)
			}
			end = max(end, f.After+f.Hold)
			require.LessOrEqual(t, end, 3*time.Minute)
			require.Contains(t, regions, f.Fault.Region)
			switch f.Fault.Scenario {
			case "primary-kill", "mariadb-pause":
				require.Contains(t, home, f.Fault.Shard)
				require.Equal(t, "us-east", f.Fault.Region)
			}
			if f.Fault.Scenario == "mariadb-pause" {
				require.Greater(t, f.Hold, 30*time.Second, "seed %d: a pause outlasts the driver's read timeout", seed)
			} else {
				require.LessOrEqual(t, f.Hold, 12*time.Second)
			}
			if f.Fault.Scenario == "region-down" {
				require.Equal(t, len(a)-1, i, "seed %d: region-down only last", seed)
				require.GreaterOrEqual(t, f.After, a[max(i-1, 0)].After+a[max(i-1, 0)].Hold, "seed %d: region-down alone", seed)
			}
		}
	}
	for _, k := range Scenarios {
		require.Positive(t, kinds[k], "%s is drawn by some seed", k)
	}
	require.Positive(t, overlaps, "some seed overlaps two faults")
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

// TestRecorderTellsNotInjectedFromHealFailures: a fault the bed could not
// inject tested nothing but broke no promise; one it could not heal left
// the bed broken, which fails the run.
func TestRecorderTellsNotInjectedFromHealFailures(t *testing.T) {
	r := &NemesisReport{}
	var progress strings.Builder
	rec := r.recorder(time.Now(), &progress)
	f := Fault{Scenario: "enqueuer-kill", Region: "ap-south"}
	rec("inject", f, "", errors.New("bootstrap shard map: nats: no response from stream"))
	require.Len(t, r.NotInjected, 1)
	require.Empty(t, r.Violations, "a fault not injected is no violation")
	rec("heal", Fault{Scenario: "partition", Region: "us-east"}, "", errors.New("restart: refused"))
	require.Len(t, r.Violations, 1)
	require.Contains(t, r.Violations[0], "heal partition in us-east")
	require.Len(t, r.Timeline, 2)
	require.Contains(t, progress.String(), "FAILED: bootstrap shard map")
}

// slowBed records when faults are injected and healed; healing the
// first fault takes healFor.
type slowBed struct {
	mu      sync.Mutex
	healFor time.Duration
	log     []string
}

func (b *slowBed) Routers(context.Context) ([]Router, error)   { return nil, nil }
func (b *slowBed) Fate(context.Context, Fault) (string, error) { return "", nil }
func (b *slowBed) Inject(_ context.Context, f Fault) (Injection, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.log = append(b.log, "inject "+f.Scenario)
	return Injection{}, nil
}
func (b *slowBed) Heal(_ context.Context, f Fault) (string, error) {
	b.mu.Lock()
	first := len(b.log) == 1
	b.mu.Unlock()
	if first {
		time.Sleep(b.healFor)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.log = append(b.log, "heal "+f.Scenario)
	return "", nil
}

// TestRunKeepsHeavyFaultsApartWhenAStepRunsLate: a heal that runs long
// makes the next injection late; the injections after it move by as
// much, so the one after that still lands after the late one's heal,
// never while it is in effect.
func TestRunKeepsHeavyFaultsApartWhenAStepRunsLate(t *testing.T) {
	t.Parallel()
	plan := []ScheduledFault{
		{Fault: Fault{Scenario: "partition"}, After: 0, Hold: 10 * time.Millisecond},
		{Fault: Fault{Scenario: "mariadb-pause"}, After: 50 * time.Millisecond, Hold: 300 * time.Millisecond},
		{Fault: Fault{Scenario: "primary-kill"}, After: 400 * time.Millisecond, Hold: 10 * time.Millisecond},
	}
	bed := &slowBed{healFor: 500 * time.Millisecond}
	run(t.Context(), bed, plan, time.Now(), func(string, Fault, string, error) {}, func(Fault) {})
	require.Equal(t, []string{"inject partition", "heal partition", "inject mariadb-pause", "heal mariadb-pause",
		"inject primary-kill", "heal primary-kill"}, bed.log)
}
