package e2e

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/api/annotations"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/triage-queue/triage/cmd/triage/node"
	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
	"github.com/triage-queue/triage/routing/auth"
	"github.com/triage-queue/triage/routing/auth/authtest"
)

// secureBed is a node with a keys file, TLS (client certificates
// verified when given) and the admin listeners, and one key per
// (namespace, role) to call it with.
type secureBed struct {
	*bed
	node   *node.Node
	tokens map[string]string // key name → key
	ca     *authtest.CA
	client *tls.Config
}

func setupSecure(t *testing.T) *secureBed {
	b := setup(t, bedOpts{noNode: true})
	dir := t.TempDir()
	ca := authtest.NewCA(t, "triage test CA")
	keys := []auth.Key{
		{Name: "producer", Namespaces: map[string][]auth.Role{"default": {auth.Producer}}},
		{Name: "consumer", Namespaces: map[string][]auth.Role{"default": {auth.Consumer}}},
		{Name: "reader", Namespaces: map[string][]auth.Role{"default": {auth.Reader}}},
		{Name: "admin", Namespaces: map[string][]auth.Role{"default": {auth.Admin}}},
		{Name: "admin-all", Namespaces: map[string][]auth.Role{"*": {auth.Admin}}},
		// every namespace role, on the other namespace only
		{Name: "other", Namespaces: map[string][]auth.Role{"other": {auth.Producer, auth.Consumer, auth.Reader, auth.Admin}}},
		{Name: "ops", ClusterAdmin: true},
		{Name: "limited", Namespaces: map[string][]auth.Role{"default": {auth.Reader}}, RateLimit: 0.01, Burst: 2},
		{Name: "cert-reader", ClientCerts: []string{"reader.client.test"}, Namespaces: map[string][]auth.Role{"default": {auth.Reader}}},
	}
	keysFile := filepath.Join(dir, "keys.json")
	s := &secureBed{bed: b, tokens: authtest.Keys(t, keysFile, keys...), ca: ca}
	tlsFiles := ca.ServerFiles(t, dir, auth.ClientAuthVerifyIfGiven)
	s.node = b.startNode(node.Config{KeysFile: keysFile, TLS: &tlsFiles, AdminGRPC: "127.0.0.1:0", AdminHTTP: "127.0.0.1:0"})
	s.client = &tls.Config{RootCAs: ca.Pool(), MinVersion: tls.VersionTLS12}
	return s
}

// conn dials addr over TLS with tc.
func (s *secureBed) conn(t *testing.T, addr string, tc *tls.Config) *grpc.ClientConn {
	c, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(tc)))
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c
}

// rpcCase is one RPC with a request that passes authorization's view of
// it: namespace "default", shard 999 (none), the rest empty or invalid on
// purpose, so that the right role gets an answer from the router itself.
type rpcCase struct {
	method string // full gRPC name
	role   auth.Role
	in     protoreflect.MessageType
	out    protoreflect.MessageType
	rule   *annotations.HttpRule
}

func (c rpcCase) request(ns string) proto.Message {
	m := c.in.New()
	fields := m.Descriptor().Fields()
	if f := fields.ByName("namespace"); f != nil {
		m.Set(f, protoreflect.ValueOfString(ns))
	}
	if f := fields.ByName("shard"); f != nil && f.Kind() == protoreflect.Uint32Kind {
		m.Set(f, protoreflect.ValueOfUint32(999))
	}
	if f := fields.ByName("config"); f != nil {
		// a body whose name differs from the URL's: refused as invalid,
		// so the table never rewrites the namespace
		cfg := m.Mutable(f).Message()
		cfg.Set(cfg.Descriptor().Fields().ByName("name"), protoreflect.ValueOfString("not-"+ns))
	}
	return m.Interface()
}

