// Package mariadb spawns and manages real MariaDB server processes for the
// local test bed and for integration tests.
//
// Each [Server] is one mariadbd child process with its own data directory,
// Unix socket, pid file and error log under [Config.Dir], listening on its own
// TCP port on 127.0.0.1. We run real servers rather than an in-memory fake
// because the queue's correctness depends on InnoDB locking, the binary log
// and crash recovery, which no fake reproduces.
//
// Servers are configured with the durability settings of a production shard
// (innodb_flush_log_at_trx_commit=1, sync_binlog=1, row-based binary log with
// GTIDs in strict mode, log_slave_updates) so that tests which kill -9 a server
// observe exactly what a production shard would keep. Only memory-sized knobs
// are tuned down for a small box. Semi-synchronous replication is built into
// MariaDB 10.11 and left disabled; nothing here prevents enabling it.
//
// A Server started twice with the same Dir reuses its data: mariadb-install-db
// runs only for a new data directory. That is what makes restart and crash
// drills ([Server.Stop] or [Server.Kill], then [Start] again) possible.
//
// The child runs in its own process group so that Ctrl-C in the parent's
// terminal does not kill it before the parent stops it cleanly. It gets
// SIGTERM when the parent dies (Linux's parent-death signal), so a test
// binary killed at its -timeout or a bed killed with -9 leaves no server
// running. The package only ever signals the PID it started; it never uses
// pkill or killall.
//
// Errors are returned, not logged; an optional *slog.Logger receives progress
// lines only. For integration tests, see package mariadbtest.
package mariadb
