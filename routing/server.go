package routing

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
)

// MaxRequestBytes is the default bound of a request, over gRPC (the
// receive limit) and over the JSON gateway (the body) alike; a node's
// max_body_bytes replaces it (grpc.MaxRecvMsgSize, WithMaxBody).
const MaxRequestBytes = 64 << 20

// NewGRPCServer returns a gRPC server with the Queue and Admin services,
// health and reflection, so grpcurl works without proto files. Options
// given replace the defaults (a later grpc.MaxRecvMsgSize wins). h is the
// health service whose status the caller keeps (see cmd/triage/node's
// readiness); nil serves a constant SERVING.
func NewGRPCServer(r *Router, h *health.Server, opts ...grpc.ServerOption) *grpc.Server {
	s := grpc.NewServer(serverOptions(r, []grpc.ServerOption{grpc.MaxRecvMsgSize(MaxRequestBytes), grpc.NumStreamWorkers(StreamWorkers)}, opts)...)
	triagev1.RegisterQueueServer(s, r)
	triagev1.RegisterAdminServer(s, r.Admin())
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
	s := grpc.NewServer(serverOptions(r, []grpc.ServerOption{grpc.MaxRecvMsgSize(MaxRequestBytes)}, opts)...)
	triagev1.RegisterAdminServer(s, r.Admin())
	if h == nil {
		h = health.NewServer()
		h.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	}
	healthpb.RegisterHealthServer(s, h)
	reflection.Register(s)
	return s
}

// serverOptions are defaults, then the caller's options (a later
// grpc.MaxRecvMsgSize wins), then the interceptors closest to the
// handlers: errors become status codes there (statusUnary), so the
// caller's interceptors (authorization, metrics, logs) see the code the
// client gets.
func serverOptions(r *Router, defaults, opts []grpc.ServerOption) []grpc.ServerOption {
	out := append(defaults, opts...)
	return append(out, grpc.ChainUnaryInterceptor(logWithheldUnary(r.log), statusUnary))
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
	return NewGatewayFor(ctx, r, r.Admin(), extra, WithLogger(r.log))
}

// GatewayOption configures NewGatewayFor.
type GatewayOption func(*gatewayConfig)

type gatewayConfig struct {
	maxBody      int64
	authenticate func(*http.Request) error
	log          *slog.Logger
}

// WithMaxBody bounds an API request's body at n bytes (default
// MaxRequestBytes): a longer one is answered 413 without being decoded.
func WithMaxBody(n int64) GatewayOption {
	return func(c *gatewayConfig) {
		if n > 0 {
			c.maxBody = n
		}
	}
}

// WithAuthenticate checks an API request's credentials before its body
// is read (routing/auth's Authorizer.AuthenticateHTTP). A request that
// fails it is answered 401 at once when its body is over
// MaxUnauthenticatedBody, and is otherwise passed on with its small
// body, so that the guard refuses it naming the RPC (and audits it when
// it is an admin RPC). So an unknown caller never makes the node read or
// parse more than MaxUnauthenticatedBody bytes.
func WithAuthenticate(f func(*http.Request) error) GatewayOption {
	return func(c *gatewayConfig) { c.authenticate = f }
}

// WithLogger receives what the gateway keeps from its clients: the
// detail of errors toStatus answered without it, and requests refused
// before their body was read. Default: not logged.
func WithLogger(l *slog.Logger) GatewayOption {
	return func(c *gatewayConfig) { c.log = l }
}

// MaxUnauthenticatedBody is the most of a request body the gateway reads
// before its caller is known (WithAuthenticate): enough for any request
// but a large enqueue, and small enough that refusing it costs nothing.
const MaxUnauthenticatedBody = 64 << 10

// NewGatewayFor is NewGateway calling q and a, which may wrap the router
// (cmd/triage/node puts routing/auth's guards in between, as the gateway
// calls in-process where no gRPC interceptor runs). A nil q or a leaves
// that service's routes out.
//
// An API request with a body (POST, PUT, PATCH) must be JSON
// (Content-Type application/json, parameters such as charset allowed)
// and is answered 415 otherwise: a web page may send a text/plain or
// form POST to any site without asking (no CORS preflight), and a JSON
// body sent as such must not be taken for a JSON request.
func NewGatewayFor(ctx context.Context, q triagev1.QueueServer, a triagev1.AdminServer, extra map[string]http.Handler, opts ...GatewayOption) (http.Handler, error) {
	cfg := gatewayConfig{maxBody: MaxRequestBytes}
	for _, o := range opts {
		o(&cfg)
	}
	mux := runtime.NewServeMux(
		runtime.WithMarshalerOption(runtime.MIMEWildcard, jsonBody{&runtime.JSONPb{
			MarshalOptions:   protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true},
			UnmarshalOptions: protojson.UnmarshalOptions{DiscardUnknown: false},
		}}),
		runtime.WithErrorHandler(func(ctx context.Context, mux *runtime.ServeMux, m runtime.Marshaler, w http.ResponseWriter, r *http.Request, err error) {
			err = toStatus(err) // as statusUnary does for gRPC
			logWithheld(cfg.log, r.Method+" "+r.URL.Path, err)
			runtime.DefaultHTTPErrorHandler(ctx, mux, m, w, r, err)
		}),
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
	top.Handle("/v1/", cfg.api(mux))
	for path, h := range extra {
		top.Handle(path, h)
	}
	top.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		_, _ = w.Write([]byte("ok\n"))
	})
	return cfg.limitBody(top), nil
}

