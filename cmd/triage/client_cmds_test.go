package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/triage-queue/triage/cmd/internal/cli"
	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
)

// fakeRouter is a Queue and Admin server that records every request and
// answers with the canned response (or error) the test set for the method.
type fakeRouter struct {
	triagev1.UnimplementedQueueServer
	triagev1.UnimplementedAdminServer

	mu    sync.Mutex
	reqs  map[string][]proto.Message
	resps map[string]proto.Message
	errs  map[string]error
}

func (f *fakeRouter) set(method string, resp proto.Message) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.resps[method] = resp
}

func (f *fakeRouter) fail(method string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.errs[method] = err
}

func (f *fakeRouter) got(method string) []proto.Message {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]proto.Message(nil), f.reqs[method]...)
}

// answer records req and returns the canned response for method, or a
// zero R when the test set none.
func answer[R proto.Message](f *fakeRouter, method string, req proto.Message) (R, error) {
	return answerFor[R](f, method, method, req)
}

// answerFor is answer with the canned response and error looked up under
// key, so one method can have several (a page per token, say).
func answerFor[R proto.Message](f *fakeRouter, method, key string, req proto.Message) (R, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reqs[method] = append(f.reqs[method], req)
	var zero R
	if err := f.errs[key]; err != nil {
		return zero, err
	}
	if r, ok := f.resps[key]; ok {
		return r.(R), nil
	}
	return zero.ProtoReflect().New().Interface().(R), nil
}

func (f *fakeRouter) Enqueue(_ context.Context, r *triagev1.EnqueueRequest) (*triagev1.EnqueueResponse, error) {
	f.mu.Lock()
	_, canned := f.resps["Enqueue"]
	f.mu.Unlock()
	resp, err := answer[*triagev1.EnqueueResponse](f, "Enqueue", r)
	if err != nil || canned {
		return resp, err
	}
	// Without a canned response, one result per item with a made-up ID.
	n := len(f.got("Enqueue"))
	for i := range r.Items {
		resp.Results = append(resp.Results, &triagev1.EnqueueResult{Id: fmt.Sprintf("1-%016x", n*10000+i), Region: "eu"})
	}
	return resp, nil
}

func (f *fakeRouter) Dequeue(_ context.Context, r *triagev1.DequeueRequest) (*triagev1.DequeueResponse, error) {
	return answer[*triagev1.DequeueResponse](f, "Dequeue", r)
}

func (f *fakeRouter) Ack(_ context.Context, r *triagev1.AckRequest) (*triagev1.AckResponse, error) {
	return answer[*triagev1.AckResponse](f, "Ack", r)
}

func (f *fakeRouter) Nack(_ context.Context, r *triagev1.NackRequest) (*triagev1.NackResponse, error) {
	return answer[*triagev1.NackResponse](f, "Nack", r)
}

func (f *fakeRouter) ExtendLease(_ context.Context, r *triagev1.ExtendLeaseRequest) (*triagev1.ExtendLeaseResponse, error) {
	return answer[*triagev1.ExtendLeaseResponse](f, "ExtendLease", r)
}

func (f *fakeRouter) GetItem(_ context.Context, r *triagev1.GetItemRequest) (*triagev1.Item, error) {
	return answer[*triagev1.Item](f, "GetItem", r)
}

func (f *fakeRouter) UpdateItem(_ context.Context, r *triagev1.UpdateItemRequest) (*triagev1.Item, error) {
	return answer[*triagev1.Item](f, "UpdateItem", r)
}

func (f *fakeRouter) DeleteItem(_ context.Context, r *triagev1.DeleteItemRequest) (*triagev1.DeleteItemResponse, error) {
	return answer[*triagev1.DeleteItemResponse](f, "DeleteItem", r)
}

func (f *fakeRouter) GetTopicStats(_ context.Context, r *triagev1.GetTopicStatsRequest) (*triagev1.TopicStats, error) {
	return answer[*triagev1.TopicStats](f, "GetTopicStats", r)
}

func (f *fakeRouter) ListTopics(_ context.Context, r *triagev1.ListTopicsRequest) (*triagev1.ListTopicsResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reqs["ListTopics"] = append(f.reqs["ListTopics"], r)
	// Two pages, so the CLI must follow next_page_token.
	if r.PageToken == "" {
		return &triagev1.ListTopicsResponse{Topics: []*triagev1.TopicSummary{{Topic: "emails", Items: 12}}, NextPageToken: "p2"}, nil
	}
	return &triagev1.ListTopicsResponse{Topics: []*triagev1.TopicSummary{{Topic: "sms-outbound", Items: 3}, {Topic: "poison", DeadLetters: 2}}}, nil
}

func (f *fakeRouter) GetShardMap(_ context.Context, r *triagev1.GetShardMapRequest) (*triagev1.ShardMap, error) {
	return answer[*triagev1.ShardMap](f, "GetShardMap", r)
}

// ListDeadLetters answers a page token with the response set for
// "ListDeadLetters@TOKEN", and the first page with "ListDeadLetters".
func (f *fakeRouter) ListDeadLetters(_ context.Context, r *triagev1.ListDeadLettersRequest) (*triagev1.ListDeadLettersResponse, error) {
	key := "ListDeadLetters"
	if r.PageToken != "" {
		key += "@" + r.PageToken
	}
	return answerFor[*triagev1.ListDeadLettersResponse](f, "ListDeadLetters", key, r)
}

func (f *fakeRouter) RedriveDeadLetters(_ context.Context, r *triagev1.RedriveDeadLettersRequest) (*triagev1.RedriveDeadLettersResponse, error) {
	return answer[*triagev1.RedriveDeadLettersResponse](f, "RedriveDeadLetters", r)
}

func (f *fakeRouter) GetNamespace(_ context.Context, r *triagev1.GetNamespaceRequest) (*triagev1.Namespace, error) {
	return answer[*triagev1.Namespace](f, "GetNamespace", r)
}

