package drill

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/timestamppb"

	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
)

// fakeRouter serves the Admin calls a drill makes, with one shard in
// us-east that never fails over, and records ReportDrill; its Queue is
// unimplemented, so the workload only collects errors.
type fakeRouter struct {
	triagev1.UnimplementedAdminServer
	fail error

	mu      sync.Mutex
	reports []*triagev1.ReportDrillRequest
}

func (f *fakeRouter) GetShardMap(context.Context, *triagev1.GetShardMapRequest) (*triagev1.ShardMap, error) {
	return &triagev1.ShardMap{Version: 1, Regions: []string{"us-east"},
		Shards: []*triagev1.Shard{{Id: 1, HomeRegion: "us-east", Primary: "127.0.0.1:3306", PrimaryRegion: "us-east", Epoch: 1}}}, nil
}

func (f *fakeRouter) PutNamespace(_ context.Context, r *triagev1.PutNamespaceRequest) (*triagev1.Namespace, error) {
	return r.Config, nil
}

func (f *fakeRouter) GetNamespace(_ context.Context, r *triagev1.GetNamespaceRequest) (*triagev1.Namespace, error) {
	return &triagev1.Namespace{Name: r.Namespace}, nil
}

func (f *fakeRouter) ReportDrill(_ context.Context, r *triagev1.ReportDrillRequest) (*triagev1.Drill, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reports = append(f.reports, r)
	return &triagev1.Drill{Id: r.Id}, f.fail
}

func serveFake(t *testing.T, f *fakeRouter) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	s := grpc.NewServer()
	triagev1.RegisterAdminServer(s, f)
	go func() { _ = s.Serve(l) }()
	t.Cleanup(s.Stop)
	return l.Addr().String()
}

func quickDrill(addr string, progress *syncBuffer) Config {
	return Config{Scenario: "primary-kill", Region: "us-east", Bed: &fakeBed{routers: []Router{{Region: "us-east", Addr: addr}}},
		Warmup: 10 * time.Millisecond, Hold: 300 * time.Millisecond, Drain: time.Second, Lease: 100 * time.Millisecond,
		Producers: 1, Consumers: 1, Progress: progress, Report: true, ID: "primary-kill-test"}
}

// TestRunReportsProgress: a drill with Report sends every progress line
// to ReportDrill in order under its id, the phases in the order they
// happen, and ends with done, the report's verdict and its lines.
func TestRunReportsProgress(t *testing.T) {
	t.Parallel()
	f := &fakeRouter{}
	var progress syncBuffer
	rep, err := Run(t.Context(), quickDrill(serveFake(t, f), &progress))
	require.NoError(t, err)

	f.mu.Lock()
	defer f.mu.Unlock()
	var events, phases []string
	for _, r := range f.reports {
		require.Equal(t, "primary-kill-test", r.Id)
		require.Equal(t, "primary-kill", r.Scenario)
		for _, e := range r.Events {
			events = append(events, e.Text)
		}
		if r.Phase != "" {
			phases = append(phases, r.Phase)
		}
	}
	require.Equal(t, []string{PhaseStarting, PhaseFaulted, PhaseHealed, PhaseDraining, PhaseDone}, phases, "no failover: the map never changes")
	last := f.reports[len(f.reports)-1]
	require.True(t, last.Done)
	require.Equal(t, "PASS", rep.Verdict(), "nothing was acknowledged, so nothing lost")
	require.Equal(t, rep.Verdict(), last.Verdict)
	for _, r := range f.reports[:len(f.reports)-1] {
		require.False(t, r.Done, "done only at the end")
	}
	lines := strings.Split(strings.TrimSpace(progress.String()), "\n")
	require.Len(t, lines, 4, "starting, fault injected, healed, draining: %q", lines)
	require.Equal(t, lines, events[:len(lines)], "the progress lines, in order")
	var printed strings.Builder
	rep.Print(&printed)
	var summary []string
	for _, l := range strings.Split(printed.String(), "\n") {
		if l = strings.TrimRight(l, " "); l != "" {
			summary = append(summary, l)
		}
	}
	require.Equal(t, summary, events[len(lines):], "then the report's lines")
	require.Regexp(t, `^\s*result\s+PASS$`, events[len(events)-1], "the verdict last")
}

// TestRunReportFailureIsHarmless: a router whose ReportDrill fails does
// not fail the drill; the failure is said once on Progress.
func TestRunReportFailureIsHarmless(t *testing.T) {
	t.Parallel()
	f := &fakeRouter{fail: errors.New("no drills here")}
	var progress syncBuffer
	rep, err := Run(t.Context(), quickDrill(serveFake(t, f), &progress))
	require.NoError(t, err)
	require.NotNil(t, rep)
	require.Equal(t, 1, strings.Count(progress.String(), "drill progress not reported to the console (the drill goes on)"), progress.String())
	require.Contains(t, progress.String(), "healed in")
}

// eventsAdmin answers ListFailoverEvents with fixed events.
type eventsAdmin struct {
	triagev1.AdminClient
	events []*triagev1.FailoverEvent
}

func (a eventsAdmin) ListFailoverEvents(context.Context, *triagev1.ListFailoverEventsRequest, ...grpc.CallOption) (*triagev1.ListFailoverEventsResponse, error) {
	return &triagev1.ListFailoverEventsResponse{Events: a.events}, nil
}

// TestFailoverSteps: the report keeps the faulted shards' steps between
// the fault and the heal, timed from the fault, in order.
func TestFailoverSteps(t *testing.T) {
	t.Parallel()
	fault := time.Now()
	ev := func(after time.Duration, shard uint32, step string) *triagev1.FailoverEvent {
		return &triagev1.FailoverEvent{At: timestamppb.New(fault.Add(after)), Shard: shard, Step: step, Details: "d"}
	}
	admin := eventsAdmin{events: []*triagev1.FailoverEvent{
		ev(2*time.Second, 1, "published"),
		ev(-time.Minute, 1, "an earlier drill"),
		ev(700*time.Millisecond, 1, "fenced"),
		ev(time.Second, 2, "another shard"),
		ev(time.Hour, 1, "after the heal"),
	}}
	steps, err := failoverSteps(t.Context(), admin, map[uint32]bool{1: true}, fault, fault.Add(10*time.Second))
	require.NoError(t, err)
	require.Equal(t, []Step{{AtMS: 700, Shard: 1, Step: "fenced", Details: "d"}, {AtMS: 2000, Shard: 1, Step: "published", Details: "d"}}, steps)
}
