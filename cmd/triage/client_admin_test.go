package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
)

func deadLetter(id string, prio, attempts int32, lastErr string, payload []byte) *triagev1.DeadLetter {
	return &triagev1.DeadLetter{
		Id: id, Topic: "emails", Priority: prio, Attempts: attempts, LastError: lastErr, Payload: payload,
		Metadata:   map[string]string{"k": "v"},
		EnqueuedAt: timestamppb.New(time.Date(2025, 6, 1, 11, 0, 0, 0, time.UTC)),
		DiedAt:     timestamppb.New(time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)),
	}
}

func TestDeadLettersOnePage(t *testing.T) {
	t.Parallel()
	b := setup(t)
	page := &triagev1.ListDeadLettersResponse{
		DeadLetters: []*triagev1.DeadLetter{
			deadLetter("2-0193a4b5c6d7e8f9", 3, 10, "smtp 451: try later", []byte("hello")),
			deadLetter("11-0193a4b5c6d7e8fa", -1, 1, "", []byte{0xff, 0x00}),
			deadLetter("3-0193a4b5c6d7e8fb", 0, 2, "line one\nline two", []byte("a\tb")),
		},
		NextPageToken: "1717243200000000.42",
	}
	b.fake.set("ListDeadLetters", page)

	r := b.run(t, "", "deadletters", "-n", "shop", "--region", "eu", "--page-size", "3", "emails")
	require.Equal(t, 0, r.code, r.stderr)
	reqs := b.fake.got("ListDeadLetters")
	require.Len(t, reqs, 1, "one page without --all")
	req := reqs[0].(*triagev1.ListDeadLettersRequest)
	require.Equal(t, "shop", req.Namespace)
	require.Equal(t, "emails", req.Topic)
	require.Equal(t, "eu", req.Region, "the client's interceptor does not fill this request, so the verb does")
	require.EqualValues(t, 3, req.PageSize)
	require.Empty(t, req.PageToken)

	require.Equal(t, []string{
		"ID PRIORITY ATTEMPTS DIED AT LAST ERROR PAYLOAD",
		"2-0193a4b5c6d7e8f9 3 10 2025-06-01T12:00:00.000Z smtp 451: try later hello",
		"11-0193a4b5c6d7e8fa -1 1 2025-06-01T12:00:00.000Z - base64:/wA=",
		`3-0193a4b5c6d7e8fb 0 2 2025-06-01T12:00:00.000Z "line one\nline two" "a\tb"`,
	}, lines(r.stdout))
	// Columns line up: every row's payload starts where the header's does.
	out := strings.Split(strings.TrimSuffix(r.stdout, "\n"), "\n")
	col := strings.Index(out[0], "PAYLOAD")
	require.Equal(t, "hello", out[1][col:])
	require.Equal(t, `"a\tb"`, out[3][col:])
	require.Equal(t, "more dead letters: --page-token 1717243200000000.42, or --all\n", r.stderr)

	// A later page by its token; the default page size is the server's.
	r = b.run(t, "", "deadletters", "emails", "--page-token", "1717243200000000.42")
	require.Equal(t, 0, r.code, r.stderr)
	req = b.fake.got("ListDeadLetters")[1].(*triagev1.ListDeadLettersRequest)
	require.Equal(t, "1717243200000000.42", req.PageToken)
	require.Zero(t, req.PageSize)
	require.Empty(t, req.Region)

	r = b.run(t, "", "deadletters", "--json", "emails")
	require.Equal(t, 0, r.code, r.stderr)
	got := parseJSON(t, r.stdout, &triagev1.ListDeadLettersResponse{})
	require.True(t, proto.Equal(page, got))
	require.Equal(t, "1717243200000000.42", got.NextPageToken, "a script can page with --json too")
	require.Contains(t, r.stdout, `"died_at"`, "proto names, not JSON names")
}