// PutNamespace echoes the config it was sent, as a router does once the
// shard map holds it, unless the test canned a response.
func (f *fakeRouter) PutNamespace(_ context.Context, r *triagev1.PutNamespaceRequest) (*triagev1.Namespace, error) {
	f.mu.Lock()
	_, canned := f.resps["PutNamespace"]
	f.mu.Unlock()
	resp, err := answer[*triagev1.Namespace](f, "PutNamespace", r)
	if err != nil || canned {
		return resp, err
	}
	return proto.CloneOf(r.GetConfig()), nil
}

type bundle struct {
	fake *fakeRouter
	addr string
}

// setup starts a fake router on a loopback port.
func setup(t *testing.T) *bundle {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	fake := &fakeRouter{reqs: map[string][]proto.Message{}, resps: map[string]proto.Message{}, errs: map[string]error{}}
	srv := grpc.NewServer()
	triagev1.RegisterQueueServer(srv, fake)
	triagev1.RegisterAdminServer(srv, fake)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return &bundle{fake: fake, addr: lis.Addr().String()}
}

type result struct {
	code           int
	stdout, stderr string
}

// run runs a client verb against the fake router with stdin as given.
func (b *bundle) run(t *testing.T, stdin, verb string, args ...string) result {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := cli.Run(t.Context(), newRoot(), append([]string{verb, "--addr", b.addr}, args...), strings.NewReader(stdin), &stdout, &stderr)
	return result{code: code, stdout: stdout.String(), stderr: stderr.String()}
}

// lines splits output into lines with their runs of spaces collapsed, so
// assertions check the columns without pinning the padding.
func lines(s string) []string {
	var out []string
	for l := range strings.Lines(s) {
		out = append(out, strings.Join(strings.Fields(l), " "))
	}
	return out
}

func parseJSON[M proto.Message](t *testing.T, s string, m M) M {
	t.Helper()
	require.True(t, json.Valid([]byte(s)), "not one JSON document: %s", s)
	require.NoError(t, protojson.Unmarshal([]byte(s), m))
	return m
}

// TestUnknownVerb: a verb the binary does not know, and a sub-verb of a
// group given alone, are usage errors; a verb's -h is not.
func TestUnknownVerb(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{args: []string{"frobnicate"}, code: 2, want: `triage: unknown command "frobnicate"`},
		// "put" is a sub-verb of namespace, not a verb of its own.
		{args: []string{"put"}, code: 2, want: `triage: unknown command "put"`},
		{args: []string{"shardmap", "-h"}, code: 0, want: "usage: triage shardmap"},
	} {
		var stdout, stderr bytes.Buffer
		code := cli.Run(t.Context(), newRoot(), tc.args, strings.NewReader(""), &stdout, &stderr)
		require.Equal(t, tc.code, code, tc.args)
		require.Contains(t, stderr.String(), tc.want)
		require.Empty(t, stdout.String())
	}
}

func TestEnqueueArgs(t *testing.T) {
	t.Parallel()
	b := setup(t)
	before := time.Now()
	r := b.run(t, "", "enqueue", "-n", "shop", "--region", "us", "--priority", "3", "--delay", "1m",
		"--lease", "45s", "--ttl", "2h", "--dedup", "order-7", "--meta", "a=1", "--meta", "b=x=y",
		"--buffered", "emails", "hello", "wörld", "--", "-dash")
	require.Equal(t, 0, r.code, r.stderr)

	reqs := b.fake.got("Enqueue")
	require.Len(t, reqs, 1)
	req := reqs[0].(*triagev1.EnqueueRequest)
	require.Equal(t, "shop", req.Namespace)
	require.Equal(t, "emails", req.Topic)
	require.Equal(t, "us", req.Region)
	require.Equal(t, triagev1.Durability_BUFFERED, req.Durability)
	require.Len(t, req.Items, 3)
	for i, want := range []string{"hello", "wörld", "-dash"} {
		it := req.Items[i]
		require.Equal(t, want, string(it.Payload))
		require.EqualValues(t, 3, it.Priority)
		require.Equal(t, "order-7", it.DedupKey)
		require.Equal(t, map[string]string{"a": "1", "b": "x=y"}, it.Metadata)
		require.Equal(t, 45*time.Second, it.LeaseDuration.AsDuration())
		require.Equal(t, 2*time.Hour, it.Ttl.AsDuration())
		require.WithinRange(t, it.DeliverAfter.AsTime(), before.Add(time.Minute), time.Now().Add(time.Minute))
	}
	require.Equal(t, []string{
		"1-0000000000002710 eu",
		"1-0000000000002711 eu",
		"1-0000000000002712 eu",
	}, lines(r.stdout))
}

func TestEnqueueDefaults(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := b.run(t, "", "enqueue", "emails", "x")
	require.Equal(t, 0, r.code, r.stderr)
	req := b.fake.got("Enqueue")[0].(*triagev1.EnqueueRequest)
	require.Equal(t, "default", req.Namespace)
	require.Empty(t, req.Region)
	require.Equal(t, triagev1.Durability_COMMITTED, req.Durability)
	it := req.Items[0]
	require.Nil(t, it.DeliverAfter)
	require.Nil(t, it.LeaseDuration)
	require.Nil(t, it.Ttl)
	require.Nil(t, it.Metadata)
	require.Empty(t, it.DedupKey)
}

func TestEnqueueStdin(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := b.run(t, "one\n\ntwo\r\nthree", "enqueue", "emails")
	require.Equal(t, 0, r.code, r.stderr)
	req := b.fake.got("Enqueue")[0].(*triagev1.EnqueueRequest)
	var payloads []string
	for _, it := range req.Items {
		payloads = append(payloads, string(it.Payload))
	}
	require.Equal(t, []string{"one", "two", "three"}, payloads)
	require.Len(t, lines(r.stdout), 3)
}