// httpRequest is the gateway route of c with the same request.
func (c rpcCase) httpRequest(ns string) (method, path, body string) {
	r := c.rule
	switch p := r.Pattern.(type) {
	case *annotations.HttpRule_Get:
		method, path = http.MethodGet, p.Get
	case *annotations.HttpRule_Post:
		method, path = http.MethodPost, p.Post
	case *annotations.HttpRule_Put:
		method, path = http.MethodPut, p.Put
	case *annotations.HttpRule_Patch:
		method, path = http.MethodPatch, p.Patch
	case *annotations.HttpRule_Delete:
		method, path = http.MethodDelete, p.Delete
	}
	path = strings.NewReplacer("{namespace}", ns, "{shard}", "999", "{topic}", "t", "{id}", "x").Replace(path)
	switch r.Body {
	case "":
	case "config":
		body = fmt.Sprintf(`{"name":"not-%s"}`, ns)
	default:
		body = "{}"
	}
	return method, path, body
}

// rpcCases lists every method of the services the gRPC listener conn
// reaches serves, as its reflection service names them, with the role
// the table gives it; a method missing from the table fails t.
func rpcCases(t *testing.T, conn *grpc.ClientConn) []rpcCase {
	var out []rpcCase
	for _, svc := range listServices(t, conn) {
		d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(svc))
		require.NoError(t, err)
		methods := d.(protoreflect.ServiceDescriptor).Methods()
		for i := range methods.Len() {
			md := methods.Get(i)
			full := "/" + svc + "/" + string(md.Name())
			role, ok := auth.MethodRole(full)
			require.True(t, ok, "%s has no entry in routing/auth's methodRoles", full)
			if role == "" || !strings.HasPrefix(svc, "triage.") {
				continue // public: health, reflection
			}
			in, err := protoregistry.GlobalTypes.FindMessageByName(md.Input().FullName())
			require.NoError(t, err)
			outT, err := protoregistry.GlobalTypes.FindMessageByName(md.Output().FullName())
			require.NoError(t, err)
			rule, _ := proto.GetExtension(md.Options(), annotations.E_Http).(*annotations.HttpRule)
			require.NotNil(t, rule, "%s has no HTTP route", full)
			require.Equal(t, specRoles[string(md.Name())], role, "%s: role in routing/auth's table", full)
			out = append(out, rpcCase{method: full, role: role, in: in, out: outT, rule: rule})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].method < out[j].method })
	return out
}

// listServices asks the server behind conn for the services it serves
// (gRPC server reflection, which it answers without credentials).
func listServices(t *testing.T, conn *grpc.ClientConn) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(ctx)
	require.NoError(t, err)
	require.NoError(t, stream.Send(&reflectionpb.ServerReflectionRequest{
		MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}))
	resp, err := stream.Recv()
	require.NoError(t, err)
	require.NoError(t, stream.CloseSend())
	list := resp.GetListServicesResponse()
	require.NotNil(t, list, "%v", resp)
	var names []string
	for _, s := range list.Service {
		names = append(names, s.Name)
	}
	return names
}

// specRoles is the table of roles, written out again so that a
// change to routing/auth's table must be made twice, on purpose.
var specRoles = map[string]auth.Role{
	"Enqueue": auth.Producer, "UpdateItem": auth.Producer, "DeleteItem": auth.Producer,
	"Dequeue": auth.Consumer, "Ack": auth.Consumer, "Nack": auth.Consumer, "ExtendLease": auth.Consumer,
	"GetItem": auth.Reader, "GetTopicStats": auth.Reader, "ListTopics": auth.Reader, "ListDeadLetters": auth.Reader,
	"ListItems": auth.Reader, "GetThroughput": auth.Reader,
	"RedriveDeadLetters": auth.Admin, "DeleteDeadLetters": auth.Admin, "GetNamespace": auth.Admin, "PutNamespace": auth.Admin,
	"PauseTopic": auth.Admin, "ResumeTopic": auth.Admin,
	"GetShardMap": auth.ClusterAdmin, "Failover": auth.ClusterAdmin, "AddShard": auth.ClusterAdmin,
	"AddNamespaceShard": auth.ClusterAdmin, "SetShardWeight": auth.ClusterAdmin, "DrainShard": auth.ClusterAdmin,
	"RetireShard": auth.ClusterAdmin, "ListFailoverEvents": auth.ClusterAdmin,
	"ReportDrill": auth.ClusterAdmin, "ListDrills": auth.ClusterAdmin,
}

