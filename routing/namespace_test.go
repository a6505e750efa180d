package routing

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
	"github.com/triage-queue/triage/shardmap"
)

var (
	nsAdmin = caller{name: `"admin"`}
	ops     = caller{name: `"ops"`, clusterAdmin: true}
)

// quotaMap is two regions, us-east (shards 1, 2) and eu (3, 4), and
// namespace "default" with the quotas a cluster-admin set, pinned to shard
// 3 in eu, using all of us-east's, with one topic config.
func quotaMap(t *testing.T) *shardmap.Map {
	t.Helper()
	m, err := shardmap.New(shardmap.Map{Version: 1, Regions: []string{"us-east", "eu"},
		Shards: []shardmap.Shard{
			{ID: 1, HomeRegion: "us-east", Primary: "a:3306"}, {ID: 2, HomeRegion: "us-east", Primary: "b:3306"},
			{ID: 3, HomeRegion: "eu", Primary: "c:3306"}, {ID: 4, HomeRegion: "eu", Primary: "d:3306"},
		},
		Namespaces: []shardmap.Namespace{{Name: "default", MaxDepth: 1000, EnqueueRateLimit: 50, MaxAttempts: 7,
			Shards: map[string][]uint32{"eu": {3}},
			Topics: map[string]shardmap.TopicConfig{"a": {Policy: shardmap.PolicyWeighted}}}},
	})
	require.NoError(t, err)
	return m
}

// change runs namespaceChange as PutNamespace would and returns the
// namespace it would publish, or the gRPC status of the refusal.
func change(m *shardmap.Map, who caller, name string, cfg *triagev1.Namespace, mask ...string) (*shardmap.Namespace, error) {
	var fm *fieldmaskpb.FieldMask
	if mask != nil {
		fm = &fieldmaskpb.FieldMask{Paths: mask}
	}
	upd, err := parseMask(fm)
	if err != nil {
		return nil, toStatus(err)
	}
	next, err := namespaceChange(m, name, cfg, upd, who)
	if err != nil {
		return nil, toStatus(err)
	}
	ns, err := next.Namespace(name)
	return ns, err
}

