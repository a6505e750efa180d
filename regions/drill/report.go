package drill

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"
)

// Report is what a drill found. Lost and EarlyDeliveries must be zero.
type Report struct {
	Scenario string `json:"scenario"`
	Fault    string `json:"fault"`
	// FaultAt is when the fault was injected, HealedAt when it was healed.
	FaultAt  time.Time `json:"fault_at"`
	HealedAt time.Time `json:"healed_at"`
	// RTO: from the fault to the first successful dequeue (that returned
	// items) and enqueue after it.
	DequeueRTOMS int64 `json:"dequeue_rto_ms"`
	EnqueueRTOMS int64 `json:"enqueue_rto_ms"`
	Acknowledged int   `json:"acknowledged"`
	Delivered    int   `json:"delivered"`
	// Lost: acknowledged enqueues never delivered. Must be 0.
	Lost    int      `json:"lost"`
	LostIDs []string `json:"lost_ids,omitempty"`
	// Duplicates: deliveries after the first, by cause.
	Duplicates map[string]int `json:"duplicates"`
	// EarlyDeliveries: delivered before their deliver_after. Must be 0.
	EarlyDeliveries int `json:"early_deliveries"`
	// PriorityInversions: deliveries made while a more urgent item had been
	// ready (and acknowledged) for at least 5 ms and was not yet delivered.
	PriorityInversions int            `json:"priority_inversions"`
	EnqueueErrors      map[string]int `json:"enqueue_errors"`
	DequeueErrors      map[string]int `json:"dequeue_errors"`
	// OldPrimary is what became of the faulted shard's primary.
	OldPrimary string `json:"old_primary,omitempty"`
	MapBefore  string `json:"map_before,omitempty"`
	MapAfter   string `json:"map_after,omitempty"`
	// Violations lists broken invariants; empty means the drill passed.
	Violations []string `json:"violations"`
}

// analyze fills the report's counts from what the workload saw.
func (w *workload) analyze(r *Report, faultAt time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	r.Acknowledged = len(w.sent)
	first := map[string]delivery{}
	byID := map[string][]delivery{}
	for _, d := range w.deliveries {
		byID[d.id] = append(byID[d.id], d)
		if _, ok := first[d.id]; !ok {
			first[d.id] = d
		}
	}
	r.Delivered = len(first)
	r.Duplicates = map[string]int{}
	for _, ds := range byID {
		for i := 1; i < len(ds); i++ {
			prev := ds[i-1]
			cause := "lease expiry"
			switch {
			case prev.action == "nack":
				cause = "nack"
			case prev.action == "crash":
				cause = "lease expiry (consumer crashed holding the lease)"
			case prev.ackErr:
				cause = "lease expiry (ack failed during the fault)"
			}
			r.Duplicates[cause]++
		}
	}
	for id, s := range w.sent {
		d, ok := first[id]
		if !ok {
			r.Lost++
			if len(r.LostIDs) < 20 {
				r.LostIDs = append(r.LostIDs, id)
			}
			continue
		}
		// Clock granularity and the two timestamps' sources: allow 1 ms.
		if d.at.Before(s.readyAt.Add(-time.Millisecond)) {
			r.EarlyDeliveries++
		}
	}
	// Priority inversions: for each first delivery, any more urgent item
	// that had been ready and acknowledged for 5 ms and was delivered only
	// more than 5 ms later.
	type ev struct {
		at       time.Time
		priority int32
	}
	var evs []ev
	for _, d := range first {
		evs = append(evs, ev{d.at, d.priority})
	}
	sort.Slice(evs, func(i, j int) bool { return evs[i].at.Before(evs[j].at) })
	const slack = 5 * time.Millisecond
	for id, s := range w.sent {
		d, ok := first[id]
		if !ok {
			continue
		}
		since := s.readyAt
		if s.ackedAt.After(since) {
			since = s.ackedAt
		}
		since = since.Add(slack)
		until := d.at.Add(-slack)
		lo := sort.Search(len(evs), func(i int) bool { return !evs[i].at.Before(since) })
		for i := lo; i < len(evs) && evs[i].at.Before(until); i++ {
			if evs[i].priority > s.priority {
				r.PriorityInversions++
			}
		}
	}
	r.EnqueueErrors = map[string]int{}
	for c, n := range w.enqErrs {
		r.EnqueueErrors[c.String()] = n
	}
	r.DequeueErrors = map[string]int{}
	for c, n := range w.deqErrs {
		r.DequeueErrors[c.String()] = n
	}
	if r.Lost > 0 {
		r.Violations = append(r.Violations, fmt.Sprintf("%d acknowledged items lost", r.Lost))
	}
	if r.EarlyDeliveries > 0 {
		r.Violations = append(r.Violations, fmt.Sprintf("%d items delivered before their deliver_after", r.EarlyDeliveries))
	}
}

// Print writes the report for people.
func (r *Report) Print(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	row := func(k string, v any) { fmt.Fprintf(tw, "  %s\t%v\n", k, v) }
	fmt.Fprintf(tw, "drill %s: %s\n", r.Scenario, r.Fault)
	row("dequeue RTO", fmtMS(r.DequeueRTOMS))
	row("enqueue RTO", fmtMS(r.EnqueueRTOMS))
	row("acknowledged enqueues", r.Acknowledged)
	row("delivered (distinct)", r.Delivered)
	row("lost (must be 0)", r.Lost)
	row("early deliveries (must be 0)", r.EarlyDeliveries)
	row("duplicates", fmtCounts(r.Duplicates))
	row("priority inversions (ready >= 5 ms)", r.PriorityInversions)
	row("enqueue errors during the fault", fmtCounts(r.EnqueueErrors))
	row("dequeue errors during the fault", fmtCounts(r.DequeueErrors))
	if r.MapBefore != "" {
		row("shard map before", r.MapBefore)
		row("shard map after", r.MapAfter)
	}
	if r.OldPrimary != "" {
		row("old primary", r.OldPrimary)
	}
	if len(r.Violations) == 0 {
		row("result", "PASS")
	} else {
		row("result", "FAIL: "+strings.Join(r.Violations, "; "))
	}
	tw.Flush()
}

func fmtMS(ms int64) string {
	if ms < 0 {
		return "no successful call after the fault"
	}
	return (time.Duration(ms) * time.Millisecond).String()
}

func fmtCounts(m map[string]int) string {
	if len(m) == 0 {
		return "none"
	}
	var parts []string
	for k, v := range m {
		parts = append(parts, fmt.Sprintf("%s: %d", k, v))
	}
	sort.Strings(parts)
	return strings.Join(parts, ", ")
}