func TestDeadLettersAll(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.fake.set("ListDeadLetters", &triagev1.ListDeadLettersResponse{
		DeadLetters:   []*triagev1.DeadLetter{deadLetter("1-a", 0, 10, "boom", []byte("one"))},
		NextPageToken: "p2",
	})
	b.fake.set("ListDeadLetters@p2", &triagev1.ListDeadLettersResponse{
		DeadLetters:   []*triagev1.DeadLetter{deadLetter("2-b", 1, 10, "boom", []byte("two"))},
		NextPageToken: "p3",
	})
	b.fake.set("ListDeadLetters@p3", &triagev1.ListDeadLettersResponse{
		DeadLetters: []*triagev1.DeadLetter{deadLetter("3-c", 2, 10, "boom", []byte("three"))},
	})

	r := b.run(t, "", "deadletters", "--all", "--page-size", "1", "emails")
	require.Equal(t, 0, r.code, r.stderr)
	require.Empty(t, r.stderr, "no hint once every page is shown")
	out := lines(r.stdout)
	require.Len(t, out, 4)
	require.True(t, strings.HasPrefix(out[1], "1-a "))
	require.True(t, strings.HasSuffix(out[3], " three"))
	reqs := b.fake.got("ListDeadLetters")
	require.Len(t, reqs, 3)
	for i, tok := range []string{"", "p2", "p3"} {
		req := reqs[i].(*triagev1.ListDeadLettersRequest)
		require.Equal(t, tok, req.PageToken)
		require.EqualValues(t, 1, req.PageSize, "every page asks for --page-size")
	}

	r = b.run(t, "", "deadletters", "--all", "--json", "emails")
	require.Equal(t, 0, r.code, r.stderr)
	got := parseJSON(t, r.stdout, &triagev1.ListDeadLettersResponse{})
	require.Len(t, got.DeadLetters, 3)
	require.Empty(t, got.NextPageToken)

	// A server that hands back a token it gave before does not loop us.
	b.fake.set("ListDeadLetters@p3", &triagev1.ListDeadLettersResponse{NextPageToken: "p2"})
	r = b.run(t, "", "deadletters", "--all", "emails")
	require.Equal(t, 0, r.code, r.stderr)
	require.Len(t, lines(r.stdout), 3)
}

func TestDeadLettersEmptyAndErrors(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := b.run(t, "", "deadletters", "emails")
	require.Equal(t, 0, r.code, r.stderr)
	require.Empty(t, r.stdout)
	require.Equal(t, "no dead letters\n", r.stderr)

	r = b.run(t, "", "deadletters", "--json", "emails")
	require.Equal(t, 0, r.code, r.stderr)
	require.Empty(t, parseJSON(t, r.stdout, &triagev1.ListDeadLettersResponse{}).DeadLetters)
	// protojson varies its whitespace on purpose, so look at the keys.
	var doc map[string]any
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &doc))
	require.Equal(t, []any{}, doc["dead_letters"], "an empty list, not a missing key")

	for _, tc := range []struct {
		args []string
		want string
	}{
		{args: nil, want: "missing TOPIC"},
		{args: []string{"a", "b"}, want: `unexpected argument "b"`},
		{args: []string{"--page-size", "1001", "emails"}, want: "--page-size 1001: allowed 1 to 1000"},
		{args: []string{"--page-size", "-1", "emails"}, want: "--page-size -1: allowed 1 to 1000"},
	} {
		r := b.run(t, "", "deadletters", tc.args...)
		require.Equal(t, 2, r.code, tc.args)
		require.Contains(t, r.stderr, tc.want)
		require.Contains(t, r.stderr, "usage: triage deadletters [flags] TOPIC")
	}
	require.Len(t, b.fake.got("ListDeadLetters"), 2, "usage errors send nothing")

	b.fake.fail("ListDeadLetters", status.Error(codes.NotFound, `namespace "nope" not found`))
	r = b.run(t, "", "deadletters", "-n", "nope", "emails")
	require.Equal(t, 1, r.code)
	require.Equal(t, "triage: NotFound: namespace \"nope\" not found\n", r.stderr)
}

