package auth_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"

	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
	"github.com/triage-queue/triage/routing/auth"
	"github.com/triage-queue/triage/routing/auth/authtest"
)

// TestEveryMethodHasARole registers what routing.NewGRPCServer registers
// and requires a table entry for each method.
func TestEveryMethodHasARole(t *testing.T) {
	t.Parallel()
	s := grpc.NewServer()
	triagev1.RegisterQueueServer(s, triagev1.UnimplementedQueueServer{})
	triagev1.RegisterAdminServer(s, triagev1.UnimplementedAdminServer{})
	healthpb.RegisterHealthServer(s, health.NewServer())
	reflection.Register(s)
	n := 0
	for svc, info := range s.GetServiceInfo() {
		for _, m := range info.Methods {
			_, ok := auth.MethodRole("/" + svc + "/" + m.Name)
			require.True(t, ok, "/%s/%s has no role in methodRoles", svc, m.Name)
			n++
		}
	}
	require.Greater(t, n, 21)
	_, ok := auth.MethodRole("/triage.v1.Queue/Nope")
	require.False(t, ok)
}

func TestParseAuthorization(t *testing.T) {
	t.Parallel()
	tok, _, err := auth.NewToken()
	require.NoError(t, err)
	for _, c := range []struct {
		name, in, want, err string
	}{
		{"bearer", "Bearer " + tok, tok, ""},
		{"scheme case", "bEARER " + tok, tok, ""},
		{"extra spaces", "Bearer   " + tok, tok, ""},
		{"basic", "Basic dXNlcjpwYXNz", "", "Bearer <key>"},
		{"no scheme", tok, "", "Bearer <key>"},
		{"empty", "", "", "Bearer <key>"},
		{"not a key", "Bearer hunter2", "", "must start with"},
		{"short", "Bearer trk_abc", "", "too short"},
		{"bad char", "Bearer " + tok[:20] + "!" + tok[21:], "", "base64url"},
		{"trailing", "Bearer " + tok + " x", "", "base64url"},
		{"long", "Bearer trk_" + strings.Repeat("a", 300), "", "at most"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := auth.ParseAuthorization(c.in)
			if c.err != "" {
				require.ErrorContains(t, err, c.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, c.want, got)
		})
	}
}

func TestParseKeysErrors(t *testing.T) {
	t.Parallel()
	h := strings.Repeat("ab", 32)
	for _, c := range []struct{ name, in, err string }{
		{"not json", "keys:", "not valid JSON"},
		{"unknown field", `{"keys":[{"name":"a","sha256":"` + h + `","role":"x"}]}`, "unknown field"},
		{"no name", `{"keys":[{"sha256":"` + h + `"}]}`, "name is required"},
		{"dup name", `{"keys":[{"name":"a","sha256":"` + h + `"},{"name":"a","client_certs":["x"]}]}`, "name used twice"},
		{"no credential", `{"keys":[{"name":"a"}]}`, "give sha256"},
		{"raw key", `{"keys":[{"name":"a","sha256":"trk_abcdef"}]}`, "64 hex digits"},
		{"dup hash", `{"keys":[{"name":"a","sha256":"` + h + `"},{"name":"b","sha256":"` + h + `"}]}`, "same key hash"},
		{"bad role", `{"keys":[{"name":"a","sha256":"` + h + `","namespaces":{"n":["owner"]}}]}`, `role "owner"`},
		{"cluster role", `{"keys":[{"name":"a","sha256":"` + h + `","namespaces":{"*":["cluster-admin"]}}]}`, "cluster_admin"},
		{"empty ns", `{"keys":[{"name":"a","sha256":"` + h + `","namespaces":{"":["reader"]}}]}`, "empty namespace"},
		{"negative rate", `{"keys":[{"name":"a","sha256":"` + h + `","rate_limit":-1}]}`, "negative"},
		{"trailing", `{"keys":[]} {}`, "extra data"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := auth.ParseKeys([]byte(c.in))
			require.ErrorContains(t, err, c.err)
		})
	}
	_, err := auth.ParseKeys([]byte(`{"keys":[{"name":"a","sha256":"` + h + `","namespaces":{"*":["reader"]},"cluster_admin":true}]}`))
	require.NoError(t, err)
}

