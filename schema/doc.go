// Package schema owns the tables of a Triage shard and applies them.
//
// Migrations are numbered SQL files in migrations/ ("0001_init.up.sql"),
// embedded in the binary, applied in order to every shard primary at start
// and recorded in schema_migrations. Concurrent starters serialise on a
// MySQL named lock, so a fleet restarting at once applies each migration
// once. Migrations only move forward; there are no down files because a
// queue's rows cannot be un-migrated safely while consumers hold leases.
//
// Each index states in a comment the query it serves. Times are BIGINT
// microseconds since the Unix epoch (see 0001_init.up.sql for why).
package schema
