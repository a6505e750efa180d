package e2e

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
	"github.com/triage-queue/triage/shardmap"
)

// nsBed is a secure node whose namespace "default" has the quotas a
// cluster-admin set, with helpers to call PutNamespace as a key over gRPC
// and the JSON gateway.
type nsBed struct {
	*secureBed
	admin triagev1.AdminClient
	hc    *http.Client
}

func setupNamespaceRoles(t *testing.T, quotas *triagev1.Namespace) *nsBed {
	s := setupSecure(t)
	b := &nsBed{secureBed: s, admin: s.admin(s.conn(t, s.node.GRPCAddr, s.client)),
		hc: &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: s.client}}}
	_, err := b.admin.PutNamespace(b.as("ops"), &triagev1.PutNamespaceRequest{Namespace: "default", Config: quotas})
	require.NoError(t, err)
	b.waitFor(t, func(ns *shardmap.Namespace) bool { return ns.MaxDepth == quotas.MaxDepth })
	return b
}

// as is a context carrying key's token.
func (b *nsBed) as(key string) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	b.t.Cleanup(cancel)
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+b.tokens[key])
}

// http sends body to /v1/namespaces/default with method as key and
// returns the status and the answer.
func (b *nsBed) http(t *testing.T, method, key, body string) (int, string) {
	req, err := http.NewRequest(method, "https://"+b.node.HTTPAddr+"/v1/namespaces/default", strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+b.tokens[key])
	req.Header.Set("Content-Type", "application/json")
	resp, err := b.hc.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(data)
}

// waitFor waits until the node's shard map holds a namespace "default"
// for which ok is true, and returns it. Changes reach the node through the
// NATS KV watch, so one that published is not visible at once.
func (b *nsBed) waitFor(t *testing.T, ok func(*shardmap.Namespace) bool) *shardmap.Namespace {
	t.Helper()
	var ns *shardmap.Namespace
	require.Eventually(t, func() bool {
		var err error
		ns, err = b.node.ShardMap().Namespace("default")
		return err == nil && ok(ns)
	}, 10*time.Second, 10*time.Millisecond)
	return ns
}