// fixture is an Authorizer over a keys file with a reader of namespace
// "n" and a cluster-admin, logging JSON into log.
type fixture struct {
	a           *auth.Authorizer
	path        string
	reader, ops string // their keys
	readerEntry auth.Key
	log         *bytes.Buffer
}

func setup(t *testing.T, opt auth.Options) *fixture {
	f := &fixture{path: filepath.Join(t.TempDir(), "keys.json"), log: &bytes.Buffer{}}
	f.readerEntry = auth.Key{Name: "reader", Namespaces: map[string][]auth.Role{"n": {auth.Reader}}}
	ops := auth.Key{Name: "ops", ClusterAdmin: true}
	f.reader, f.ops = authtest.Token(t, &f.readerEntry), authtest.Token(t, &ops)
	authtest.KeysFile(t, f.path, f.readerEntry, ops)
	opt.Logger = slog.New(slog.NewJSONHandler(f.log, nil))
	keys, err := auth.LoadKeys(f.path, opt.Logger)
	require.NoError(t, err)
	f.a = auth.New(keys, opt)
	return f
}

func (f *fixture) call(token, method string, req any) error {
	ctx := context.Background()
	if token != "" {
		ctx = metadata.NewIncomingContext(ctx, metadata.Pairs("authorization", "Bearer "+token))
	}
	_, err := f.a.UnaryInterceptor()(ctx, req, &grpc.UnaryServerInfo{FullMethod: method}, func(ctx context.Context, req any) (any, error) {
		if _, ok := auth.FromContext(ctx); !ok {
			return nil, status.Error(codes.Internal, "no identity")
		}
		return nil, nil
	})
	return err
}

func TestAuditLine(t *testing.T) {
	t.Parallel()
	state := "v1"
	f := setup(t, auth.Options{Snapshot: func(string, any) any { return state }})
	req := &triagev1.GetNamespaceRequest{Namespace: "n"}
	require.Equal(t, codes.PermissionDenied, status.Code(f.call(f.reader, triagev1.Admin_GetNamespace_FullMethodName, req)))
	require.Contains(t, f.log.String(), `"who":"reader"`)
	require.Contains(t, f.log.String(), `"code":"PermissionDenied"`)
	f.log.Reset()
	// the state changes during the call: before and after differ
	_, err := f.a.UnaryInterceptor()(metadata.NewIncomingContext(context.Background(), metadata.Pairs("authorization", "Bearer "+f.ops)),
		&triagev1.PutNamespaceRequest{Namespace: "n"}, &grpc.UnaryServerInfo{FullMethod: triagev1.Admin_PutNamespace_FullMethodName},
		func(context.Context, any) (any, error) { state = "v2"; return nil, nil })
	require.NoError(t, err)
	for _, want := range []string{`"msg":"audit"`, `"who":"ops"`, `"what":"/triage.v1.Admin/PutNamespace"`, `"before":"v1"`, `"after":"v2"`, `"request":"{\"namespace\":\"n\"}"`} {
		require.Contains(t, f.log.String(), want)
	}
	f.log.Reset()
	require.NoError(t, f.call(f.reader, triagev1.Queue_GetTopicStats_FullMethodName, &triagev1.GetTopicStatsRequest{Namespace: "n"}))
	require.Empty(t, f.log.String(), "data-plane reads are not audited")
	require.NoError(t, f.call(f.ops, triagev1.Admin_GetShardMap_FullMethodName, &triagev1.GetShardMapRequest{}))
	require.NoError(t, f.call(f.ops, triagev1.Admin_ListDrills_FullMethodName, &triagev1.ListDrillsRequest{}))
	require.Empty(t, f.log.String(), "granted admin reads are not audited")
}