// TestNamespaceQuotasAreClusterAdmins: a namespace admin's replace or
// update that would change shards or a quota, by leaving it out too, is
// PERMISSION_DENIED naming what it would change; one that leaves them as
// they are passes, and its shards keep their stored form. cluster-admin
// changes anything.
func TestNamespaceQuotasAreClusterAdmins(t *testing.T) {
	t.Parallel()
	m := quotaMap(t)
	stored, err := m.Namespace("default")
	require.NoError(t, err)
	require.Equal(t, 50, stored.EnqueueBurst, "the burst defaults to one second of the rate")

	for _, tc := range []struct {
		name    string
		who     caller
		cfg     *triagev1.Namespace
		mask    []string // nil: replace
		denied  []string // fields the refusal names
		invalid string
		check   func(t *testing.T, ns *shardmap.Namespace)
	}{
		{
			name: "admin replaces with nothing", who: nsAdmin, cfg: &triagev1.Namespace{},
			denied: []string{"max_depth (1000 → 0)", "enqueue_rate_limit (50 → 0)", "enqueue_burst (50 → 0)", "shards in eu (3 → 3, 4)"},
		},
		{
			name: "admin changes shards", who: nsAdmin,
			cfg: &triagev1.Namespace{MaxDepth: 1000, EnqueueRateLimit: 50, MaxAttempts: 3,
				Shards: []*triagev1.NamespaceShards{{Region: "us-east", Shards: []uint32{1}}, {Region: "eu", Shards: []uint32{3}}}},
			denied: []string{"shards in us-east (1, 2 → 1)"},
		},
		{
			name: "admin masks shards", who: nsAdmin, mask: []string{"shards"},
			cfg:    &triagev1.Namespace{Shards: []*triagev1.NamespaceShards{{Region: "eu", Shards: []uint32{4}}}},
			denied: []string{"shards in eu (3 → 4)"},
		},
		{name: "admin masks max_depth to 0", who: nsAdmin, mask: []string{"max_depth"}, cfg: &triagev1.Namespace{}, denied: []string{"max_depth (1000 → 0)"}},
		{
			name: "admin raises the payload limit", who: nsAdmin, mask: []string{"max_payload_bytes"},
			cfg: &triagev1.Namespace{MaxPayloadBytes: 1 << 20}, denied: []string{"max_payload_bytes (262144 → 1048576)"},
		},
		{name: "admin replaces all with *", who: nsAdmin, mask: []string{"*"}, cfg: &triagev1.Namespace{}, denied: []string{"max_depth (1000 → 0)"}},
		{
			name: "admin creates a namespace", who: nsAdmin, cfg: &triagev1.Namespace{}, denied: []string{`namespace "fresh" does not exist`},
		},
		{
			name: "admin replace keeps the quotas", who: nsAdmin,
			cfg: &triagev1.Namespace{MaxDepth: 1000, EnqueueRateLimit: 50, MaxAttempts: 5, DefaultLeaseDuration: durationpb.New(45 * time.Second),
				Shards: []*triagev1.NamespaceShards{{Region: "eu", Shards: []uint32{3}}, {Region: "us-east", Shards: []uint32{2, 1}}}},
			check: func(t *testing.T, ns *shardmap.Namespace) {
				require.Equal(t, 5, ns.MaxAttempts)
				require.Equal(t, shardmap.Duration(45*time.Second), ns.DefaultLeaseDuration)
				require.Equal(t, []int64{1000, 50}, []int64{ns.MaxDepth, int64(ns.EnqueueRateLimit)})
				require.Equal(t, 50, ns.EnqueueBurst)
				require.Equal(t, map[string][]uint32{"eu": {3}}, ns.Shards, "us-east listed as it is served: still all its shards")
				require.Empty(t, ns.Topics, "a replace without topics drops them")
			},
		},
		{
			name: "admin writes back what GetNamespace shows", who: nsAdmin,
			cfg: func() *triagev1.Namespace {
				p := namespaceProto(m, stored)
				p.MaxAttempts = 9
				return p
			}(),
			check: func(t *testing.T, ns *shardmap.Namespace) {
				require.Equal(t, 9, ns.MaxAttempts)
				require.Equal(t, map[string][]uint32{"eu": {3}}, ns.Shards, "us-east still uses all its shards")
				require.Contains(t, ns.Topics, "a")
			},
		},
		{
			name: "admin updates behaviour", who: nsAdmin, mask: []string{"max_attempts", "default_lease_duration", "dedup_window"},
			cfg: &triagev1.Namespace{MaxAttempts: 4, DefaultLeaseDuration: durationpb.New(time.Minute), DedupWindow: durationpb.New(time.Hour),
				MaxDepth: 1, EnqueueRateLimit: 1},
			check: func(t *testing.T, ns *shardmap.Namespace) {
				require.Equal(t, 4, ns.MaxAttempts)
				require.Equal(t, shardmap.Duration(time.Minute), ns.DefaultLeaseDuration)
				require.Equal(t, shardmap.Duration(time.Hour), ns.DedupWindow)
				require.Equal(t, int64(1000), ns.MaxDepth, "not in the mask: kept")
				require.Equal(t, 50.0, ns.EnqueueRateLimit)
				require.Contains(t, ns.Topics, "a")
			},
		},
		{
			name: "admin masks quotas at their values", who: nsAdmin, mask: []string{"max_depth", "enqueue_rate_limit", "enqueue_burst", "max_attempts"},
			cfg: &triagev1.Namespace{MaxDepth: 1000, EnqueueRateLimit: 50, MaxAttempts: 2},
			check: func(t *testing.T, ns *shardmap.Namespace) {
				require.Equal(t, 2, ns.MaxAttempts)
				require.Equal(t, 50, ns.EnqueueBurst, "burst 0 is the default, one second of the rate: the value stored")
			},
		},
		{
			name: "admin sets and removes topics one by one", who: nsAdmin, mask: []string{"topics.b", "topics.a"},
			cfg: &triagev1.Namespace{Topics: map[string]*triagev1.TopicConfig{"b": {AtMostOnce: true}}},
			check: func(t *testing.T, ns *shardmap.Namespace) {
				require.Equal(t, map[string]shardmap.TopicConfig{"b": {Policy: shardmap.PolicyStrict, AtMostOnce: true}}, ns.Topics)
			},
		},
		{
			name: "empty mask changes nothing", who: nsAdmin, mask: []string{}, cfg: &triagev1.Namespace{},
			check: func(t *testing.T, ns *shardmap.Namespace) { require.Equal(t, stored, ns) },
		},
		{
			name: "empty path names nothing", who: nsAdmin, mask: []string{""}, cfg: &triagev1.Namespace{},
			check: func(t *testing.T, ns *shardmap.Namespace) { require.Equal(t, stored, ns) },
		},
		{
			name: "admin grows topics past the cap", who: nsAdmin, mask: []string{"topics"}, cfg: &triagev1.Namespace{Topics: topics(MaxTopicConfigs + 1)},
			invalid: fmt.Sprintf("at most %d", MaxTopicConfigs),
		},
		{
			name: "admin fills topics to the cap", who: nsAdmin, mask: []string{"topics"}, cfg: &triagev1.Namespace{Topics: topics(MaxTopicConfigs)},
			check: func(t *testing.T, ns *shardmap.Namespace) { require.Len(t, ns.Topics, MaxTopicConfigs) },
		},
		{name: "unknown path", who: ops, mask: []string{"max_deep"}, cfg: &triagev1.Namespace{}, invalid: `update_mask path "max_deep": allowed`},
		{name: "bad topic path", who: ops, mask: []string{"topics.a/b"}, cfg: &triagev1.Namespace{}, invalid: `update_mask path "topics.a/b"`},
		{
			name: "ops replaces with nothing", who: ops, cfg: &triagev1.Namespace{},
			check: func(t *testing.T, ns *shardmap.Namespace) {
				require.Equal(t, []int64{0, 0, 0}, []int64{ns.MaxDepth, int64(ns.EnqueueRateLimit), int64(ns.EnqueueBurst)})
				require.Empty(t, ns.Shards, "every region uses all its shards")
				require.Equal(t, stored.Slots, ns.Slots, "the dedup slot tables stay")
			},
		},
		{
			name: "ops sets quotas and shards", who: ops, mask: []string{"max_depth", "enqueue_rate_limit", "max_payload_bytes", "shards"},
			cfg: &triagev1.Namespace{MaxDepth: 5, EnqueueRateLimit: 7, MaxPayloadBytes: 1 << 20,
				Shards: []*triagev1.NamespaceShards{{Region: "eu", Shards: []uint32{3, 4}}}},
			check: func(t *testing.T, ns *shardmap.Namespace) {
				require.Equal(t, []int64{5, 7, 50, 1 << 20}, []int64{ns.MaxDepth, int64(ns.EnqueueRateLimit), int64(ns.EnqueueBurst), int64(ns.MaxPayloadBytes)},
					"the stored burst stays unless the mask names it")
				require.Equal(t, map[string][]uint32{"eu": {3, 4}}, ns.Shards)
				require.Equal(t, 7, ns.MaxAttempts)
			},
		},
		{
			name: "ops creates a namespace with a mask", who: ops, mask: []string{"max_attempts"}, cfg: &triagev1.Namespace{MaxAttempts: 3},
			check: func(t *testing.T, ns *shardmap.Namespace) {
				require.Equal(t, 3, ns.MaxAttempts)
				require.Equal(t, shardmap.DefaultMaxPayloadBytes, ns.MaxPayloadBytes)
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			name := "default"
			if tc.name == "admin creates a namespace" || tc.name == "ops creates a namespace with a mask" {
				name = "fresh"
			}
			ns, err := change(m, tc.who, name, tc.cfg, tc.mask...)
			switch {
			case tc.denied != nil:
				require.Equal(t, codes.PermissionDenied, status.Code(err), "%v", err)
				for _, d := range tc.denied {
					require.Contains(t, status.Convert(err).Message(), d)
				}
			case tc.invalid != "":
				require.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
				require.Contains(t, status.Convert(err).Message(), tc.invalid)
			default:
				require.NoError(t, err)
				tc.check(t, ns)
			}
		})
	}
}