func TestRedrive(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.fake.set("RedriveDeadLetters", &triagev1.RedriveDeadLettersResponse{Redriven: 7})

	r := b.run(t, "", "redrive", "-n", "shop", "--region", "us", "emails")
	require.Equal(t, 0, r.code, r.stderr)
	require.Equal(t, "redriven: 7\n", r.stdout)
	req := b.fake.got("RedriveDeadLetters")[0].(*triagev1.RedriveDeadLettersRequest)
	require.Equal(t, "shop", req.Namespace)
	require.Equal(t, "emails", req.Topic)
	require.Equal(t, "us", req.Region)
	require.Empty(t, req.Ids, "no IDs: all of the topic's")

	r = b.run(t, "", "redrive", "--json", "emails")
	require.Equal(t, 0, r.code, r.stderr)
	require.EqualValues(t, 7, parseJSON(t, r.stdout, &triagev1.RedriveDeadLettersResponse{}).Redriven)

	// Listed IDs, one of them twice: each is asked for once.
	b.fake.set("RedriveDeadLetters", &triagev1.RedriveDeadLettersResponse{Redriven: 2})
	r = b.run(t, "", "redrive", "emails", "2-a", "3-b", "2-a")
	require.Equal(t, 0, r.code, r.stderr)
	require.Equal(t, "redriven: 2\n", r.stdout)
	require.Empty(t, r.stderr)
	req = b.fake.got("RedriveDeadLetters")[2].(*triagev1.RedriveDeadLettersRequest)
	require.Equal(t, []string{"2-a", "3-b"}, req.Ids)

	// Fewer redriven than listed fails the command, JSON or not.
	b.fake.set("RedriveDeadLetters", &triagev1.RedriveDeadLettersResponse{Redriven: 1})
	r = b.run(t, "", "redrive", "emails", "2-a", "3-b")
	require.Equal(t, 1, r.code)
	require.Equal(t, "redriven: 1\n", r.stdout)
	require.Contains(t, r.stderr, "triage: 1 of 2 not redriven")
	r = b.run(t, "", "redrive", "--json", "emails", "2-a", "3-b")
	require.Equal(t, 1, r.code)
	require.EqualValues(t, 1, parseJSON(t, r.stdout, &triagev1.RedriveDeadLettersResponse{}).Redriven)

	r = b.run(t, "", "redrive")
	require.Equal(t, 2, r.code)
	require.Contains(t, r.stderr, "missing TOPIC")
	require.Contains(t, r.stderr, "usage: triage redrive [flags] TOPIC [ID...]")

	b.fake.fail("RedriveDeadLetters", status.Error(codes.InvalidArgument, `id "x": not an item ID`))
	r = b.run(t, "", "redrive", "emails", "x")
	require.Equal(t, 1, r.code)
	require.Empty(t, r.stdout)
	require.Equal(t, "triage: InvalidArgument: id \"x\": not an item ID\n", r.stderr)
}

func TestRedriveChunksIDs(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.fake.set("RedriveDeadLetters", &triagev1.RedriveDeadLettersResponse{Redriven: 1000})
	args := []string{"emails"}
	for i := range 1500 {
		args = append(args, fmt.Sprintf("1-%016x", i))
	}
	r := b.run(t, "", "redrive", args...)
	require.Equal(t, 0, r.code, r.stderr)
	require.Equal(t, "redriven: 2000\n", r.stdout, "the counts of every call add up")
	reqs := b.fake.got("RedriveDeadLetters")
	require.Len(t, reqs, 2, "at most 1000 IDs a call")
	require.Len(t, reqs[0].(*triagev1.RedriveDeadLettersRequest).Ids, 1000)
	require.Len(t, reqs[1].(*triagev1.RedriveDeadLettersRequest).Ids, 500)
}

