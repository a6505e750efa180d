package routing

import (
	"context"
	"net/http"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"
	"google.golang.org/protobuf/encoding/protojson"

	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
)

// NewGRPCServer returns a gRPC server with the Queue and Admin services,
// health (SERVING) and reflection, so grpcurl works without proto files.
func NewGRPCServer(r *Router, opts ...grpc.ServerOption) *grpc.Server {
	s := grpc.NewServer(append([]grpc.ServerOption{grpc.MaxRecvMsgSize(64 << 20)}, opts...)...)
	triagev1.RegisterQueueServer(s, r)
	triagev1.RegisterAdminServer(s, r)
	h := health.NewServer()
	h.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	h.SetServingStatus("triage.v1.Queue", healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(s, h)
	reflection.Register(s)
	return s
}

// NewGateway returns the JSON gateway calling r in-process. JSON uses the
// proto field names (lease_token, not leaseToken) as the API docs do, and
// prints every field, so a false "ok" is visible. bytes travel as base64.
func NewGateway(ctx context.Context, r *Router) (http.Handler, error) {
	mux := runtime.NewServeMux(
		runtime.WithMarshalerOption(runtime.MIMEWildcard, &runtime.JSONPb{
			MarshalOptions:   protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true},
			UnmarshalOptions: protojson.UnmarshalOptions{DiscardUnknown: false},
		}),
	)
	if err := triagev1.RegisterQueueHandlerServer(ctx, mux, r); err != nil {
		return nil, err
	}
	if err := triagev1.RegisterAdminHandlerServer(ctx, mux, r); err != nil {
		return nil, err
	}
	top := http.NewServeMux()
	top.Handle("/v1/", mux)
	top.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		_, _ = w.Write([]byte("ok\n"))
	})
	return top, nil
}