// TestPutNamespaceKeepsMovedSlots: a replace keeps the record of dedup
// slots a drain moved (dedup_slots_from), which tells routers where a
// moved key's item or tombstone may still be, as well as the slot tables.
func TestPutNamespaceKeepsMovedSlots(t *testing.T) {
	t.Parallel()
	m, err := quotaMap(t).WithDrain(1, time.Now())
	require.NoError(t, err)
	before, err := m.Namespace("default")
	require.NoError(t, err)
	require.NotEmpty(t, before.SlotsFrom["us-east"])
	ns, err := change(m, ops, "default", &triagev1.Namespace{MaxAttempts: 3})
	require.NoError(t, err)
	require.Equal(t, before.Slots, ns.Slots)
	require.Equal(t, before.SlotsFrom, ns.SlotsFrom)
}

// TestNamespaceCallerWithoutIdentity: a context that never passed an
// Authorizer holds no cluster-admin.
func TestNamespaceCallerWithoutIdentity(t *testing.T) {
	t.Parallel()
	who := callerOf(context.Background())
	require.False(t, who.clusterAdmin)
	_, err := change(quotaMap(t), who, "default", &triagev1.Namespace{})
	require.Equal(t, codes.PermissionDenied, status.Code(err), "%v", err)
}

func topics(n int) map[string]*triagev1.TopicConfig {
	out := map[string]*triagev1.TopicConfig{}
	for i := range n {
		out[fmt.Sprintf("t%d", i)] = &triagev1.TopicConfig{}
	}
	return out
}

