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

// TestCheckGrants: the rows SHOW GRANTS prints on MariaDB 10.11 for an
// account, or its enabled roles, holding SUPER, READ_ONLY ADMIN or ALL
// PRIVILEGES on *.* are refused with ErrPrivilegedAccount, naming the
// privilege and never the password's hash; the application account's
// rows, grants on one database (even all of it), roles granted and
// replication are taken.
func TestCheckGrants(t *testing.T) {
	t.Parallel()
	const hash = "*7B9EBEED26AA52ED10C0F549FA863F13C39E0209"
	app := []string{
		"GRANT USAGE ON *.* TO `app`@`%` IDENTIFIED BY PASSWORD '" + hash + "'",
		"GRANT SELECT, INSERT, UPDATE, DELETE ON `triage`.* TO `app`@`%`",
	}
	for _, tc := range []struct {
		name   string
		grants []string
		says   string // "" when taken
	}{
		{"application account", app, ""},
		{"no rows", nil, ""},
		{"everything on one database", []string{"GRANT ALL PRIVILEGES ON `triage`.* TO `app`@`%`"}, ""},
		{"a role without privileges", append([]string{"GRANT `reader` TO `app`@`%`", "GRANT USAGE ON *.* TO `reader`", "SET DEFAULT ROLE `reader` FOR `app`@`%`"}, app...), ""},
		{"replication", []string{"GRANT REPLICATION SLAVE ON *.* TO `repl`@`%` IDENTIFIED BY PASSWORD '" + hash + "'"}, ""},
		{"a table named like a privilege", []string{"GRANT SELECT ON `triage`.`SUPER` TO `app`@`%`"}, ""},
		{"root", []string{"GRANT ALL PRIVILEGES ON *.* TO `root`@`localhost` WITH GRANT OPTION", "GRANT PROXY ON ``@`%` TO `root`@`localhost` WITH GRANT OPTION"},
			"the account holds ALL PRIVILEGES on *.*"},
		{"SUPER", append([]string{"GRANT SUPER ON *.* TO `app`@`%` IDENTIFIED BY PASSWORD '" + hash + "'"}, app[1:]...), "the account holds SUPER on *.*"},
		{"READ_ONLY ADMIN", append([]string{"GRANT READ_ONLY ADMIN ON *.* TO `app`@`%` IDENTIFIED BY PASSWORD '" + hash + "'"}, app[1:]...), "holds READ_ONLY ADMIN on *.*"},
		{"READ ONLY ADMIN as GRANT spells it", []string{"GRANT RELOAD, READ ONLY ADMIN ON *.* TO `app`@`%`"}, "holds READ_ONLY ADMIN on *.*"},
		{"among others", []string{"GRANT SELECT, PROCESS, SUPER ON *.* TO `app`@`%`"}, "holds SUPER on *.*"},
		{"through the default role", append(append([]string{"GRANT `ops` TO `app`@`%`"}, app...), "GRANT `admin` TO `ops`", "GRANT USAGE ON *.* TO `ops`",
			"GRANT READ_ONLY ADMIN ON *.* TO `admin`", "SET DEFAULT ROLE `ops` FOR `app`@`%`"), "holds READ_ONLY ADMIN on *.* through its role `admin`"},
	} {
		err := CheckGrants(tc.grants)
		if tc.says == "" {
			require.NoError(t, err, tc.name)
			continue
		}
		require.ErrorIs(t, err, ErrPrivilegedAccount, tc.name)
		require.ErrorContains(t, err, tc.says, tc.name)
		require.ErrorContains(t, err, "read_only", tc.name)
		require.NotContains(t, err.Error(), hash, tc.name)
	}
}
