package tracing

import (
	"context"
	"errors"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

func provider(ratio float64) (*sdktrace.TracerProvider, *tracetest.InMemoryExporter) {
	exp := tracetest.NewInMemoryExporter()
	return NewProvider(sdktrace.NewSimpleSpanProcessor(exp), ratio, nil), exp
}

// TestHeaderRoundTrip: each batch's traceparent comes back as its remote
// span context, in order; a batch without one stays without; an envelope
// without any trace gets no header; a header of the wrong length is
// ignored rather than misattributed.
func TestHeaderRoundTrip(t *testing.T) {
	tp, _ := provider(1)
	tr := Tracer(tp)
	ctx1, s1 := tr.Start(context.Background(), "one")
	ctx2, s2 := tr.Start(context.Background(), "two")
	tp1, tp2 := Traceparent(ctx1), Traceparent(ctx2)
	require.Regexp(t, `^00-[0-9a-f]{32}-[0-9a-f]{16}-01$`, tp1)
	require.Empty(t, Traceparent(context.Background()))

	h := nats.Header{}
	Inject(h, []string{tp1, "", tp2})
	require.Equal(t, []string{tp1, "-", tp2}, h.Values(Header))
	got := Extract(h, 3)
	require.Equal(t, s1.SpanContext().TraceID(), got[0].TraceID())
	require.Equal(t, s1.SpanContext().SpanID(), got[0].SpanID())
	require.True(t, got[0].IsRemote() && got[0].IsSampled())
	require.False(t, got[1].IsValid())
	require.Equal(t, s2.SpanContext().TraceID(), got[2].TraceID())
	for _, sc := range Extract(h, 2) {
		require.False(t, sc.IsValid(), "a header that does not match the batches is not used")
	}

	empty := nats.Header{}
	Inject(empty, []string{"", ""})
	require.Empty(t, empty, "no trace: no header")
	require.Len(t, Extract(empty, 2), 2)

	// Tracing off: the no-op tracer's spans carry no context to inject.
	ctx, _ := Tracer(nil).Start(context.Background(), "off")
	require.Empty(t, Traceparent(ctx))
}

// TestStartLinked: work for several parents is a child of the first and
// links the rest; every other sampled parent's trace gets its own span;
// an unsampled parent gets none; the error is recorded on all.
func TestStartLinked(t *testing.T) {
	tp, exp := provider(1)
	tr := Tracer(tp)
	_, a := tr.Start(context.Background(), "a")
	_, b := tr.Start(context.Background(), "b")
	a.End()
	b.End()
	unsampled := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1}, SpanID: trace.SpanID{1}, Remote: true})
	remote := func(s trace.Span) trace.SpanContext {
		return trace.NewSpanContext(trace.SpanContextConfig{TraceID: s.SpanContext().TraceID(), SpanID: s.SpanContext().SpanID(), TraceFlags: trace.FlagsSampled, Remote: true})
	}
	exp.Reset()
	ctx, end := StartLinked(context.Background(), tr, "insert", []trace.SpanContext{remote(a), {}, remote(b), remote(a), unsampled})
	require.Equal(t, a.SpanContext().TraceID(), trace.SpanContextFromContext(ctx).TraceID())
	end(errors.New("boom"))
	spans := exp.GetSpans()
	require.Len(t, spans, 2, "one for a's trace (links b and the unsampled one), one for b's")
	main, other := spans[0], spans[1]
	if main.SpanContext.TraceID() != a.SpanContext().TraceID() {
		main, other = other, main
	}
	require.Equal(t, a.SpanContext().SpanID(), main.Parent.SpanID())
	require.Len(t, main.Links, 2)
	require.Equal(t, b.SpanContext().TraceID(), main.Links[0].SpanContext.TraceID())
	require.Equal(t, b.SpanContext().TraceID(), other.SpanContext.TraceID())
	require.Equal(t, b.SpanContext().SpanID(), other.Parent.SpanID())
	require.Equal(t, main.SpanContext.SpanID(), other.Links[0].SpanContext.SpanID())
	for _, s := range spans {
		require.Equal(t, "insert", s.Name)
		require.Equal(t, codes.Error, s.Status.Code)
	}

	// No parent: a new root.
	exp.Reset()
	_, end = StartLinked(context.Background(), tr, "insert", nil)
	end(nil)
	require.Len(t, exp.GetSpans(), 1)
	require.False(t, exp.GetSpans()[0].Parent.IsValid())
}

// TestNewChecksConfig: the exporter's config errors are the node's.
func TestNewChecksConfig(t *testing.T) {
	_, err := New(context.Background(), Config{}, "triage", "r")
	require.ErrorContains(t, err, "endpoint is required")
	bad := 1.5
	_, err = New(context.Background(), Config{Endpoint: "127.0.0.1:4317", SampleRatio: &bad}, "triage", "r")
	require.ErrorContains(t, err, "sample_ratio")
	half := 0.5
	tp, err := New(context.Background(), Config{Endpoint: "127.0.0.1:1", SampleRatio: &half, Insecure: true}, "triage", "r")
	require.NoError(t, err, "the exporter connects lazily")
	require.NoError(t, tp.Shutdown(context.Background()))
}

// TestEnd: a span ended with an error carries it as its status and an
// event; one ended without keeps an unset status; attributes are set
// either way.
func TestEnd(t *testing.T) {
	tp, exp := provider(1)
	tr := Tracer(tp)
	_, failed := tr.Start(context.Background(), "failed")
	End(failed, errors.New("boom"), attribute.Int("triage.items", 3))
	_, fine := tr.Start(context.Background(), "fine")
	End(fine, nil, attribute.Int("triage.items", 0))
	spans := exp.GetSpans()
	require.Len(t, spans, 2)
	require.Equal(t, codes.Error, spans[0].Status.Code)
	require.Equal(t, "boom", spans[0].Status.Description)
	require.Len(t, spans[0].Events, 1, "the error recorded")
	require.Contains(t, spans[0].Attributes, attribute.Int("triage.items", 3))
	require.Equal(t, codes.Unset, spans[1].Status.Code)
	require.Empty(t, spans[1].Events)
	require.Contains(t, spans[1].Attributes, attribute.Int("triage.items", 0))
}
