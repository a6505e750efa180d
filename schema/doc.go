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
package schema
