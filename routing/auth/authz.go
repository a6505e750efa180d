package auth

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"time"
	"unicode/utf8"

	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

// methodRoles maps every RPC a router serves to the role it needs: the one
// table of authorization (see the package documentation). A method not in
// it is refused.
var methodRoles = map[string]Role{
	"/triage.v1.Queue/Enqueue":            Producer,
	"/triage.v1.Queue/UpdateItem":         Producer,
	"/triage.v1.Queue/DeleteItem":         Producer,
	"/triage.v1.Queue/Dequeue":            Consumer,
	"/triage.v1.Queue/Ack":                Consumer,
	"/triage.v1.Queue/Nack":               Consumer,
	"/triage.v1.Queue/ExtendLease":        Consumer,
	"/triage.v1.Queue/GetItem":            Reader,
	"/triage.v1.Queue/GetTopicStats":      Reader,
	"/triage.v1.Queue/ListTopics":         Reader,
	"/triage.v1.Queue/ListDeadLetters":    Reader,
	"/triage.v1.Queue/ListItems":          Reader,
	"/triage.v1.Queue/GetThroughput":      Reader,
	"/triage.v1.Queue/RedriveDeadLetters": Admin,
	"/triage.v1.Queue/DeleteDeadLetters":  Admin,
	"/triage.v1.Admin/GetNamespace":       Admin,
	"/triage.v1.Admin/PutNamespace":       Admin,
	"/triage.v1.Admin/PauseTopic":         Admin,
	"/triage.v1.Admin/ResumeTopic":        Admin,
	"/triage.v1.Admin/GetShardMap":        ClusterAdmin,
	"/triage.v1.Admin/Failover":           ClusterAdmin,
	"/triage.v1.Admin/AddShard":           ClusterAdmin,
	"/triage.v1.Admin/AddNamespaceShard":  ClusterAdmin,
	"/triage.v1.Admin/SetShardWeight":     ClusterAdmin,
	"/triage.v1.Admin/DrainShard":         ClusterAdmin,
	"/triage.v1.Admin/RetireShard":        ClusterAdmin,
	"/triage.v1.Admin/ListFailoverEvents": ClusterAdmin,
	"/triage.v1.Admin/ReportDrill":        ClusterAdmin,
	"/triage.v1.Admin/ListDrills":         ClusterAdmin,

	"/grpc.health.v1.Health/Check":                                   public,
	"/grpc.health.v1.Health/Watch":                                   public,
	"/grpc.health.v1.Health/List":                                    public,
	"/grpc.reflection.v1.ServerReflection/ServerReflectionInfo":      public,
	"/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo": public,
}

// adminReads are the admin-role methods that change nothing: they are
// not audited when granted (a console polls them every second or two, and
// the audit log is for what changed); refusals are, as for every admin
// method.
var adminReads = map[string]bool{
	"/triage.v1.Admin/GetNamespace":       true,
	"/triage.v1.Admin/GetShardMap":        true,
	"/triage.v1.Admin/ListFailoverEvents": true,
	"/triage.v1.Admin/ListDrills":         true,
}

// createsNamespace are the methods that create their namespace when it
// does not exist; creating one needs cluster-admin: a namespace admin may
// change
// the namespaces it was granted, but a new namespace takes shards,
// quotas and a name from everyone, which is the cluster's to give. A
// grant on "*" is a grant on the namespaces that exist, so it does not
// let an admin create one either.
var createsNamespace = map[string]bool{
	"/triage.v1.Admin/PutNamespace": true,
}

// MethodRole returns the role method needs, and false for a method the
// table does not know (which is refused).
func MethodRole(method string) (Role, bool) {
	r, ok := methodRoles[method]
	return r, ok
}

// Options configure an Authorizer.
type Options struct {
	// Logger receives key file reload errors and the audit lines.
	Logger *slog.Logger
	// ClusterElsewhere refuses cluster-admin RPCs here: they are served on
	// the node's admin listener only.
	ClusterElsewhere bool
	// AdminOnly admits cluster-admin identities only (the admin listener).
	AdminOnly bool
	// Snapshot returns the state an admin RPC changes (a namespace's
	// config, a shard), for the audit line's before and after. Nil: none.
	Snapshot func(method string, req any) any
	// NamespaceExists tells whether a namespace exists now, so that
	// PutNamespace of a new namespace needs cluster-admin.
	// Nil: no namespace is known to exist, so those methods always need
	// it (deny by default).
	NamespaceExists func(namespace string) bool
}

