// Package tracing is Triage's OpenTelemetry tracing: the OTLP exporter a
// node turns on with its config's "tracing" section (off by default), and
// the W3C trace context carried through the NATS enqueue buffer.
//
// # Off by default
//
// With no tracing section a node installs no stats handler, no HTTP
// tracing handler and no exporter, and the roles hold a no-op tracer: the
// request path pays nothing. With one, New builds a TracerProvider that
// samples a share of new traces (sample_ratio, parent-based: a request
// that arrives with a sampled traceparent is traced whatever the ratio)
// and batches spans to an OTLP/gRPC collector.
//
// # One trace from Enqueue to the insert
//
// The router's gRPC server (otelgrpc stats handler) and the JSON gateway
// (a small handler of the node's, continuing the caller's traceparent
// header) start a span per request. An Enqueue's batches go through
// the enqueue buffer, where a router coalesces the batches of several
// requests into one JetStream message (an envelope). The router's
// "enqueue.publish" span (a child of the RPC's) is what each batch
// carries: the message's "traceparent" header has one value per batch,
// in the envelope's order ("-" for a batch without a trace), written by
// Inject and read by Extract. The enqueuer's worker inserts the batches
// of several messages in one transaction: its "enqueuer.insert" span is a
// child of the first batch's context and links the others, and every
// other sampled trace among the batches gets its own "enqueuer.insert"
// span, with the same timing, so each Enqueue's trace ends in the insert
// that stored it.
//
// # From the insert to the consumer
//
// The insert stores each batch's trace context (Format of its parent,
// the router's publish span) with its items, in items.traceparent; the
// head read carries it into the dequeuer's buffers and every delivery
// hands it out (LeasedItem.traceparent, GetItem too). The Go worker
// starts each handler's "process TOPIC" span as a consumer span of its
// own trace linked to it: an item may be delivered many times, so the
// producer's trace is a link, as OpenTelemetry's messaging conventions
// have it, not a parent. Only traced enqueues store one (a node with
// tracing off stores none), and a redriven dead letter has none.
//
// Dequeue, Ack, Nack and ExtendLease are traced as the RPCs they are (a
// lease's delivery and its ack are separate requests, each its own
// trace).
package tracing
