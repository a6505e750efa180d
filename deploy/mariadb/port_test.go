package mariadb

import "testing"

// TestPickPortNeverRepeats: ports handed out in one process are distinct,
// although the kernel may hand a port it just gave out (and that nobody
// has bound yet) to the next caller.
func TestPickPortNeverRepeats(t *testing.T) {
	seen := map[int]bool{}
	for range 300 {
		p, err := pickPort()
		if err != nil {
			t.Fatal(err)
		}
		if seen[p] {
			t.Fatalf("port %d handed out twice", p)
		}
		seen[p] = true
	}
}
