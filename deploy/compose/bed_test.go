package compose

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestParseContainersKeepsALastLineOfEmptyLabels: docker's listing is
// trimmed (docker()), so a last line whose labels end empty lost its tabs
// and the container (a WAN gateway: no shard, address or start label) was
// not seen, which failed a CI partition drill with every gateway up.
func TestParseContainersKeepsALastLineOfEmptyLabels(t *testing.T) {
	line := func(v ...string) string { return strings.Join(append(v, "end"), "\t") }
	out := strings.TrimSpace(strings.Join([]string{
		line("a1", "router-us-east", "running", "us-east", "router", "0", "", "", ""),
		line("b2", "mariadb-s1-us-east", "running", "us-east", "mariadb", "0", "1", "mariadb-s1-us-east:3306", "primary"),
		line("c3", "wan-us-east", "running", "us-east", "wan", "0", "", "", ""),
	}, "\n") + "\n")
	cs, bad := parseContainers(out)
	require.Empty(t, bad)
	require.Len(t, cs, 3)
	require.Equal(t, container{ID: "c3", Service: "wan-us-east", State: "running", Region: "us-east", Role: "wan"}, cs[2])
	require.Equal(t, uint32(1), cs[0].Shard, "sorted by service")

	_, bad = parseContainers("x\ty\n")
	require.Equal(t, []string{"x\ty\n"}, bad, "a line of the wrong shape is reported")
}