func sampleNamespace() *triagev1.Namespace {
	return &triagev1.Namespace{
		Name: "shop", MaxPayloadBytes: 262144, DefaultLeaseDuration: durationpb.New(30 * time.Second), MaxAttempts: 10,
		EnqueueRateLimit: 250.5, EnqueueBurst: 250, DedupWindow: durationpb.New(time.Hour),
		Shards: []*triagev1.NamespaceShards{
			{Namespace: "shop", Region: "eu", Shards: []uint32{1, 2}},
			{Namespace: "shop", Region: "us", Shards: []uint32{11}},
		},
		Topics: map[string]*triagev1.TopicConfig{
			"orders": {Policy: triagev1.DequeuePolicy_WEIGHTED, BandWeights: []float64{8, 4, 0.5}, AgingThreshold: durationpb.New(30 * time.Second),
				MaxAttempts: 3, RetryBackoff: &triagev1.RetryBackoff{Kind: triagev1.RetryBackoff_FIXED, Base: durationpb.New(30 * time.Second), Jitter: proto.Float64(0)}},
			"audit": {Policy: triagev1.DequeuePolicy_STRICT, AtMostOnce: true},
			"bulk":  {Policy: triagev1.DequeuePolicy_WEIGHTED},
		},
	}
}

func TestNamespaceGet(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.fake.set("GetNamespace", sampleNamespace())
	r := b.run(t, "", "namespace", "get", "shop")
	require.Equal(t, 0, r.code, r.stderr)
	require.Equal(t, "shop", b.fake.got("GetNamespace")[0].(*triagev1.GetNamespaceRequest).Namespace)
	require.Equal(t, []string{
		"name shop",
		"max payload bytes 262144",
		"default lease 30s",
		"max attempts 10",
		"default ttl none",
		"enqueue rate 250.5/s",
		"enqueue burst 250",
		"max depth no limit",
		"dedup window 1h0m0s",
		"dedup retry window 5m0s",
		"shards eu=1,2",
		"us=11",
		"",
		"TOPIC POLICY WEIGHTS AT MOST ONCE AGING MAX ATTEMPTS BACKOFF",
		"audit strict - yes off namespace's default",
		"bulk weighted default no off namespace's default",
		"orders weighted 8/4/0.5 no 30s 3 fixed/30s jitter 0",
	}, lines(r.stdout))

	r = b.run(t, "", "namespace", "get", "--json", "shop")
	require.Equal(t, 0, r.code, r.stderr)
	require.True(t, proto.Equal(sampleNamespace(), parseJSON(t, r.stdout, &triagev1.Namespace{})))
	require.Contains(t, r.stdout, `"enqueue_rate_limit"`)

	b.fake.set("GetNamespace", &triagev1.Namespace{Name: "bare", MaxDepth: 5000})
	r = b.run(t, "", "namespace", "get", "bare")
	require.Equal(t, 0, r.code, r.stderr)
	out := lines(r.stdout)
	require.Contains(t, out, "max depth 5000")
	require.Contains(t, out, "enqueue rate no limit")
	require.Contains(t, out, "shards -")
	require.NotContains(t, r.stdout, "TOPIC", "no topic table without topics")

	b.fake.fail("GetNamespace", status.Error(codes.NotFound, `namespace "nope" not found`))
	r = b.run(t, "", "namespace", "get", "nope")
	require.Equal(t, 1, r.code)
	require.Equal(t, "triage: NotFound: namespace \"nope\" not found\n", r.stderr)
}

func TestNamespacePutFlags(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := b.run(t, "", "namespace", "put", "shop",
		"--max-payload-bytes", "262144", "--default-lease", "30s", "--max-attempts", "10", "--dedup-window", "1h",
		"--rate", "250.5", "--burst", "250",
		"--shards", "eu=1,2", "--shards", "us=11",
		"--topic", "orders:policy=weighted,weights=8/4/0.5,aging=30s,jitter=0,max-attempts=3,backoff=fixed/30s",
		"--topic", "audit:policy=strict,at-most-once",
		"--topic", "bulk:policy=WEIGHTED")
	require.Equal(t, 0, r.code, r.stderr)
	reqs := b.fake.got("PutNamespace")
	require.Len(t, reqs, 1)
	req := reqs[0].(*triagev1.PutNamespaceRequest)
	require.Equal(t, "shop", req.Namespace)
	require.True(t, proto.Equal(sampleNamespace(), req.Config), "config sent: %v", req.Config)
	require.Nil(t, req.Config.DefaultTtl, "flags not given stay unset, so the server applies its default")
	require.Zero(t, req.Config.MaxDepth)

	// The fake echoes the config, so the output is what get prints.
	b.fake.set("GetNamespace", sampleNamespace())
	g := b.run(t, "", "namespace", "get", "shop")
	require.Equal(t, g.stdout, r.stdout)

	r = b.run(t, "", "namespace", "put", "--json", "shop", "--max-depth", "5")
	require.Equal(t, 0, r.code, r.stderr)
	got := parseJSON(t, r.stdout, &triagev1.Namespace{})
	require.EqualValues(t, 5, got.MaxDepth)
	require.Equal(t, "shop", got.Name)
}

