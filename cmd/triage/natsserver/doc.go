// Package natsserver runs an embedded NATS server with JetStream, for the
// local bed and for tests. Triage uses NATS as a buffer and control plane,
// never as the system of record; see the README's Durability section for the fsync caveat.
//
// Config.Auth makes it require logins (auth.go): one for Triage's own
// processes, allowed the internal subjects (triage.>, JetStream, KV, and
// its replies under peer.InboxPrefix), and client logins denied exactly
// those and the default inbox "_INBOX.>", each receiving its replies under
// its own ClientInboxPrefix. Replies carry what Triage answers (a
// dequeue's payloads and lease tokens), so a login that could subscribe to
// them, or publish to them, could read other tenants' items or answer in
// Triage's place. Publishing on triage.> is how the roles hand each other
// enqueue batches, dequeue requests and commits, trusted as validated and
// authorized by a router; only Triage may do it. Permissions are per user
// in the global account, not separate accounts, because JetStream's
// streams and buckets must stay where every Triage process sees them.
//
// # TLS and routes
//
// Config.TLS (tls.go) makes the client port TLS only: the server's INFO
// says TLS is required and a client that sends anything but a handshake
// is dropped, so neither a login nor an envelope crosses the network in
// the clear. TLS.VerifyClients adds mTLS: a client needs a certificate of
// the CA as well as its login. The certificate and key are read at start;
// renewing them means restarting the server (nats-server reloads only
// from a config file, which the embedded server has none of).
//
// Config.RouteAuth is the cluster's route login: a server that dials the
// route port without it is refused, so a stranger who reaches the port
// cannot join the cluster, read every stream through it or take part in
// JetStream's elections. TLS.Routes encrypts the routes with the same
// certificate and makes each end verify the other against the CA, which
// also keeps out a server holding the login but no certificate. The beds
// join the regions' servers into one cluster by routes (no gateways or
// leaf nodes), so routes are the only server-to-server links to guard.
//
// # Raft timing
//
// The first Start of a process sets nats-server's Raft heartbeat (250 ms),
// election timeout (1.5-3.5 s, from 4-9 s) and lost-quorum interval (5 s,
// from 10 s) through go:linkname (raft.go): nats-server has no option for
// them, and a region that dies with the leaders of the shard map bucket,
// the controller lease and the enqueue buffers stops every region's
// writes until new leaders are elected. The values are those nats-server's
// own test suite runs its clusters with, but for a gentler heartbeat.
package natsserver