// TestKeysReload: a revoked key stops working and a new one starts once
// the file changes; a broken file keeps the last good keys.
func TestKeysReload(t *testing.T) {
	t.Parallel()
	f := setup(t, auth.Options{})
	stats := &triagev1.GetTopicStatsRequest{Namespace: "n"}
	method := triagev1.Queue_GetTopicStats_FullMethodName
	require.NoError(t, f.call(f.reader, method, stats))

	next := f.readerEntry
	newToken := authtest.Token(t, &next)
	authtest.KeysFile(t, f.path, next)
	require.Eventually(t, func() bool { return f.call(newToken, method, stats) == nil }, 5*time.Second, 50*time.Millisecond)
	require.Equal(t, codes.Unauthenticated, status.Code(f.call(f.reader, method, stats)))

	authtest.Write(t, f.path, []byte(`{"keys": [`))
	require.Eventually(t, func() bool {
		// the file is checked on the request path
		return f.call(newToken, method, stats) == nil && strings.Contains(f.log.String(), "keeping the last good keys")
	}, 5*time.Second, 50*time.Millisecond)
	require.NoError(t, f.call(newToken, method, stats))
}

func TestRateLimit(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	k := auth.Key{Name: "slow", Namespaces: map[string][]auth.Role{"*": {auth.Reader}}, RateLimit: 0.001, Burst: 3}
	tok := authtest.Token(t, &k)
	authtest.KeysFile(t, filepath.Join(dir, "k.json"), k)
	keys, err := auth.LoadKeys(filepath.Join(dir, "k.json"), nil)
	require.NoError(t, err)
	f := &fixture{a: auth.New(keys, auth.Options{})}
	for range 3 {
		require.NoError(t, f.call(tok, triagev1.Queue_ListTopics_FullMethodName, &triagev1.ListTopicsRequest{Namespace: "x"}))
	}
	err = f.call(tok, triagev1.Queue_ListTopics_FullMethodName, &triagev1.ListTopicsRequest{Namespace: "x"})
	require.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
}

func TestLoadKeysErrors(t *testing.T) {
	t.Parallel()
	_, err := auth.LoadKeys(filepath.Join(t.TempDir(), "missing.json"), nil)
	require.ErrorContains(t, err, "keys file")
	p := filepath.Join(t.TempDir(), "bad.json")
	authtest.Write(t, p, []byte(`{"keys":[{"name":"x"}]}`))
	_, err = auth.LoadKeys(p, nil)
	require.ErrorContains(t, err, p)
	require.ErrorContains(t, err, "give sha256")
}

// tlsServer serves the health service over TLS files with client auth
// mode, on the Authorizer of f (nil: none).
func tlsServer(t *testing.T, files auth.TLSFiles) string {
	cfg, err := files.ServerConfig(nil)
	require.NoError(t, err)
	s := grpc.NewServer(grpc.Creds(credentials.NewTLS(cfg)))
	h := health.NewServer()
	healthpb.RegisterHealthServer(s, h)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = s.Serve(l) }()
	t.Cleanup(s.Stop)
	return l.Addr().String()
}

func check(t *testing.T, addr string, tc *tls.Config) error {
	c, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(tc)))
	require.NoError(t, err)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = healthpb.NewHealthClient(c).Check(ctx, &healthpb.HealthCheckRequest{})
	return err
}

// TestMTLSRequired: with client_auth require, a client without a
// certificate of the CA cannot connect; one with it can.
func TestMTLSRequired(t *testing.T) {
	t.Parallel()
	ca, other := authtest.NewCA(t, "ca"), authtest.NewCA(t, "other ca")
	addr := tlsServer(t, ca.ServerFiles(t, t.TempDir(), auth.ClientAuthRequire))
	base := &tls.Config{RootCAs: ca.Pool(), MinVersion: tls.VersionTLS12}

	require.Error(t, check(t, addr, base), "no client certificate")
	wrong := base.Clone()
	wrong.Certificates = []tls.Certificate{other.ClientCert(t, "mallory")}
	require.Error(t, check(t, addr, wrong), "certificate of another CA")
	good := base.Clone()
	good.Certificates = []tls.Certificate{ca.ClientCert(t, "alice")}
	require.NoError(t, check(t, addr, good))
	// and the client checks the server too
	require.Error(t, check(t, addr, &tls.Config{RootCAs: other.Pool(), Certificates: good.Certificates, MinVersion: tls.VersionTLS12}))
}

