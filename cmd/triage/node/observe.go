package node

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	grpcprom "github.com/grpc-ecosystem/go-grpc-middleware/providers/prometheus"
	"github.com/nats-io/nuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	noopmetric "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"

	"github.com/triage-queue/triage/routing"
	"github.com/triage-queue/triage/schema/metrics"
	"github.com/triage-queue/triage/schema/tracing"
	"github.com/triage-queue/triage/shardmap"
)

// ReadyEvery is how often a node re-checks its readiness (the gRPC
// health status and /readyz follow the last check).
const ReadyEvery = time.Second

// RequestIDHeader carries a request's ID: taken from the request when the
// client sent one, else minted, and sent back in the response (HTTP
// header, gRPC header metadata "x-request-id"), so a client's report and
// the server's log line can be matched.
const RequestIDHeader = "X-Request-Id"

// observability is a node's metrics registry, readiness state and the
// handlers that serve them.
type observability struct {
	reg    *prometheus.Registry
	set    *metrics.Set
	rpc    *grpcprom.ServerMetrics
	health *health.Server
	log    *slog.Logger

	// tracer is the node's tracer provider; nil: tracing off.
	tracer trace.TracerProvider

	mu       sync.Mutex
	notReady error // last readiness check; nil: ready
	srv      *http.Server
}

func newObservability(cfg Config, log *slog.Logger) *observability {
	reg := prometheus.NewRegistry()
	o := &observability{reg: reg, log: log.With("region", cfg.Region),
		set:      metrics.New(reg, metrics.Options{MaxTopics: cfg.MaxTopicLabels}),
		health:   health.NewServer(),
		notReady: fmt.Errorf("starting"),
	}
	o.rpc = grpcprom.NewServerMetrics(grpcprom.WithServerHandlingTimeHistogram(
		grpcprom.WithHistogramBuckets([]float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 20})))
	reg.MustRegister(o.rpc)
	o.setStatus(healthpb.HealthCheckResponse_NOT_SERVING)
	return o
}

func (o *observability) setStatus(st healthpb.HealthCheckResponse_ServingStatus) {
	o.health.SetServingStatus("", st)
	o.health.SetServingStatus(routing.QueueService, st)
}

// readiness re-checks check every ReadyEvery until ctx ends, logging each
// change once.
func (o *observability) readiness(ctx context.Context, check func(context.Context) error) {
	t := time.NewTicker(ReadyEvery)
	defer t.Stop()
	for {
		cctx, cancel := context.WithTimeout(ctx, ReadyEvery)
		err := check(cctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		o.mu.Lock()
		was := o.notReady
		o.notReady = err
		o.mu.Unlock()
		switch {
		case err == nil && was != nil:
			o.log.Info("node ready")
			o.setStatus(healthpb.HealthCheckResponse_SERVING)
		case err != nil && (was == nil || was.Error() != err.Error()):
			o.log.Warn("node not ready", "reason", err)
			o.setStatus(healthpb.HealthCheckResponse_NOT_SERVING)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// stop marks the node not ready (a stopping node takes no new work) and
// closes the metrics listener.
func (o *observability) stop() {
	o.mu.Lock()
	o.notReady = fmt.Errorf("node is stopping")
	srv := o.srv
	o.mu.Unlock()
	o.health.Shutdown()
	if srv != nil {
		_ = srv.Close()
	}
}

// probes are /readyz and /livez, which the router's public HTTP listener
// and the metrics listener serve to anyone. With reason, /readyz says why
// the node is not ready; without it (the public listener) it says only
// that, since the reason may name a shard primary's or NATS's address.
func (o *observability) probes(reason bool) map[string]http.Handler {
	return map[string]http.Handler{
		"/readyz": http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			o.mu.Lock()
			err := o.notReady
			o.mu.Unlock()
			w.Header().Set("Content-Type", "text/plain")
			switch {
			case err != nil && reason:
				w.WriteHeader(http.StatusServiceUnavailable)
				fmt.Fprintf(w, "not ready: %v\n", err)
				return
			case err != nil:
				w.WriteHeader(http.StatusServiceUnavailable)
				fmt.Fprintln(w, "not ready (the reason is in the log and on the metrics listener)")
				return
			}
			fmt.Fprintln(w, "ok")
		}),
		// The process runs and serves HTTP: nothing more, so a liveness
		// probe never restarts a node for what a dependency does.
		"/livez": http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/plain")
			fmt.Fprintln(w, "ok")
		}),
	}
}

// serve serves /metrics, /shardmap and the probes on addr
// (Config.Metrics), the only listener with /metrics: its labels name
// namespaces, topics and the shard primaries' addresses, which the
// router's public listeners never show.
func (o *observability) serve(addr string, maps func() *shardmap.Map) (string, error) {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(o.reg, promhttp.HandlerOpts{Registry: o.reg}))
	mux.Handle("/shardmap", mapVersion(maps))
	for p, h := range o.probes(true) {
		mux.Handle(p, h)
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return "", fmt.Errorf("metrics listen: %w", err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	o.mu.Lock()
	o.srv = srv
	o.mu.Unlock()
	go func() { _ = srv.Serve(lis) }()
	return lis.Addr().String(), nil
}

// mapVersion answers which shard map the node holds, in a few bytes: a
// check that every node serves a change (the scale run, an operator after
// a shard add) polls it where a /metrics scrape at a thousand shards would
// cost more than the wait it measures.
func mapVersion(maps func() *shardmap.Map) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		m := maps()
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(struct {
			Version    uint64 `json:"version"`
			Shards     int    `json:"shards"`
			Namespaces int    `json:"namespaces"`
		}{m.Version, len(m.Shards), len(m.Namespaces)})
	})
}