func TestEnqueueStdinBatches(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := b.run(t, strings.Repeat("x\n", 1001), "enqueue", "emails")
	require.Equal(t, 0, r.code, r.stderr)
	reqs := b.fake.got("Enqueue")
	require.Len(t, reqs, 2)
	require.Len(t, reqs[0].(*triagev1.EnqueueRequest).Items, 1000)
	require.Len(t, reqs[1].(*triagev1.EnqueueRequest).Items, 1)
	require.Len(t, lines(r.stdout), 1001)
}

func TestEnqueueDuplicateAndJSON(t *testing.T) {
	t.Parallel()
	b := setup(t)
	canned := &triagev1.EnqueueResponse{Results: []*triagev1.EnqueueResult{
		{Id: "2-0193a4b5c6d7e8f9", Region: "eu"},
		{Id: "3-0193a4b5c6d7e8fa", Region: "eu", Duplicate: true},
	}}
	b.fake.set("Enqueue", canned)

	r := b.run(t, "", "enqueue", "emails", "a", "b")
	require.Equal(t, 0, r.code, r.stderr)
	require.Equal(t, []string{"2-0193a4b5c6d7e8f9 eu", "3-0193a4b5c6d7e8fa eu duplicate"}, lines(r.stdout))

	r = b.run(t, "", "enqueue", "--json", "emails", "a", "b")
	require.Equal(t, 0, r.code, r.stderr)
	require.True(t, proto.Equal(canned, parseJSON(t, r.stdout, &triagev1.EnqueueResponse{})))
	// protojson varies its whitespace on purpose, so look at the keys.
	var doc struct {
		Results []map[string]any `json:"results"`
	}
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &doc))
	require.Contains(t, doc.Results[0], "duplicate", "unpopulated fields are emitted")
	require.Equal(t, false, doc.Results[0]["duplicate"])
}

func TestEnqueueUsageErrors(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, tc := range []struct {
		name  string
		stdin string
		args  []string
		want  string
	}{
		{name: "no topic", args: nil, want: "missing TOPIC"},
		{name: "no items", stdin: "\n\n", args: []string{"emails"}, want: "no PAYLOAD"},
		{name: "bad meta", args: []string{"--meta", "novalue", "emails", "x"}, want: `"novalue" is not k=v`},
		{name: "unknown flag", args: []string{"--prio", "1", "emails", "x"}, want: "flag provided but not defined"},
		{name: "priority range", args: []string{"--priority", "3000000000", "emails", "x"}, want: "out of range"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := b.run(t, tc.stdin, "enqueue", tc.args...)
			require.Equal(t, 2, r.code)
			require.Contains(t, r.stderr, tc.want)
			require.Contains(t, r.stderr, "usage: triage enqueue [flags] TOPIC [PAYLOAD...]")
		})
	}
	require.Empty(t, b.fake.got("Enqueue"))
}

func TestDequeue(t *testing.T) {
	t.Parallel()
	b := setup(t)
	exp := time.Date(2025, 6, 1, 12, 0, 30, 0, time.UTC)
	b.fake.set("Dequeue", &triagev1.DequeueResponse{Items: []*triagev1.LeasedItem{
		{Id: "2-0193a4b5c6d7e8f9", Priority: 0, Attempts: 1, LeaseToken: "tokA", LeaseExpiresAt: timestamppb.New(exp), Payload: []byte("hello world")},
		{Id: "11-0193a4b5c6d7e8fa", Priority: -5, Attempts: 12, LeaseToken: "tokB", LeaseExpiresAt: timestamppb.New(exp), Payload: []byte{0xff, 0x00, 0x01}},
		{Id: "3-0193a4b5c6d7e8fb", Priority: 7, Attempts: 2, LeaseToken: "tokC", LeaseExpiresAt: timestamppb.New(exp), Payload: []byte("a\tb\nc")},
	}})

	r := b.run(t, "", "dequeue", "emails", "--count", "5", "--lease", "2m", "--wait", "1500ms", "-n", "shop", "--region", "eu")
	require.Equal(t, 0, r.code, r.stderr)
	req := b.fake.got("Dequeue")[0].(*triagev1.DequeueRequest)
	require.Equal(t, "shop", req.Namespace)
	require.Equal(t, "eu", req.Region)
	require.Len(t, req.Topics, 1)
	require.Equal(t, "emails", req.Topics[0].Topic)
	require.EqualValues(t, 5, req.Topics[0].Count)
	require.Equal(t, 2*time.Minute, req.LeaseDuration.AsDuration())
	require.Equal(t, 1500*time.Millisecond, req.Wait.AsDuration())

	out := strings.Split(strings.TrimSuffix(r.stdout, "\n"), "\n")
	require.Len(t, out, 4)
	// Columns line up: every row's payload starts where the header's does.
	col := strings.Index(out[0], "PAYLOAD")
	require.Positive(t, col)
	require.Equal(t, "hello world", out[1][col:])
	require.Equal(t, "base64:/wAB", out[2][col:])
	require.Equal(t, `"a\tb\nc"`, out[3][col:])
	require.Equal(t, "ID PRIORITY ATTEMPTS LEASE TOKEN LEASE EXPIRES PAYLOAD", lines(r.stdout)[0])
	require.Equal(t, "11-0193a4b5c6d7e8fa -5 12 tokB 2025-06-01T12:00:30.000Z base64:/wAB", lines(r.stdout)[2])
	require.Empty(t, b.fake.got("Ack"), "no ack without --ack")
}

func TestDequeueDefaultsAndEmpty(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := b.run(t, "", "dequeue", "emails")
	require.Equal(t, 0, r.code, r.stderr)
	require.Empty(t, r.stdout)
	require.Contains(t, r.stderr, "no items")
	req := b.fake.got("Dequeue")[0].(*triagev1.DequeueRequest)
	require.EqualValues(t, 1, req.Topics[0].Count)
	require.Nil(t, req.LeaseDuration)
	require.Nil(t, req.Wait)
	require.Nil(t, req.MinPriority, "no bound without the flag")
	require.Nil(t, req.MaxPriority)
}