// TestCertificateReload: a renewed certificate is served without a
// restart; a broken one keeps the last good.
func TestCertificateReload(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ca1, ca2 := authtest.NewCA(t, "one"), authtest.NewCA(t, "two")
	files := ca1.ServerFiles(t, dir, auth.ClientAuthNone)
	addr := tlsServer(t, files)
	require.NoError(t, check(t, addr, &tls.Config{RootCAs: ca1.Pool(), MinVersion: tls.VersionTLS12}))

	c, k := ca2.Issue(t, "renewed", true)
	authtest.Write(t, files.KeyFile, k)
	authtest.Write(t, files.CertFile, c)
	require.Eventually(t, func() bool {
		return check(t, addr, &tls.Config{RootCAs: ca2.Pool(), MinVersion: tls.VersionTLS12}) == nil
	}, 10*time.Second, 100*time.Millisecond)

	authtest.Write(t, files.CertFile, []byte("garbage"))
	time.Sleep(1100 * time.Millisecond) // past the reloader's check interval
	require.NoError(t, check(t, addr, &tls.Config{RootCAs: ca2.Pool(), MinVersion: tls.VersionTLS12}))
}

func TestTLSFilesErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ca := authtest.NewCA(t, "ca")
	good := ca.ServerFiles(t, dir, "")
	for _, c := range []struct {
		name string
		f    auth.TLSFiles
		err  string
	}{
		{"no key", auth.TLSFiles{CertFile: good.CertFile}, "both required"},
		{"missing", auth.TLSFiles{CertFile: dir + "/nope", KeyFile: good.KeyFile}, "no such file"},
		{"swapped", auth.TLSFiles{CertFile: good.KeyFile, KeyFile: good.CertFile}, "cert_file"},
		{"mode", auth.TLSFiles{CertFile: good.CertFile, KeyFile: good.KeyFile, ClientAuth: "always"}, "allowed none"},
		{"require no CA", auth.TLSFiles{CertFile: good.CertFile, KeyFile: good.KeyFile, ClientAuth: "require"}, "needs client_ca_file"},
		{"CA not PEM", auth.TLSFiles{CertFile: good.CertFile, KeyFile: good.KeyFile, ClientCAFile: good.KeyFile}, "no PEM certificate"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := c.f.ServerConfig(nil)
			require.ErrorContains(t, err, c.err)
		})
	}
	_, err := good.ServerConfig(nil)
	require.NoError(t, err)
}

// TestPutNamespaceCreateNeedsClusterAdmin: a namespace admin (of that
// namespace or of "*") may change an existing namespace but not create
// one; cluster-admin may; without NamespaceExists nothing counts as
// existing. A key without the admin role learns nothing of existence.
func TestPutNamespaceCreateNeedsClusterAdmin(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "keys.json")
	nsAdmin := auth.Key{Name: "ns-admin", Namespaces: map[string][]auth.Role{"n": {auth.Admin}, "new": {auth.Admin}}}
	allAdmin := auth.Key{Name: "all-admin", Namespaces: map[string][]auth.Role{"*": {auth.Admin}}}
	producer := auth.Key{Name: "producer", Namespaces: map[string][]auth.Role{"*": {auth.Producer}}}
	ops := auth.Key{Name: "ops", ClusterAdmin: true}
	tokens := map[string]string{}
	for _, k := range []*auth.Key{&nsAdmin, &allAdmin, &producer, &ops} {
		tokens[k.Name] = authtest.Token(t, k)
	}
	authtest.KeysFile(t, path, nsAdmin, allAdmin, producer, ops)
	keys, err := auth.LoadKeys(path, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	existing := map[string]bool{"n": true}
	for _, c := range []struct {
		exists    map[string]bool
		key, ns   string
		want      codes.Code
		mentionNS bool
	}{
		{existing, "ns-admin", "n", codes.OK, false},
		{existing, "all-admin", "n", codes.OK, false},
		{existing, "ops", "n", codes.OK, false},
		{existing, "ns-admin", "new", codes.PermissionDenied, true},
		{existing, "all-admin", "new", codes.PermissionDenied, true},
		{existing, "producer", "new", codes.PermissionDenied, false},
		{existing, "ops", "new", codes.OK, false},
		{nil, "ns-admin", "n", codes.PermissionDenied, true},
		{nil, "ops", "n", codes.OK, false},
	} {
		var exists func(string) bool
		if c.exists != nil {
			exists = func(ns string) bool { return c.exists[ns] }
		}
		a := auth.New(keys, auth.Options{NamespaceExists: exists})
		ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("authorization", "Bearer "+tokens[c.key]))
		called := false
		_, err := a.UnaryInterceptor()(ctx, &triagev1.PutNamespaceRequest{Namespace: c.ns},
			&grpc.UnaryServerInfo{FullMethod: triagev1.Admin_PutNamespace_FullMethodName},
			func(context.Context, any) (any, error) { called = true; return nil, nil })
		require.Equal(t, c.want, status.Code(err), "%s on %s (lookup %v): %v", c.key, c.ns, c.exists != nil, err)
		require.Equal(t, c.want == codes.OK, called)
		if err != nil {
			require.Equal(t, c.mentionNS, strings.Contains(err.Error(), "does not exist"), "%v", err)
		}
		// Other admin RPCs of an existing namespace are unaffected.
		if c.exists != nil && c.ns == "n" {
			_, err = a.UnaryInterceptor()(ctx, &triagev1.GetNamespaceRequest{Namespace: "new"},
				&grpc.UnaryServerInfo{FullMethod: triagev1.Admin_GetNamespace_FullMethodName},
				func(context.Context, any) (any, error) { return nil, nil })
			require.Equal(t, c.key != "producer", err == nil, "%v", err)
		}
	}
}

