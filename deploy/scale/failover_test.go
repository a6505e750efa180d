package scale_test

import (
	"bytes"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/triage-queue/triage/deploy/scale"
)

// TestFailoverLosesNothing runs a small scale bed with Config.Failover
// (12 shards on 3 servers, each server replicated to eu-west and
// ap-south) through every step of a run and checks the failover step's
// figures: the killed server held the primaries of its four shards and
// the spare the map-changes step added, all of them moved, together, to
// one of its replicas, the drill's history lost and undid nothing, the
// enqueue and dequeue RTO are the failover's, under
// FailoverRTOLimitSeconds, not the hold's (the other replica follows the
// new primary, a semi-sync replica connected to it), and the old primary
// rejoined. The other bounds (idle CPU, map changes, takeover) depend on
// what else runs on the machine, so they are logged, not asserted.
func TestFailoverLosesNothing(t *testing.T) {
	bin := t.TempDir()
	build := exec.Command("go", "build", "-o", bin, "../../cmd/triage")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "go build ./cmd/triage:\n%s", out)
	dir := t.TempDir()
	t.Cleanup(func() {
		if t.Failed() {
			logTails(t, dir)
		}
	})
	rec, err := scale.Run(t.Context(), scale.Config{Dir: dir, Triage: filepath.Join(bin, "triage"), Shards: 12, Servers: 3,
		Failover: true, Logger: slog.New(slog.DiscardHandler), Progress: func(line string) { t.Log(line) }},
		scale.Options{IdleFor: 2 * time.Second, Rate: 50, LoadFor: 3 * time.Second, FailoverHold: 12 * time.Second})
	require.NoError(t, err)
	var buf bytes.Buffer
	rec.Print(&buf)
	t.Log("\n" + buf.String())
	f := rec.Failover
	require.NotNil(t, f, "a bed with Failover records the failover step")
	assert.Equal(t, 5, f.Shards, "the first server holds shards 1, 4, 7, 10 and the spare, 13")
	assert.Equal(t, f.Shards, f.Moved, "every shard of the killed server moved to one of its replicas")
	assert.Equal(t, 1, f.NewPrimaries, "all to one server")
	assert.Positive(t, f.Seconds)
	assert.Positive(t, f.Acknowledged, "the drill's producers were served")
	assert.Empty(t, f.Violations)
	assert.Contains(t, f.OldPrimary, "rejoined as a read-only replica of "+f.NewPrimary)
	assert.Contains(t, []string{"eu-west", "ap-south"}, f.NewRegion)
	assert.Len(t, f.Others, 1, "the replica in the other replica region")
	assert.Equal(t, len(f.Others), f.Following, "the other replica follows the new primary: %v", f.Others)
	assert.Positive(t, f.SemiSyncClients, "the new primary has a semi-sync replica connected")
	limit := int64(scale.FailoverRTOLimitSeconds * 1000)
	for what, ms := range map[string]int64{"enqueue": f.EnqueueRTOMs, "dequeue": f.DequeueRTOMs} {
		assert.True(t, ms >= 0 && ms < limit, "%s RTO %d ms: under %d ms, shorter than the hold", what, ms, limit)
	}
	var failoverChecks int
	for _, c := range rec.Checks {
		if strings.Contains(c.Name, "killed server") || strings.Contains(c.Name, "failover drill") {
			failoverChecks++
			assert.True(t, c.OK, "%s: %v (limit %v)", c.Name, c.Value, c.Limit)
		}
	}
	assert.Equal(t, 6, failoverChecks, "moved, lost, undone, both RTOs and the other replicas are checked")
}

// logTails logs the end of every node's log in dir.
func logTails(t *testing.T, dir string) {
	logs, _ := filepath.Glob(filepath.Join(dir, "*.log"))
	for _, l := range logs {
		data, err := os.ReadFile(l)
		if err != nil {
			continue
		}
		if len(data) > 4000 {
			data = data[len(data)-4000:]
		}
		t.Logf("%s:\n%s", filepath.Base(l), data)
	}
}