func TestDequeuePriorityBounds(t *testing.T) {
	t.Parallel()
	p := func(v int32) *int32 { return &v }
	for _, tc := range []struct {
		name     string
		args     []string
		min, max *int32
	}{
		{name: "none", args: nil},
		{name: "max zero is a bound", args: []string{"--max-priority", "0"}, max: p(0)},
		{name: "min zero is a bound", args: []string{"--min-priority=0"}, min: p(0)},
		{name: "band", args: []string{"--min-priority", "-3", "--max-priority", "2"}, min: p(-3), max: p(2)},
		{name: "equal", args: []string{"--min-priority", "5", "--max-priority", "5"}, min: p(5), max: p(5)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			r := b.run(t, "", "dequeue", append([]string{"emails"}, tc.args...)...)
			require.Equal(t, 0, r.code, r.stderr)
			reqs := b.fake.got("Dequeue")
			require.Len(t, reqs, 1)
			req := reqs[0].(*triagev1.DequeueRequest)
			require.Equal(t, tc.min, req.MinPriority)
			require.Equal(t, tc.max, req.MaxPriority)
			require.Equal(t, "emails", req.Topics[0].Topic)
		})
	}

	b := setup(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{args: []string{"--min-priority", "3", "--max-priority", "2"}, want: "--min-priority 3 is above --max-priority 2"},
		{args: []string{"--max-priority", "3000000000"}, want: "--max-priority 3000000000 is out of range"},
		{args: []string{"--min-priority", "x"}, want: "invalid value"},
	} {
		r := b.run(t, "", "dequeue", append([]string{"emails"}, tc.args...)...)
		require.Equal(t, 2, r.code, tc.args)
		require.Contains(t, r.stderr, tc.want)
		require.Contains(t, r.stderr, "usage: triage dequeue")
	}
	require.Empty(t, b.fake.got("Dequeue"))
}

func TestDequeueAckAndJSON(t *testing.T) {
	t.Parallel()
	b := setup(t)
	canned := &triagev1.DequeueResponse{Items: []*triagev1.LeasedItem{
		{Id: "2-0193a4b5c6d7e8f9", LeaseToken: "tokA", Payload: []byte("x"), Metadata: map[string]string{"k": "v"}},
		{Id: "2-0193a4b5c6d7e8fa", LeaseToken: "tokB", Payload: []byte("y")},
	}}
	b.fake.set("Dequeue", canned)
	b.fake.set("Ack", &triagev1.AckResponse{Results: []*triagev1.ItemResult{
		{Id: "2-0193a4b5c6d7e8f9", Ok: true}, {Id: "2-0193a4b5c6d7e8fa", Ok: true},
	}})

	r := b.run(t, "", "dequeue", "--json", "--ack", "--count", "2", "emails")
	require.Equal(t, 0, r.code, r.stderr)
	require.True(t, proto.Equal(canned, parseJSON(t, r.stdout, &triagev1.DequeueResponse{})))
	require.Contains(t, r.stdout, `"lease_token"`, "proto names, not JSON names")

	acks := b.fake.got("Ack")
	require.Len(t, acks, 1)
	ack := acks[0].(*triagev1.AckRequest)
	require.Equal(t, "default", ack.Namespace)
	require.Len(t, ack.Acks, 2)
	require.Equal(t, "2-0193a4b5c6d7e8f9", ack.Acks[0].Id)
	require.Equal(t, "tokA", ack.Acks[0].LeaseToken)
	require.Equal(t, "tokB", ack.Acks[1].LeaseToken)

	// An item the ack refuses fails the command after the items printed.
	b.fake.set("Ack", &triagev1.AckResponse{Results: []*triagev1.ItemResult{
		{Id: "2-0193a4b5c6d7e8f9", Ok: true}, {Id: "2-0193a4b5c6d7e8fa", Error: "stale lease token"},
	}})
	r = b.run(t, "", "dequeue", "--ack", "emails")
	require.Equal(t, 1, r.code)
	require.Len(t, lines(r.stdout), 3)
	require.Contains(t, r.stderr, "triage: ack 2-0193a4b5c6d7e8fa: stale lease token")
}

func TestAck(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.fake.set("Ack", &triagev1.AckResponse{Results: []*triagev1.ItemResult{
		{Id: "2-0193a4b5c6d7e8f9", Ok: true},
		{Id: "12-0193a4b5c6d7e8fa", Error: "stale lease token"},
	}})
	r := b.run(t, "", "ack", "-n", "shop", "2-0193a4b5c6d7e8f9:tokA", "12-0193a4b5c6d7e8fa:tok:B")
	require.Equal(t, 1, r.code, "a refused item fails the command")
	require.Equal(t, []string{
		"2-0193a4b5c6d7e8f9 ok",
		"12-0193a4b5c6d7e8fa error: stale lease token",
	}, lines(r.stdout))
	// The error column lines up.
	out := strings.Split(r.stdout, "\n")
	require.Equal(t, strings.Index(out[0], "ok"), strings.Index(out[1], "error"))

	req := b.fake.got("Ack")[0].(*triagev1.AckRequest)
	require.Equal(t, "shop", req.Namespace)
	require.Len(t, req.Acks, 2)
	require.Equal(t, "2-0193a4b5c6d7e8f9", req.Acks[0].Id)
	require.Equal(t, "tokA", req.Acks[0].LeaseToken)
	require.Equal(t, "12-0193a4b5c6d7e8fa", req.Acks[1].Id)
	require.Equal(t, "tok:B", req.Acks[1].LeaseToken, "the ID ends at the first ':'")

	b.fake.set("Ack", &triagev1.AckResponse{Results: []*triagev1.ItemResult{{Id: "2-0193a4b5c6d7e8f9", Ok: true}}})
	r = b.run(t, "", "ack", "2-0193a4b5c6d7e8f9:tokA")
	require.Equal(t, 0, r.code, r.stderr)

	r = b.run(t, "", "ack", "--json", "2-0193a4b5c6d7e8f9:tokA")
	require.Equal(t, 0, r.code, r.stderr)
	got := parseJSON(t, r.stdout, &triagev1.AckResponse{})
	require.True(t, got.Results[0].Ok)

	// Fewer results than refs counts as a failure.
	r = b.run(t, "", "ack", "2-0193a4b5c6d7e8f9:tokA", "3-0193a4b5c6d7e8f9:tokB")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stdout, "3-0193a4b5c6d7e8f9  error: no result from the server")
}

