// Package postgres spawns a private PostgreSQL server for the bench's
// peer rows: River, the Go job queue on Postgres, is what a Go user would
// pick instead of Triage, so `make bench` measures it on the same box in
// the same run, and River needs a Postgres.
//
// A [Server] is one postgres child process with its own data directory
// (initdb'd on first start) and log under [Config.Dir], listening on a
// free TCP port on 127.0.0.1 and on no Unix socket, with trust
// authentication for the superuser "postgres". Every commit is durable
// (fsync=on, synchronous_commit=on, full_page_writes=on): its figures
// stand beside MariaDB shards that flush and sync the binary log on every
// commit. Only memory-sized knobs are set, to the bed's MariaDB sizes.
//
// Postgres refuses to run as root. When the caller is root the server and
// initdb run as the unprivileged account Debian's package creates
// ("postgres"), which Start creates as a system account if it is missing,
// and Config.Dir is handed to it; otherwise they run as the caller.
//
// As with package mariadb, the child runs in its own process group and
// gets a parent-death signal (SIGQUIT: postgres's immediate shutdown), so
// a bench killed with -9 leaves no server running; the package only ever
// signals the PID it started. [EnsureInstalled] installs Debian's
// postgresql-15 with apt-get when the binaries are missing and the caller
// is root.
package postgres