// Authorizer decides every request of one listener.
type Authorizer struct {
	keys *Keys
	opt  Options

	mu       sync.Mutex
	limiters map[string]*limiter // by identity name
}

type limiter struct {
	r     float64
	burst int
	l     *rate.Limiter
}

// New returns an Authorizer checking keys. With nil keys authentication
// is off: every caller is "anonymous" and may do everything, but the
// listener split (ClusterElsewhere) and the audit lines still apply. Several listeners may share
// one (rate limits are per Authorizer); WithOptions derives another for a
// different listener sharing the buckets.
func New(keys *Keys, opt Options) *Authorizer {
	return &Authorizer{keys: keys, opt: opt, limiters: map[string]*limiter{}}
}

// Identity is who a request authenticated as.
type Identity struct {
	// Name is the key entry's name.
	Name string
	// Via is "key" or "cert".
	Via string
	key *Key
}

// ClusterAdmin reports whether the identity holds cluster-admin. Handlers
// that decide on a request's fields (PutNamespace: shards and quotas are
// cluster-admin's) ask it; anonymous, when authentication is off, does.
func (id Identity) ClusterAdmin() bool { return id.key != nil && id.key.ClusterAdmin }

// anonymous is every caller when authentication is off (no keys file):
// it may do everything, and audit lines name it.
var anonymous = Identity{Name: "anonymous", Via: "none", key: &Key{Name: "anonymous", ClusterAdmin: true}}

type identityKey struct{}

// FromContext returns the identity of an authorized request.
func FromContext(ctx context.Context) (Identity, bool) {
	id, ok := ctx.Value(identityKey{}).(Identity)
	return id, ok
}

type tlsStateKey struct{}

// WithTLSState records an HTTP request's TLS state, so that the gateway's
// in-process calls see the client certificate as gRPC calls do.
func WithTLSState(ctx context.Context, st *tls.ConnectionState) context.Context {
	return context.WithValue(ctx, tlsStateKey{}, st)
}

func peerCert(ctx context.Context) *x509.Certificate {
	var st *tls.ConnectionState
	if s, ok := ctx.Value(tlsStateKey{}).(*tls.ConnectionState); ok {
		st = s
	} else if p, ok := peer.FromContext(ctx); ok {
		if info, ok := p.AuthInfo.(credentials.TLSInfo); ok {
			st = &info.State
		}
	}
	// Only a verified chain counts: with client_auth "request" an
	// unverified certificate would otherwise name anyone.
	if st == nil || len(st.VerifiedChains) == 0 || len(st.VerifiedChains[0]) == 0 {
		return nil
	}
	return st.VerifiedChains[0][0]
}

// certNames are the names of a certificate a key entry's client_certs may
// list: its common name and SANs.
func certNames(c *x509.Certificate) []string {
	names := []string{}
	if c.Subject.CommonName != "" {
		names = append(names, c.Subject.CommonName)
	}
	names = append(names, c.DNSNames...)
	names = append(names, c.EmailAddresses...)
	for _, u := range c.URIs {
		names = append(names, u.String())
	}
	return names
}

// authenticate finds who ctx's caller is.
func (a *Authorizer) authenticate(ctx context.Context) (Identity, error) {
	if a.keys == nil {
		return anonymous, nil
	}
	set := a.keys.Current()
	md, _ := metadata.FromIncomingContext(ctx)
	if vals := md.Get("authorization"); len(vals) > 0 {
		if len(vals) > 1 {
			return Identity{}, status.Error(codes.Unauthenticated, "more than one authorization header; send one \"Bearer <key>\"")
		}
		token, err := ParseAuthorization(vals[0])
		if err != nil {
			return Identity{}, status.Error(codes.Unauthenticated, err.Error())
		}
		k, ok := set.byToken(token)
		if !ok {
			return Identity{}, status.Error(codes.Unauthenticated, "unknown API key (revoked, or not in this cluster's keys file)")
		}
		return Identity{Name: k.Name, Via: "key", key: k}, nil
	}
	if c := peerCert(ctx); c != nil {
		names := certNames(c)
		for _, n := range names {
			if k, ok := set.byCert[n]; ok {
				return Identity{Name: k.Name, Via: "cert", key: k}, nil
			}
		}
		return Identity{}, status.Errorf(codes.Unauthenticated, "client certificate %v names no identity of the keys file (client_certs)", names)
	}
	return Identity{}, status.Error(codes.Unauthenticated, "no credentials: send the header \"authorization: Bearer <key>\" (env TRIAGE_TOKEN for the triage CLI) or a client certificate")
}

