package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/triage-queue/triage/cmd/internal/cli"
)

// TestDrillBadFlags: bad drill flags are refused with exit status 2 and a
// message saying what is allowed, before anything touches the bed.
func TestDrillBadFlags(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	layout := `{"regions":[{"name":"us-east","grpc":"127.0.0.1:1"},{"name":"eu-west","grpc":"127.0.0.1:2"}],"control":"127.0.0.1:3"}`
	require.NoError(t, os.WriteFile(filepath.Join(dir, "bed.json"), []byte(layout), 0o644))
	tests := []struct {
		name string
		args []string
		want string
	}{
		{name: "no producers", args: []string{"--producers", "0", "partition"}, want: "--producers and --consumers must be at least 1"},
		{name: "negative hold", args: []string{"--hold", "-1s", "partition"}, want: "--lease, --hold and --drain positive"},
		{name: "unknown router region", args: []string{"--via", "mars", "partition"}, want: "no router to run the workload through: via [mars], the bed's regions are [us-east eu-west]"},
		{name: "unknown scenario", args: []string{"meteor"}, want: `unknown scenario "meteor": allowed primary-kill, region-down`},
		{name: "no scenario", args: nil, want: "usage: triage-bed drill"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var stdout, stderr bytes.Buffer
			code := cli.Run(t.Context(), newRoot(), append([]string{"drill", "--dir", dir}, tt.args...), strings.NewReader(""), &stdout, &stderr)
			require.Equal(t, 2, code, stderr.String())
			require.Contains(t, stderr.String(), tt.want)
		})
	}
}
