package routing

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
	"github.com/triage-queue/triage/shardmap"
)

func testNamespace(t testing.TB) *shardmap.Namespace {
	m, err := shardmap.New(shardmap.Map{Regions: []string{"r"}, Namespaces: []shardmap.Namespace{{Name: "n"}}})
	require.NoError(t, err)
	ns, err := m.Namespace("n")
	require.NoError(t, err)
	return ns
}

func TestValidateEnqueue(t *testing.T) {
	t.Parallel()
	ns := testNamespace(t)
	now := time.Now()
	ok := func() *triagev1.EnqueueRequest {
		return &triagev1.EnqueueRequest{Namespace: "n", Topic: "t", Items: []*triagev1.NewItem{{Payload: []byte("x")}}}
	}
	require.NoError(t, validateEnqueue(ok(), ns, now))
	for _, tc := range []struct {
		name string
		mod  func(*triagev1.EnqueueRequest)
		want string
	}{
		{"bad topic", func(r *triagev1.EnqueueRequest) { r.Topic = "a b" }, "topic"},
		{"no items", func(r *triagev1.EnqueueRequest) { r.Items = nil }, "items is empty"},
		{"too many", func(r *triagev1.EnqueueRequest) {
			r.Items = make([]*triagev1.NewItem, MaxItemsPerEnqueue+1)
			for i := range r.Items {
				r.Items[i] = &triagev1.NewItem{}
			}
		}, "at most 1000"},
		{"payload", func(r *triagev1.EnqueueRequest) { r.Items[0].Payload = make([]byte, 256<<10+1) }, "allows at most 262144"},
		{"lease", func(r *triagev1.EnqueueRequest) { r.Items[0].LeaseDuration = durationpb.New(time.Millisecond) }, "out of range"},
		{"ttl", func(r *triagev1.EnqueueRequest) { r.Items[0].Ttl = durationpb.New(-time.Second) }, "ttl"},
		{"far future", func(r *triagev1.EnqueueRequest) {
			r.Items[0].DeliverAfter = timestamppb.New(now.Add(400 * 24 * time.Hour))
		}, "future"},
		{"dedup", func(r *triagev1.EnqueueRequest) { r.Items[0].DedupKey = strings.Repeat("k", 256) }, "dedup_key"},
		{"metadata", func(r *triagev1.EnqueueRequest) { r.Items[0].Metadata = map[string]string{"": "v"} }, "metadata"},
		{"durability", func(r *triagev1.EnqueueRequest) { r.Durability = 7 }, "durability"},
	} {
		r := ok()
		tc.mod(r)
		err := validateEnqueue(r, ns, now)
		require.ErrorIs(t, err, ErrInvalid, tc.name)
		require.Contains(t, err.Error(), tc.want, tc.name)
	}
}

func TestValidateDequeue(t *testing.T) {
	t.Parallel()
	ok := &triagev1.DequeueRequest{Namespace: "n", Topics: []*triagev1.TopicCount{{Topic: "t", Count: 1}}}
	require.NoError(t, validateDequeue(ok))
	for name, mod := range map[string]func(*triagev1.DequeueRequest){
		"no topics":  func(r *triagev1.DequeueRequest) { r.Topics = nil },
		"count 0":    func(r *triagev1.DequeueRequest) { r.Topics[0].Count = 0 },
		"count big":  func(r *triagev1.DequeueRequest) { r.Topics[0].Count = MaxDequeueCount + 1 },
		"dup topic":  func(r *triagev1.DequeueRequest) { r.Topics = append(r.Topics, r.Topics[0]) },
		"wait":       func(r *triagev1.DequeueRequest) { r.Wait = durationpb.New(21 * time.Second) },
		"lease long": func(r *triagev1.DequeueRequest) { r.LeaseDuration = durationpb.New(13 * time.Hour) },
	} {
		r := proto.Clone(ok).(*triagev1.DequeueRequest)
		mod(r)
		require.ErrorIs(t, validateDequeue(r), ErrInvalid, name)
	}
}

// FuzzValidateEnqueue: whatever the bytes, validation either accepts the
// request within the limits or refuses it with ErrInvalid; it never panics.
func FuzzValidateEnqueue(f *testing.F) {
	seed, _ := proto.Marshal(&triagev1.EnqueueRequest{Namespace: "n", Topic: "t", Items: []*triagev1.NewItem{{Payload: []byte("x"), Priority: 3,
		LeaseDuration: durationpb.New(time.Second), Metadata: map[string]string{"a": "b"}}}})
	f.Add(seed)
	f.Add([]byte{})
	f.Add([]byte("\x1a\x00"))
	ns := testNamespace(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		var r triagev1.EnqueueRequest
		if proto.Unmarshal(data, &r) != nil {
			return
		}
		err := validateEnqueue(&r, ns, time.Now())
		if err != nil {
			require.True(t, errors.Is(err, ErrInvalid), "%v", err)
			return
		}
		require.True(t, len(r.Items) >= 1 && len(r.Items) <= MaxItemsPerEnqueue)
		for _, it := range r.Items {
			require.LessOrEqual(t, len(it.Payload), ns.MaxPayloadBytes)
		}
	})
}

// FuzzValidateDequeue: accepted requests are within every limit.
func FuzzValidateDequeue(f *testing.F) {
	seed, _ := proto.Marshal(&triagev1.DequeueRequest{Namespace: "n", Topics: []*triagev1.TopicCount{{Topic: "t", Count: 5}}, Wait: durationpb.New(time.Second)})
	f.Add(seed)
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		var r triagev1.DequeueRequest
		if proto.Unmarshal(data, &r) != nil {
			return
		}
		if err := validateDequeue(&r); err != nil {
			require.ErrorIs(t, err, ErrInvalid)
			return
		}
		for _, tc := range r.Topics {
			require.True(t, tc.Count >= 1 && tc.Count <= MaxDequeueCount)
		}
		require.LessOrEqual(t, r.Wait.AsDuration(), MaxWait)
	})
}
