package main

import (
	"bytes"
	"net"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/triage-queue/triage/cmd/internal/cli"
	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
	"github.com/triage-queue/triage/routing/auth"
	"github.com/triage-queue/triage/routing/auth/authtest"
)

// TestClientSendsTriageToken: the client verbs authenticate with
// TRIAGE_TOKEN against a router enforcing keys (routing/auth's real
// interceptor in front of the fake router), and fail clearly without it.
func TestClientSendsTriageToken(t *testing.T) {
	k := auth.Key{Name: "reader", Namespaces: map[string][]auth.Role{"default": {auth.Reader}}}
	tok := authtest.Token(t, &k)
	path := filepath.Join(t.TempDir(), "keys.json")
	authtest.KeysFile(t, path, k)
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

	run := func() (int, string) {
		var stdout, stderr bytes.Buffer
		code := cli.Run(t.Context(), newRoot(), []string{"topics", "--addr", lis.Addr().String()}, strings.NewReader(""), &stdout, &stderr)
		return code, stderr.String()
	}
	t.Setenv("TRIAGE_TOKEN", "")
	code, stderr := run()
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "Unauthenticated")
	require.Contains(t, stderr, "TRIAGE_TOKEN")

	t.Setenv("TRIAGE_TOKEN", tok)
	code, stderr = run()
	require.Equal(t, 0, code, stderr)
	require.NotEmpty(t, fake.got("ListTopics"))
}