// keyWithout returns a key on "default" that lacks role.
func keyWithout(role auth.Role) string {
	if role == auth.Producer {
		return "reader"
	}
	return "producer"
}

// TestAuthTable is the done-when table of routing/auth: every RPC × {no
// credentials, wrong namespace, wrong role, right role} over gRPC and the
// JSON gateway, each on the listener that serves it (cluster-admin RPCs
// on the admin listeners).
func TestAuthTable(t *testing.T) {
	t.Parallel()
	s := setupSecure(t)
	pub := s.conn(t, s.node.GRPCAddr, s.client)
	adm := s.conn(t, s.node.AdminGRPCAddr, s.client)
	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: s.client}}

	cases := rpcCases(t, pub)
	adminCases := rpcCases(t, adm)
	require.Len(t, cases, 29, "Queue (15) and Admin (14) RPCs on the public listener")
	require.Len(t, adminCases, 14)

	type cred struct{ name, key string }
	for _, c := range cases {
		grpcConn, httpAddr := pub, s.node.HTTPAddr
		if c.role == auth.ClusterAdmin {
			grpcConn, httpAddr = adm, s.node.AdminHTTPAddr
		}
		right, wrongNS := string(c.role), "other"
		if c.role == auth.ClusterAdmin {
			right, wrongNS = "ops", "admin" // cluster RPCs have no namespace: a namespace admin is the near miss
		}
		rows := []struct {
			name string
			cred cred
			want codes.Code // codes.OK: any answer but the auth refusals
		}{
			{"no credentials", cred{}, codes.Unauthenticated},
			{"bad key", cred{"forged", auth.TokenPrefix + strings.Repeat("A", 43)}, codes.Unauthenticated},
			{"wrong namespace", cred{wrongNS, s.tokens[wrongNS]}, codes.PermissionDenied},
			{"wrong role", cred{keyWithout(c.role), s.tokens[keyWithout(c.role)]}, codes.PermissionDenied},
			{"right role", cred{right, s.tokens[right]}, codes.OK},
		}
		for _, row := range rows {
			t.Run(c.method+"/grpc/"+row.name, func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				if row.cred.key != "" {
					ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+row.cred.key)
				}
				err := grpcConn.Invoke(ctx, c.method, c.request("default"), c.out.New().Interface())
				checkAuthCode(t, row.want, status.Code(err), err)
			})
			t.Run(c.method+"/http/"+row.name, func(t *testing.T) {
				method, path, body := c.httpRequest("default")
				req, err := http.NewRequest(method, "https://"+httpAddr+path, strings.NewReader(body))
				require.NoError(t, err)
				if body != "" {
					req.Header.Set("Content-Type", "application/json")
				}
				if row.cred.key != "" {
					req.Header.Set("Authorization", "Bearer "+row.cred.key)
				}
				resp, err := hc.Do(req)
				require.NoError(t, err)
				data, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				var got codes.Code
				switch resp.StatusCode {
				case http.StatusUnauthorized:
					got = codes.Unauthenticated
				case http.StatusForbidden:
					got = codes.PermissionDenied
				case http.StatusNotImplemented:
					got = codes.Unimplemented
				}
				checkAuthCode(t, row.want, got, fmt.Errorf("%s %s: %d %s", method, path, resp.StatusCode, data))
			})
		}
	}

	// The listeners' split: cluster RPCs are not served publicly even to
	// cluster-admin, and the admin listener admits cluster-admin only.
	ctx := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+s.tokens["ops"])
	_, err := s.admin(pub).GetShardMap(ctx, nil)
	require.Equal(t, codes.PermissionDenied, status.Code(err), "%v", err)
	require.Contains(t, status.Convert(err).Message(), "admin listener only")
	ctx = metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+s.tokens["admin"])
	_, err = s.admin(adm).GetNamespace(ctx, nil)
	require.Equal(t, codes.PermissionDenied, status.Code(err), "%v", err)

	// PutNamespace of a namespace that does not exist creates it, which
	// only cluster-admin may, even for an admin of every namespace ("*");
	// once it exists, that admin may change it. Over gRPC and HTTP.
	put := func(key, ns string) codes.Code {
		ctx := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+s.tokens[key])
		_, err := s.admin(pub).PutNamespace(ctx, &triagev1.PutNamespaceRequest{Namespace: ns, Config: &triagev1.Namespace{MaxAttempts: 7}})
		return status.Code(err)
	}
	putHTTP := func(key, ns string) int {
		req, err := http.NewRequest(http.MethodPut, "https://"+s.node.HTTPAddr+"/v1/namespaces/"+ns, strings.NewReader(`{"max_attempts":7}`))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+s.tokens[key])
		resp, err := hc.Do(req)
		require.NoError(t, err)
		data, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		t.Logf("PUT %s as %s: %d %s", ns, key, resp.StatusCode, data)
		return resp.StatusCode
	}
	require.Equal(t, codes.PermissionDenied, put("admin-all", "brand-new"))
	require.Equal(t, http.StatusForbidden, putHTTP("admin-all", "brand-new-http"))
	require.Equal(t, codes.PermissionDenied, put("admin", "brand-new"), "no role there at all")
	require.Equal(t, codes.OK, put("admin-all", "default"), "an existing namespace: its admin may change it")
	require.Equal(t, http.StatusOK, putHTTP("admin", "default"))
	require.Equal(t, codes.OK, put("ops", "brand-new"))
	require.Equal(t, http.StatusOK, putHTTP("ops", "brand-new-http"))
	require.Eventually(t, func() bool {
		_, err := s.node.ShardMap().Namespace("brand-new")
		return err == nil
	}, 10*time.Second, 10*time.Millisecond)
	require.Equal(t, codes.OK, put("admin-all", "brand-new"), "it exists now")

	// A key's rate limit (burst 2, then one per 100 s) holds over gRPC and
	// HTTP together.
	stats := &triagev1.GetTopicStatsRequest{Namespace: "default", Topic: "t"}
	ctx = metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+s.tokens["limited"])
	for range 2 {
		_, err = triagev1.NewQueueClient(pub).GetTopicStats(ctx, stats)
		require.NoError(t, err)
	}
	_, err = triagev1.NewQueueClient(pub).GetTopicStats(ctx, stats)
	require.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
	req, err := http.NewRequest(http.MethodGet, "https://"+s.node.HTTPAddr+"/v1/namespaces/default/topics/t/stats", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+s.tokens["limited"])
	resp, err := hc.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusTooManyRequests, resp.StatusCode)

	// A client certificate from the CA authenticates as the identity that
	// lists its name, without a key; one that no entry lists does not.
	for _, c := range []struct {
		cn   string
		want codes.Code
	}{{"reader.client.test", codes.OK}, {"stranger.client.test", codes.Unauthenticated}} {
		tc := s.client.Clone()
		tc.Certificates = []tls.Certificate{s.ca.ClientCert(t, c.cn)}
		_, err = triagev1.NewQueueClient(s.conn(t, s.node.GRPCAddr, tc)).GetTopicStats(context.Background(), stats)
		require.Equal(t, c.want, status.Code(err), "%s: %v", c.cn, err)
		hcc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: tc}}
		resp, err := hcc.Get("https://" + s.node.HTTPAddr + "/v1/namespaces/default/topics/t/stats")
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, map[codes.Code]int{codes.OK: 200, codes.Unauthenticated: 401}[c.want], resp.StatusCode, c.cn)
	}
}

