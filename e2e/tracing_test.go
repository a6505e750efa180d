package e2e

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/triage-queue/triage/client"
	"github.com/triage-queue/triage/cmd/triage/node"
	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
	"github.com/triage-queue/triage/schema/tracing"
)

// TestTraceEnqueueToInsert: with tracing on, an Enqueue RPC's trace goes
// through the enqueue buffer (the NATS message's traceparent) into the
// enqueuer's insert; a JSON API request continues the caller's trace the
// same way; Dequeue and Ack are spans of their own.
func TestTraceEnqueueToInsert(t *testing.T) {
	t.Parallel()
	b := setup(t, bedOpts{noNode: true})
	exp := tracetest.NewInMemoryExporter()
	b.startNode(node.Config{Seams: node.Seams{TracerProvider: tracing.NewProvider(sdktrace.NewSimpleSpanProcessor(exp), 1, nil)}})

	find := func(name string, traceID trace.TraceID) (tracetest.SpanStub, bool) {
		for _, s := range exp.GetSpans() {
			if s.Name == name && (!traceID.IsValid() || s.SpanContext.TraceID() == traceID) {
				return s, true
			}
		}
		return tracetest.SpanStub{}, false
	}
	waitFor := func(name string, traceID trace.TraceID) tracetest.SpanStub {
		t.Helper()
		var s tracetest.SpanStub
		require.Eventually(t, func() bool {
			var ok bool
			s, ok = find(name, traceID)
			return ok
		}, 10*time.Second, 10*time.Millisecond, "no span %q in trace %s; have %d spans", name, traceID, len(exp.GetSpans()))
		return s
	}

	// gRPC: the server span, the publish span under it, the insert under
	// that.
	id := enqueue(t, b, "traced", &triagev1.NewItem{Payload: []byte("x")})[0].Id
	rpc := waitFor("triage.v1.Queue/Enqueue", trace.TraceID{})
	require.Equal(t, trace.SpanKindServer, rpc.SpanKind)
	pub := waitFor("enqueue.publish", rpc.SpanContext.TraceID())
	require.Equal(t, rpc.SpanContext.SpanID(), pub.Parent.SpanID())
	require.Equal(t, trace.SpanKindProducer, pub.SpanKind)
	ins := waitFor("enqueuer.insert", rpc.SpanContext.TraceID())
	require.Equal(t, pub.SpanContext.SpanID(), ins.Parent.SpanID(), "the insert is a child of the publish, across NATS")
	require.True(t, ins.Parent.IsRemote())
	require.Equal(t, trace.SpanKindConsumer, ins.SpanKind)
	require.Contains(t, ins.Attributes, attribute.Int("triage.items", 1))

	// JSON gateway, with the caller's trace context.
	const callerTrace = "4bf92f3577b34da6a3ce929d0e0e4736"
	req, err := http.NewRequest(http.MethodPost, b.http+"/v1/namespaces/default/topics/traced/items",
		strings.NewReader(`{"items":[{"payload":"eQ=="}]}`))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("traceparent", "00-"+callerTrace+"-00f067aa0ba902b7-01")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	caller, err := trace.TraceIDFromHex(callerTrace)
	require.NoError(t, err)
	gw := waitFor("gateway POST", caller)
	require.Equal(t, "00f067aa0ba902b7", gw.Parent.SpanID().String())
	waitFor("enqueuer.insert", caller)

	// Dequeue and ack: spans as they come.
	var got []*triagev1.LeasedItem
	require.Eventually(t, func() bool { got = dequeue(t, b, "traced", 2, 0); return len(got) == 2 }, 10*time.Second, 20*time.Millisecond)
	require.Contains(t, []string{got[0].Id, got[1].Id}, id)
	for _, r := range ack(t, b, got...) {
		require.True(t, r.Ok)
	}
	waitFor("triage.v1.Queue/Dequeue", trace.TraceID{})
	waitFor("triage.v1.Queue/Ack", trace.TraceID{})
	conn, err := grpc.NewClient(b.node.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	_, err = healthpb.NewHealthClient(conn).Check(b.ctx(), &healthpb.HealthCheckRequest{})
	require.NoError(t, err)
	_, health := find("grpc.health.v1.Health/Check", trace.TraceID{})
	require.False(t, health, "health probes are not traced")
}

// TestTraceDequeueAcrossNATS: a Dequeue RPC served by a dequeuer in
// another node (so over NATS, not in-process) is one trace: the router's
// RPC span, its "dequeue.forward" under it, and the dequeuer's
// "dequeuer.dequeue" under that, joined by the request's traceparent
// header. Each node exports to its own exporter, as separate processes
// would.
func TestTraceDequeueAcrossNATS(t *testing.T) {
	t.Parallel()
	b := setup(t, bedOpts{noNode: true})
	routerSpans, dequeuerSpans := tracetest.NewInMemoryExporter(), tracetest.NewInMemoryExporter()
	provider := func(exp *tracetest.InMemoryExporter) trace.TracerProvider {
		return tracing.NewProvider(sdktrace.NewSimpleSpanProcessor(exp), 1, nil)
	}
	// The dequeuer first: the router's start waits until the shards are owned.
	b.startNode(node.Config{Roles: []string{node.RoleDequeuer}, Seams: node.Seams{TracerProvider: provider(dequeuerSpans)}})
	b.startNode(node.Config{Roles: []string{node.RoleRouter, node.RoleEnqueuer}, Seams: node.Seams{TracerProvider: provider(routerSpans)}})
	require.Nil(t, b.node.Dequeuer(), "the router's node runs no dequeuer: the dequeue crosses NATS")

	id := enqueue(t, b, "hop", &triagev1.NewItem{Payload: []byte("x")})[0].Id
	var got []*triagev1.LeasedItem
	require.Eventually(t, func() bool { got = dequeue(t, b, "hop", 1, 0); return len(got) == 1 }, 10*time.Second, 20*time.Millisecond)
	require.Equal(t, id, got[0].Id)

	// The dequeuer's span that served the item, then its parents.
	var served tracetest.SpanStub
	require.Eventually(t, func() bool {
		for _, s := range dequeuerSpans.GetSpans() {
			if s.Name == "dequeuer.dequeue" && slices.Contains(s.Attributes, attribute.Int("triage.items", 1)) {
				served = s
				return true
			}
		}
		return false
	}, 10*time.Second, 10*time.Millisecond)
	require.Equal(t, trace.SpanKindServer, served.SpanKind)
	require.True(t, served.Parent.IsRemote(), "its parent came over NATS")
	byID := map[trace.SpanID]tracetest.SpanStub{}
	require.Eventually(t, func() bool {
		for _, s := range routerSpans.GetSpans() {
			byID[s.SpanContext.SpanID()] = s
		}
		_, ok := byID[served.Parent.SpanID()]
		return ok
	}, 10*time.Second, 10*time.Millisecond, "no router span is the dequeuer span's parent")
	fwd := byID[served.Parent.SpanID()]
	require.Equal(t, "dequeue.forward", fwd.Name)
	require.Equal(t, served.SpanContext.TraceID(), fwd.SpanContext.TraceID(), "one trace")
	require.Contains(t, fwd.Attributes, attribute.Int("triage.items", 1))
	rpc, ok := byID[fwd.Parent.SpanID()]
	require.True(t, ok, "the forward's parent is a router span")
	require.Equal(t, "triage.v1.Queue/Dequeue", rpc.Name)
	require.Equal(t, served.SpanContext.TraceID(), rpc.SpanContext.TraceID())
	for _, s := range dequeuerSpans.GetSpans() {
		if s.Name == "dequeuer.dequeue" {
			require.True(t, s.Parent.IsValid() && s.Parent.IsRemote(), "every dequeue the router forwarded carries its trace")
		}
	}
}

// TestTraceLinksConsumerToProducer: the enqueue's trace context is stored
// with the item and handed to its consumer: the Go worker's handler span
// ("process TOPIC", a consumer span of its own trace) links to the
// router's "enqueue.publish" span of the Enqueue that stored it, and the
// handler's context carries that span. GetItem shows the same context.
func TestTraceLinksConsumerToProducer(t *testing.T) {
	t.Parallel()
	b := setup(t, bedOpts{noNode: true})
	server := tracetest.NewInMemoryExporter()
	b.startNode(node.Config{Seams: node.Seams{TracerProvider: tracing.NewProvider(sdktrace.NewSimpleSpanProcessor(server), 1, nil)}})

	id := enqueue(t, b, "linked", &triagev1.NewItem{Payload: []byte("x")})[0].Id
	var pub tracetest.SpanStub
	require.Eventually(t, func() bool {
		for _, s := range server.GetSpans() {
			if s.Name == "enqueue.publish" {
				pub = s
				return true
			}
		}
		return false
	}, 10*time.Second, 10*time.Millisecond)
	item, err := b.queue.GetItem(b.ctx(), &triagev1.GetItemRequest{Namespace: "default", Id: id})
	require.NoError(t, err)
	require.Equal(t, tracing.Format(pub.SpanContext), item.Traceparent)

	consumer := tracetest.NewInMemoryExporter()
	c, err := client.Dial(b.ctx(), b.node.GRPCAddr)
	require.NoError(t, err)
	defer c.Close()
	w, err := client.NewWorker(c, client.WorkerConfig{Namespace: "default", Wait: time.Second,
		TracerProvider: sdktrace.NewTracerProvider(sdktrace.WithSyncer(consumer))})
	require.NoError(t, err)
	inHandler := make(chan trace.SpanContext, 1)
	w.Handle("linked", func(ctx context.Context, it *client.Item) error {
		inHandler <- trace.SpanContextFromContext(ctx)
		return nil
	}, client.TopicOptions{})
	require.NoError(t, w.Start(b.ctx()))
	defer w.Stop(context.Background())

	var handler trace.SpanContext
	select {
	case handler = <-inHandler:
	case <-time.After(10 * time.Second):
		t.Fatal("the worker never ran the handler")
	}
	var span tracetest.SpanStub
	require.Eventually(t, func() bool {
		for _, s := range consumer.GetSpans() {
			if s.Name == "process linked" {
				span = s
				return true
			}
		}
		return false
	}, 10*time.Second, 10*time.Millisecond)
	require.Equal(t, handler, span.SpanContext, "the handler's context carries its span")
	require.Equal(t, trace.SpanKindConsumer, span.SpanKind)
	require.Contains(t, span.Attributes, attribute.String("messaging.message.id", id))
	require.Len(t, span.Links, 1)
	require.Equal(t, pub.SpanContext.TraceID(), span.Links[0].SpanContext.TraceID(), "linked to the producer's trace")
	require.Equal(t, pub.SpanContext.SpanID(), span.Links[0].SpanContext.SpanID(), "at the span that enqueued the item")
}
