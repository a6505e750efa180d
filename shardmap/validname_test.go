package shardmap

import (
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"
)

// nameRule is ValidName's rule as a regular expression, which it was
// until a profile showed its cost on every request.
var nameRule = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$`)

func TestValidNameFollowsTheRule(t *testing.T) {
	cases := []string{"", "a", "A", "0", "_a", ".a", "-a", "a_", "a.b-c_d", "a b", "a/b", "é", "a\x00",
		strings.Repeat("a", 128), strings.Repeat("a", 129), "a" + strings.Repeat("-", 127), "a\n"}
	alphabet := "aZ09_.-/ \xff"
	rnd := rand.New(rand.NewPCG(1, 2))
	for range 20000 {
		b := make([]byte, rnd.IntN(6))
		for i := range b {
			b[i] = alphabet[rnd.IntN(len(alphabet))]
		}
		cases = append(cases, string(b))
	}
	for _, s := range cases {
		if got, want := ValidName(s), nameRule.MatchString(s); got != want {
			t.Errorf("ValidName(%q) = %v, the rule says %v", s, got, want)
		}
	}
}

func FuzzValidName(f *testing.F) {
	f.Add("emails")
	f.Add("_x")
	f.Fuzz(func(t *testing.T, s string) {
		if got, want := ValidName(s), nameRule.MatchString(s); got != want {
			t.Errorf("ValidName(%q) = %v, the rule says %v", s, got, want)
		}
	})
}
