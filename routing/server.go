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
		runtime.WithMarshalerOption(runtime.MIMEWildcard, jsonBody{&runtime.JSONPb{
			MarshalOptions:   protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true},
			UnmarshalOptions: protojson.UnmarshalOptions{DiscardUnknown: false},
		}}),
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

// jsonBody is the gateway's JSON marshaler with decode errors that say what
// is wrong: protojson names a bad field itself, but a body that is not JSON
// at all would otherwise be answered with a bare "unexpected EOF".
type jsonBody struct{ *runtime.JSONPb }

// NewDecoder implements runtime.Marshaler.
func (j jsonBody) NewDecoder(r io.Reader) runtime.Decoder {
	d := j.JSONPb.NewDecoder(r)
	return runtime.DecoderFunc(func(v any) error {
		err := d.Decode(v)
		var syntax *json.SyntaxError
		if errors.Is(err, io.ErrUnexpectedEOF) || errors.As(err, &syntax) {
			return fmt.Errorf("request body is not valid JSON (%v): send one JSON object with the request's fields", err)
		}
		return err
	})
}