// TestNamespaceAdminCannotChangeQuotasOrShards is the reported case: a key
// holding only admin on "default" sent PUT {} and reset the quotas a
// cluster-admin set. Now that request, and any other of a namespace admin
// that would change a quota or the shards, is PERMISSION_DENIED (403)
// naming the fields, and changes nothing; changing the namespace's
// behaviour still works and leaves the quotas as they are.
func TestNamespaceAdminCannotChangeQuotasOrShards(t *testing.T) {
	t.Parallel()
	b := setupNamespaceRoles(t, &triagev1.Namespace{MaxDepth: 1000, EnqueueRateLimit: 50})

	code, body := b.http(t, http.MethodPut, "admin", `{}`)
	require.Equal(t, http.StatusForbidden, code, body)
	for _, field := range []string{"max_depth (1000 → 0)", "enqueue_rate_limit (50 → 0)", "enqueue_burst (50 → 0)", "nothing was changed"} {
		require.Contains(t, body, field)
	}

	for _, c := range []struct {
		name   string
		key    string
		req    *triagev1.PutNamespaceRequest
		fields []string
	}{
		{"replace with nothing", "admin", &triagev1.PutNamespaceRequest{Namespace: "default", Config: &triagev1.Namespace{MaxAttempts: 3}},
			[]string{"max_depth (1000 → 0)", "enqueue_rate_limit (50 → 0)", "enqueue_burst (50 → 0)"}},
		{"an admin of every namespace", "admin-all", &triagev1.PutNamespaceRequest{Namespace: "default"},
			[]string{"max_depth (1000 → 0)"}},
		{"shards", "admin", &triagev1.PutNamespaceRequest{Namespace: "default", Config: &triagev1.Namespace{MaxDepth: 1000, EnqueueRateLimit: 50, MaxAttempts: 3,
			Shards: []*triagev1.NamespaceShards{{Region: "us-east", Shards: []uint32{1}}}}},
			[]string{"shards in us-east (1, 2 → 1)"}},
		{"a masked quota", "admin", &triagev1.PutNamespaceRequest{Namespace: "default", Config: &triagev1.Namespace{MaxPayloadBytes: 1 << 20, MaxAttempts: 3},
			UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"max_payload_bytes", "max_attempts"}}},
			[]string{"max_payload_bytes (262144 → 1048576)"}},
	} {
		_, err := b.admin.PutNamespace(b.as(c.key), c.req)
		require.Equal(t, codes.PermissionDenied, status.Code(err), "%s: %v", c.name, err)
		for _, f := range c.fields {
			require.Contains(t, status.Convert(err).Message(), f, c.name)
		}
	}
	code, body = b.http(t, http.MethodPatch, "admin", `{"max_depth": 0, "max_attempts": 3}`)
	require.Equal(t, http.StatusForbidden, code, body)
	require.Contains(t, body, "max_depth (1000 → 0)")
	require.NotContains(t, body, "enqueue_rate_limit (", "PATCH leaves the fields its body does not name alone")

	// The namespace's behaviour is its admin's to change, and the quotas
	// and shards stay. Once this change is visible every earlier one
	// would be (the map is one sequence of versions), so none of the
	// refused requests (all of which set max_attempts 3) went through.
	code, body = b.http(t, http.MethodPatch, "admin", `{"max_attempts": 4, "default_lease_duration": "45s"}`)
	require.Equal(t, http.StatusOK, code, body)
	b.waitFor(t, func(ns *shardmap.Namespace) bool { return ns.MaxAttempts == 4 })
	got, err := b.admin.GetNamespace(b.as("admin"), &triagev1.GetNamespaceRequest{Namespace: "default"})
	require.NoError(t, err)
	require.Equal(t, int64(1000), got.MaxDepth)
	require.Equal(t, 50.0, got.EnqueueRateLimit)
	require.Equal(t, int32(50), got.EnqueueBurst)
	require.Equal(t, int32(shardmap.DefaultMaxPayloadBytes), got.MaxPayloadBytes)
	require.Equal(t, 45*time.Second, got.DefaultLeaseDuration.AsDuration())
	require.Equal(t, []uint32{1, 2}, got.Shards[0].Shards)

	// A replace whose quotas and shards are what is stored passes: the
	// admin writes back what GetNamespace showed, with one change. The
	// region still uses all its shards (no list of its own).
	got.MaxAttempts = 6
	_, err = b.admin.PutNamespace(b.as("admin"), &triagev1.PutNamespaceRequest{Namespace: "default", Config: got})
	require.NoError(t, err)
	ns := b.waitFor(t, func(ns *shardmap.Namespace) bool { return ns.MaxAttempts == 6 })
	require.Empty(t, ns.Shards)
	require.Equal(t, int64(1000), ns.MaxDepth)

	// cluster-admin still sets quotas, by PUT or PATCH.
	code, body = b.http(t, http.MethodPatch, "ops", `{"max_depth": 0, "enqueue_rate_limit": 80, "enqueue_burst": 160}`)
	require.Equal(t, http.StatusOK, code, body)
	ns = b.waitFor(t, func(ns *shardmap.Namespace) bool { return ns.EnqueueRateLimit == 80 })
	require.Equal(t, []int64{0, 160, 6}, []int64{ns.MaxDepth, int64(ns.EnqueueBurst), int64(ns.MaxAttempts)})
	_, err = b.admin.PutNamespace(b.as("ops"), &triagev1.PutNamespaceRequest{Namespace: "default", Config: &triagev1.Namespace{MaxDepth: 7}})
	require.NoError(t, err)
	ns = b.waitFor(t, func(ns *shardmap.Namespace) bool { return ns.MaxDepth == 7 })
	require.Zero(t, ns.EnqueueRateLimit, "PUT replaces: what it leaves out takes its default")
}

