// Package node assembles Triage's roles (router, enqueuer, dequeuer,
// controller) into one process from a config file: it is the production
// composition root, and lives next to the binary that runs it. `triage
// serve` runs one node; the local bed (deploy/bed) runs one per region in
// its own process; the e2e tests start nodes in their own process, and as
// separate `triage serve` processes to kill them.
//
// It sits under cmd/triage rather than in deploy/ because it is what the
// production binary is made of, while deploy/ holds what deploys and tests
// it (the beds, the bench, the WAN proxies). Its non-test code imports
// nothing from deploy/, so the `serve` binary does not link the bed, the
// bench or toxiproxy (cmd/triage's TestServeDoesNotLinkTheBed).
//
// # Observability
//
// Each node has its own Prometheus registry (schema/metrics.Set), handed
// to every role it runs, and serves /metrics, /readyz and /livez on
// Config.Metrics when set (observe.go). The router's public HTTP listener
// serves /readyz (without its reason) and /livez but never /metrics, whose
// labels name namespaces, topics and every shard primary's address. The
// router's gRPC server records RPC metrics with go-grpc-middleware's
// prometheus provider and gives every RPC a request ID (x-request-id),
// logged with its outcome; the JSON gateway does the same for /v1/ with
// the X-Request-Id header.
//
// Readiness is Healthy, re-checked every ReadyEvery by one goroutine; its
// last answer drives /readyz and the gRPC health status of "" and
// triage.v1.Queue, so probes never fan out pings to the primaries. A node
// is NOT_SERVING until its first check passes and from the moment Stop
// begins. /livez answers ok while the process serves HTTP: restarting a
// node does not fix NATS or a primary.
//
// Tracing (Config.Tracing, off by default) is one TracerProvider per
// node (schema/tracing), handed to the router and enqueuer and to the
// gRPC servers' otelgrpc stats handler; the JSON gateway gets a server
// span per /v1/ request from traceHTTP. Tests give the provider through
// Config.Seams, with an in-memory exporter.
//
// The router's HTTP listener also serves the web console
// (routing/console) at /console unless Config.DisableConsole; it calls
// the same gateway routes any client does, through the same guards. It
// serves the OpenAPI document of the JSON API at /openapi.json
// (OpenAPIPath, openapi.go) to anyone, as gRPC reflection is.
//
// # Security
//
// security.go wires routing/auth into the router's listeners: one
// Authorizer per listener kind (public, admin), as gRPC interceptors and
// as guards around the router for the in-process JSON gateway, so both
// paths make the same decision from the same table. Without keys_file the
// Authorizer still runs, admitting everyone as "anonymous", so the admin
// listener split and the audit lines hold either way; since anonymous may
// then do everything, Config.fill refuses a router without keys_file whose
// listeners bind anything but loopback unless Config.Insecure. TLS configs are
// cloned per listener (net/http writes HTTP/2 settings into its copy) and
// share one certificate reloader. e2e's auth_test.go is the table of every
// RPC × credentials over gRPC and HTTPS.
//
// Behind the router, the node keeps two MySQL pools: Config.MySQL, the
// application account the roles use (DML only), and Config.Admin, used
// by the controller, by the observer for replica lag, and for migrations
// only when schema.Pending says a shard is behind (routing.MigrateShard),
// so a node of a bootstrapped cluster needs no admin password unless it
// runs the controller. Config.Replication is the replication account the
// controller hands replicas in CHANGE MASTER TO; the node never logs in
// as it. Both pools connect over TLS when their account's tls names a CA
// (shardmap.MySQLTLS, registered with the driver as tls=<name>), and
// Config.ReplicationTLS makes the replicas the controller points connect
// to their primary over TLS too (replication.TLS: MASTER_SSL=1).
// Passwords come from files or environment variables
// (shardmap.Secret), never from the shard map. Config.NATSAuth is the
// NATS Triage login (cmd/triage/natsserver.Auth) and Config.NATSTLS how the
// node verifies the NATS servers (their CA) and, when they ask, proves
// itself (its certificate): with it the connection, and so every envelope
// and login, is encrypted. e2e's privilege_test.go checks the accounts
// against a real MariaDB and an embedded NATS server with logins;
// natstls_test.go there runs a node end to end against a NATS server
// requiring mTLS.
//
// # Tests
//
// The package's own tests are unit tests of Config (config_test.go). The
// integration tests of the whole queue, which start nodes against a
// spawned mariadbd and an embedded NATS server and drive them through the
// gRPC and JSON APIs, are in e2e. Besides the config and the APIs they
// use Config.Seams (skewed clocks, a tracer provider, a hook into the
// dequeuer's fetches), Node.Dequeuer and Node.ShardOwner.
package node
