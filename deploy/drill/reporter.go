package drill

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/timestamppb"

	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
)

// Phases a drill reports.
const (
	PhaseStarting   = "starting"
	PhaseFaulted    = "fault injected"
	PhaseFailedOver = "failed over"
	PhaseHealed     = "healed"
	PhaseDraining   = "draining"
	PhaseDone       = "done"
)

// drillReporter is the one call of triagev1.AdminClient the reporter
// makes.
type drillReporter interface {
	ReportDrill(ctx context.Context, in *triagev1.ReportDrillRequest, opts ...grpc.CallOption) (*triagev1.Drill, error)
}

// reportTimeout bounds one ReportDrill call; flushTimeout what finish
// waits for the reports still queued.
const (
	reportTimeout = 5 * time.Second
	flushTimeout  = 10 * time.Second
	// reportQueue is how many reports wait for the sender; more are
	// dropped (and counted in the next one) rather than wait.
	reportQueue = 64
	// maxEventsPerReport stays within the API's limit per call.
	maxEventsPerReport = 100
	maxEventText       = 1000
)

// reporter is an io.Writer in front of a drill's Progress: every line
// written goes to Progress and, by one goroutine behind a small buffered
// channel, to ReportDrill, with the phase and, at the end, the verdict.
// Reporting is best effort: a failing call is printed once to Progress,
// a full channel drops the report (the next one says how many lines were
// lost), and nothing the drill does waits for the router.
type reporter struct {
	api      drillReporter
	id       string
	scenario string

	mu      sync.Mutex // guards out and partial, and orders the lines
	out     io.Writer
	partial []byte
	dropped int
	failed  bool
	closed  bool

	ch   chan *triagev1.ReportDrillRequest
	done chan struct{}
}

// newReporter starts the sender; finish stops it.
func newReporter(api drillReporter, id, scenario string, out io.Writer) *reporter {
	r := &reporter{api: api, id: id, scenario: scenario, out: out,
		ch: make(chan *triagev1.ReportDrillRequest, reportQueue), done: make(chan struct{})}
	go r.send()
	return r
}

// Write writes p to Progress and queues each complete line as an event.
func (r *reporter) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n, err := r.out.Write(p)
	r.partial = append(r.partial, p...)
	var events []*triagev1.DrillEvent
	now := timestamppb.Now()
	for {
		i := bytes.IndexByte(r.partial, '\n')
		if i < 0 {
			break
		}
		if line := strings.TrimRight(string(r.partial[:i]), "\r"); line != "" {
			events = append(events, &triagev1.DrillEvent{At: now, Text: clip(line)})
		}
		r.partial = r.partial[i+1:]
	}
	if len(events) > 0 {
		r.queueLocked(&triagev1.ReportDrillRequest{Events: events})
	}
	return n, err
}

// phase reports the drill's new phase.
func (r *reporter) phase(p string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.queueLocked(&triagev1.ReportDrillRequest{Phase: p})
}

// queueLocked hands req to the sender without waiting.
func (r *reporter) queueLocked(req *triagev1.ReportDrillRequest) {
	if r.closed {
		return
	}
	select {
	case r.ch <- req:
	default:
		r.dropped += len(req.Events)
	}
}

// finish reports the verdict and summary lines as the last report, done,
// and waits (up to flushTimeout or ctx) for the queued reports to go.
func (r *reporter) finish(ctx context.Context, verdict string, summary []string) {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return
	}
	req := &triagev1.ReportDrillRequest{Phase: PhaseDone, Done: true, Verdict: clip(verdict)}
	now := timestamppb.Now()
	for _, s := range summary {
		if s = strings.TrimRight(s, " \r"); s != "" {
			req.Events = append(req.Events, &triagev1.DrillEvent{At: now, Text: clip(s)})
		}
	}
	// Nothing else queues from here on; the last report must not be
	// dropped, so it waits for room, briefly.
	r.closed = true
	r.mu.Unlock()
	select {
	case r.ch <- req:
	case <-time.After(flushTimeout):
	case <-ctx.Done():
	}
	close(r.ch)
	select {
	case <-r.done:
	case <-time.After(flushTimeout):
	case <-ctx.Done():
	}
}

// send makes the calls, merging what queued up meanwhile into one, but
// never two phases: each phase the drill went through is reported, in
// order, with the lines written before it.
func (r *reporter) send() {
	defer close(r.done)
	var pending *triagev1.ReportDrillRequest
	for {
		req := pending
		pending = nil
		if req == nil {
			var ok bool
			if req, ok = <-r.ch; !ok {
				return
			}
		}
	gather:
		for len(req.Events) < maxEventsPerReport && !req.Done {
			select {
			case next, ok := <-r.ch:
				if !ok {
					break gather // the next receive returns
				}
				if next.Phase != "" && req.Phase != "" {
					pending = next
					break gather
				}
				req = merge(req, next)
			default:
				break gather
			}
		}
		r.mu.Lock()
		if r.dropped > 0 {
			req.Events = append([]*triagev1.DrillEvent{{At: timestamppb.Now(),
				Text: fmt.Sprintf("(%d progress lines were not reported: the reporter fell behind)", r.dropped)}}, req.Events...)
			r.dropped = 0
		}
		r.mu.Unlock()
		for len(req.Events) > maxEventsPerReport {
			// Only a merge overshoots; split it.
			head := &triagev1.ReportDrillRequest{Events: req.Events[:maxEventsPerReport]}
			req.Events = req.Events[maxEventsPerReport:]
			r.call(head)
		}
		r.call(req)
	}
}

func merge(a, b *triagev1.ReportDrillRequest) *triagev1.ReportDrillRequest {
	a.Events = append(a.Events, b.Events...)
	if b.Phase != "" {
		a.Phase = b.Phase
	}
	if b.Verdict != "" {
		a.Verdict = b.Verdict
	}
	a.Done = a.Done || b.Done
	return a
}

func (r *reporter) call(req *triagev1.ReportDrillRequest) {
	req.Id, req.Scenario = r.id, r.scenario
	ctx, cancel := context.WithTimeout(context.Background(), reportTimeout)
	defer cancel()
	_, err := r.api.ReportDrill(ctx, req)
	if err == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.failed {
		r.failed = true
		fmt.Fprintf(r.out, "drill progress not reported to the console (the drill goes on): %v\n", err)
	}
}

// clip cuts s to the API's limit of an event's text, on a rune boundary.
// clip makes s an event text the API takes: valid UTF-8 (a protobuf
// string must be; a container's log line need not be) of at most
// maxEventText bytes.
func clip(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	if len(s) <= maxEventText {
		return s
	}
	return strings.ToValidUTF8(s[:maxEventText-3], "") + "..."
}
