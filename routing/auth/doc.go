// Package auth authenticates and authorizes every request to a router,
// over gRPC and the JSON gateway alike, and serves the TLS certificates
// of its listeners.
//
// # Identities
//
// A caller proves who it is with an API key, sent as
// "authorization: Bearer <key>" (gRPC metadata or HTTP header; the
// gateway forwards the header as metadata), or with a client certificate
// verified against the configured CA (mTLS) whose common name or a DNS,
// URI or e-mail SAN is listed by a key entry's client_certs. Either way
// the caller becomes that entry's identity (its name). A bearer key wins
// over a certificate when both are sent, so a proxy holding a certificate
// can still act for a key.
//
// Keys are high-entropy random strings (NewToken: "trk_" and 32 random
// bytes, base64url). The keys file (JSON, KeysFile) stores only their
// SHA-256: a stolen file gives no usable key, and a slow password hash
// would buy nothing against 256 random bits while costing every request.
// The file is re-read when its content changes (checked
// at most once a second, on the request path); a file that no longer
// parses keeps the last good set and logs why, so a bad edit never locks
// everyone out or lets everyone in.
//
// # Roles
//
// Roles are granted per namespace ("*" is every namespace):
//
//	producer       Enqueue, UpdateItem, DeleteItem
//	consumer       Dequeue, Ack, Nack, ExtendLease
//	reader         GetItem, GetTopicStats, ListTopics, ListDeadLetters,
//	               ListItems, GetThroughput
//	admin          GetNamespace, PutNamespace (behaviour fields only),
//	               RedriveDeadLetters, DeleteDeadLetters, PauseTopic,
//	               ResumeTopic
//	cluster-admin  GetShardMap, Failover, AddShard, AddNamespaceShard,
//	               SetShardWeight, DrainShard, RetireShard,
//	               ListFailoverEvents, ReportDrill, ListDrills (a key
//	               entry's cluster_admin; it also holds every namespace
//	               role)
//
// PutNamespace of a namespace that does not exist creates it, and
// creating needs cluster-admin (Options.NamespaceExists, which the node
// answers from its shard map): a namespace takes shards, quotas and a
// name from the whole cluster, so an admin, even of "*", only changes the
// namespaces that exist. That check comes after the role check, so only a
// namespace admin learns whether a namespace exists.
//
// Which fields of a namespace a PutNamespace may change is decided by the
// router (routing's PutNamespace), the one place that knows what a
// request changes: shards and quotas (max_payload_bytes,
// enqueue_rate_limit, enqueue_burst, max_depth) protect the cluster from
// a tenant and are cluster-admin's; a namespace admin whose request would
// change one gets PERMISSION_DENIED naming them. Identity.ClusterAdmin,
// on the identity FromContext returns, is what the router asks.
//
// Roles do not imply one another (a consumer cannot read stats unless it
// is also a reader): grants name what a key may do, nothing more.
// UpdateItem and DeleteItem belong to producer because they change what
// was enqueued (reprioritize, cancel), not the lease a consumer holds.
// RedriveDeadLetters, DeleteDeadLetters, PauseTopic and ResumeTopic are
// admin's: they act on a whole topic (every consumer of it, or the dead
// letters nobody else can bring back), which is an operator's call.
//
// The table methodRoles maps every RPC's full gRPC name to its role, and
// is the single place a decision is made: the gRPC interceptors and the
// gateway's guards (GuardQueue, GuardAdmin; the gateway calls the router in-process,
// so no gRPC interceptor runs for it) both call Authorizer.unary. An RPC
// missing from the table is refused (deny by default), and a test fails
// when a method of a registered service has no entry. Health and
// reflection are public: probes carry no key, and the API schema is no
// secret.
//
// A request without credentials gets UNAUTHENTICATED (HTTP 401); an
// unknown key too; a known identity without the role on the request's
// namespace gets PERMISSION_DENIED (403). Only then is the request
// validated, so an unauthenticated caller learns nothing about which
// namespaces exist.
//
// # Admin listener, audit, limits
//
// With Options.ClusterElsewhere (the node serves the Admin service on its
// own address), cluster-admin RPCs are refused on the public listeners;
// Options.AdminOnly makes a listener admit cluster-admin identities only.
// Every admin RPC (admin and cluster-admin roles) writes one audit log
// line: who, which RPC, the request, the outcome, and the state before and
// after (Options.Snapshot, which the node fills from the shard map). The
// reads among them (GetNamespace, GetShardMap, ListFailoverEvents,
// ListDrills) are audited only when refused: the console polls them.
//
// The request in an audit line, and its error, are cut at MaxAuditText
// (4 KiB) with the original length: a request may be as large as the
// body limit.
//
// A caller is authenticated before its request is read. grpc-go decodes
// a unary request before any interceptor runs, so ServerOptions installs
// TapHandle, which refuses a call without valid credentials when its
// headers arrive (auditing a refused admin RPC with its request unread).
// The gateway asks AuthenticateHTTP before it reads a body and reads at
// most a small one of a caller it does not know (see
// routing.WithAuthenticate). Both only authenticate: which role a call
// needs depends on its namespace, which is in the request, so the
// interceptor and the guards decide that as before.
//
// A key entry may carry rate_limit (requests per second) and burst: a
// token bucket per identity, shared by gRPC and HTTP, answering
// RESOURCE_EXHAUSTED when empty. Buckets survive key file reloads unless
// their limits change.
//
// # TLS
//
// TLSFiles serves a certificate and key from files, re-read when they
// change (tls.Config.GetCertificate), so a renewed certificate needs no
// restart; a broken renewal keeps the last good pair. ClientCAFile with
// client_auth "require" makes the handshake refuse a client without a
// certificate signed by that CA; "verify_if_given" accepts both.
package auth
