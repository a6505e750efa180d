// Package bed runs a local Triage bed: real MariaDB shard primaries
// (mariadbd children in temp datadirs), embedded NATS with JetStream, and a
// node running every Triage role per region. `triage-bed up` (make up) runs
// one in the foreground; e2e tests, drills and `make bench` use it too.
//
// The bed writes its layout to <Dir>/bed.json so drills and scripts can find
// every process by role, region, shard, port and PID, and so `triage-bed
// down` (make down) can stop a bed from another terminal by PID.
//
// # One region
//
// The default: region us-east with two shard primaries, one standalone NATS
// server, one node. No replicas and no WAN.
//
// # Several regions
//
// With Regions set to more than one (`triage-bed up --multi-region` gives
// us-east, eu-west and ap-south), each region gets:
//
//   - its shard primaries (one each by default), and one replica of every
//     shard of the previous region: region i's shards are replicated in
//     region i+1 (mod the number of regions). Replicas replicate with GTID
//     (MASTER_USE_GTID=slave_pos) and semi-sync AFTER_SYNC, start with
//     --read-only=ON, and are set up through package regions/replication
//     exactly as production would be;
//   - a NATS server, clustered with the others, with JetStream; the
//     control-plane buckets and every region's enqueue stream are
//     replicated on up to three servers (one per region), so losing a
//     region keeps the control plane;
//   - a node (router, enqueuer, dequeuer) on its region's NATS server,
//     serving JSON on HTTPBase+i and gRPC on GRPCBase+i.
//
// Every cross-region connection goes through a WAN link of package
// deploy/wan (default 20 ms one way): replication, a node's access to
// another region's MariaDB (node.Config.MySQL.DialVia maps each remote
// server's address to the link from the node's region), and the NATS
// routes; router forwarding rides on NATS. The shard map and bed.json name
// servers by their real addresses; [Layout.Via] and [Bed.Via] translate for
// a region. A drill cuts a region off with Net().Cut or kills it with
// [Bed.KillRegion].
//
// # Accounts
//
// Every server gets, before replication starts and with sql_log_bin=0, the
// replication account and the application account that nodes use
// (provision.BedAccounts, set up by provision.EnsureAccounts, which the
// compose bed's bootstrap runs too). The application account lacks SUPER
// and READ ONLY ADMIN, so read_only fences it on replicas and on a deposed
// primary. It has no DDL either: a node migrates a shard whose schema is
// behind as its admin account, root (no password, loopback only), which
// the controller uses too. Nodes read the application password from
// mysql-app.password in the bed's directory (0600), and the controllers
// the replication password from mysql-repl.password, as a deployment
// would mount secrets; they are in no node config and not in the shard
// map.
//
// # NATS security
//
// With Config.Auth (make up) the NATS servers require logins
// (nats-triage.password, nats-client.password) and TLS: the bed makes a
// throwaway CA, signs one certificate for 127.0.0.1 with it and drops the
// CA's key (certs.go), so ca.crt can verify the servers but sign nothing
// more. Every node, the JetStream wait and a bench run against the
// bed connect with that CA (Layout.NATSTLS); a client without it is
// refused. With several
// regions the routes between the servers are TLS too, verified both ways
// against the same CA, and need a random route login kept in memory: a
// stranger reaching a route port cannot join the cluster. The WAN links
// forward TCP, so TLS runs end to end through them. A bed started without
// Auth (most tests) runs NATS in the clear.
//
// # MySQL TLS
//
// With Config.MySQLTLS (on with Auth, so make up has it) the same CA signs
// the mariadbd servers' certificate (mysql-server.crt, for 127.0.0.1),
// which every server offers (--ssl-cert, --ssl-key, --ssl-ca, kept over
// restarts). The nodes' application and admin pools verify it against
// ca.crt (node.Config.MySQL.TLS, Layout.MySQLTLS), the replicas connect
// to their primary with MASTER_SSL=1, verifying chain and name through the
// WAN links too (node.Config.ReplicationTLS, at bring-up and at every
// repoint and rejoin), and the application and replication accounts are
// REQUIRE SSL. Root stays reachable over plain TCP on loopback for the
// bed's own checks and fault injection.
//
// # What it shares with production
//
// The nodes are cmd/triage/node's, and the accounts, replication and the
// JetStream wait are package cmd/triage/provision's, the code `triage
// bootstrap` runs: the bed differs from a deployment in where the
// processes run, not in how they are set up. The dependency points one
// way: the production binary links nothing of this package.
package bed
