package main

import (
	"bytes"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/triage-queue/triage/cmd/internal/cli"
	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
	"github.com/triage-queue/triage/routing/auth"
)

// runKeyCreate runs `triage key create` with args and returns its exit
// status and streams.
func runKeyCreate(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = cli.Run(t.Context(), newRoot(), append([]string{"key", "create"}, args...), strings.NewReader(""), &out, &errOut)
	return code, out.String(), errOut.String()
}

// createdKey runs `triage key create` with args, which must succeed, and
// returns the two lines of its stdout: the key and the keys file entry.
func createdKey(t *testing.T, args ...string) (token, entry string) {
	t.Helper()
	code, stdout, stderr := runKeyCreate(t, args...)
	require.Equal(t, 0, code, stderr)
	lines := strings.Split(strings.TrimSuffix(stdout, "\n"), "\n")
	require.Len(t, lines, 2, "stdout: the key, then the entry: %q", stdout)
	require.NotContains(t, stderr, lines[0], "the key is printed once, to stdout")
	require.NotContains(t, lines[1], lines[0], "the entry holds the key's hash, not the key")
	return lines[0], lines[1]
}

// TestKeyCreate: the entry `triage key create` prints loads with
// routing/auth's keys file loader, and the key printed with it
// authenticates against a router enforcing that file, with the roles the
// flags granted and no others.
func TestKeyCreate(t *testing.T) {
	token, entry := createdKey(t, "orders-api", "-n", "orders", "--role", "reader,producer", "-r", "reader", "--rate-limit", "50", "--burst", "100")
	_, err := auth.ParseToken(token)
	require.NoError(t, err)

	dec := json.NewDecoder(strings.NewReader(entry))
	dec.DisallowUnknownFields()
	var k auth.Key
	require.NoError(t, dec.Decode(&k))
	require.Equal(t, auth.Key{
		Name: "orders-api", SHA256: auth.HashToken(token),
		Namespaces: map[string][]auth.Role{"orders": {auth.Reader, auth.Producer}},
		RateLimit:  50, Burst: 100,
	}, k)

	path := filepath.Join(t.TempDir(), "keys.json")
	require.NoError(t, os.WriteFile(path, []byte(`{"keys": [`+entry+`]}`), 0o600))
	keys, err := auth.LoadKeys(path, nil)
	require.NoError(t, err)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	fake := &fakeRouter{reqs: map[string][]proto.Message{}, resps: map[string]proto.Message{}, errs: map[string]error{}}
	fake.set("ListTopics", &triagev1.ListTopicsResponse{})
	srv := grpc.NewServer(auth.New(keys, auth.Options{}).ServerOptions()...)
	triagev1.RegisterQueueServer(srv, fake)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)

	topics := func(ns string) (int, string) {
		var stdout, stderr bytes.Buffer
		code := cli.Run(t.Context(), newRoot(), []string{"topics", "--addr", lis.Addr().String(), "-n", ns}, strings.NewReader(""), &stdout, &stderr)
		return code, stderr.String()
	}
	t.Setenv("TRIAGE_TOKEN", token)
	code, stderr := topics("orders")
	require.Equal(t, 0, code, stderr)
	require.NotEmpty(t, fake.got("ListTopics"))
	code, stderr = topics("billing")
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "PermissionDenied")

	other, _ := createdKey(t, "orders-api", "-n", "orders", "-r", "reader")
	require.NotEqual(t, token, other, "every key is new")
	t.Setenv("TRIAGE_TOKEN", other)
	code, stderr = topics("orders")
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "Unauthenticated", "a key not in the file")
}

// TestKeyCreateClusterAdmin: --cluster-admin makes an entry with
// cluster_admin and no namespaces, which the keys file parser accepts.
func TestKeyCreateClusterAdmin(t *testing.T) {
	t.Parallel()
	token, entry := createdKey(t, "ops", "--cluster-admin")
	require.JSONEq(t, `{"name": "ops", "sha256": "`+auth.HashToken(token)+`", "cluster_admin": true}`, entry)
	_, err := auth.ParseKeys([]byte(`{"keys": [` + entry + `]}`))
	require.NoError(t, err)
}

// TestKeyCreateUsage: flags that would make a key granted nothing, or an
// entry the keys file refuses, are usage errors (status 2) that print no
// key.
func TestKeyCreateUsage(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "want NAME"},
		{[]string{"a", "b", "--cluster-admin"}, "want NAME"},
		{[]string{" ", "--cluster-admin"}, "NAME must not be empty"},
		{[]string{"x"}, "a key granted nothing"},
		{[]string{"x", "-r", "reader"}, "--role needs --namespace"},
		{[]string{"x", "-n", "orders"}, "--namespace needs --role"},
		{[]string{"x", "-n", "orders", "-r", "writer"}, `--role "writer"`},
		{[]string{"x", "-n", "orders", "-r", "cluster-admin"}, "give --cluster-admin"},
		{[]string{"x", "-n", "orders,", "-r", "reader"}, "empty --namespace"},
		{[]string{"x", "--cluster-admin", "--rate-limit", "-1"}, "--rate-limit must be"},
		{[]string{"x", "--cluster-admin", "--rate-limit", "NaN"}, "--rate-limit must be"},
		{[]string{"x", "--cluster-admin", "--rate-limit", "1", "--burst", "-1"}, "--burst must not be negative"},
		{[]string{"x", "--cluster-admin", "--burst", "5"}, "--burst needs --rate-limit"},
		{[]string{"x", "--cluster-admin", "--rate-limit", "fast"}, "invalid value"},
		{[]string{"x", "--cluster-admin", "--admin"}, "flag provided but not defined"},
	} {
		code, stdout, stderr := runKeyCreate(t, tc.args...)
		require.Equal(t, 2, code, "%q: %s", tc.args, stderr)
		require.Contains(t, stderr, tc.want, "%q", tc.args)
		require.Contains(t, stderr, "usage: triage key create", "%q", tc.args)
		require.Empty(t, stdout, "%q", tc.args)
	}
}
