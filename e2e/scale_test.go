package e2e

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/triage-queue/triage/deploy/scale"
)

// TestScale runs `triage-bed scale` at 200 shards (databases on four
// mariadbd servers) with 10,000 topics in 1,000 namespaces, each role a
// `triage serve` process, and holds it to issue 40's bounds at that size:
// every node serves a namespace update and an added shard within 2 s, a
// killed dequeuer's shards are all owned again within 10 s, every idle
// node uses under 10 % of a core, and a load spread over every shard is
// delivered in full. The binaries are built without -race here: the
// bounds are about what a deployment's processes cost, and the race
// detector multiplies CPU several times over (other tests run every path
// under -race). It does not run in parallel: its bounds are CPU and time
// on the box, and its 200 databases' bring-up is heavy enough to slow
// the tests beside it.
func TestScale(t *testing.T) {
	dir := t.TempDir()
	build := exec.Command("go", "build", "-o", dir, "../cmd/triage", "../cmd/triage-bed")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "build: %s", out)

	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	records := filepath.Join(dir, "scale.json")
	cmd := exec.CommandContext(ctx, filepath.Join(dir, "triage-bed"), "scale", "--shards", "200", "--topics", "10000",
		"--dir", dir, "--out", records, "--idle-for", "10s", "--warm-for", "5s", "--load-for", "10s", "--rate", "200")
	out, err = cmd.CombinedOutput()
	t.Logf("triage-bed scale:\n%s", out)
	require.NoError(t, err, "the scale run failed or missed a bound")

	data, err := os.ReadFile(records)
	require.NoError(t, err)
	var f scale.File
	require.NoError(t, json.Unmarshal(data, &f))
	require.Len(t, f.Records, 1)
	rec := f.Records[0]
	require.Equal(t, 200, rec.Shards)
	require.Equal(t, 10000, rec.Topics)
	require.Empty(t, rec.Failed())
	// Every bound was checked, and the figures are real.
	require.Len(t, rec.Checks, 5+5, "map change, shard add, takeover, even split, load delivered, and the idle CPU of 5 nodes")
	require.Len(t, rec.NamespaceChangeMs, 3)
	require.Positive(t, rec.AddShardMs)
	require.Equal(t, 101, rec.Takeover.Shards, "the killed dequeuer owned half of the 201 shards (the spare added), rounded up")
	require.Positive(t, rec.Load.Enqueued)
	require.Zero(t, rec.Load.Missing, "every acknowledged enqueue delivered")
	require.GreaterOrEqual(t, rec.Load.Delivered, rec.Load.Enqueued)
	require.Zero(t, rec.Load.Errors)
	require.Greater(t, rec.Load.ShardsHit, 150, "the load reached most of the 200 shards")
	require.Greater(t, rec.MapBytes, 100_000)
	for _, s := range rec.Scrapes {
		require.Positive(t, s.Bytes, "%s served /metrics", s.Name)
	}
}
