// Package schematest gives integration tests a fresh shard database with
// Triage's schema applied: a new database on the package's shared MariaDB
// server (package mariadbtest, whose Main the test package's TestMain must
// run), migrated with schema.Migrate and dropped when the test ends.
package schematest
