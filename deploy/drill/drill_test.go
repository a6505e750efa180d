package drill

import (
	"bytes"
	"context"
	"errors"
	"maps"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"

	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
)

// fakeBed is a Bed that injects nothing and records what it was asked.
type fakeBed struct {
	routers []Router
	err     error
	asked   []string
}

func (b *fakeBed) Routers(context.Context) ([]Router, error) { return b.routers, b.err }
func (b *fakeBed) Inject(_ context.Context, f Fault) (Injection, error) {
	b.asked = append(b.asked, "inject "+f.Scenario)
	return Injection{}, nil
}
func (b *fakeBed) Heal(_ context.Context, f Fault) (string, error) {
	b.asked = append(b.asked, "heal "+f.Scenario)
	return "", nil
}
func (b *fakeBed) Fate(_ context.Context, f Fault) (string, error) {
	b.asked = append(b.asked, "fate "+f.Scenario)
	return "", nil
}

// TestRunRefusesBeforeInjecting: a drill that cannot run (unknown
// scenario, no bed, a bed without routers, --via naming no region of the
// bed) says why and never touches the bed's faults.
func TestRunRefusesBeforeInjecting(t *testing.T) {
	t.Parallel()
	routers := []Router{{Region: "us-east", Addr: "127.0.0.1:1"}, {Region: "eu-west", Addr: "127.0.0.1:1"}}
	for _, tc := range []struct {
		name string
		cfg  Config
		bed  *fakeBed
		want string
	}{
		{name: "unknown scenario", cfg: Config{Scenario: "meteor"}, bed: &fakeBed{routers: routers}, want: `unknown scenario "meteor"`},
		{name: "no bed", cfg: Config{Scenario: "partition"}, want: "no bed"},
		{name: "routers unknown", cfg: Config{Scenario: "partition"}, bed: &fakeBed{err: errors.New("docker: not found")}, want: "docker: not found"},
		{name: "via names no region", cfg: Config{Scenario: "partition", Via: []string{"mars"}}, bed: &fakeBed{routers: routers},
			want: "the bed's regions are [us-east eu-west]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cfg := tc.cfg
			if tc.bed != nil {
				cfg.Bed = tc.bed
			}
			_, err := Run(context.Background(), cfg)
			require.ErrorContains(t, err, tc.want)
			if tc.bed != nil {
				require.Empty(t, tc.bed.asked)
			}
		})
	}
}

// TestFaultedShardsShareTheServer: a primary-kill or mariadb-pause faults
// every shard whose primary is on the server, not only the named shard's.
// The workload spreads its items over every home shard, so with one of a
// server's 251 shards counted, the RTO at 1,000 shards measured the wait
// for a call to land on that shard (9.6-23 s), not the recovery.
func TestFaultedShardsShareTheServer(t *testing.T) {
	t.Parallel()
	home := []uint32{1, 2, 3, 4, 5}
	primaries := map[uint32]string{1: "a:1", 2: "b:1", 3: "a:1", 4: "c:1", 5: "a:1"}
	keys := func(m map[uint32]bool) []uint32 { return slices.Sorted(maps.Keys(m)) }
	require.Equal(t, []uint32{1, 3, 5}, keys(faulted("primary-kill", 3, home, primaries)))
	require.Equal(t, []uint32{2}, keys(faulted("mariadb-pause", 2, home, primaries)))
	require.Equal(t, home, keys(faulted("partition", 1, home, primaries)), "a region's fault reaches every home shard")
}

// movingMapAdmin answers GetShardMap with shard 1 on primary "old:1"
// for its first call and on "new:1" after.
type movingMapAdmin struct {
	triagev1.AdminClient
	calls atomic.Int32
}

func (a *movingMapAdmin) GetShardMap(context.Context, *triagev1.GetShardMapRequest, ...grpc.CallOption) (*triagev1.ShardMap, error) {
	primary := "old:1"
	if a.calls.Add(1) > 1 {
		primary = "new:1"
	}
	return &triagev1.ShardMap{Shards: []*triagev1.Shard{{Id: 1, Primary: primary}}}, nil
}

// TestFailoverWatchPollsWhileTheBedInjects: a publication seen while the
// bed is still injecting (the compose bed's docker CLI takes seconds) is
// timed when seen, not once the fault is known: the watch asks for the
// fault's time only to print a move.
func TestFailoverWatchPollsWhileTheBedInjects(t *testing.T) {
	t.Parallel()
	known := make(chan struct{})
	faultAt := time.Now()
	wait := func() (time.Time, bool) { <-known; return faultAt, true }
	published := map[uint32]time.Time{}
	done := make(chan struct{})
	var out bytes.Buffer
	go func() {
		defer close(done)
		watchFailover(t.Context(), &movingMapAdmin{}, map[uint32]string{1: "old:1"}, map[uint32]bool{1: true}, published, wait, &out)
	}()
	time.Sleep(time.Second) // the bed still injecting
	knownAt := time.Now()
	close(known)
	<-done
	require.True(t, published[1].Before(knownAt), "published at %v, the fault known at %v", published[1], knownAt)
	require.Contains(t, out.String(), "shard 1: new primary new:1")
}