// TestTopicRetryPolicy: a topic's max_attempts and retry_backoff are
// stored with every default filled (so a GET shows what a nack does) and
// override the namespace's; bad values are INVALID_ARGUMENT saying what
// is allowed, and change nothing.
func TestTopicRetryPolicy(t *testing.T) {
	t.Parallel()
	m := quotaMap(t)
	jitter := func(f float64) *float64 { return &f }
	ns, err := change(m, nsAdmin, "default", &triagev1.Namespace{Topics: map[string]*triagev1.TopicConfig{
		"fixed": {MaxAttempts: 3, RetryBackoff: &triagev1.RetryBackoff{Kind: triagev1.RetryBackoff_FIXED, Base: durationpb.New(30 * time.Second)}},
		"exp":   {RetryBackoff: &triagev1.RetryBackoff{Base: durationpb.New(2 * time.Second), Jitter: jitter(0)}},
		"big":   {RetryBackoff: &triagev1.RetryBackoff{Base: durationpb.New(time.Hour)}},
		"plain": {},
	}}, "topics")
	require.NoError(t, err)

	n, b := ns.Retry("fixed")
	require.Equal(t, 3, n)
	require.Equal(t, shardmap.Backoff{Fixed: true, Base: shardmap.Duration(30 * time.Second), Jitter: 0.5}, b)
	n, b = ns.Retry("exp")
	require.Equal(t, 7, n, "the namespace's max_attempts")
	require.Equal(t, shardmap.Backoff{Base: shardmap.Duration(2 * time.Second), Cap: shardmap.Duration(15 * time.Minute)}, b)
	require.Equal(t, 8*time.Second, b.Delay(3), "2s doubled twice, no jitter")
	require.Equal(t, 15*time.Minute, b.Delay(30), "capped")
	_, b = ns.Retry("big")
	require.Equal(t, shardmap.Duration(time.Hour), b.Cap, "a base above the default cap is its own cap")
	n, b = ns.Retry("plain")
	require.Equal(t, 7, n)
	require.Equal(t, shardmap.DefaultBackoff, b)

	got := namespaceProto(m, ns).Topics["fixed"]
	require.Equal(t, int32(3), got.MaxAttempts)
	require.Equal(t, triagev1.RetryBackoff_FIXED, got.RetryBackoff.Kind)
	require.Equal(t, 0.5, got.RetryBackoff.GetJitter())

	for _, tc := range []struct {
		cfg  *triagev1.TopicConfig
		want string
	}{
		{&triagev1.TopicConfig{MaxAttempts: -1}, `topics["t"].max_attempts -1: allowed 0 (the namespace's) or more`},
		{&triagev1.TopicConfig{RetryBackoff: &triagev1.RetryBackoff{Kind: 9}}, "kind 9: allowed EXPONENTIAL or FIXED"},
		{&triagev1.TopicConfig{RetryBackoff: &triagev1.RetryBackoff{Base: durationpb.New(0)}}, "base 0s: allowed 1ms to 24h0m0s"},
		{&triagev1.TopicConfig{RetryBackoff: &triagev1.RetryBackoff{Base: durationpb.New(time.Minute), Cap: durationpb.New(time.Second)}},
			"cap 1s: allowed base (1m0s) to 24h0m0s"},
		{&triagev1.TopicConfig{RetryBackoff: &triagev1.RetryBackoff{Jitter: jitter(1.5)}}, "jitter 1.5: allowed 0 to 1"},
	} {
		_, err := change(m, nsAdmin, "default", &triagev1.Namespace{Topics: map[string]*triagev1.TopicConfig{"t": tc.cfg}}, "topics")
		require.Equal(t, codes.InvalidArgument, status.Code(err), "%v: %v", tc.cfg, err)
		require.Contains(t, status.Convert(err).Message(), tc.want)
	}
}