func TestNack(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.fake.set("Nack", &triagev1.NackResponse{Results: []*triagev1.ItemResult{{Id: "2-0193a4b5c6d7e8f9", Ok: true}}})
	r := b.run(t, "", "nack", "--delay", "30s", "--error", "smtp 451", "--meta", "retry=yes", "2-0193a4b5c6d7e8f9:tokA")
	require.Equal(t, 0, r.code, r.stderr)
	require.Equal(t, []string{"2-0193a4b5c6d7e8f9 ok"}, lines(r.stdout))
	req := b.fake.got("Nack")[0].(*triagev1.NackRequest)
	require.Len(t, req.Nacks, 1)
	n := req.Nacks[0]
	require.Equal(t, "2-0193a4b5c6d7e8f9", n.Id)
	require.Equal(t, "tokA", n.LeaseToken)
	require.Equal(t, 30*time.Second, n.Delay.AsDuration())
	require.Equal(t, "smtp 451", n.Error)
	require.Equal(t, map[string]string{"retry": "yes"}, n.Metadata)

	b.fake.set("Nack", &triagev1.NackResponse{Results: []*triagev1.ItemResult{{Id: "2-0193a4b5c6d7e8f9", Error: "not found"}}})
	r = b.run(t, "", "nack", "--json", "2-0193a4b5c6d7e8f9:tokA")
	require.Equal(t, 1, r.code, "a refused item fails the command with --json too")
	got := parseJSON(t, r.stdout, &triagev1.NackResponse{})
	require.Equal(t, "not found", got.Results[0].Error)
}

// --dead-letter and --release set the NackItem fields the server acts on
// (dead letters at once; the attempt taken back); together, or
// --dead-letter with a --delay it would ignore, they are usage errors that
// send nothing.
func TestNackDeadLetterAndRelease(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name          string
		args          []string
		dead, release bool
		delay         *durationpb.Duration
		usage         string
	}{
		{name: "neither", args: nil},
		{name: "dead letter", args: []string{"--dead-letter"}, dead: true},
		{name: "release", args: []string{"--release"}, release: true},
		{name: "release after a delay", args: []string{"--release", "--delay", "5s"}, release: true, delay: durationpb.New(5 * time.Second)},
		{name: "both", args: []string{"--dead-letter", "--release"}, usage: "--dead-letter and --release exclude each other"},
		{name: "dead letter with a delay", args: []string{"--dead-letter", "--delay", "0s"}, usage: "--delay has no effect with --dead-letter"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			b.fake.set("Nack", &triagev1.NackResponse{Results: []*triagev1.ItemResult{{Id: "2-a", Ok: true}, {Id: "3-b", Ok: true}}})
			r := b.run(t, "", "nack", append([]string{"2-a:tokA", "3-b:tokB"}, tc.args...)...)
			if tc.usage != "" {
				require.Equal(t, 2, r.code, r.stderr)
				require.Contains(t, r.stderr, tc.usage)
				require.Contains(t, r.stderr, "usage: triage nack")
				require.Empty(t, b.fake.got("Nack"))
				return
			}
			require.Equal(t, 0, r.code, r.stderr)
			req := b.fake.got("Nack")[0].(*triagev1.NackRequest)
			require.Len(t, req.Nacks, 2)
			for _, n := range req.Nacks {
				require.Equal(t, tc.dead, n.DeadLetter, n.Id)
				require.Equal(t, tc.release, n.Release, n.Id)
				require.True(t, proto.Equal(tc.delay, n.Delay), "delay %v", n.Delay)
			}
		})
	}
}

// An unset delay asks the server for its exponential backoff; "0s" asks
// for redelivery at once. The two must reach the server differently.
func TestNackDelay(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		args  []string
		delay *durationpb.Duration
	}{
		{name: "no flag leaves it unset", args: nil, delay: nil},
		{name: "zero is sent", args: []string{"--delay", "0s"}, delay: durationpb.New(0)},
		{name: "zero without unit", args: []string{"--delay=0"}, delay: durationpb.New(0)},
		{name: "positive", args: []string{"--delay", "1m30s"}, delay: durationpb.New(90 * time.Second)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			b.fake.set("Nack", &triagev1.NackResponse{Results: []*triagev1.ItemResult{{Id: "2-a", Ok: true}, {Id: "3-b", Ok: true}}})
			r := b.run(t, "", "nack", append([]string{"2-a:tokA", "3-b:tokB"}, tc.args...)...)
			require.Equal(t, 0, r.code, r.stderr)
			req := b.fake.got("Nack")[0].(*triagev1.NackRequest)
			require.Len(t, req.Nacks, 2)
			for _, n := range req.Nacks {
				if tc.delay == nil {
					require.Nil(t, n.Delay)
				} else {
					require.NotNil(t, n.Delay)
					require.True(t, proto.Equal(tc.delay, n.Delay), "delay %v", n.Delay)
				}
			}
		})
	}
}