// checkAuthCode: want OK means "passed authentication and authorization",
// whatever the router then answered.
func checkAuthCode(t *testing.T, want, got codes.Code, err error) {
	t.Helper()
	if want != codes.OK {
		require.Equal(t, want, got, "%v", err)
		return
	}
	require.NotContains(t, []codes.Code{codes.Unauthenticated, codes.PermissionDenied, codes.Unimplemented}, got, "%v", err)
}

func (s *secureBed) admin(c *grpc.ClientConn) triagev1.AdminClient { return triagev1.NewAdminClient(c) }

// TestGatewayRefusesNonJSONBody: an authenticated enqueue whose
// Content-Type is not application/json (text/plain, a form: what a web
// page may send cross-site without a CORS preflight, with the browser's
// client certificate) is answered 415 and enqueues nothing; the same
// request as JSON is served.
func TestGatewayRefusesNonJSONBody(t *testing.T) {
	t.Parallel()
	s := setupSecure(t)
	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: s.client}}
	post := func(contentType string) (int, string) {
		req, err := http.NewRequest(http.MethodPost, "https://"+s.node.HTTPAddr+"/v1/namespaces/default/topics/plain/items",
			strings.NewReader(`{"items":[{"payload":"aGk="}]}`))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+s.tokens["producer"])
		if contentType != "" {
			req.Header.Set("Content-Type", contentType)
		}
		resp, err := hc.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		data, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(data)
	}
	for _, ct := range []string{"text/plain", "text/plain;charset=UTF-8", "application/x-www-form-urlencoded", ""} {
		code, body := post(ct)
		require.Equal(t, http.StatusUnsupportedMediaType, code, "%q: %s", ct, body)
		require.Contains(t, body, `"code":3`)
		require.Contains(t, body, "Content-Type: application/json")
	}
	require.Zero(t, s.rowCount("items"), "a refused request enqueued")
	code, body := post("application/json; charset=utf-8")
	require.Equal(t, http.StatusOK, code, body)
	require.Equal(t, 1, s.rowCount("items"))
}

