package tracing

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// Config is a node's "tracing" section.
type Config struct {
	// Endpoint is the OTLP/gRPC collector, host:port (usually :4317).
	// Required.
	Endpoint string `json:"endpoint"`
	// SampleRatio is the share of new traces sampled, 0 to 1. Default 1.
	// Requests that carry a sampled traceparent are always traced.
	SampleRatio *float64 `json:"sample_ratio,omitempty"`
	// Insecure talks plaintext to the collector (a sidecar or a
	// collector on a private network). Default TLS.
	Insecure bool `json:"insecure,omitempty"`
	// Headers are sent with each export (a collector's API key).
	Headers map[string]string `json:"headers,omitempty"`
}

// Propagator is the W3C trace context, the one format Triage reads and
// writes (gRPC metadata, HTTP headers, NATS message headers).
var Propagator propagation.TextMapPropagator = propagation.TraceContext{}

// Noop is the tracer provider of a node without tracing.
var Noop trace.TracerProvider = noop.NewTracerProvider()

// Name is the instrumentation scope of Triage's own spans.
const Name = "github.com/triage-queue/triage"

// New returns a TracerProvider exporting to cfg.Endpoint over OTLP/gRPC,
// its spans tagged with service and region. Shut it down to flush.
func New(ctx context.Context, cfg Config, service, region string) (*sdktrace.TracerProvider, error) {
	if cfg.Endpoint == "" {
		return nil, errors.New("tracing: endpoint is required")
	}
	ratio := 1.0
	if cfg.SampleRatio != nil {
		ratio = *cfg.SampleRatio
	}
	if ratio < 0 || ratio > 1 {
		return nil, fmt.Errorf("tracing: sample_ratio %v: allowed 0 to 1", ratio)
	}
	opts := []otlptracegrpc.Option{otlptracegrpc.WithEndpoint(cfg.Endpoint)}
	if cfg.Insecure {
		opts = append(opts, otlptracegrpc.WithInsecure())
	}
	if len(cfg.Headers) > 0 {
		opts = append(opts, otlptracegrpc.WithHeaders(cfg.Headers))
	}
	// The exporter connects lazily: a collector that is down costs
	// dropped spans, never a node that will not start.
	exp, err := otlptracegrpc.New(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("tracing: %w", err)
	}
	res := resource.NewSchemaless(semconv.ServiceName(service), semconv.CloudRegion(region))
	return NewProvider(sdktrace.NewBatchSpanProcessor(exp), ratio, res), nil
}

// NewProvider is New's provider over any span processor (tests give an
// in-memory exporter's).
func NewProvider(sp sdktrace.SpanProcessor, ratio float64, res *resource.Resource) *sdktrace.TracerProvider {
	opts := []sdktrace.TracerProviderOption{
		sdktrace.WithSpanProcessor(sp),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(ratio))),
	}
	if res != nil {
		opts = append(opts, sdktrace.WithResource(res))
	}
	return sdktrace.NewTracerProvider(opts...)
}

// Tracer is tp's tracer for Triage's spans; a nil tp gives the no-op one.
func Tracer(tp trace.TracerProvider) trace.Tracer {
	if tp == nil {
		tp = Noop
	}
	return tp.Tracer(Name)
}

// Header is the NATS message header that carries the batches' trace
// contexts, one value per batch of the envelope.
const Header = "traceparent"

// none stands for a batch that carries no trace context.
const none = "-"

// Traceparent returns the W3C traceparent of ctx's span, or "" when ctx
// has none (tracing off). An unsampled span has one too, with the
// sampled flag clear, so the insert is not sampled either.
func Traceparent(ctx context.Context) string {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return ""
	}
	c := propagation.MapCarrier{}
	Propagator.Inject(ctx, c)
	return c.Get(Header)
}

// Format returns sc as a W3C traceparent, "" when it is not valid.
func Format(sc trace.SpanContext) string {
	return Traceparent(trace.ContextWithRemoteSpanContext(context.Background(), sc))
}

// Formats is Format of each of scs.
func Formats(scs []trace.SpanContext) []string {
	out := make([]string, len(scs))
	for i, sc := range scs {
		out[i] = Format(sc)
	}
	return out
}

// Inject sets h's Header to the batches' traceparents, in order, when
// any batch has one; an envelope without traces gets no header.
func Inject(h nats.Header, traceparents []string) {
	has := false
	for _, tp := range traceparents {
		if tp != "" {
			has = true
			break
		}
	}
	if !has {
		return
	}
	h.Del(Header)
	for _, tp := range traceparents {
		if tp == "" {
			tp = none
		}
		h.Add(Header, tp)
	}
}

// Extract returns the remote span context of each of n batches of a
// message with header h (invalid where a batch carries none, and for
// every batch when the header does not hold n values).
func Extract(h nats.Header, n int) []trace.SpanContext {
	out := make([]trace.SpanContext, n)
	vals := h.Values(Header)
	if len(vals) != n {
		return out
	}
	for i, v := range vals {
		if v == none {
			continue
		}
		ctx := Propagator.Extract(context.Background(), propagation.MapCarrier{Header: v})
		out[i] = trace.SpanContextFromContext(ctx)
	}
	return out
}

// StartLinked starts a span named name for work done once on behalf of
// several remote parents (the enqueuer's insert of many requests'
// batches): the returned context's span is a child of the first valid
// parent (a new root when none is) and links the others, and every other
// sampled parent gets a span of its own, with the same name and
// attributes, linked to the first. end ends them all, recording err.
func StartLinked(ctx context.Context, tracer trace.Tracer, name string, parents []trace.SpanContext, opts ...trace.SpanStartOption) (context.Context, func(err error)) {
	var distinct []trace.SpanContext
	type id struct {
		trace trace.TraceID
		span  trace.SpanID
	}
	seen := map[id]bool{}
	for _, p := range parents {
		if k := (id{p.TraceID(), p.SpanID()}); p.IsValid() && !seen[k] {
			seen[k] = true
			distinct = append(distinct, p)
		}
	}
	mainCtx := ctx
	if len(distinct) > 0 {
		mainCtx = trace.ContextWithRemoteSpanContext(ctx, distinct[0])
	}
	var links []trace.Link
	for _, p := range distinct[min(1, len(distinct)):] {
		links = append(links, trace.Link{SpanContext: p})
	}
	mainCtx, main := tracer.Start(mainCtx, name, append(opts, trace.WithLinks(links...))...)
	spans := []trace.Span{main}
	for _, p := range distinct[min(1, len(distinct)):] {
		if !p.IsSampled() {
			continue
		}
		_, s := tracer.Start(trace.ContextWithRemoteSpanContext(ctx, p), name,
			append(opts, trace.WithLinks(trace.Link{SpanContext: main.SpanContext()}))...)
		spans = append(spans, s)
	}
	return mainCtx, func(err error) {
		for _, s := range spans {
			End(s, err)
		}
	}
}

// End ends span after setting attrs, recording err (if any) as its error
// status: the deferred end of every span the roles start.
func End(span trace.Span, err error, attrs ...attribute.KeyValue) {
	span.SetAttributes(attrs...)
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}