func TestRefUsageErrors(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, tc := range []struct {
		verb string
		args []string
		want string
	}{
		{verb: "ack", args: []string{"2-0193a4b5c6d7e8f9"}, want: `"2-0193a4b5c6d7e8f9" is not ID:TOKEN`},
		{verb: "ack", args: []string{"2-0193a4b5c6d7e8f9:"}, want: "is not ID:TOKEN"},
		{verb: "ack", args: []string{":tok"}, want: "is not ID:TOKEN"},
		{verb: "ack", want: "missing ID:TOKEN"},
		{verb: "nack", args: []string{"a:b", "nope"}, want: `"nope" is not ID:TOKEN`},
		{verb: "extend", want: "missing ID:TOKEN"},
		{verb: "extend", args: []string{"a:b", "c:d"}, want: `unexpected argument "c:d"`},
		{verb: "get", want: "missing ID"},
		{verb: "delete", args: []string{"a", "b"}, want: `unexpected argument "b"`},
		{verb: "stats", want: "missing TOPIC"},
		{verb: "dequeue", args: []string{"--count", "0", "t"}, want: "--count must be at least 1"},
		{verb: "topics", args: []string{"extra"}, want: `unexpected argument "extra"`},
		{verb: "shardmap", args: []string{"--timeout", "0s"}, want: "--timeout must be positive"},
	} {
		t.Run(tc.verb+" "+strings.Join(tc.args, " "), func(t *testing.T) {
			t.Parallel()
			r := b.run(t, "", tc.verb, tc.args...)
			require.Equal(t, 2, r.code)
			require.Contains(t, r.stderr, tc.want)
			require.Contains(t, r.stderr, "usage: triage "+tc.verb)
		})
	}
	require.Empty(t, b.fake.got("Ack"))
	require.Empty(t, b.fake.got("Nack"))
}

func TestGRPCError(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.fake.fail("Enqueue", status.Error(codes.InvalidArgument, `topic "bad topic": use 1-128 letters`))
	b.fake.fail("Ack", status.Error(codes.Unavailable, "no primary for shard 2"))

	r := b.run(t, "", "enqueue", "bad topic", "x")
	require.Equal(t, 1, r.code)
	require.Empty(t, r.stdout)
	require.Equal(t, "triage: InvalidArgument: topic \"bad topic\": use 1-128 letters\n", r.stderr)

	r = b.run(t, "", "ack", "2-0193a4b5c6d7e8f9:tok")
	require.Equal(t, 1, r.code)
	require.Equal(t, "triage: Unavailable: no primary for shard 2\n", r.stderr)
}

func TestUnreachableRouter(t *testing.T) {
	t.Parallel()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := lis.Addr().String()
	require.NoError(t, lis.Close())
	var stdout, stderr bytes.Buffer
	code := cli.Run(t.Context(), newRoot(), []string{"shardmap", "--addr", addr, "--timeout", "2s"}, strings.NewReader(""), &stdout, &stderr)
	require.Equal(t, 1, code)
	require.True(t, strings.HasPrefix(stderr.String(), "triage: Unavailable: ") ||
		strings.HasPrefix(stderr.String(), "triage: DeadlineExceeded: "), stderr.String())
}

func TestExtend(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.fake.set("ExtendLease", &triagev1.ExtendLeaseResponse{LeaseExpiresAt: timestamppb.New(time.Date(2025, 6, 1, 12, 5, 0, 0, time.UTC))})
	r := b.run(t, "", "extend", "--lease", "5m", "2-0193a4b5c6d7e8f9:tokA")
	require.Equal(t, 0, r.code, r.stderr)
	require.Equal(t, "2-0193a4b5c6d7e8f9  leased until 2025-06-01T12:05:00.000Z\n", r.stdout)
	req := b.fake.got("ExtendLease")[0].(*triagev1.ExtendLeaseRequest)
	require.Equal(t, "2-0193a4b5c6d7e8f9", req.Id)
	require.Equal(t, "tokA", req.LeaseToken)
	require.Equal(t, 5*time.Minute, req.LeaseDuration.AsDuration())
}

func sampleItem() *triagev1.Item {
	return &triagev1.Item{
		Id: "2-0193a4b5c6d7e8f9", Namespace: "shop", Topic: "emails", Priority: 4, Attempts: 2, MaxAttempts: 5,
		Payload: []byte("hi"), Metadata: map[string]string{"b": "2", "a": "1"}, State: triagev1.ItemState_LEASED,
		Region: "eu", DeliverAfter: timestamppb.New(time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)),
		LeaseDuration: durationpb.New(30 * time.Second), LastError: "smtp 451",
	}
}

func TestGet(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.fake.set("GetItem", sampleItem())
	r := b.run(t, "", "get", "-n", "shop", "2-0193a4b5c6d7e8f9")
	require.Equal(t, 0, r.code, r.stderr)
	req := b.fake.got("GetItem")[0].(*triagev1.GetItemRequest)
	require.Equal(t, "shop", req.Namespace)
	require.Equal(t, "2-0193a4b5c6d7e8f9", req.Id)

	out := lines(r.stdout)
	require.Contains(t, out, "id 2-0193a4b5c6d7e8f9")
	require.Contains(t, out, "state LEASED")
	require.Contains(t, out, "priority 4")
	require.Contains(t, out, "deliver after 2025-06-01T12:00:00.000Z")
	require.Contains(t, out, "lease duration 30s")
	require.Contains(t, out, "lease expires -")
	require.Contains(t, out, "last error smtp 451")
	require.Contains(t, out, "attempts 2 of 5", "the deliveries made and the ones its retry policy allows")
	require.Contains(t, r.stdout, "metadata        a=1\n                b=2\n", "metadata sorted, one key a line, aligned")
	require.Equal(t, "payload hi", out[len(out)-1])

	for _, l := range out {
		require.NotContains(t, l, "original priority", "no history rows for an unchanged priority")
	}

	r = b.run(t, "", "get", "--json", "2-0193a4b5c6d7e8f9")
	require.Equal(t, 0, r.code, r.stderr)
	require.True(t, proto.Equal(sampleItem(), parseJSON(t, r.stdout, &triagev1.Item{})))
}