// grpcOptions are the router's gRPC server options: RPC metrics, then
// request IDs and RPC logs.
func (o *observability) grpcOptions() []grpc.ServerOption {
	opts := []grpc.ServerOption{grpc.ChainUnaryInterceptor(o.rpc.UnaryServerInterceptor(), o.logUnary)}
	if o.tracer != nil {
		// A span per RPC, continuing the caller's W3C trace context;
		// health probes are left out.
		opts = append(opts, grpc.StatsHandler(otelgrpc.NewServerHandler(
			otelgrpc.WithTracerProvider(o.tracer), otelgrpc.WithPropagators(tracing.Propagator),
			otelgrpc.WithMeterProvider(noopmetric.NewMeterProvider()), // metrics are Prometheus's
			otelgrpc.WithFilter(func(info *stats.RPCTagInfo) bool {
				return !strings.HasPrefix(info.FullMethodName, "/grpc.health.")
			}))))
	}
	return opts
}

// traceHTTP gives each JSON API request (/v1/) a server span, continuing
// the caller's traceparent header, when tracing is on. The gateway calls
// the router in-process, so this span is the parent of what the router
// does. (A few lines rather than otelhttp, which would add its semantic
// conventions and httpsnoop to the binary for one span.)
func (o *observability) traceHTTP(next http.Handler) http.Handler {
	if o.tracer == nil {
		return next
	}
	tr := tracing.Tracer(o.tracer)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasPrefix(r.URL.Path, "/v1/") {
			next.ServeHTTP(w, r)
			return
		}
		ctx := tracing.Propagator.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
		ctx, span := tr.Start(ctx, "gateway "+r.Method, trace.WithSpanKind(trace.SpanKindServer),
			trace.WithAttributes(attribute.String("http.request.method", r.Method), attribute.String("url.path", r.URL.Path)))
		defer span.End()
		sw := &statusWriter{ResponseWriter: w, code: http.StatusOK}
		next.ServeHTTP(sw, r.WithContext(ctx))
		span.SetAttributes(attribute.Int("http.response.status_code", sw.code))
		if sw.code >= 500 {
			span.SetStatus(otelcodes.Error, http.StatusText(sw.code))
		}
	})
}

// logUnary gives each RPC a request ID and logs it: at debug when it
// succeeded or the client was at fault, at warn when the server was
// (Internal, Unknown, Unavailable, DeadlineExceeded, DataLoss).
func (o *observability) logUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	id := ""
	// Not FromIncomingContext, which copies every key of the metadata.
	if v := metadata.ValueFromIncomingContext(ctx, "x-request-id"); len(v) > 0 {
		id = v[0]
	}
	if id == "" {
		id = nuid.Next()
	}
	_ = grpc.SetHeader(ctx, metadata.Pairs("x-request-id", id))
	start := time.Now()
	resp, err := handler(ctx, req)
	code := status.Code(err)
	lvl := slog.LevelDebug
	switch code {
	case codes.Internal, codes.Unknown, codes.Unavailable, codes.DeadlineExceeded, codes.DataLoss:
		lvl = slog.LevelWarn
	}
	if o.log.Enabled(ctx, lvl) {
		attrs := []any{"request_id", id, "method", info.FullMethod, "code", code.String(), "took", time.Since(start).Round(time.Microsecond)}
		if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
			attrs = append(attrs, "trace_id", sc.TraceID().String())
		}
		if err != nil {
			attrs = append(attrs, "err", status.Convert(err).Message())
		}
		o.log.Log(ctx, lvl, "rpc", attrs...)
	}
	return resp, err
}

// statusWriter keeps the status code an HTTP handler wrote.
type statusWriter struct {
	http.ResponseWriter
	code int
}

func (w *statusWriter) WriteHeader(code int) {
	w.code = code
	w.ResponseWriter.WriteHeader(code)
}

// Flush lets streaming through (the gateway flushes).
func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// logHTTP is logUnary for the JSON gateway, which calls the router
// in-process (no gRPC interceptor runs): request IDs in X-Request-Id, and
// a log line per API request, at warn for 5xx answers.
func (o *observability) logHTTP(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasPrefix(r.URL.Path, "/v1/") {
			next.ServeHTTP(w, r) // probes and scrapes: not logged
			return
		}
		id := r.Header.Get(RequestIDHeader)
		if id == "" {
			id = nuid.Next()
		}
		w.Header().Set(RequestIDHeader, id)
		sw := &statusWriter{ResponseWriter: w, code: http.StatusOK}
		start := time.Now()
		next.ServeHTTP(sw, r)
		lvl := slog.LevelDebug
		if sw.code >= 500 {
			lvl = slog.LevelWarn
		}
		if o.log.Enabled(r.Context(), lvl) {
			attrs := []any{"request_id", id, "method", r.Method, "path", r.URL.Path, "status", sw.code, "took", time.Since(start).Round(time.Microsecond)}
			if sc := trace.SpanContextFromContext(r.Context()); sc.IsValid() {
				attrs = append(attrs, "trace_id", sc.TraceID().String())
			}
			o.log.Log(r.Context(), lvl, "http", attrs...)
		}
	})
}