// api checks an API request before the gateway decodes it: its caller
// (see WithAuthenticate), then its content type.
func (c gatewayConfig) api(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if c.authenticate != nil {
			if err := c.authenticate(req); err != nil && !c.smallBody(w, req, err) {
				return
			}
		}
		if hasBody(req.Method) && !isJSON(req.Header.Get("Content-Type")) {
			writeError(w, http.StatusUnsupportedMediaType, codes.InvalidArgument, fmt.Sprintf(
				"Content-Type %q: a %s request's body must be JSON, sent as Content-Type: application/json (parameters such as charset=utf-8 allowed)",
				req.Header.Get("Content-Type"), req.Method))
			return
		}
		h.ServeHTTP(w, req)
	})
}

// smallBody reads the body of a request whose caller is unknown, up to
// MaxUnauthenticatedBody, and passes it on (it returns true) for the
// guard to refuse; a longer body is refused here with unknown's status,
// unread.
func (c gatewayConfig) smallBody(w http.ResponseWriter, req *http.Request, unknown error) bool {
	var body []byte
	long := req.ContentLength > MaxUnauthenticatedBody
	if !long && req.ContentLength != 0 {
		var err error
		body, err = io.ReadAll(io.LimitReader(req.Body, MaxUnauthenticatedBody+1))
		long = err != nil || len(body) > MaxUnauthenticatedBody
	}
	if long {
		if c.log != nil {
			c.log.Warn("request refused before reading its body", "method", req.Method, "path", truncate(req.URL.Path),
				"content_length", req.ContentLength, "err", status.Convert(unknown).Message())
		}
		w.Header().Set("Connection", "close")
		writeError(w, http.StatusUnauthorized, codes.Unauthenticated, status.Convert(unknown).Message())
		return false
	}
	req.Body = io.NopCloser(bytes.NewReader(body))
	req.ContentLength = int64(len(body))
	return true
}

// hasBody tells the methods whose body the gateway decodes.
func hasBody(method string) bool {
	return method == http.MethodPost || method == http.MethodPut || method == http.MethodPatch
}

// isJSON tells whether a Content-Type header is application/json.
func isJSON(contentType string) bool {
	mt, _, err := mime.ParseMediaType(contentType)
	return err == nil && mt == "application/json"
}

// limitBody refuses a body over c.maxBody, as gRPC does: at once with 413
// when Content-Length says so, else when reading passes the limit (the
// decoder then answers 400 with the same message).
func (c gatewayConfig) limitBody(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.ContentLength > c.maxBody {
			w.Header().Set("Connection", "close")
			writeError(w, http.StatusRequestEntityTooLarge, codes.ResourceExhausted, bodyTooLarge(req.ContentLength, c.maxBody))
			return
		}
		req.Body = http.MaxBytesReader(w, req.Body, c.maxBody)
		h.ServeHTTP(w, req)
	})
}

// writeError answers as the gateway answers an RPC's error: a JSON object
// with the gRPC code, the message and no details.
func writeError(w http.ResponseWriter, httpStatus int, code codes.Code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(httpStatus)
	data, _ := json.Marshal(map[string]any{"code": int(code), "message": msg, "details": []any{}})
	_, _ = w.Write(data)
}

func bodyTooLarge(n, limit int64) string {
	if n > 0 {
		return fmt.Sprintf("request body is %d bytes; at most %d (%s) allowed", n, limit, byteSize(limit))
	}
	return fmt.Sprintf("request body is over %d bytes (%s), the most allowed", limit, byteSize(limit))
}

// truncate cuts a client's string (a path) for a log line.
func truncate(s string) string {
	if len(s) > 256 {
		return s[:256] + "…"
	}
	return s
}

// byteSize writes n in the largest binary unit that divides it.
func byteSize(n int64) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d bytes", n)
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
			return errors.New(bodyTooLarge(0, tooBig.Limit))
		}
		var syntax *json.SyntaxError
		if errors.Is(err, io.ErrUnexpectedEOF) || errors.As(err, &syntax) {
			return fmt.Errorf("request body is not valid JSON (%v): send one JSON object with the request's fields", err)
		}
		return err
	})
}
