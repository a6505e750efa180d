package peer_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestRolesDoNotImportEachOther holds the layering this package exists
// for: routing, enqueuer and dequeuer meet on the store, this leaf and the
// shard map, never on each other's insides.
func TestRolesDoNotImportEachOther(t *testing.T) {
	t.Parallel()
	const mod = "github.com/triage-queue/triage/"
	roles := []string{"routing", "enqueuer", "dequeuer"}
	for _, r := range roles {
		out, err := exec.Command("go", "list", "-f", `{{join .Imports "\n"}}`, mod+r).Output()
		if err != nil {
			t.Fatalf("go list %s: %v", r, err)
		}
		for _, imp := range strings.Fields(string(out)) {
			for _, other := range roles {
				if other != r && imp == mod+other {
					t.Errorf("%s imports %s; share what they need through proto/triage/peer or schema/store instead", r, other)
				}
			}
		}
	}
}