// authorize checks that caller id may call method with req.
func (a *Authorizer) authorize(id Identity, method string, role Role, req any) error {
	if a.opt.AdminOnly && !id.key.ClusterAdmin {
		return status.Errorf(codes.PermissionDenied, "%q is not cluster-admin: the admin listener serves cluster-admin identities only", id.Name)
	}
	if role == ClusterAdmin {
		if !id.key.ClusterAdmin {
			return status.Errorf(codes.PermissionDenied, "%s needs cluster-admin; %q is not", method, id.Name)
		}
		return nil
	}
	nsReq, ok := req.(interface{ GetNamespace() string })
	if !ok {
		return status.Errorf(codes.Internal, "%s: request names no namespace to authorize against", method)
	}
	ns := nsReq.GetNamespace()
	if !id.key.allows(role, ns) {
		return status.Errorf(codes.PermissionDenied, "%s needs role %s on namespace %q; %q holds %v there", method, role, ns, id.Name, id.key.rolesOn(ns))
	}
	// After the role check, so that only a namespace admin learns whether
	// a namespace exists.
	if createsNamespace[method] && !id.key.ClusterAdmin && (a.opt.NamespaceExists == nil || !a.opt.NamespaceExists(ns)) {
		return status.Errorf(codes.PermissionDenied, "%s on namespace %q, which does not exist, creates it and needs cluster-admin; %q is not (a namespace admin changes existing namespaces only)", method, ns, id.Name)
	}
	return nil
}

func (k *Key) rolesOn(ns string) []Role {
	return append(append([]Role{}, k.Namespaces[ns]...), k.Namespaces[AllNamespaces]...)
}

// allow takes a token from id's bucket.
func (a *Authorizer) allow(id Identity) bool {
	k := id.key
	if k.RateLimit <= 0 {
		return true
	}
	burst := k.Burst
	if burst == 0 {
		burst = max(1, int(math.Ceil(k.RateLimit)))
	}
	a.mu.Lock()
	l := a.limiters[k.Name]
	if l == nil || l.r != k.RateLimit || l.burst != burst {
		l = &limiter{r: k.RateLimit, burst: burst, l: rate.NewLimiter(rate.Limit(k.RateLimit), burst)}
		a.limiters[k.Name] = l
	}
	a.mu.Unlock()
	return l.l.Allow()
}

// unary authenticates, authorizes, rate-limits and audits one call; the
// gRPC interceptor and the gateway guards both use it.
func (a *Authorizer) unary(ctx context.Context, method string, req any, handler grpc.UnaryHandler) (any, error) {
	role, known := methodRoles[method]
	if !known {
		return nil, status.Errorf(codes.PermissionDenied, "%s is not in the authorization table; refused", method)
	}
	if role == public {
		return handler(ctx, req)
	}
	if role == ClusterAdmin && a.opt.ClusterElsewhere {
		return nil, status.Errorf(codes.PermissionDenied, "%s is served on the admin listener only", method)
	}
	id, err := a.authenticate(ctx)
	if err == nil {
		err = a.authorize(id, method, role, req)
	}
	if err != nil {
		if role == Admin || role == ClusterAdmin {
			a.auditRefusal(id, method, protoText(req), err)
		}
		return nil, err
	}
	if !a.allow(id) {
		return nil, status.Errorf(codes.ResourceExhausted, "%q is over its rate limit of %g requests/s (burst %d); slow down and retry", id.Name, id.key.RateLimit, max(id.key.Burst, int(math.Ceil(id.key.RateLimit))))
	}
	ctx = context.WithValue(ctx, identityKey{}, id)
	if role != Admin && role != ClusterAdmin || adminReads[method] {
		return handler(ctx, req)
	}
	return a.audited(ctx, id, method, req, handler)
}

// auditRefusal logs the audit line of a refused admin RPC: refused
// attempts are what an incident review looks for.
func (a *Authorizer) auditRefusal(id Identity, method, request string, err error) {
	if a.opt.Logger == nil {
		return
	}
	a.opt.Logger.Warn("audit", "who", cmp.Or(id.Name, "(unauthenticated)"), "what", method, "request", request,
		"code", status.Code(err).String(), "err", bounded(status.Convert(err).Message()))
}