// TestAuditLineBounded: a refused admin call with a huge request writes
// an audit line of bounded size, with the request's length.
func TestAuditLineBounded(t *testing.T) {
	t.Parallel()
	f := setup(t, auth.Options{})
	huge := strings.Repeat("n", 1<<20)
	req := &triagev1.PutNamespaceRequest{Namespace: huge}
	for _, token := range []string{f.reader, ""} { // refused by role, refused unauthenticated
		f.log.Reset()
		err := f.call(token, triagev1.Admin_PutNamespace_FullMethodName, req)
		require.Contains(t, []codes.Code{codes.PermissionDenied, codes.Unauthenticated}, status.Code(err), "%v", err)
		line := f.log.String()
		require.Contains(t, line, `"msg":"audit"`)
		require.Less(t, len(line), 2*auth.MaxAuditText+1024, "audit line of %d bytes", len(line))
		require.Contains(t, line, fmt.Sprintf("truncated: %d bytes", len(`{"namespace":""}`)+len(huge)))
	}
}

// payloadCounter counts the request messages a gRPC server read.
type payloadCounter struct{ in atomic.Int32 }

func (c *payloadCounter) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }
func (c *payloadCounter) HandleRPC(_ context.Context, s stats.RPCStats) {
	if _, ok := s.(*stats.InPayload); ok {
		c.in.Add(1)
	}
}
func (c *payloadCounter) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context {
	return ctx
}
func (c *payloadCounter) HandleConn(context.Context, stats.ConnStats) {}

