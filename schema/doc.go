// Package schema owns the tables of a Triage shard and applies them.
//
// Migrations are numbered SQL files in migrations/ ("0001_init.up.sql"),
// embedded in the binary, applied in order to every shard primary at start
// and recorded in schema_migrations. Concurrent starters serialise on a
// MySQL named lock, so a fleet restarting at once applies each migration
// once. Migrations only move forward; there are no down files because a
// queue's rows cannot be un-migrated safely while consumers hold leases.
//
// Shards run MariaDB, from MinMariaDB (10.11) on: the queue's statements
// use JSON_TABLE and BEGIN NOT ATOMIC, and failover MariaDB's replication
// statements. CheckServer, which routing.MigrateShard runs before the
// migrations (node start, AddShard), refuses any other server with
// ErrUnsupportedServer, saying what it is and what is needed, instead of
// letting it fail later on the first statement it lacks.
//
// Each index states in a comment the query it serves. Times are BIGINT
// microseconds since the Unix epoch (see 0001_init.up.sql for why).
//
// # The application account
//
// The router, enqueuer and dequeuer write as an account with SELECT,
// INSERT, UPDATE and DELETE on the shard database only. The failover
// controller fences a deposed primary with read_only, which MariaDB does
// not apply to an account with READ_ONLY ADMIN (ALL PRIVILEGES includes
// it), and SUPER may turn semi-sync off, which failover relies on.
// CheckGrants refuses an account holding any of the three on *.*, itself
// or through its enabled roles, with ErrPrivilegedAccount; the pool of the
// application account (shardmap.NewAppPool) runs it on every connection
// it opens, so a node given root, or a shard it is given, fails at its
// first statement (routing.MigrateShard at node start and AddShard)
// saying which privilege. The admin account, which runs migrations and
// the controller's replication statements, is not checked.
//
// # Timeouts
//
// A statement the client gave up on must not commit later: an ack
// reported failed would then be applied after its caller retried or gave
// up. The client giving up does not stop the server (go-sql-driver closes
// the connection, it does not KILL the query), and a statement waiting
// for a row lock runs on when the lock is released, COMMIT included when
// it was sent in the same multi-statement query. So the server's bounds
// on a statement of an application session are below the client's:
//
//	LockWaitTimeout  (innodb_lock_wait_timeout, 10 s) < StatementTimeout
//	(max_statement_time, 20 s) < ReadTimeout (the driver's, 30 s)
//
// A row lock wait fails with 1205 and the statement limit with 1969,
// both before the driver's read times out, and with either the failing
// statement's changes are undone and a multi-statement query stops there,
// so its COMMIT never runs; the transaction stays open until the store
// rolls it back or the connection closes. In MariaDB max_statement_time
// bounds writes as well as reads (MySQL's max_execution_time bounds
// SELECT only). A caller's context that bounds a statement must outlast
// StatementTimeout for the same reason, as the ack and serve batchers'
// flush timeout does; one that ends first (a client's deadline) leaves
// the statement running on the server for up to StatementTimeout, and its
// outcome is unknown, as with any lost answer. The bounds are per
// statement: each statement of a multi-statement query, and each retry
// after a deadlock, has its own.
//
// A COMMIT that waits for a semi-sync acknowledgement is bounded by
// neither limit: the transaction is already in the primary's binlog, and
// MariaDB lets the wait run to the semi-sync timeout (none, see
// replication.NoFallback) however long max_statement_time is. When no
// replica acknowledges within ReadTimeout, the client reports an error
// (a lost connection or its context's end) while the transaction commits
// on the primary once a replica acknowledges it, and is lost with that
// primary if none does before a failover. The outcome of such an error
// is unknown, and callers must treat it so: the enqueue worker's
// redelivery is idempotent, and an ack retried after one may find its
// item gone.
package schema