func TestGetPriorityHistory(t *testing.T) {
	t.Parallel()
	b := setup(t)
	changed := sampleItem()
	changed.Priority, changed.OriginalPriority = 1, 4
	changed.PriorityChangedBy = "aging"
	changed.PriorityChangedAt = timestamppb.New(time.Date(2025, 6, 1, 12, 3, 0, 0, time.UTC))
	b.fake.set("GetItem", changed)

	r := b.run(t, "", "get", "2-0193a4b5c6d7e8f9")
	require.Equal(t, 0, r.code, r.stderr)
	out := lines(r.stdout)
	i := slices.Index(out, "priority 1")
	require.Positive(t, i)
	require.Equal(t, []string{
		"original priority 4",
		"priority changed by aging",
		"priority changed at 2025-06-01T12:03:00.000Z",
	}, out[i+1:i+4], "history follows the priority")

	r = b.run(t, "", "get", "--json", "2-0193a4b5c6d7e8f9")
	require.Equal(t, 0, r.code, r.stderr)
	got := parseJSON(t, r.stdout, &triagev1.Item{})
	require.True(t, proto.Equal(changed, got))
	require.Contains(t, r.stdout, `"priority_changed_by"`)
}

func TestUpdate(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.fake.set("UpdateItem", sampleItem())
	for _, tc := range []struct {
		name  string
		args  []string
		check func(t *testing.T, req *triagev1.UpdateItemRequest)
	}{
		{
			name: "priority zero is sent",
			args: []string{"2-0193a4b5c6d7e8f9", "--priority", "0"},
			check: func(t *testing.T, req *triagev1.UpdateItemRequest) {
				require.NotNil(t, req.Priority)
				require.EqualValues(t, 0, *req.Priority)
				require.Nil(t, req.DeliverAfter)
				require.Nil(t, req.Metadata)
				require.Empty(t, req.UpdatedBy, "the server picks who without --by")
			},
		},
		{
			name: "by",
			args: []string{"2-0193a4b5c6d7e8f9", "--priority", "-2", "--by", "oncall@example"},
			check: func(t *testing.T, req *triagev1.UpdateItemRequest) {
				require.EqualValues(t, -2, *req.Priority)
				require.Equal(t, "oncall@example", req.UpdatedBy)
			},
		},
		{
			name: "deliver after",
			args: []string{"--deliver-after", "2025-06-01T12:00:00+02:00", "2-0193a4b5c6d7e8f9"},
			check: func(t *testing.T, req *triagev1.UpdateItemRequest) {
				require.Nil(t, req.Priority)
				require.Equal(t, time.Date(2025, 6, 1, 10, 0, 0, 0, time.UTC), req.DeliverAfter.AsTime())
			},
		},
		{
			name: "delay and meta",
			args: []string{"2-0193a4b5c6d7e8f9", "--delay", "1h", "--meta", "gone=", "--meta", "k=v"},
			check: func(t *testing.T, req *triagev1.UpdateItemRequest) {
				require.WithinDuration(t, time.Now().Add(time.Hour), req.DeliverAfter.AsTime(), 10*time.Second)
				require.Equal(t, map[string]string{"gone": "", "k": "v"}, req.Metadata)
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			b.fake.set("UpdateItem", sampleItem())
			r := b.run(t, "", "update", tc.args...)
			require.Equal(t, 0, r.code, r.stderr)
			require.Contains(t, lines(r.stdout), "id 2-0193a4b5c6d7e8f9")
			reqs := b.fake.got("UpdateItem")
			require.Len(t, reqs, 1)
			req := reqs[0].(*triagev1.UpdateItemRequest)
			require.Equal(t, "2-0193a4b5c6d7e8f9", req.Id)
			tc.check(t, req)
		})
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{args: []string{"2-0193a4b5c6d7e8f9"}, want: "nothing to update"},
		{args: []string{"2-0193a4b5c6d7e8f9", "--by", "me"}, want: "nothing to update"},
		{args: []string{"2-0193a4b5c6d7e8f9", "--delay", "1m", "--deliver-after", "2025-06-01T12:00:00Z"}, want: "not both"},
		{args: []string{"2-0193a4b5c6d7e8f9", "--deliver-after", "tomorrow"}, want: "not an RFC3339 time"},
	} {
		r := b.run(t, "", "update", tc.args...)
		require.Equal(t, 2, r.code, tc.args)
		require.Contains(t, r.stderr, tc.want)
	}
	require.Empty(t, b.fake.got("UpdateItem"))
}

func TestDelete(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := b.run(t, "", "delete", "-n", "shop", "2-0193a4b5c6d7e8f9")
	require.Equal(t, 0, r.code, r.stderr)
	require.Equal(t, "2-0193a4b5c6d7e8f9  deleted\n", r.stdout)
	req := b.fake.got("DeleteItem")[0].(*triagev1.DeleteItemRequest)
	require.Equal(t, "shop", req.Namespace)
	require.Equal(t, "2-0193a4b5c6d7e8f9", req.Id)

	b.fake.fail("DeleteItem", status.Error(codes.NotFound, "item 2-0193a4b5c6d7e8f9 not found"))
	r = b.run(t, "", "delete", "2-0193a4b5c6d7e8f9")
	require.Equal(t, 1, r.code)
	require.Equal(t, "triage: NotFound: item 2-0193a4b5c6d7e8f9 not found\n", r.stderr)
}

