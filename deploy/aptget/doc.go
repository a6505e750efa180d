// Package aptget installs the Debian packages whose servers the beds and
// the bench start themselves (MariaDB, Postgres), so a fresh machine or CI
// runner needs no manual step, and quotes the end of a program's output in
// errors. It is shared by the launchers in deploy/mariadb and
// deploy/postgres, which differ only in the package and the programs they
// look for.
package aptget