// TestNamespacePatchChangesOnlyMaskedFields: PATCH through the gateway
// fills update_mask from the body's fields, so only those change; a
// gRPC update_mask does the same, and "topics.NAME" changes one topic.
func TestNamespacePatchChangesOnlyMaskedFields(t *testing.T) {
	t.Parallel()
	full := &triagev1.Namespace{MaxDepth: 1000, EnqueueRateLimit: 50, MaxAttempts: 5,
		DefaultLeaseDuration: durationpb.New(45 * time.Second), DefaultTtl: durationpb.New(time.Hour), DedupWindow: durationpb.New(10 * time.Minute),
		Topics: map[string]*triagev1.TopicConfig{"a": {Policy: triagev1.DequeuePolicy_WEIGHTED}}}
	b := setupNamespaceRoles(t, full)
	before, err := b.admin.GetNamespace(b.as("admin"), &triagev1.GetNamespaceRequest{Namespace: "default"})
	require.NoError(t, err)

	code, body := b.http(t, http.MethodPatch, "admin", `{"max_attempts": 8, "default_ttl": "120s"}`)
	require.Equal(t, http.StatusOK, code, body)
	answer := &triagev1.Namespace{}
	require.NoError(t, protojson.Unmarshal([]byte(body), answer))
	want := proto.CloneOf(before)
	want.MaxAttempts, want.DefaultTtl = 8, durationpb.New(2*time.Minute)
	require.True(t, proto.Equal(want, answer), "PATCH answers the whole namespace with the two fields changed:\nwant %v\ngot  %v", want, answer)
	b.waitFor(t, func(ns *shardmap.Namespace) bool { return ns.MaxAttempts == 8 })
	got, err := b.admin.GetNamespace(b.as("admin"), &triagev1.GetNamespaceRequest{Namespace: "default"})
	require.NoError(t, err)
	require.True(t, proto.Equal(want, got), "want %v\ngot  %v", want, got)

	// PATCH {} names no field: it changes nothing (a replace would reset
	// the quotas and be refused).
	code, body = b.http(t, http.MethodPatch, "admin", `{}`)
	require.Equal(t, http.StatusOK, code, body)
	answer = &triagev1.Namespace{}
	require.NoError(t, protojson.Unmarshal([]byte(body), answer))
	require.True(t, proto.Equal(want, answer), "want %v\ngot  %v", want, answer)

	// A quota named at its current value changes nothing, so the
	// namespace admin may send it.
	code, body = b.http(t, http.MethodPatch, "admin", `{"max_depth": 1000, "max_attempts": 9}`)
	require.Equal(t, http.StatusOK, code, body)

	// One topic by its own path; the other stays.
	_, err = b.admin.PutNamespace(b.as("admin"), &triagev1.PutNamespaceRequest{Namespace: "default",
		Config:     &triagev1.Namespace{Topics: map[string]*triagev1.TopicConfig{"b": {AtMostOnce: true}}},
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"topics.b"}}})
	require.NoError(t, err)
	ns := b.waitFor(t, func(ns *shardmap.Namespace) bool { return len(ns.Topics) == 2 })
	require.Equal(t, shardmap.PolicyWeighted, ns.Topics["a"].Policy)
	require.True(t, ns.Topics["b"].AtMostOnce)
	require.Equal(t, 9, ns.MaxAttempts)
	require.Equal(t, []int64{1000, 50, 50}, []int64{ns.MaxDepth, int64(ns.EnqueueRateLimit), int64(ns.EnqueueBurst)})
	require.Equal(t, shardmap.Duration(45*time.Second), ns.DefaultLeaseDuration)

	// A mask naming something Namespace does not have is refused.
	_, err = b.admin.PutNamespace(b.as("admin"), &triagev1.PutNamespaceRequest{Namespace: "default",
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"max_deep"}}})
	require.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
	code, body = b.http(t, http.MethodPatch, "admin", `{"max_deep": 1}`)
	require.Equal(t, http.StatusBadRequest, code, body)
}
