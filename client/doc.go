// Package client is the Go client for Triage's gRPC API: a connection to
// one or more routers with failover, and a Worker that runs the consumer
// loop users would otherwise write themselves.
//
// DialEndpoints (or Dial, for one router) returns a Client that exposes the
// generated stubs as Queue and Admin, so every RPC in proto/triage/v1 is
// available with its full request, and a few convenience methods
// (Enqueue, Dequeue, Ack, Nack) for hand-written loops. Most consumers use
// a Worker instead:
//
//	c, err := client.Dial(ctx, "127.0.0.1:9090")
//	w, err := client.NewWorker(c, client.WorkerConfig{Namespace: "default"})
//	w.Handle("emails", func(ctx context.Context, it *client.Item) error {
//		return send(ctx, it.Payload) // nil acks, an error nacks
//	}, client.TopicOptions{Concurrency: 8}) // TopicOptions{} for the defaults
//	err = w.Run(ctx) // until ctx is done, then a graceful stop
//
// # The worker
//
// A Worker dequeues for all its topics in one long-polling call, asking
// each topic for as many items as it has room for: Concurrency handlers
// plus Prefetch items waiting (default: as many as the concurrency), so a
// handler that finishes finds the next item without a round trip, and the
// worker never leases more than it can start soon. The server's dequeue
// policy of each topic (strict or weighted) decides which items come.
//
// Every item the worker holds, prefetched or running, has its lease
// extended every third of WorkerConfig.Lease (default 30s). A third leaves
// two more tries before the lease lapses, so one slow or failed extension
// does not lose the item; the worker asks for an explicit lease on every
// dequeue and extension so its heartbeat needs no clock shared with the
// server. A refused extension (stale token, item gone) means another
// consumer may hold the item: the handler's context is cancelled with
// cause ErrLeaseLost and its result is dropped rather than acked with a
// stale view. Transient extension failures are retried until the lease
// would have lapsed by the local clock, counted from when the last
// successful call was sent (so never later than the server's expiry).
//
// Handlers are registered per topic with TopicOptions, one struct with
// every option and its default: Concurrency, Prefetch and Timeout.
//
// The handler's result decides the item's fate:
//
//   - nil: ack (the item is deleted).
//   - an error: nack without a delay, so the server applies the
//     namespace's exponential backoff and dead-letters the item after
//     max_attempts deliveries. The error text becomes last_error.
//   - Permanent(err): nack with dead_letter, straight to the dead letters
//     whatever attempts remain. HandleJSON treats an undecodable payload
//     this way.
//   - Snooze(d): nack with release and delay d: the item comes back after
//     d with this delivery not counted, and a snooze never dead-letters.
//   - a panic: recovered, turned into a *PanicError carrying the stack,
//     and nacked like an error, so last_error shows where it happened.
//   - no result within the topic's timeout: nacked like an error, with
//     "handler timed out after <Timeout>" (see Handler timeout).
//
// Dead-lettering and not counting a delivery are server operations (the
// Nack fields dead_letter and release) rather than client tricks such as
// a nack at max attempts or an ExtendLease for the snooze: the server
// knows the namespace's max_attempts, and an extended lease would keep
// the item from other consumers and from the stats' ready count.
//
// Acks and nacks are batched across handlers: one sender each takes
// whatever queued up while its previous call was in flight (up to
// MaxBatch), so batches grow with load and an idle worker acks at once,
// without a linger timer adding latency. A worker whose slots are full
// carries its acks in the Dequeue that a freed slot wakes
// (DequeueRequest.acks), one call where an Ack and a Dequeue were two;
// while a long poll is in flight, acks go by themselves.
//
// Middleware (func(next Handler) Handler, added with Use) wraps every
// handler; the first added is outermost. It sees panics as *PanicError,
// so logging, metrics and tracing hooks see every outcome.
//
// # Handler timeout
//
// Every handler call has a timeout, TopicOptions.Timeout, counted from
// when the handler starts: one minute by default (DefaultHandlerTimeout),
// as River's job timeout; set it per topic, or to NoTimeout (any negative
// value) for none. The heartbeat only says that the process is alive, not
// that the handler makes progress: without a limit, a handler stuck on a
// dead socket holds its item leased until the process dies.
//
// When the timeout passes, the handler's context is cancelled with cause
// ErrHandlerTimeout (its Deadline says when from the start, so the calls
// it makes with it give up too), the worker stops extending the item's
// lease and nacks the item without a delay: the server's backoff applies,
// the attempt counts towards max_attempts and last_error reads "handler
// timed out after 1m0s". A handler that returns an error once its context
// has timed out counts as timed out as well. The worker does not wait for
// the handler: the topic's slot takes the next item at once and whatever
// the handler returns later is ignored, so the item is settled once. A
// handler that ignores its context keeps running on its own goroutine,
// outside the topic's Concurrency and holding no lease, until it returns.
//
// # Shutdown
//
// Stop (and Run, when its context ends) first stops dequeuing, cancelling
// the long poll in flight (the router hands back items it leased for a
// reply it could not send). Items prefetched but not started are handed
// back at once with a release nack: ready immediately, no attempt counted,
// so another worker takes them without waiting out a lease. Running
// handlers finish within Stop's context (or are abandoned at their
// timeout, their items nacked), and their acks and nacks are sent before
// Stop returns. If the context ends first, the handlers' contexts are
// cancelled with cause ErrWorkerStopped; those that ignore it are
// abandoned, their leases no longer extended, so their items come back
// when the lease lapses: at-least-once, never lost.
//
// # Endpoints, failover and retries
//
// Any router serves any call (an item ID names its shard, and leases live
// in the shards), so a client can move between routers freely: a lease
// taken through one router is extended and acked through another.
// DialEndpoints keeps a connection per router and sends each call to the
// first endpoint of the preferred region (WithRegion) that is not marked
// down, then the others in the order given. A call that fails with
// UNAVAILABLE marks its endpoint down for RetryPolicy.DownFor and moves on
// to the next endpoint at once; after a round over all of them it backs off
// exponentially with jitter (each sleep drawn from [d/2, d)) so the
// workers of a lost router do not return in step.
//
// UNAVAILABLE does not say whether the router acted on the call, so only
// calls that are safe to repeat are retried: lease calls (their token
// makes a repeat a refusal, not a second effect), reads, and Enqueue when
// every item carries a dedup key. An Enqueue without dedup keys and the
// Admin changes are sent once. A router answers a lease call whose write
// it could not settle UNAVAILABLE with "outcome unknown"; the retry with
// the same token finds an acked item gone ("item not found"), which the
// worker counts as done, and a nacked one's token cleared ("stale lease
// token").
//
// # Regions
//
// Enqueue, Dequeue, GetTopicStats and ListTopics name a region; left empty,
// the router uses its own. WithRegion sets a default for the requests whose
// region is empty, including those sent through Queue directly. It is filled
// in by a unary interceptor on a copy of the request, so a caller's request
// is never changed and may be reused. Calls that take an item ID need no
// region: the ID names its shard.
//
// # Transport
//
// Dial uses plaintext (insecure) credentials, which suit the loopback bed.
// WithDialOptions adds gRPC dial options, for example TLS credentials, which
// replace the plaintext default. Dial does not wait for the connection: the
// first RPC does, under its own context.
//
// # Errors
//
// Failed RPCs are *Error values (method, endpoint, gRPC code, attempts)
// that match the sentinels ErrUnavailable, ErrNotFound, ErrStaleLease,
// ErrInvalid and ErrResourceExhausted with errors.Is, and work with
// status.Code. Batch calls succeed as a whole and report each item in an
// ItemResult; Nack, which takes a single item, turns a failed result into
// an *ItemError, which matches ErrStaleLease or ErrNotFound.
//
// # Tests
//
// The tests run the worker against real routers (cmd/triage/node) on a
// spawned mariadbd and an embedded NATS server, including a router cut off
// mid-call; fakes serve only to inject UNAVAILABLE into the endpoint layer.
package client
