package aptget

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestTailKeepsWholeLines: a long output is cut to its last 2 KiB at a
// line boundary; a short one is kept, trimmed.
func TestTailKeepsWholeLines(t *testing.T) {
	require.Equal(t, "a\nb", Tail([]byte("  a\nb\n")))
	long := strings.Repeat("x", 3000) + "\nlast line\n"
	require.Equal(t, "last line", Tail([]byte(long)))
	lines := strings.Repeat("0123456789\n", 300)
	got := Tail([]byte(lines))
	require.LessOrEqual(t, len(got), 2048)
	require.True(t, strings.HasPrefix(got, "0123456789"), "starts at a line: %q", got[:20])
}
