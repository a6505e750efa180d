package freeport

import (
	"net"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestPickIsFreeBelowTheEphemeralRangeAndNeverRepeats: every port Pick
// returns can be bound, lies below the kernel's ephemeral range (where a
// listen on port 0 or an outgoing connection cannot take it meanwhile),
// and is returned once per process.
func TestPickIsFreeBelowTheEphemeralRangeAndNeverRepeats(t *testing.T) {
	low := ephemeralLow()
	seen := map[int]bool{}
	for range 300 {
		p, err := Pick()
		require.NoError(t, err)
		require.False(t, seen[p], "port %d returned twice", p)
		seen[p] = true
		if low-lowest >= 1000 {
			require.True(t, p >= lowest && p < low, "port %d outside [%d, %d)", p, lowest, low)
		}
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		require.NoError(t, err, "port %d", p)
		l.Close()
	}
}

// TestPickSkipsAPortInUse: a port someone listens on is never returned,
// however often the random choice lands on it.
func TestPickSkipsAPortInUse(t *testing.T) {
	var held []net.Listener
	t.Cleanup(func() {
		for _, l := range held {
			l.Close()
		}
	})
	low := ephemeralLow()
	if low-lowest < 1000 {
		t.Skip("no room below the ephemeral range on this machine; Pick asks the kernel")
	}
	// Hold a block of the range; Pick must return none of them.
	inUse := map[int]bool{}
	for p := lowest; p < lowest+200 && p < low; p++ {
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			continue
		}
		held = append(held, l)
		inUse[p] = true
	}
	for range 500 {
		p, err := Pick()
		require.NoError(t, err)
		require.False(t, inUse[p], "port %d is in use", p)
	}
}
