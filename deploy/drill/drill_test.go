package drill

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
)

// fakeBed is a Bed that injects nothing and records what it was asked.
type fakeBed struct {
	routers []Router
	err     error
	asked   []string
}

func (b *fakeBed) Routers(context.Context) ([]Router, error) { return b.routers, b.err }
func (b *fakeBed) Inject(_ context.Context, f Fault) (Injection, error) {
	b.asked = append(b.asked, "inject "+f.Scenario)
	return Injection{}, nil
}
func (b *fakeBed) Heal(_ context.Context, f Fault) (string, error) {
	b.asked = append(b.asked, "heal "+f.Scenario)
	return "", nil
}
func (b *fakeBed) Fate(_ context.Context, f Fault) (string, error) {
	b.asked = append(b.asked, "fate "+f.Scenario)
	return "", nil
}

// TestRunRefusesBeforeInjecting: a drill that cannot run (unknown
// scenario, no bed, a bed without routers, --via naming no region of the
// bed) says why and never touches the bed's faults.
func TestRunRefusesBeforeInjecting(t *testing.T) {
	t.Parallel()
	routers := []Router{{Region: "us-east", Addr: "127.0.0.1:1"}, {Region: "eu-west", Addr: "127.0.0.1:1"}}
	for _, tc := range []struct {
		name string
		cfg  Config
		bed  *fakeBed
		want string
	}{
		{name: "unknown scenario", cfg: Config{Scenario: "meteor"}, bed: &fakeBed{routers: routers}, want: `unknown scenario "meteor"`},
		{name: "no bed", cfg: Config{Scenario: "partition"}, want: "no bed"},
		{name: "routers unknown", cfg: Config{Scenario: "partition"}, bed: &fakeBed{err: errors.New("docker: not found")}, want: "docker: not found"},
		{name: "via names no region", cfg: Config{Scenario: "partition", Via: []string{"mars"}}, bed: &fakeBed{routers: routers},
			want: "the bed's regions are [us-east eu-west]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cfg := tc.cfg
			if tc.bed != nil {
				cfg.Bed = tc.bed
			}
			_, err := Run(context.Background(), cfg)
			require.ErrorContains(t, err, tc.want)
			if tc.bed != nil {
				require.Empty(t, tc.bed.asked)
			}
		})
	}
}
