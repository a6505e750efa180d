// Package replication is the seam between Triage's failover controller and
// MySQL-family replication: it sets a shard's servers up, watches them, and
// performs the role changes of a failover (promote the most advanced
// replica, repoint the others, bring the deposed primary back as a
// replica). It decides nothing: which server to fence, promote or give up
// on is the controller's call (package regions). Each server is driven
// through an [Admin] on a root connection; every statement that must not
// replicate runs with sql_log_bin=0.
//
// The shard's servers run with GTID strict mode, log_slave_updates, ROW
// binary logs and sync_binlog=1 (package deploy/mariadb starts them so);
// this package relies on all four.
//
// # Setting a shard up
//
//  1. [Admin.EnsureUsers] on every server: the replication account and the
//     application account, which lacks SUPER and READ ONLY ADMIN so that
//     read_only fences it.
//  2. [Admin.EnableSemiSync] with primary=true on the primary: it waits
//     AFTER_SYNC for one replica's acknowledgement, with no fallback to
//     asynchronous replication ([NoFallback] timeout, wait_no_slave=ON).
//     Triage runs a replica in each other region (three regions: two), so
//     one dead replica costs no commit anything, and a primary cut off from
//     both completes no commit: its clients see their own deadline expire,
//     never OK, and nothing it acknowledged can be lost by a failover.
//  3. [Admin.ReplicateFrom] the primary on each replica (read_only=1 first,
//     MASTER_USE_GTID=slave_pos, semi-sync as a replica).
//  4. Alarms: poll [Admin.SemiSyncStatus] on the primary. [SemiSync.Blocked]
//     (no replica connected) means commits are waiting and writers time
//     out; [SemiSync.FellBack] (enabled but OFF) can only come from someone
//     changing the settings, and means commits are acknowledged that no
//     replica has.
//
// # Failover
//
// With the primary dead (seen dead by more than one observer):
//
//  1. Fence: the controller bumps the shard's epoch in the shard map and, if
//     the old primary answers, calls SetReadOnly(ctx, true) on it.
//  2. [MostAdvanced] over the replicas ranks them by what they received
//     (Gtid_IO_Pos merged with gtid_slave_pos), not by what they applied:
//     the promotion applies the rest. It compares sequence numbers per
//     replication domain and refuses diverged positions ([ErrDiverged]).
//     Every replica passed must answer; dropping an unreachable one is the
//     controller's decision, because it may hold the only acknowledgement
//     of the last commits.
//  3. [Admin.Promote] the winner: STOP SLAVE IO_THREAD, MASTER_GTID_WAIT
//     for Gtid_IO_Pos (the relay log is applied), STOP SLAVE, RESET SLAVE
//     ALL, read_only=0. It returns the GTID position it reached.
//  4. (Promote has turned semi-sync on as a primary before read_only=0.)
//     ReplicateFrom it on the other replicas (a replica's leftover relay log from the old
//     primary is discarded and fetched again from the new one, which has
//     it), publish the new shard map.
//
// A planned switchover is the same with the old primary alive: fence it
// first, wait until the chosen replica's Status.Received covers the old
// primary's BinlogPos, promote, then RejoinAsReplica the old primary (no
// restart needed: nothing of it is in doubt).
//
// Why no acknowledged write is lost: with AFTER_SYNC the primary commits in
// InnoDB, and answers the client, only after a replica has written the
// transaction to its relay log. The most advanced replica therefore has
// every acknowledged transaction, and Promote applies them before it takes
// writes. Semi-sync never falls back to async ([NoFallback]). The guarantee
// keeps one hole, outside this package: the acknowledging replica
// crashing together with the primary, because a replica acknowledges
// before syncing its relay log (sync_relay_log) and, in GTID mode,
// discards its relay log on restart anyway.
//
// # Rejoin rule
//
// A deposed primary never comes back as a second primary. It is restarted
// with [RejoinArgs] (mariadbd --init-rpl-role=SLAVE --read-only=ON
// --skip-slave-start --rpl-semi-sync-slave-enabled=ON) and then
// [Admin.RejoinAsReplica] of the new primary:
//
//   - --init-rpl-role=SLAVE makes crash recovery roll back, and cut from the
//     binary log, transactions that were written but still waiting for an
//     acknowledgement when it died. No client was told they committed and
//     the new primary may not have them; committed, they would make the old
//     primary diverge (the new primary then refuses it with error 1236).
//     Needs MariaDB 10.11.9 or later (MDEV-33465).
//   - --init-rpl-role does not fence anything: --read-only=ON does, from
//     the first connection, before the controller reaches the server.
//   - RejoinAsReplica sets read_only=1 again and points the server at the
//     new primary with MASTER_USE_GTID=slave_pos, adding
//     MASTER_DEMOTE_TO_SLAVE=1 where its binary log is ahead of its replica
//     position (it wrote as a primary), so that it resumes after its own
//     transactions. ReplicateFrom refuses such a server
//     ([ErrLocalTransactions]) so a deposed primary cannot slip past the
//     rule.
//
// If the old primary holds transactions the new one never received (an
// operator turned semi-sync off, or a commit that had waited for a replica
// the failover then did not promote), its IO thread stops
// with error 1236 ("diverged"), visible in [Admin.Status]: rebuild it from
// a copy of the new primary.
//
// # TLS
//
// [Credentials.TLS] of the replication account makes every CHANGE MASTER
// TO of this package (ReplicateFrom, RejoinAsReplica, so the bootstrap's
// replicas, the failover's repoints and a deposed primary's rejoin alike)
// add MASTER_SSL=1 with the CA the replica verifies its primary's chain
// against (MASTER_SSL_CA, a path on the replica's host) and, by default,
// MASTER_SSL_VERIFY_SERVER_CERT=1, so the certificate must also name the
// host the replica dials. [Status.TLS] reads it back (Master_SSL_Allowed).
// [Credentials.RequireSSL] makes EnsureUsers create an account REQUIRE
// SSL, so that the server refuses its login over plain TCP: the
// application account when the nodes connect over TLS, the replication
// account when replicas do. Without TLS, CHANGE MASTER TO names no SSL
// option, so a replica keeps whatever it was given before.
//
// # MariaDB and MySQL 8
//
// The statements live behind the [Flavor] interface so that the procedure
// above is written once. [MariaDB] is implemented; [MySQL8] is a TODO that
// returns [ErrNotSupported], and [DetectFlavor] gives that error for any
// server that is not MariaDB. A MySQL 8 flavor must change:
//
//	MariaDB 10.11                               MySQL 8.0.23+ / 8.4
//	CHANGE MASTER TO ... MASTER_USE_GTID=       CHANGE REPLICATION SOURCE TO ...
//	  slave_pos                                   SOURCE_AUTO_POSITION=1
//	MASTER_DEMOTE_TO_SLAVE=1                    not needed: auto-position sends
//	                                              gtid_executed, own trx included
//	START/STOP SLAVE [IO_THREAD], RESET SLAVE   START/STOP REPLICA [IO_THREAD],
//	  ALL, SHOW SLAVE STATUS                      RESET REPLICA ALL, SHOW REPLICA STATUS
//	Gtid_IO_Pos, gtid_slave_pos                 Retrieved_Gtid_Set, gtid_executed
//	MASTER_GTID_WAIT(pos, timeout)              WAIT_FOR_EXECUTED_GTID_SET(set, timeout)
//	GTIDs "domain-server-seq", one per domain   "uuid:1-100" interval sets: GTIDList
//	                                              does not apply
//	semi-sync built in, rpl_semi_sync_master_*  plugin semisync_source /
//	  / _slave_*                                  semisync_replica, *_source_* / *_replica_*
//	read_only + no READ ONLY ADMIN              super_read_only=ON fences root too
//	--init-rpl-role=SLAVE truncates in-doubt    no equivalent: an in-doubt tail must be
//	  binlog tail on recovery                     found and discarded (or the server cloned)
//
// # MariaDB behaviour this package depends on
//
// Verified against MariaDB 10.11 by the tests of this package:
//
//   - A CREATE USER or GRANT binary-logged on a replica gets a GTID with the
//     replica's server id; the primary's next transaction then stops the
//     replica's SQL thread with error 1950 (GTID strict mode). Hence
//     sql_log_bin=0 for every admin statement.
//   - read_only stops only accounts without READ ONLY ADMIN (part of SUPER
//     before 10.11); root and the replication applier write through it.
//   - In GTID mode, starting either replication thread while both are
//     stopped discards the relay log and refetches from gtid_slave_pos. A
//     replica with a stopped SQL thread must have it started while its IO
//     thread still runs, or what it received from a dead primary is gone.
//   - rpl_semi_sync_slave_enabled takes effect when the IO thread connects,
//     so EnableSemiSync restarts a running IO thread.
//   - With rpl_semi_sync_master_wait_no_slave=ON and the NoFallback timeout,
//     a primary whose replicas are all gone keeps semi-sync ON and holds
//     each commit until a returning replica acknowledges it.
//   - The primary notices a dead replica only when it next writes to it, so
//     ChangePrimary sets MASTER_HEARTBEAT_PERIOD=1 to keep
//     Rpl_semi_sync_master_clients current.
//   - Gtid_IO_Pos advances only at complete transactions, so waiting for it
//     never waits for a transaction torn by the primary's death.
package replication
