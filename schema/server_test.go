package schema

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestCheckVersion: MariaDB from MinMariaDB on is taken; MySQL, an older
// MariaDB and a version that cannot be read are refused with
// ErrUnsupportedServer, saying what the server is and what is needed.
func TestCheckVersion(t *testing.T) {
	t.Parallel()
	for _, v := range []string{"10.11.19-MariaDB-0+deb12u1-log", "10.11.9-MariaDB", "11.4.2-MariaDB-ubu2404", "5.5.5-10.11.6-MariaDB"} {
		require.NoError(t, checkVersion(v), v)
	}
	for v, says := range map[string]string{
		"8.0.36":                    "the server is MySQL 8.0.36",
		"8.4.0-commercial":          "the server is MySQL 8.4.0-commercial",
		"10.6.18-MariaDB-0+deb11u1": "the server is MariaDB 10.6.18-MariaDB-0+deb11u1",
		"10.10.7-MariaDB":           "the server is MariaDB 10.10.7-MariaDB",
		"9.5.1-MariaDB":             "the server is MariaDB 9.5.1-MariaDB",
		"MariaDB":                   "cannot read the version",
		"x.11-MariaDB":              "cannot read the version",
	} {
		err := checkVersion(v)
		require.ErrorIs(t, err, ErrUnsupportedServer, v)
		require.ErrorContains(t, err, says, v)
		require.ErrorContains(t, err, "Triage needs MariaDB 10.11 or later", v)
	}
}