func TestStats(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.fake.set("GetTopicStats", &triagev1.TopicStats{
		Namespace: "shop", Topic: "emails", Ready: 12, Leased: 3, Delayed: 1, Total: 16, DeadLetters: 4,
		OldestReadyAge:  durationpb.New(90 * time.Second),
		ReadyByPriority: []*triagev1.PriorityDepth{{Priority: 0, Ready: 10}, {Priority: 5, Ready: 2}},
	})
	r := b.run(t, "", "stats", "-n", "shop", "--region", "us", "emails")
	require.Equal(t, 0, r.code, r.stderr)
	req := b.fake.got("GetTopicStats")[0].(*triagev1.GetTopicStatsRequest)
	require.Equal(t, "emails", req.Topic)
	require.Equal(t, "us", req.Region)
	out := lines(r.stdout)
	require.Contains(t, out, "ready 12")
	require.Contains(t, out, "total 16")
	require.Contains(t, out, "dead letters 4")
	require.Contains(t, out, "oldest ready age 1m30s")
	require.Equal(t, []string{"PRIORITY READY", "0 10", "5 2"}, out[len(out)-3:])

	r = b.run(t, "", "stats", "--json", "emails")
	require.Equal(t, 0, r.code, r.stderr)
	got := parseJSON(t, r.stdout, &triagev1.TopicStats{})
	require.EqualValues(t, 12, got.Ready)
	require.EqualValues(t, 4, got.DeadLetters)
	require.Contains(t, r.stdout, `"ready_by_priority"`)
}

func TestTopicsFollowsPages(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := b.run(t, "", "topics", "--region", "eu")
	require.Equal(t, 0, r.code, r.stderr)
	require.Equal(t, []string{"TOPIC ITEMS DEAD LETTERS", "emails 12 0", "sms-outbound 3 0", "poison 0 2"}, lines(r.stdout))
	reqs := b.fake.got("ListTopics")
	require.Len(t, reqs, 2)
	require.Equal(t, "p2", reqs[1].(*triagev1.ListTopicsRequest).PageToken)
	require.Equal(t, "eu", reqs[0].(*triagev1.ListTopicsRequest).Region)

	r = b.run(t, "", "topics", "--json")
	require.Equal(t, 0, r.code, r.stderr)
	got := parseJSON(t, r.stdout, &triagev1.ListTopicsResponse{})
	require.Len(t, got.Topics, 3)
	require.Empty(t, got.NextPageToken)
}

func TestShardmap(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.fake.set("GetShardMap", &triagev1.ShardMap{
		Version: 7, Regions: []string{"eu", "us"},
		Shards: []*triagev1.Shard{
			{Id: 1, HomeRegion: "eu", Primary: "127.0.0.1:3307", Replicas: []string{"127.0.0.1:3308"}, Epoch: 2},
			{Id: 12, HomeRegion: "us", Primary: "127.0.0.1:3310", Epoch: 1},
		},
		Namespaces: []*triagev1.NamespaceShards{{Namespace: "default", Region: "eu", Shards: []uint32{1, 2}}},
	})
	r := b.run(t, "", "shardmap")
	require.Equal(t, 0, r.code, r.stderr)
	require.Equal(t, []string{
		"version 7",
		"regions eu, us",
		"",
		"SHARD HOME REGION PRIMARY REPLICAS EPOCH",
		"1 eu 127.0.0.1:3307 127.0.0.1:3308 2",
		"12 us 127.0.0.1:3310 - 1",
		"",
		"NAMESPACE REGION SHARDS",
		"default eu 1,2",
	}, lines(r.stdout))

	r = b.run(t, "", "shardmap", "--json")
	require.Equal(t, 0, r.code, r.stderr)
	require.EqualValues(t, 7, parseJSON(t, r.stdout, &triagev1.ShardMap{}).Version)
}

func TestHelpExitsZero(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := b.run(t, "", "enqueue", "-h")
	require.Equal(t, 0, r.code)
	require.Contains(t, r.stderr, "usage: triage enqueue")
	require.Contains(t, r.stderr, "-buffered")
}

func TestDefaultAddr(t *testing.T) {
	t.Parallel()
	require.Equal(t, "127.0.0.1:9090", defaultAddr(func(string) string { return "" }))
	require.Equal(t, "10.0.0.5:7000", defaultAddr(func(k string) string {
		if k == "TRIAGE_ADDR" {
			return "10.0.0.5:7000"
		}
		return ""
	}))
}

// TestInterspersedFlags: flags may stand anywhere among the positional
// arguments ("update ID --priority 3"); after "--" everything is
// positional.
func TestInterspersedFlags(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		args []string
		pos  []string
		prio int
	}{
		{name: "flags first", args: []string{"--priority", "3", "a", "b"}, pos: []string{"a", "b"}, prio: 3},
		{name: "flags between", args: []string{"a", "--priority", "3", "b"}, pos: []string{"a", "b"}, prio: 3},
		{name: "flags last", args: []string{"a", "b", "--priority=3"}, pos: []string{"a", "b"}, prio: 3},
		{name: "double dash", args: []string{"a", "--", "--priority", "-x"}, pos: []string{"a", "--priority", "-x"}},
		{name: "lone dash is positional", args: []string{"-", "a"}, pos: []string{"-", "a"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			r := b.run(t, "", "enqueue", append([]string{"topic"}, tc.args...)...)
			require.Equal(t, 0, r.code, r.stderr)
			req := b.fake.got("Enqueue")[0].(*triagev1.EnqueueRequest)
			var pos []string
			for _, it := range req.Items {
				pos = append(pos, string(it.Payload))
				require.EqualValues(t, tc.prio, it.Priority)
			}
			require.Equal(t, tc.pos, pos)
		})
	}
}

func TestPayloadText(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   []byte
		want string
	}{
		{in: []byte("plain text"), want: "plain text"},
		{in: []byte("ünïcödé ✓"), want: "ünïcödé ✓"},
		{in: []byte("two\nlines"), want: `"two\nlines"`},
		{in: []byte{0xc3, 0x28}, want: "base64:wyg="},
		{in: nil, want: ""},
	} {
		require.Equal(t, tc.want, payloadText(tc.in), "%q", tc.in)
	}
}
