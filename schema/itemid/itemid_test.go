package itemid

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestRoundTrip(t *testing.T) {
	t.Parallel()
	g, err := NewGenerator(7)
	require.NoError(t, err)
	for shard := uint32(0); shard < 5; shard++ {
		id := ID{Shard: shard, Key: g.Next()}
		got, err := Parse(id.String())
		require.NoError(t, err)
		require.Equal(t, id, got)
	}
}

func TestParseRejects(t *testing.T) {
	t.Parallel()
	for _, s := range []string{"", "1", "1-", "-0193a4b5c6d7e8f9", "x-0193a4b5c6d7e8f9", "1-0193A4B5C6D7E8F9",
		"1-0193a4b5c6d7e8f", "01-0193a4b5c6d7e8f9", "+1-0193a4b5c6d7e8f9", "1-0000000000000000", "99999999999-0193a4b5c6d7e8f9",
		"1-0193a4b5c6d7e8f9-", "1-0x93a4b5c6d7e8f9"} {
		_, err := Parse(s)
		require.ErrorIs(t, err, ErrInvalid, s)
	}
}

func TestKeysIncreaseAndAreUnique(t *testing.T) {
	t.Parallel()
	g, err := NewGenerator(MaxNode)
	require.NoError(t, err)
	frozen := time.Now()
	g.now = func() time.Time { return frozen } // force sequence overflow into borrowed milliseconds
	var mu sync.Mutex
	seen := map[uint64]bool{}
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var last uint64
			for i := 0; i < 5000; i++ {
				k := g.Next()
				require.Greater(t, k, last)
				last = k
				mu.Lock()
				require.False(t, seen[k])
				seen[k] = true
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	require.Len(t, seen, 20000)
	_, err = NewGenerator(MaxNode + 1)
	require.Error(t, err)
}

func TestKeyTime(t *testing.T) {
	t.Parallel()
	g, _ := NewGenerator(1)
	k := g.Next()
	require.WithinDuration(t, time.Now(), KeyTime(k), time.Second)
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{"1-0193a4b5c6d7e8f9", "0-0000000000000001", "4294967295-ffffffffffffffff", "1-", "a-b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		id, err := Parse(s)
		if err != nil {
			return
		}
		// Whatever parses must print back to the same string: one ID, one spelling.
		require.Equal(t, s, id.String())
	})
}