func TestNamespacePutZeroIsSent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := b.run(t, "", "namespace", "put", "shop", "--default-ttl", "0s", "--dedup-window", "0s", "--rate", "0", "--max-depth", "0")
	require.Equal(t, 0, r.code, r.stderr)
	cfg := b.fake.got("PutNamespace")[0].(*triagev1.PutNamespaceRequest).Config
	require.NotNil(t, cfg.DefaultTtl, "an explicit 0s is sent")
	require.Zero(t, cfg.DefaultTtl.AsDuration())
	require.NotNil(t, cfg.DedupWindow)
	require.Nil(t, cfg.DefaultLeaseDuration)

	r = b.run(t, "", "namespace", "put", "shop")
	require.Equal(t, 0, r.code, r.stderr)
	cfg = b.fake.got("PutNamespace")[1].(*triagev1.PutNamespaceRequest).Config
	require.True(t, proto.Equal(&triagev1.Namespace{Name: "shop"}, cfg), "no flags: every field takes its default")
}

// TestNamespacePatchSendsMask: namespace patch names in update_mask
// exactly the settings its flags give (a topic by its own path), so the
// server keeps every other one, quotas included; without a flag it sends
// nothing.
func TestNamespacePatchSendsMask(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := b.run(t, "", "namespace", "patch", "shop", "--max-attempts", "5", "--default-lease", "45s", "--max-depth", "0",
		"--topic", "orders:policy=weighted", "--remove-topic", "old")
	require.Equal(t, 0, r.code, r.stderr)
	req := b.fake.got("PutNamespace")[0].(*triagev1.PutNamespaceRequest)
	require.Equal(t, "shop", req.Namespace)
	require.ElementsMatch(t, []string{"max_attempts", "default_lease_duration", "max_depth", "topics.orders", "topics.old"}, req.UpdateMask.GetPaths())
	want := &triagev1.Namespace{Name: "shop", MaxAttempts: 5, DefaultLeaseDuration: durationpb.New(45 * time.Second),
		Topics: map[string]*triagev1.TopicConfig{"orders": {Policy: triagev1.DequeuePolicy_WEIGHTED}}}
	require.True(t, proto.Equal(want, req.Config), "config sent: %v", req.Config)

	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{name: "no setting", args: []string{"shop"}, want: "no setting given"},
		{name: "set and removed", args: []string{"shop", "--topic", "t:", "--remove-topic", "t"}, want: `topic "t" is both set`},
		{name: "no shards flag", args: []string{"shop", "--shards", "eu=1"}, want: "flag provided but not defined: --shards"},
	} {
		r := b.run(t, "", "namespace", append([]string{"patch"}, tc.args...)...)
		require.Equal(t, 2, r.code, "%s: %s", tc.name, r.stderr)
		require.Contains(t, r.stderr, tc.want, tc.name)
	}
	require.Len(t, b.fake.got("PutNamespace"), 1, "a refused command sends nothing")

	// namespace put sends no mask: it replaces.
	r = b.run(t, "", "namespace", "put", "shop", "--max-attempts", "5")
	require.Equal(t, 0, r.code, r.stderr)
	require.Nil(t, b.fake.got("PutNamespace")[1].(*triagev1.PutNamespaceRequest).UpdateMask)
}

