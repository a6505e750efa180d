package drill

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"

	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
)

// fakeAdmin records ReportDrill calls; fail or block make it misbehave.
type fakeAdmin struct {
	mu    sync.Mutex
	calls []*triagev1.ReportDrillRequest
	fail  error
	block chan struct{}
}

func (f *fakeAdmin) ReportDrill(ctx context.Context, in *triagev1.ReportDrillRequest, _ ...grpc.CallOption) (*triagev1.Drill, error) {
	if f.block != nil {
		select {
		case <-f.block:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, in)
	return &triagev1.Drill{Id: in.Id}, f.fail
}

func (f *fakeAdmin) texts() (events, phases []string, done bool, verdict string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range f.calls {
		for _, e := range c.Events {
			events = append(events, e.Text)
		}
		if c.Phase != "" {
			phases = append(phases, c.Phase)
		}
		done = done || c.Done
		verdict = orElse(verdict, c.Verdict)
	}
	return
}

func orElse(a, b string) string {
	if b != "" {
		return b
	}
	return a
}

// syncBuffer is a strings.Builder safe for the reporter's goroutine.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestReporterSendsLinesInOrder: every line written reaches ReportDrill,
// in order and under the drill's id, with the phases, and the verdict and
// summary come last, done; Progress still gets every line.
func TestReporterSendsLinesInOrder(t *testing.T) {
	t.Parallel()
	api := &fakeAdmin{}
	var out syncBuffer
	r := newReporter(api, "primary-kill-1", "primary-kill", &out)
	r.phase(PhaseStarting)
	var want []string
	for i := range 250 {
		line := fmt.Sprintf("line %d", i)
		want = append(want, line)
		fmt.Fprintf(r, "%s\n", line)
		if i == 100 {
			r.phase(PhaseFaulted)
		}
		if i%50 == 0 {
			// Let the sender keep up: the queue drops what overflows it
			// (TestReporterFailureIsHarmless).
			require.Eventually(t, func() bool { return len(r.ch) == 0 }, 10*time.Second, time.Millisecond)
		}
	}
	fmt.Fprint(r, "split ")
	fmt.Fprint(r, "line\n")
	want = append(want, "split line", "result  PASS")
	r.finish(t.Context(), "PASS", []string{"", "result  PASS", ""})

	events, phases, done, verdict := api.texts()
	require.Equal(t, want, events)
	require.Equal(t, []string{PhaseStarting, PhaseFaulted, PhaseDone}, phases)
	require.True(t, done)
	require.Equal(t, "PASS", verdict)
	api.mu.Lock()
	for _, c := range api.calls {
		require.Equal(t, "primary-kill-1", c.Id)
		require.Equal(t, "primary-kill", c.Scenario)
		require.LessOrEqual(t, len(c.Events), maxEventsPerReport)
	}
	api.mu.Unlock()
	require.Contains(t, out.String(), "line 249\nsplit line\n")
	require.NotContains(t, out.String(), "not reported")

	fmt.Fprintln(r, "after the end") // still printed, no longer sent
	require.Contains(t, out.String(), "after the end")
}

// TestReporterFailureIsHarmless: a ReportDrill that fails is said once on
// Progress and never fails the writer; one that hangs blocks no write, and
// finish gives up on it in bounded time.
func TestReporterFailureIsHarmless(t *testing.T) {
	t.Parallel()
	t.Run("failing", func(t *testing.T) {
		t.Parallel()
		api := &fakeAdmin{fail: errors.New("router down")}
		var out syncBuffer
		r := newReporter(api, "d", "partition", &out)
		for i := range 20 {
			_, err := fmt.Fprintf(r, "line %d\n", i)
			require.NoError(t, err)
		}
		r.finish(t.Context(), "PASS", nil)
		require.Equal(t, 1, strings.Count(out.String(), "drill progress not reported to the console (the drill goes on): router down"), out.String())
		require.Contains(t, out.String(), "line 19\n")
	})
	t.Run("hanging", func(t *testing.T) {
		t.Parallel()
		api := &fakeAdmin{block: make(chan struct{})}
		defer close(api.block)
		var out syncBuffer
		r := newReporter(api, "d", "partition", &out)
		start := time.Now()
		for i := range 10 * reportQueue {
			fmt.Fprintf(r, "line %d\n", i)
			r.phase(PhaseFaulted)
		}
		require.Less(t, time.Since(start), time.Second, "writes waited for the router")
		ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
		defer cancel()
		r.finish(ctx, "PASS", nil)
		require.Less(t, time.Since(start), 3*time.Second, "finish waited past its context")
		require.Contains(t, out.String(), fmt.Sprintf("line %d\n", 10*reportQueue-1))
	})
}

// TestClip: an event text is valid UTF-8 of at most maxEventText bytes,
// whatever the line was (a cut through a rune, invalid bytes).
func TestClip(t *testing.T) {
	for _, in := range []string{"ok", "bad \xff byte", strings.Repeat("é", maxEventText), strings.Repeat("x", maxEventText+1)} {
		out := clip(in)
		require.True(t, utf8.ValidString(out), "%q", out)
		require.LessOrEqual(t, len(out), maxEventText)
	}
	require.Equal(t, "ok", clip("ok"))
	require.Equal(t, "bad \uFFFD byte", clip("bad \xff byte"))
}