// audited runs an admin RPC and logs one audit line for it.
func (a *Authorizer) audited(ctx context.Context, id Identity, method string, req any, handler grpc.UnaryHandler) (any, error) {
	var before any
	if a.opt.Snapshot != nil {
		before = a.opt.Snapshot(method, req)
	}
	start := time.Now()
	resp, err := handler(ctx, req)
	if a.opt.Logger == nil {
		return resp, err
	}
	attrs := []any{"who", id.Name, "via", id.Via, "what", method, "request", protoText(req),
		"code", status.Code(err).String(), "took", time.Since(start).Round(time.Millisecond)}
	if err != nil {
		attrs = append(attrs, "err", bounded(status.Convert(err).Message()))
	}
	if a.opt.Snapshot != nil {
		attrs = append(attrs, "before", before, "after", a.opt.Snapshot(method, req))
	}
	a.opt.Logger.Info("audit", attrs...)
	return resp, err
}

// MaxAuditText bounds the request (and error message) of an audit line:
// a request may be as large as the body limit, and one refused call must
// not write megabytes to the log.
const MaxAuditText = 4 << 10

// protoText renders a request for the audit log (compact JSON), cut to
// MaxAuditText.
func protoText(v any) string {
	m, ok := v.(proto.Message)
	if !ok {
		return bounded(fmt.Sprint(v))
	}
	data, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(m)
	if err != nil {
		return bounded(fmt.Sprint(v))
	}
	return bounded(string(data))
}

// bounded returns s, or its first MaxAuditText bytes (cut at a rune
// boundary) and a marker with its whole length.
func bounded(s string) string {
	if len(s) <= MaxAuditText {
		return s
	}
	cut := MaxAuditText
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return fmt.Sprintf("%s…[truncated: %d bytes]", s[:cut], len(s))
}

// UnaryInterceptor is the gRPC face of the Authorizer.
func (a *Authorizer) UnaryInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		return a.unary(ctx, info.FullMethod, req, handler)
	}
}

// StreamInterceptor authorizes streaming RPCs (today only health Watch
// and reflection, both public). A streaming RPC needing a role is
// authorized before its first message, without a request to name the
// namespace, so only cluster-admin may call one.
func (a *Authorizer) StreamInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		role, known := methodRoles[info.FullMethod]
		if !known {
			return status.Errorf(codes.PermissionDenied, "%s is not in the authorization table; refused", info.FullMethod)
		}
		if role == public {
			return handler(srv, ss)
		}
		id, err := a.authenticate(ss.Context())
		if err != nil {
			return err
		}
		if !id.key.ClusterAdmin {
			return status.Errorf(codes.PermissionDenied, "%s needs cluster-admin; %q is not", info.FullMethod, id.Name)
		}
		if !a.allow(id) {
			return status.Errorf(codes.ResourceExhausted, "%q is over its rate limit", id.Name)
		}
		return handler(srv, ss)
	}
}

// TapHandle refuses a call without valid credentials when its headers
// arrive, before its message is read: grpc-go decodes a unary request
// (up to the server's receive limit) before any interceptor runs, so
// without it an anonymous caller could make the server read and parse
// megabytes to be told UNAUTHENTICATED. It only authenticates (which role
// a request needs depends on its namespace, in the message) and runs on
// the connection's reader goroutine, so it does nothing slow: a hash and
// a map lookup. Refused admin calls are audited here, their request
// unread.
func (a *Authorizer) TapHandle() tap.ServerInHandle {
	return func(ctx context.Context, info *tap.Info) (context.Context, error) {
		role, known := methodRoles[info.FullMethodName]
		if a.keys == nil || !known || role == public {
			// Unknown methods: the interceptor refuses the registered ones,
			// gRPC answers UNIMPLEMENTED for the rest.
			return ctx, nil
		}
		if role == ClusterAdmin && a.opt.ClusterElsewhere {
			return ctx, status.Errorf(codes.PermissionDenied, "%s is served on the admin listener only", info.FullMethodName)
		}
		id, err := a.authenticate(ctx)
		if err != nil {
			if role == Admin || role == ClusterAdmin {
				a.auditRefusal(id, info.FullMethodName, "(not read: unauthenticated)", err)
			}
			return ctx, err
		}
		return ctx, nil
	}
}

// ServerOptions are the gRPC server options that enforce a.
func (a *Authorizer) ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.InTapHandle(a.TapHandle()),
		grpc.ChainUnaryInterceptor(a.UnaryInterceptor()), grpc.ChainStreamInterceptor(a.StreamInterceptor())}
}