func TestNamespacePutFile(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// A document as "namespace get --json" prints another namespace.
	doc := `{
	  "name": "other",
	  "max_attempts": 5,
	  "default_ttl": "86400s",
	  "default_lease_duration": null,
	  "enqueue_rate_limit": 100,
	  "shards": [
	    {"namespace": "other", "region": "eu", "shards": [1, 2]},
	    {"namespace": "other", "region": "us", "shards": [11, 12]}
	  ],
	  "topics": {
	    "orders": {"policy": "WEIGHTED", "band_weights": [2, 1]},
	    "audit": {"policy": "STRICT", "at_most_once": true}
	  }
	}`
	path := filepath.Join(t.TempDir(), "ns.json")
	require.NoError(t, os.WriteFile(path, []byte(doc), 0o600))

	r := b.run(t, "", "namespace", "put", "shop", "--file", path,
		"--max-attempts", "3", "--shards", "us=13", "--shards", "ap=21", "--topic", "orders:policy=strict")
	require.Equal(t, 0, r.code, r.stderr)
	cfg := b.fake.got("PutNamespace")[0].(*triagev1.PutNamespaceRequest).Config
	want := &triagev1.Namespace{
		Name: "shop", MaxAttempts: 3, DefaultTtl: durationpb.New(24 * time.Hour), EnqueueRateLimit: 100,
		Shards: []*triagev1.NamespaceShards{
			{Namespace: "shop", Region: "eu", Shards: []uint32{1, 2}},
			{Namespace: "shop", Region: "us", Shards: []uint32{13}},
			{Namespace: "shop", Region: "ap", Shards: []uint32{21}},
		},
		Topics: map[string]*triagev1.TopicConfig{
			"orders": {Policy: triagev1.DequeuePolicy_STRICT},
			"audit":  {Policy: triagev1.DequeuePolicy_STRICT, AtMostOnce: true},
		},
	}
	require.True(t, proto.Equal(want, cfg), "NAME, then flags, override the file: %v", cfg)
	require.Contains(t, lines(r.stdout), "max attempts 3")

	// "-" reads the document from stdin.
	r = b.run(t, `{"max_depth": "9000", "dedupWindow": "10s"}`, "namespace", "put", "shop", "--file", "-")
	require.Equal(t, 0, r.code, r.stderr)
	cfg = b.fake.got("PutNamespace")[1].(*triagev1.PutNamespaceRequest).Config
	require.EqualValues(t, 9000, cfg.MaxDepth)
	require.Equal(t, 10*time.Second, cfg.DedupWindow.AsDuration())
}

func TestNamespacePutFileErrors(t *testing.T) {
	t.Parallel()
	b := setup(t)
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.json")
	require.NoError(t, os.WriteFile(bad, []byte(`{"max_attemps": 3}`), 0o600))

	r := b.run(t, "", "namespace", "put", "shop", "--file", filepath.Join(dir, "missing.json"))
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "triage: --file: open ")
	r = b.run(t, "", "namespace", "put", "shop", "--file", bad)
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "not a Namespace document")
	require.Contains(t, r.stderr, "max_attemps", "a misspelt key is named")
	r = b.run(t, "not json", "namespace", "put", "shop", "--file", "-")
	require.Equal(t, 1, r.code)
	require.Empty(t, b.fake.got("PutNamespace"))

	b.fake.fail("PutNamespace", status.Error(codes.InvalidArgument, `shards: region "mars": allowed [eu us]`))
	r = b.run(t, "", "namespace", "put", "shop", "--shards", "mars=1")
	require.Equal(t, 1, r.code)
	require.Equal(t, "triage: InvalidArgument: shards: region \"mars\": allowed [eu us]\n", r.stderr)
}

