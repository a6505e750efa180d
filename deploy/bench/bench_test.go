package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestRunQuick runs the whole benchmark in quick mode on real beds (one
// region, then three): every scenario must produce a number (or be marked
// skipped), bench.json must parse, and no mariadbd the run started may
// outlive it. It asserts nothing about speed: CI boxes vary.
func TestRunQuick(t *testing.T) {
	dir := t.TempDir()
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	start := time.Now()
	rep, err := Run(ctx, Config{Quick: true, Dir: dir, Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))}, &out)
	t.Logf("quick run took %s; output:\n%s", time.Since(start).Round(time.Second), out.String())
	require.NoError(t, err)
	require.NotNil(t, rep)

	// Every scenario, in order, with a number unless marked skipped.
	var names []string
	for _, s := range rep.Scenarios {
		names = append(names, s.Name)
		if s.Skipped {
			require.Zero(t, s.ItemsPerSec, s.Name)
			require.Contains(t, s.Notes, "skipped", s.Name)
			continue
		}
		require.Empty(t, s.Error, s.Name)
		require.Greater(t, s.ItemsPerSec, 0.0, s.Name)
	}
	require.Equal(t, Names, names)

	// bench.json parses and holds the same scenarios and the machine facts.
	data, err := os.ReadFile(filepath.Join(dir, "bench.json"))
	require.NoError(t, err)
	var doc struct {
		Machine   map[string]any   `json:"machine"`
		Scenarios []map[string]any `json:"scenarios"`
	}
	require.NoError(t, json.Unmarshal(data, &doc))
	require.Len(t, doc.Scenarios, len(Names))
	for i, s := range doc.Scenarios {
		require.Equal(t, Names[i], s["name"])
		for _, k := range []string{"items_per_sec", "p50_ms", "p99_ms", "p999_ms", "ratio_vs_naive", "ratio_vs_ceiling", "notes"} {
			require.Contains(t, s, k, Names[i])
		}
	}
	require.NotZero(t, doc.Machine["cores"])
	require.NotEmpty(t, doc.Machine["mariadb_version"])
	durability, _ := doc.Machine["durability"].(map[string]any)
	require.Equal(t, "1", durability["innodb_flush_log_at_trx_commit"])
	require.Equal(t, "1", durability["sync_binlog"])

	// The run's bed lived elsewhere and is gone: no bed.json in Dir, and
	// none of its mariadbd processes is running.
	require.NoFileExists(t, filepath.Join(dir, "bed.json"))
	require.NotEmpty(t, rep.MariaDBPIDs)
	for _, pid := range rep.MariaDBPIDs {
		cmd, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
		if err == nil {
			require.NotContains(t, string(cmd), "mariadbd", "mariadbd pid %d outlived the run", pid)
		}
	}
}

func TestCountInversions(t *testing.T) {
	t.Parallel()
	const ms = int64(time.Millisecond)
	tests := []struct {
		name  string
		prios []int32
		ackAt []int64
		all   []delivery
		want  int
	}{
		{
			name:  "in order",
			prios: []int32{0, 5},
			ackAt: []int64{1 * ms, 1 * ms},
			all:   []delivery{{seq: 0, prio: 0, sent: 10 * ms, recv: 11 * ms}, {seq: 1, prio: 5, sent: 12 * ms, recv: 13 * ms}},
		},
		{
			name:  "urgent item waited 9 ms while a lower one went out",
			prios: []int32{0, 5},
			ackAt: []int64{1 * ms, 1 * ms},
			all:   []delivery{{seq: 1, prio: 5, sent: 10 * ms, recv: 11 * ms}, {seq: 0, prio: 0, sent: 12 * ms, recv: 13 * ms}},
			want:  1,
		},
		{
			name:  "urgent item ready only 2 ms: not counted",
			prios: []int32{0, 5},
			ackAt: []int64{8 * ms, 1 * ms},
			all:   []delivery{{seq: 1, prio: 5, sent: 10 * ms, recv: 11 * ms}, {seq: 0, prio: 0, sent: 12 * ms, recv: 13 * ms}},
		},
		{
			name:  "same answer carries both",
			prios: []int32{0, 5},
			ackAt: []int64{1 * ms, 1 * ms},
			all:   []delivery{{seq: 1, prio: 5, sent: 10 * ms, recv: 11 * ms}, {seq: 0, prio: 0, sent: 10 * ms, recv: 11 * ms}},
		},
		{
			name:  "overlapping requests of two consumers: not counted",
			prios: []int32{0, 5},
			ackAt: []int64{1 * ms, 1 * ms},
			all:   []delivery{{seq: 1, prio: 5, sent: 10 * ms, recv: 12 * ms}, {seq: 0, prio: 0, sent: 11 * ms, recv: 13 * ms}},
		},
		{
			name:  "never delivered urgent item",
			prios: []int32{0, 5, 5},
			ackAt: []int64{1 * ms, 1 * ms, 1 * ms},
			all:   []delivery{{seq: 1, prio: 5, sent: 10 * ms, recv: 11 * ms}, {seq: 2, prio: 5, sent: 20 * ms, recv: 21 * ms}},
			want:  2,
		},
		{
			name:  "failed enqueue is not waiting",
			prios: []int32{0, 5},
			ackAt: []int64{-1, 1 * ms},
			all:   []delivery{{seq: 1, prio: 5, sent: 10 * ms, recv: 11 * ms}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := countInversions(tt.prios, tt.ackAt, tt.all, 5*ms)
			require.Equal(t, tt.want, got.count)
		})
	}
}

func TestPercentile(t *testing.T) {
	t.Parallel()
	var d []time.Duration
	for i := 1; i <= 1000; i++ {
		d = append(d, time.Duration(i)*time.Millisecond)
	}
	require.Equal(t, 500.0, percentile(d, 50))
	require.Equal(t, 990.0, percentile(d, 99))
	require.Equal(t, 999.0, percentile(d, 99.9))
	require.Equal(t, 0.0, percentile(nil, 99))
	require.True(t, strings.HasSuffix(human(12345), "k"))
}
