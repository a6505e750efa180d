package routing

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"
	"google.golang.org/protobuf/encoding/protojson"

	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
)

// MaxRequestBytes bounds a request, over gRPC (the receive limit) and over
// the JSON gateway (the body) alike.
const MaxRequestBytes = 64 << 20

// NewGRPCServer returns a gRPC server with the Queue and Admin services,
// health and reflection, so grpcurl works without proto files. h is the
// health service whose status the caller keeps (see cmd/triage/node's
// readiness); nil serves a constant SERVING.
func NewGRPCServer(r *Router, h *health.Server, opts ...grpc.ServerOption) *grpc.Server {
	s := grpc.NewServer(append([]grpc.ServerOption{grpc.MaxRecvMsgSize(MaxRequestBytes), grpc.NumStreamWorkers(StreamWorkers)}, opts...)...)
	triagev1.RegisterQueueServer(s, r)
	triagev1.RegisterAdminServer(s, r)
	if h == nil {
		h = health.NewServer()
		h.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
		h.SetServingStatus(QueueService, healthpb.HealthCheckResponse_SERVING)
	}
	healthpb.RegisterHealthServer(s, h)
	reflection.Register(s)
	return s
}

// NewAdminGRPCServer returns a gRPC server with only the Admin service
// (and health and reflection), for a node's admin listener.
func NewAdminGRPCServer(r *Router, h *health.Server, opts ...grpc.ServerOption) *grpc.Server {
	s := grpc.NewServer(append([]grpc.ServerOption{grpc.MaxRecvMsgSize(MaxRequestBytes)}, opts...)...)
	triagev1.RegisterAdminServer(s, r)
	if h == nil {
		h = health.NewServer()
		h.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	}
	healthpb.RegisterHealthServer(s, h)
	reflection.Register(s)
	return s
}

// StreamWorkers is how many goroutines the queue server keeps to run
// RPCs on (a call that finds them all busy gets a goroutine of its own,
// as without them). A new goroutine per call starts with a small stack
// and grows it, copying, through the interceptor chain, the router and
// the NATS publish: 7.6 % of the process's CPU in a profile of
// triage-enqueue-batch1. A worker keeps its grown stack. Three back to
// back pairs of that bench (2 cores): 5.68-6.04k items/s without, 6.03-
// 6.79k with 256 workers.
const StreamWorkers = 256

// QueueService is the gRPC health service name of the queue API.
const QueueService = "triage.v1.Queue"

// NewGateway returns the JSON gateway calling r in-process. JSON uses the
// proto field names (lease_token, not leaseToken) as the API docs do, and
// prints every field, so a false "ok" is visible. bytes travel as base64.
//
// extra, when set, serves the paths it is given (the node's /metrics,
// /readyz, /livez) beside the API.
func NewGateway(ctx context.Context, r *Router, extra map[string]http.Handler) (http.Handler, error) {
	return NewGatewayFor(ctx, r, r, extra)
}

// NewGatewayFor is NewGateway calling q and a, which may wrap the router
// (cmd/triage/node puts routing/auth's guards in between, as the gateway
// calls in-process where no gRPC interceptor runs). A nil q or a leaves
// that service's routes out.
func NewGatewayFor(ctx context.Context, q triagev1.QueueServer, a triagev1.AdminServer, extra map[string]http.Handler) (http.Handler, error) {
	mux := runtime.NewServeMux(
		runtime.WithMarshalerOption(runtime.MIMEWildcard, jsonBody{&runtime.JSONPb{
			MarshalOptions:   protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true},
			UnmarshalOptions: protojson.UnmarshalOptions{DiscardUnknown: false},
		}}),
	)
	if q != nil {
		if err := triagev1.RegisterQueueHandlerServer(ctx, mux, q); err != nil {
			return nil, err
		}
	}
	if a != nil {
		if err := triagev1.RegisterAdminHandlerServer(ctx, mux, a); err != nil {
			return nil, err
		}
	}
	top := http.NewServeMux()
	top.Handle("/v1/", mux)
	for path, h := range extra {
		top.Handle(path, h)
	}
	top.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		_, _ = w.Write([]byte("ok\n"))
	})
	return limitBody(top), nil
}

// limitBody refuses a body over MaxRequestBytes, as gRPC does: at once
// with 413 when Content-Length says so, else when reading passes the
// limit (the decoder then answers 400 with the same message).
func limitBody(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.ContentLength > MaxRequestBytes {
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Connection", "close")
			w.WriteHeader(http.StatusRequestEntityTooLarge)
			data, _ := json.Marshal(map[string]any{"code": 8, "message": bodyTooLarge(req.ContentLength), "details": []any{}})
			_, _ = w.Write(data)
			return
		}
		req.Body = http.MaxBytesReader(w, req.Body, MaxRequestBytes)
		h.ServeHTTP(w, req)
	})
}

func bodyTooLarge(n int64) string {
	if n > 0 {
		return fmt.Sprintf("request body is %d bytes; at most %d (64 MiB) allowed", n, MaxRequestBytes)
	}
	return fmt.Sprintf("request body is over %d bytes (64 MiB), the most allowed", MaxRequestBytes)
}

// jsonBody is the gateway's JSON marshaler with decode errors that say what
// is wrong: protojson names a bad field itself, but a body that is not JSON
// at all would otherwise be answered with a bare "unexpected EOF".
type jsonBody struct{ *runtime.JSONPb }

// NewDecoder implements runtime.Marshaler.
func (j jsonBody) NewDecoder(r io.Reader) runtime.Decoder {
	d := j.JSONPb.NewDecoder(r)
	return runtime.DecoderFunc(func(v any) error {
		err := d.Decode(v)
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return errors.New(bodyTooLarge(0))
		}
		var syntax *json.SyntaxError
		if errors.Is(err, io.ErrUnexpectedEOF) || errors.As(err, &syntax) {
			return fmt.Errorf("request body is not valid JSON (%v): send one JSON object with the request's fields", err)
		}
		return err
	})
}