func TestNamespacePutUsageErrors(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{name: "no name", args: nil, want: "missing NAME"},
		{name: "two names", args: []string{"a", "b"}, want: `unexpected argument "b"`},
		{name: "shards without ids", args: []string{"shop", "--shards", "eu="}, want: `"eu=" is not REGION=ID or REGION=ID,ID`},
		{name: "shards without region", args: []string{"shop", "--shards", "1,2"}, want: "is not REGION=ID or REGION=ID,ID"},
		{name: "shard not a number", args: []string{"shop", "--shards", "eu=1,x"}, want: `shard ID "x" is not a number`},
		{name: "shard region twice", args: []string{"shop", "--shards", "eu=1", "--shards", "eu=2"}, want: `region "eu" given twice`},
		{name: "bad policy", args: []string{"shop", "--topic", "t:policy=fifo"}, want: `policy "fifo": allowed weighted or strict`},
		{name: "weights with strict", args: []string{"shop", "--topic", "t:policy=strict,weights=1/2"}, want: "weights apply only with policy=weighted"},
		{name: "weights without policy", args: []string{"shop", "--topic", "t:weights=1/2"}, want: "weights apply only with policy=weighted"},
		{name: "bad weight", args: []string{"shop", "--topic", "t:policy=weighted,weights=1/two"}, want: `weight "two" is not a number`},
		{name: "bad aging", args: []string{"shop", "--topic", "t:aging=soon"}, want: `aging "soon" is not a duration`},
		{name: "unknown option", args: []string{"shop", "--topic", "t:fifo"}, want: `option "fifo"`},
		{name: "empty option", args: []string{"shop", "--topic", "t:policy=strict,"}, want: `option ""`},
		{name: "option twice", args: []string{"shop", "--topic", "t:aging=1s,aging=2s"}, want: "aging given twice"},
		{name: "bad backoff", args: []string{"shop", "--topic", "t:backoff=fixed/1s/2s"}, want: "want exp/BASE[/CAP] or fixed/DELAY"},
		{name: "bad max attempts", args: []string{"shop", "--topic", "t:max-attempts=-1"}, want: "want a count"},
		{name: "no topic name", args: []string{"shop", "--topic", ":policy=strict"}, want: "want NAME:policy="},
		{name: "topic twice", args: []string{"shop", "--topic", "t:", "--topic", "t:at-most-once"}, want: `topic "t" given twice`},
		{name: "rate NaN", args: []string{"shop", "--rate", "NaN"}, want: "--rate NaN is not a number"},
		{name: "rate Inf", args: []string{"shop", "--rate", "+Inf"}, want: "--rate +Inf is not a number"},
		{name: "attempts range", args: []string{"shop", "--max-attempts", "3000000000"}, want: "--max-attempts 3000000000 is out of range"},
		{name: "bad duration", args: []string{"shop", "--default-lease", "30"}, want: "invalid value"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := b.run(t, "", "namespace", append([]string{"put"}, tc.args...)...)
			require.Equal(t, 2, r.code, r.stderr)
			require.Contains(t, r.stderr, tc.want)
			require.Contains(t, r.stderr, "usage: triage namespace put [flags] NAME")
		})
	}
	require.Empty(t, b.fake.got("PutNamespace"))
}