// TestTapRefusesBeforeReadingTheMessage: over gRPC, a call without a
// valid key is refused when its headers arrive, before its message (here
// 8 MiB) is read, and a refused admin call is audited; a known caller's
// message is read and then authorized. Public methods need no key.
func TestTapRefusesBeforeReadingTheMessage(t *testing.T) {
	t.Parallel()
	f := setup(t, auth.Options{})
	counter := &payloadCounter{}
	s := grpc.NewServer(append(f.a.ServerOptions(), grpc.StatsHandler(counter), grpc.MaxRecvMsgSize(64<<20))...)
	triagev1.RegisterQueueServer(s, triagev1.UnimplementedQueueServer{})
	triagev1.RegisterAdminServer(s, triagev1.UnimplementedAdminServer{})
	healthpb.RegisterHealthServer(s, health.NewServer())
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = s.Serve(l) }()
	t.Cleanup(s.Stop)
	conn, err := grpc.NewClient(l.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })

	big := &triagev1.EnqueueRequest{Namespace: "n", Topic: "t", Items: []*triagev1.NewItem{{Payload: make([]byte, 8<<20)}}}
	call := func(token string, f func(ctx context.Context) error) error {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if token != "" {
			ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
		}
		return f(ctx)
	}
	enqueue := func(ctx context.Context) error { _, err := triagev1.NewQueueClient(conn).Enqueue(ctx, big); return err }
	for _, token := range []string{"", auth.TokenPrefix + strings.Repeat("A", 43)} {
		err := call(token, enqueue)
		require.Equal(t, codes.Unauthenticated, status.Code(err), "%v", err)
		require.Zero(t, counter.in.Load(), "the message was read before the caller was known")
	}
	require.Empty(t, f.log.String(), "data-plane refusals are not audited")

	err = call("", func(ctx context.Context) error {
		_, err := triagev1.NewAdminClient(conn).PutNamespace(ctx, &triagev1.PutNamespaceRequest{Namespace: "n"})
		return err
	})
	require.Equal(t, codes.Unauthenticated, status.Code(err), "%v", err)
	require.Zero(t, counter.in.Load())
	for _, want := range []string{`"msg":"audit"`, `"who":"(unauthenticated)"`, `"what":"/triage.v1.Admin/PutNamespace"`, `"request":"(not read: unauthenticated)"`} {
		require.Contains(t, f.log.String(), want)
	}

	_, err = healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{})
	require.NoError(t, err, "health is public")
	in := counter.in.Load()
	err = call(f.reader, enqueue) // a reader of n, not a producer
	require.Equal(t, codes.PermissionDenied, status.Code(err), "%v", err)
	require.Equal(t, in+1, counter.in.Load(), "a known caller's message is read, then authorized")
}

// TestAuthenticateHTTP: the gateway's check before reading a body knows
// the callers the guards know, by key or verified client certificate,
// and everyone when authentication is off.
func TestAuthenticateHTTP(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "keys.json")
	ca := authtest.NewCA(t, "ca")
	tokens := authtest.Keys(t, path, auth.Key{Name: "p", Namespaces: map[string][]auth.Role{"n": {auth.Producer}}},
		auth.Key{Name: "edge", ClientCerts: []string{"edge.test"}, Namespaces: map[string][]auth.Role{"n": {auth.Producer}}})
	keys, err := auth.LoadKeys(path, nil)
	require.NoError(t, err)
	a := auth.New(keys, auth.Options{})
	leaf := func(cn string) *tls.ConnectionState {
		c, err := x509.ParseCertificate(ca.ClientCert(t, cn).Certificate[0])
		require.NoError(t, err)
		return &tls.ConnectionState{VerifiedChains: [][]*x509.Certificate{{c}}}
	}
	for _, c := range []struct {
		name    string
		headers []string
		tls     *tls.ConnectionState
		ok      bool
	}{
		{"key", []string{"Bearer " + tokens["p"]}, nil, true},
		{"no credentials", nil, nil, false},
		{"unknown key", []string{"Bearer " + auth.TokenPrefix + strings.Repeat("A", 43)}, nil, false},
		{"not bearer", []string{"Basic dXNlcjpwYXNz"}, nil, false},
		{"two keys", []string{"Bearer " + tokens["p"], "Bearer " + tokens["p"]}, nil, false},
		{"certificate", nil, leaf("edge.test"), true},
		{"certificate of nobody", nil, leaf("stranger.test"), false},
		{"unverified certificate", nil, &tls.ConnectionState{PeerCertificates: leaf("edge.test").VerifiedChains[0]}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodPost, "/v1/namespaces/n/topics/t/items", nil)
			for _, h := range c.headers {
				r.Header.Add("Authorization", h)
			}
			r.TLS = c.tls
			err := a.AuthenticateHTTP(r)
			if c.ok {
				require.NoError(t, err)
				return
			}
			require.Equal(t, codes.Unauthenticated, status.Code(err), "%v", err)
			require.NoError(t, auth.New(nil, auth.Options{}).AuthenticateHTTP(r), "authentication off")
		})
	}
}
