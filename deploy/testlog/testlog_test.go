package testlog

import (
	"log/slog"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// recorder is a testing.TB that keeps what is logged to it.
type recorder struct {
	testing.TB
	lines    []string
	cleanups []func()
}

func (r *recorder) Log(args ...any)  { r.lines = append(r.lines, args[0].(string)) }
func (r *recorder) Helper()          {}
func (r *recorder) Cleanup(f func()) { r.cleanups = append(r.cleanups, f) }

func TestLinesGoToTheTestAtTheirLevel(t *testing.T) {
	r := &recorder{TB: t}
	log := New(r, slog.LevelInfo)
	log.Debug("hidden")
	log.Info("shown", "k", 1)
	log.Warn("also shown")
	require.Len(t, r.lines, 2, "%q", r.lines)
	require.True(t, strings.HasSuffix(r.lines[0], `msg=shown k=1`), r.lines[0])
	require.NotContains(t, r.lines[0], "\n")
	for _, f := range r.cleanups {
		f()
	}
	log.Warn("after the test") // to stderr: t.Log would panic
	require.Len(t, r.lines, 2)
}