func TestNamespaceGroupUsage(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{name: "no command", args: nil, code: 2, want: "triage namespace: missing command"},
		{name: "unknown command", args: []string{"delete", "shop"}, code: 2, want: `triage namespace: unknown command "delete"`},
		{name: "flag value is no command", args: []string{"-n", "get", "--json"}, code: 2, want: "missing command"},
		{name: "after double dash", args: []string{"--", "get", "shop"}, code: 2, want: "missing command"},
		{name: "help", args: []string{"-h"}, code: 0},
		{name: "help word", args: []string{"help"}, code: 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := b.run(t, "", "namespace", tc.args...)
			require.Equal(t, tc.code, r.code, r.stderr)
			require.Contains(t, r.stderr, tc.want)
			require.Contains(t, r.stderr, "usage: triage namespace add-shard|get|patch|put ...")
			require.Contains(t, lines(r.stderr), "triage namespace get NAME Show a namespace's configuration.")
			require.Empty(t, r.stdout)
		})
	}

	// Flags, the common ones or the sub-verb's, may come before the sub-verb.
	b.fake.set("GetNamespace", &triagev1.Namespace{Name: "shop"})
	r := b.run(t, "", "namespace", "--timeout", "5s", "--json", "get", "shop")
	require.Equal(t, 0, r.code, r.stderr)
	require.Equal(t, "shop", parseJSON(t, r.stdout, &triagev1.Namespace{}).Name)
	r = b.run(t, "", "namespace", "--rate", "5", "--topic=put:at-most-once", "put", "put")
	require.Equal(t, 0, r.code, r.stderr)
	req := b.fake.got("PutNamespace")[0].(*triagev1.PutNamespaceRequest)
	require.Equal(t, "put", req.Namespace, "a namespace may be called put")
	require.EqualValues(t, 5, req.Config.EnqueueRateLimit)
	require.True(t, req.Config.Topics["put"].AtMostOnce)

	r = b.run(t, "", "namespace", "get", "-h")
	require.Equal(t, 0, r.code)
	require.Contains(t, r.stderr, "usage: triage namespace get [flags] NAME")
	r = b.run(t, "", "namespace", "put", "-h")
	require.Equal(t, 0, r.code)
	require.Contains(t, r.stderr, "-topic SPEC")
	require.Contains(t, r.stderr, "-shards REGION=ID,ID...")
	require.Len(t, b.fake.got("GetNamespace"), 1)
}

func TestParseTopicSpec(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   string
		name string
		want *triagev1.TopicConfig
	}{
		{in: "jobs", name: "jobs", want: &triagev1.TopicConfig{}},
		{in: "jobs:", name: "jobs", want: &triagev1.TopicConfig{}},
		{in: "jobs:at-most-once", name: "jobs", want: &triagev1.TopicConfig{AtMostOnce: true}},
		{in: "jobs:at-most-once=false", name: "jobs", want: &triagev1.TopicConfig{}},
		{in: "a.b-c:policy=weighted", name: "a.b-c", want: &triagev1.TopicConfig{Policy: triagev1.DequeuePolicy_WEIGHTED}},
		{
			in: "jobs:aging=1m,policy=weighted,at-most-once,weights=8/4/2/1/0.5", name: "jobs",
			want: &triagev1.TopicConfig{
				Policy: triagev1.DequeuePolicy_WEIGHTED, BandWeights: []float64{8, 4, 2, 1, 0.5},
				AtMostOnce: true, AgingThreshold: durationpb.New(time.Minute),
			},
		},
		{
			in: "jobs:max-attempts=25,backoff=exp/2s/1h,jitter=0.1", name: "jobs",
			want: &triagev1.TopicConfig{MaxAttempts: 25, RetryBackoff: &triagev1.RetryBackoff{Kind: triagev1.RetryBackoff_EXPONENTIAL,
				Base: durationpb.New(2 * time.Second), Cap: durationpb.New(time.Hour), Jitter: proto.Float64(0.1)}},
		},
		{
			in: "jobs:backoff=fixed/30s", name: "jobs",
			want: &triagev1.TopicConfig{RetryBackoff: &triagev1.RetryBackoff{Kind: triagev1.RetryBackoff_FIXED, Base: durationpb.New(30 * time.Second)}},
		},
	} {
		name, got, err := parseTopicSpec(tc.in)
		require.NoError(t, err, tc.in)
		require.Equal(t, tc.name, name)
		require.True(t, proto.Equal(tc.want, got), "%s: %v", tc.in, got)
	}
}

// FuzzParseTopicSpec checks that no --topic value panics and that what
// parses names a topic and keeps weights to the weighted policy.
func FuzzParseTopicSpec(f *testing.F) {
	for _, s := range []string{"jobs", "t:policy=weighted,weights=8/4/2/1/0.5,at-most-once,aging=30s", ":", "t:,,", "t:weights=1/"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		name, tc, err := parseTopicSpec(s)
		if err != nil {
			return
		}
		require.NotEmpty(t, name)
		require.NotContains(t, name, ":")
		if len(tc.BandWeights) > 0 {
			require.Equal(t, triagev1.DequeuePolicy_WEIGHTED, tc.Policy)
		}
	})
}
