package drill

import (
	"bytes"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestAnalyze: the report counts losses, early deliveries, duplicates by
// cause and priority inversions from what the workload recorded, and
// flags the broken invariants.
func TestAnalyze(t *testing.T) {
	t.Parallel()
	t0 := time.Now()
	w := newWorkload(nil, "n", "t", "r", time.Second)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	w.sent = map[string]*sent{
		"a":    {id: "a", priority: 0, readyAt: at(0), ackedAt: at(0)},
		"b":    {id: "b", priority: 2, readyAt: at(0), ackedAt: at(0)},
		"c":    {id: "c", priority: 1, readyAt: at(500), ackedAt: at(0)}, // delayed
		"lost": {id: "lost", priority: 1, readyAt: at(0), ackedAt: at(0)},
	}
	w.deliveries = []delivery{
		{id: "b", priority: 2, at: at(10), action: "nack"}, // "a" was ready and more urgent: inversion
		{id: "a", priority: 0, at: at(20), action: "crash"},
		{id: "b", priority: 2, at: at(30), action: "ack"},
		{id: "a", priority: 0, at: at(40), action: "ack", ackErr: true},
		{id: "a", priority: 0, at: at(50), action: "ack"},
		{id: "c", priority: 1, at: at(100), action: "ack"}, // early
	}
	r := &Report{}
	w.analyze(r, t0)
	require.Equal(t, 4, r.Acknowledged)
	require.Equal(t, 3, r.Delivered)
	require.Equal(t, 1, r.Lost)
	require.Equal(t, []string{"lost"}, r.LostIDs)
	require.Equal(t, 1, r.EarlyDeliveries)
	require.Equal(t, map[string]int{"nack": 1, "lease expiry (consumer crashed holding the lease)": 1,
		"lease expiry (ack failed during the fault)": 1}, r.Duplicates)
	require.Equal(t, 1, r.PriorityInversions)
	require.Len(t, r.Violations, 2)
	var out bytes.Buffer
	r.Print(&out)
	require.Contains(t, out.String(), "FAIL: 1 acknowledged items lost")
}