// stalledBody sends head, then nothing for 8 s, then fails: a server
// that waits for the rest of it answers nothing in that time.
type stalledBody struct {
	head []byte
	stop chan struct{}
	once sync.Once
}

func newStalledBody(head []byte) *stalledBody {
	return &stalledBody{head: head, stop: make(chan struct{})}
}

func (b *stalledBody) Read(p []byte) (int, error) {
	if len(b.head) > 0 {
		n := copy(p, b.head)
		b.head = b.head[n:]
		return n, nil
	}
	select {
	case <-b.stop:
	case <-time.After(8 * time.Second):
	}
	return 0, io.ErrUnexpectedEOF
}

func (b *stalledBody) Close() error {
	b.once.Do(func() { close(b.stop) })
	return nil
}

// TestGatewayRefusesUnauthenticatedBodyUnread: a large request without a
// valid key is answered 401 from its headers, on the public and the
// admin listener, though its body never arrives (the client stalls after
// its first bytes); without a declared length, after at most 64 KiB.
func TestGatewayRefusesUnauthenticatedBodyUnread(t *testing.T) {
	t.Parallel()
	s := setupSecure(t)
	for _, c := range []struct {
		name, addr, path, key string
		length                int64
		head                  int
	}{
		{"no key", s.node.HTTPAddr, "/v1/namespaces/default/topics/t/items", "", 10 << 20, 1 << 10},
		{"unknown key", s.node.HTTPAddr, "/v1/namespaces/default/topics/t/items", auth.TokenPrefix + strings.Repeat("A", 43), 10 << 20, 1 << 10},
		{"no length", s.node.HTTPAddr, "/v1/namespaces/default/topics/t/items", "", -1, 1 << 20},
		{"admin listener", s.node.AdminHTTPAddr, "/v1/shards", "", 10 << 20, 1 << 10},
	} {
		t.Run(c.name, func(t *testing.T) {
			hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: s.client}}
			req, err := http.NewRequest(http.MethodPost, "https://"+c.addr+c.path,
				newStalledBody([]byte(`{"items":[{"payload":"`+strings.Repeat("A", c.head))))
			require.NoError(t, err)
			req.ContentLength = c.length
			req.Header.Set("Content-Type", "application/json")
			if c.key != "" {
				req.Header.Set("Authorization", "Bearer "+c.key)
			}
			start := time.Now()
			resp, err := hc.Do(req)
			require.NoError(t, err, "no answer: the server waited for the body")
			data, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			require.Equal(t, http.StatusUnauthorized, resp.StatusCode, "%s", data)
			require.Contains(t, string(data), `"code":16`)
			require.Less(t, time.Since(start), 5*time.Second)
		})
	}
}
