// Package provision brings the servers of a Triage deployment to the state
// its nodes start from: the MariaDB accounts on every server, each shard
// replicated to its replicas with semi-sync, and a JetStream cluster that
// has elected its meta leader. `triage bootstrap` (cmd/triage/bootstrap.Run)
// runs it against the compose bed's containers, and the local bed
// (deploy/bed) against the mariadbd and NATS servers it spawns, so both
// beds are set up by the same code, the way a deployment would be.
//
// It lives beside the production binary, not in deploy/bed, because
// `triage bootstrap` is a production verb and the `serve` binary must not
// link the bed (cmd/triage's TestServeDoesNotLinkTheBed). It decides
// nothing about topology: the caller names the servers, the accounts and
// the replicas; the statements themselves are package
// regions/replication's.
//
// # Accounts
//
// [EnsureAccounts] creates, with sql_log_bin=0 so that it never creates a
// GTID, the replication account and the application account that nodes
// use. The application account lacks SUPER and READ ONLY ADMIN, so
// read_only fences it on replicas and on a deposed primary, and it has no
// DDL (CREATE, DROP, ALTER and INDEX, which earlier versions granted, are
// revoked): migrations run as the admin account, so a leaked application
// password can change rows but neither tables nor the fence.
// [BedAccounts] are the beds' fixed accounts.
//
// # Waiting
//
// Every wait here is [Poll]: try, and on failure try again after a pause
// until the context ends, then report the last failure. Independent work
// on several servers runs with [Parallel], which waits for all of it and
// joins every error, so one slow server does not hide another's failure.
package provision
