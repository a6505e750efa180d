package e2e

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/triage-queue/triage/cmd/triage/node"
	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
	"github.com/triage-queue/triage/schema/store"
)

// inputBed is a bed with one item leased for an hour (topic "held") and
// one ready item nobody has dequeued (topic "idle"). Refused requests
// aim at them, so one wrongly accepted shows up in a snapshot.
type inputBed struct {
	*bed
	held *triagev1.LeasedItem
	idle string
}

func setupInput(t *testing.T) *inputBed {
	t.Helper()
	b := setup(t, bedOpts{})
	enqueue(t, b, "held", &triagev1.NewItem{Payload: []byte("held")})
	got := dequeue(t, b, "held", 1, time.Hour)
	require.Len(t, got, 1)
	idle := enqueue(t, b, "idle", &triagev1.NewItem{Payload: []byte("idle")})[0].Id
	return &inputBed{bed: b, held: got[0], idle: idle}
}

// snapshot is everything a refused request must leave as it was.
type snapshot struct {
	rows       int
	held, idle *triagev1.Item
}

func (ib *inputBed) snapshot(t *testing.T) snapshot {
	t.Helper()
	return snapshot{rows: ib.rowCount("items"), held: getItem(t, ib.bed, ib.held.Id), idle: getItem(t, ib.bed, ib.idle)}
}

func (s snapshot) requireSame(t *testing.T, now snapshot) {
	t.Helper()
	require.Equal(t, s.rows, now.rows, "row count in items")
	require.True(t, proto.Equal(s.held, now.held), "leased item changed:\n%v\n%v", s.held, now.held)
	require.True(t, proto.Equal(s.idle, now.idle), "ready item changed:\n%v\n%v", s.idle, now.idle)
}

func TestBadInputGRPC(t *testing.T) {
	t.Parallel()
	ib := setupInput(t)
	q := ib.queue
	held := ib.held
	big := make([]byte, 256<<10+1)
	topic := func(n int32) []*triagev1.TopicCount { return []*triagev1.TopicCount{{Topic: "idle", Count: n}} }
	tooMany := make([]*triagev1.NewItem, 1001)
	for i := range tooMany {
		tooMany[i] = &triagev1.NewItem{Payload: []byte("x")}
	}
	enq := func(items ...*triagev1.NewItem) *triagev1.EnqueueRequest {
		return &triagev1.EnqueueRequest{Namespace: "default", Topic: "idle", Items: items}
	}
	const badID = "not-an-id"
	idForm := "want <shard>-<16 hex digits>"
	leaseRange := "allowed 100ms to 12h0m0s"

	cases := []struct {
		name string
		call func(ctx context.Context) error
		code codes.Code
		msg  []string
	}{
		{"payload over 256 KiB", func(ctx context.Context) error {
			_, err := q.Enqueue(ctx, enq(&triagev1.NewItem{Payload: big}))
			return err
		}, codes.InvalidArgument, []string{"262145 bytes", "at most 262144"}},
		{"empty item list", func(ctx context.Context) error {
			_, err := q.Enqueue(ctx, enq())
			return err
		}, codes.InvalidArgument, []string{"items is empty", "1 to 1000"}},
		{"1001 items", func(ctx context.Context) error {
			_, err := q.Enqueue(ctx, enq(tooMany...))
			return err
		}, codes.InvalidArgument, []string{"1001 items", "at most 1000"}},
		{"one bad item refuses the batch", func(ctx context.Context) error {
			_, err := q.Enqueue(ctx, enq(&triagev1.NewItem{Payload: []byte("fine")}, &triagev1.NewItem{Payload: big}))
			return err
		}, codes.InvalidArgument, []string{"items[1]", "at most 262144"}},
		{"bad topic name", func(ctx context.Context) error {
			_, err := q.Enqueue(ctx, &triagev1.EnqueueRequest{Namespace: "default", Topic: "has space", Items: []*triagev1.NewItem{{}}})
			return err
		}, codes.InvalidArgument, []string{`topic "has space"`, "letters, digits"}},
		{"item lease 1ms", func(ctx context.Context) error {
			_, err := q.Enqueue(ctx, enq(&triagev1.NewItem{LeaseDuration: durationpb.New(time.Millisecond)}))
			return err
		}, codes.InvalidArgument, []string{"lease_duration 1ms", leaseRange}},
		{"enqueue unknown namespace", func(ctx context.Context) error {
			_, err := q.Enqueue(ctx, &triagev1.EnqueueRequest{Namespace: "nope", Topic: "idle", Items: []*triagev1.NewItem{{}}})
			return err
		}, codes.NotFound, []string{`unknown namespace "nope"`, "create it in the shard map"}},
		{"enqueue unknown region", func(ctx context.Context) error {
			r := enq(&triagev1.NewItem{})
			r.Region = "mars"
			_, err := q.Enqueue(ctx, r)
			return err
		}, codes.InvalidArgument, []string{`region "mars"`, "allowed us-east"}},
		{"dequeue count 0", func(ctx context.Context) error {
			_, err := q.Dequeue(ctx, &triagev1.DequeueRequest{Namespace: "default", Topics: topic(0)})
			return err
		}, codes.InvalidArgument, []string{"count 0", "allowed 1 to 1000"}},
		{"dequeue count -1", func(ctx context.Context) error {
			_, err := q.Dequeue(ctx, &triagev1.DequeueRequest{Namespace: "default", Topics: topic(-1)})
			return err
		}, codes.InvalidArgument, []string{"count -1", "allowed 1 to 1000"}},
		{"dequeue count 1001", func(ctx context.Context) error {
			_, err := q.Dequeue(ctx, &triagev1.DequeueRequest{Namespace: "default", Topics: topic(1001)})
			return err
		}, codes.InvalidArgument, []string{"count 1001", "allowed 1 to 1000"}},
		{"dequeue no topics", func(ctx context.Context) error {
			_, err := q.Dequeue(ctx, &triagev1.DequeueRequest{Namespace: "default"})
			return err
		}, codes.InvalidArgument, []string{"topics is empty"}},
		{"dequeue lease 1ms", func(ctx context.Context) error {
			_, err := q.Dequeue(ctx, &triagev1.DequeueRequest{Namespace: "default", Topics: topic(1), LeaseDuration: durationpb.New(time.Millisecond)})
			return err
		}, codes.InvalidArgument, []string{"lease_duration 1ms", leaseRange}},
		{"dequeue lease 13h", func(ctx context.Context) error {
			_, err := q.Dequeue(ctx, &triagev1.DequeueRequest{Namespace: "default", Topics: topic(1), LeaseDuration: durationpb.New(13 * time.Hour)})
			return err
		}, codes.InvalidArgument, []string{"lease_duration 13h0m0s", leaseRange}},
		{"dequeue wait 21s", func(ctx context.Context) error {
			_, err := q.Dequeue(ctx, &triagev1.DequeueRequest{Namespace: "default", Topics: topic(1), Wait: durationpb.New(21 * time.Second)})
			return err
		}, codes.InvalidArgument, []string{"wait must be between 0s and 20s"}},
		{"dequeue unknown namespace", func(ctx context.Context) error {
			_, err := q.Dequeue(ctx, &triagev1.DequeueRequest{Namespace: "nope", Topics: topic(1)})
			return err
		}, codes.NotFound, []string{`unknown namespace "nope"`}},
		{"dequeue unknown region", func(ctx context.Context) error {
			_, err := q.Dequeue(ctx, &triagev1.DequeueRequest{Namespace: "default", Topics: topic(1), Region: "mars"})
			return err
		}, codes.InvalidArgument, []string{`region "mars"`, "allowed us-east"}},
		{"ack bad id", func(ctx context.Context) error {
			_, err := q.Ack(ctx, &triagev1.AckRequest{Namespace: "default", Acks: []*triagev1.LeaseRef{{Id: badID, LeaseToken: held.LeaseToken}}})
			return err
		}, codes.InvalidArgument, []string{badID, idForm}},
		{"ack id of a shard that does not exist", func(ctx context.Context) error {
			_, err := q.Ack(ctx, &triagev1.AckRequest{Namespace: "default", Acks: []*triagev1.LeaseRef{{Id: "9-00000000000000ff", LeaseToken: held.LeaseToken}}})
			return err
		}, codes.InvalidArgument, []string{"shard 9 does not exist"}},
		{"ack batch with one bad id acks nothing", func(ctx context.Context) error {
			_, err := q.Ack(ctx, &triagev1.AckRequest{Namespace: "default", Acks: []*triagev1.LeaseRef{
				{Id: held.Id, LeaseToken: held.LeaseToken}, {Id: badID, LeaseToken: held.LeaseToken}}})
			return err
		}, codes.InvalidArgument, []string{badID, idForm}},
		{"ack bad token", func(ctx context.Context) error {
			_, err := q.Ack(ctx, &triagev1.AckRequest{Namespace: "default", Acks: []*triagev1.LeaseRef{{Id: held.Id, LeaseToken: "xyz"}}})
			return err
		}, codes.InvalidArgument, []string{"acks[0]", "16 hex digits"}},
		{"ack zero token", func(ctx context.Context) error {
			_, err := q.Ack(ctx, &triagev1.AckRequest{Namespace: "default", Acks: []*triagev1.LeaseRef{{Id: held.Id, LeaseToken: "0000000000000000"}}})
			return err
		}, codes.InvalidArgument, []string{"16 hex digits"}},
		{"ack nothing", func(ctx context.Context) error {
			_, err := q.Ack(ctx, &triagev1.AckRequest{Namespace: "default"})
			return err
		}, codes.InvalidArgument, []string{"no items given", "1 to 1000"}},
		{"ack unknown namespace", func(ctx context.Context) error {
			_, err := q.Ack(ctx, &triagev1.AckRequest{Namespace: "nope", Acks: []*triagev1.LeaseRef{{Id: held.Id, LeaseToken: held.LeaseToken}}})
			return err
		}, codes.NotFound, []string{`unknown namespace "nope"`}},
		{"get bad id", func(ctx context.Context) error {
			_, err := q.GetItem(ctx, &triagev1.GetItemRequest{Namespace: "default", Id: badID})
			return err
		}, codes.InvalidArgument, []string{badID, idForm}},
		{"get upper-case id", func(ctx context.Context) error {
			// A fixed ID: an upper-cased real one may have no hex letters.
			_, err := q.GetItem(ctx, &triagev1.GetItemRequest{Namespace: "default", Id: "1-0193A4B5C6D7E8F9"})
			return err
		}, codes.InvalidArgument, []string{"lower-case hex"}},
		{"get unknown namespace", func(ctx context.Context) error {
			_, err := q.GetItem(ctx, &triagev1.GetItemRequest{Namespace: "nope", Id: ib.idle})
			return err
		}, codes.NotFound, []string{`unknown namespace "nope"`}},
		{"nack bad id", func(ctx context.Context) error {
			_, err := q.Nack(ctx, &triagev1.NackRequest{Namespace: "default", Nacks: []*triagev1.NackItem{{Id: badID, LeaseToken: held.LeaseToken}}})
			return err
		}, codes.InvalidArgument, []string{badID, idForm}},
		{"nack bad token", func(ctx context.Context) error {
			_, err := q.Nack(ctx, &triagev1.NackRequest{Namespace: "default", Nacks: []*triagev1.NackItem{{Id: held.Id, LeaseToken: "not-hex-16chars!"}}})
			return err
		}, codes.InvalidArgument, []string{"nacks[0]", "16 hex digits"}},
		{"nack negative delay", func(ctx context.Context) error {
			_, err := q.Nack(ctx, &triagev1.NackRequest{Namespace: "default", Nacks: []*triagev1.NackItem{{Id: held.Id, LeaseToken: held.LeaseToken, Delay: durationpb.New(-time.Second)}}})
			return err
		}, codes.InvalidArgument, []string{"nacks[0].delay must be between 0s and"}},
		{"extend bad id", func(ctx context.Context) error {
			_, err := q.ExtendLease(ctx, &triagev1.ExtendLeaseRequest{Namespace: "default", Id: badID, LeaseToken: held.LeaseToken})
			return err
		}, codes.InvalidArgument, []string{badID, idForm}},
		{"extend bad token", func(ctx context.Context) error {
			_, err := q.ExtendLease(ctx, &triagev1.ExtendLeaseRequest{Namespace: "default", Id: held.Id, LeaseToken: "12345"})
			return err
		}, codes.InvalidArgument, []string{"16 hex digits"}},
		{"extend to 13h", func(ctx context.Context) error {
			_, err := q.ExtendLease(ctx, &triagev1.ExtendLeaseRequest{Namespace: "default", Id: held.Id, LeaseToken: held.LeaseToken, LeaseDuration: durationpb.New(13 * time.Hour)})
			return err
		}, codes.InvalidArgument, []string{"lease_duration 13h0m0s", leaseRange}},
		{"update bad id", func(ctx context.Context) error {
			p := int32(1)
			_, err := q.UpdateItem(ctx, &triagev1.UpdateItemRequest{Namespace: "default", Id: badID, Priority: &p})
			return err
		}, codes.InvalidArgument, []string{badID, idForm}},
		{"update nothing", func(ctx context.Context) error {
			_, err := q.UpdateItem(ctx, &triagev1.UpdateItemRequest{Namespace: "default", Id: ib.idle})
			return err
		}, codes.InvalidArgument, []string{"nothing to update", "priority, deliver_after or metadata"}},
		{"delete bad id", func(ctx context.Context) error {
			_, err := q.DeleteItem(ctx, &triagev1.DeleteItemRequest{Namespace: "default", Id: badID})
			return err
		}, codes.InvalidArgument, []string{badID, idForm}},
		{"stats unknown namespace", func(ctx context.Context) error {
			_, err := q.GetTopicStats(ctx, &triagev1.GetTopicStatsRequest{Namespace: "nope", Topic: "idle"})
			return err
		}, codes.NotFound, []string{`unknown namespace "nope"`}},
		{"stats unknown region", func(ctx context.Context) error {
			_, err := q.GetTopicStats(ctx, &triagev1.GetTopicStatsRequest{Namespace: "default", Topic: "idle", Region: "mars"})
			return err
		}, codes.InvalidArgument, []string{`region "mars"`, "allowed us-east"}},
		{"list topics page size -1", func(ctx context.Context) error {
			_, err := q.ListTopics(ctx, &triagev1.ListTopicsRequest{Namespace: "default", PageSize: -1})
			return err
		}, codes.InvalidArgument, []string{"page_size -1", "allowed 1 to 1000"}},
		{"list topics unknown region", func(ctx context.Context) error {
			_, err := q.ListTopics(ctx, &triagev1.ListTopicsRequest{Namespace: "default", Region: "mars"})
			return err
		}, codes.InvalidArgument, []string{`region "mars"`}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := ib.snapshot(t)
			requireCode(t, tc.call(ib.ctx()), tc.code, tc.msg...)
			before.requireSame(t, ib.snapshot(t))
		})
	}

	// The limits are inclusive: exactly 256 KiB, 1000 items per dequeue and
	// a 12h lease are accepted.
	res := enqueue(t, ib.bed, "limits", &triagev1.NewItem{Payload: make([]byte, 256<<10)})
	require.Len(t, getItem(t, ib.bed, res[0].Id).Payload, 256<<10)
	got, err := q.Dequeue(ib.ctx(), &triagev1.DequeueRequest{Namespace: "default", Topics: []*triagev1.TopicCount{{Topic: "limits", Count: 1000}},
		LeaseDuration: durationpb.New(12 * time.Hour)})
	require.NoError(t, err)
	require.Len(t, got.Items, 1)
	require.WithinDuration(t, time.Now().Add(12*time.Hour), got.Items[0].LeaseExpiresAt.AsTime(), time.Minute)
}

func TestBadInputHTTP(t *testing.T) {
	t.Parallel()
	ib := setupInput(t)
	held := ib.held
	base := ib.http + "/v1/namespaces/default"
	bigPayload := base64.StdEncoding.EncodeToString(make([]byte, 256<<10+1))
	ackBody := func(id, token string) string {
		return fmt.Sprintf(`{"acks":[{"id":%q,"lease_token":%q}]}`, id, token)
	}

	cases := []struct {
		name, method, path, body string
		status                   int
		msg                      []string
	}{
		{"payload over 256 KiB", "POST", base + "/topics/idle/items", `{"items":[{"payload":"` + bigPayload + `"}]}`,
			http.StatusBadRequest, []string{"at most 262144"}},
		{"empty item list", "POST", base + "/topics/idle/items", `{"items":[]}`, http.StatusBadRequest, []string{"items is empty", "1 to 1000"}},
		{"truncated JSON", "POST", base + "/topics/idle/items", `{"items":[{"payload":`, http.StatusBadRequest,
			[]string{"request body is not valid JSON", "unexpected EOF"}},
		{"not JSON", "POST", base + ":dequeue", `topics=idle`, http.StatusBadRequest, []string{"request body is not valid JSON", "invalid character"}},
		{"priority of the wrong type", "POST", base + "/topics/idle/items", `{"items":[{"payload":"aGk=","priority":"high"}]}`,
			http.StatusBadRequest, []string{"priority", "high"}},
		{"unknown field", "POST", base + "/topics/idle/items", `{"items":[{"payload":"aGk=","prio":1}]}`,
			http.StatusBadRequest, []string{"prio"}},
		{"payload not base64", "POST", base + "/topics/idle/items", `{"items":[{"payload":"!!"}]}`, http.StatusBadRequest, []string{"payload"}},
		{"enqueue unknown namespace", "POST", ib.http + "/v1/namespaces/nope/topics/idle/items", `{"items":[{"payload":"aGk="}]}`,
			http.StatusNotFound, []string{`unknown namespace "nope"`}},
		{"enqueue unknown region", "POST", base + "/topics/idle/items", `{"items":[{"payload":"aGk="}],"region":"mars"}`,
			http.StatusBadRequest, []string{`region "mars"`, "allowed us-east"}},
		{"dequeue count 0", "POST", base + ":dequeue", `{"topics":[{"topic":"idle","count":0}]}`, http.StatusBadRequest, []string{"allowed 1 to 1000"}},
		{"dequeue count -1", "POST", base + ":dequeue", `{"topics":[{"topic":"idle","count":-1}]}`, http.StatusBadRequest, []string{"allowed 1 to 1000"}},
		{"dequeue count 1001", "POST", base + ":dequeue", `{"topics":[{"topic":"idle","count":1001}]}`, http.StatusBadRequest, []string{"allowed 1 to 1000"}},
		{"dequeue lease 1ms", "POST", base + ":dequeue", `{"topics":[{"topic":"idle","count":1}],"lease_duration":"0.001s"}`,
			http.StatusBadRequest, []string{"allowed 100ms to 12h0m0s"}},
		{"dequeue lease 13h", "POST", base + ":dequeue", `{"topics":[{"topic":"idle","count":1}],"lease_duration":"46800s"}`,
			http.StatusBadRequest, []string{"allowed 100ms to 12h0m0s"}},
		{"dequeue wait 21s", "POST", base + ":dequeue", `{"topics":[{"topic":"idle","count":1}],"wait":"21s"}`,
			http.StatusBadRequest, []string{"between 0s and 20s"}},
		{"dequeue wait not a duration", "POST", base + ":dequeue", `{"topics":[{"topic":"idle","count":1}],"wait":"soon"}`,
			http.StatusBadRequest, []string{"invalid google.protobuf.Duration", `"soon"`}},
		{"dequeue unknown namespace", "POST", ib.http + "/v1/namespaces/nope:dequeue", `{"topics":[{"topic":"idle","count":1}]}`,
			http.StatusNotFound, []string{`unknown namespace "nope"`}},
		{"dequeue unknown region", "POST", base + ":dequeue", `{"topics":[{"topic":"idle","count":1}],"region":"mars"}`,
			http.StatusBadRequest, []string{`region "mars"`}},
		{"get bad id", "GET", base + "/items/not-an-id", "", http.StatusBadRequest, []string{"want <shard>-<16 hex digits>"}},
		{"ack bad id", "POST", base + ":ack", ackBody("not-an-id", held.LeaseToken), http.StatusBadRequest, []string{"want <shard>-<16 hex digits>"}},
		{"ack bad token", "POST", base + ":ack", ackBody(held.Id, "xyz"), http.StatusBadRequest, []string{"16 hex digits"}},
		{"nack bad id", "POST", base + ":nack", fmt.Sprintf(`{"nacks":[{"id":"not-an-id","lease_token":%q}]}`, held.LeaseToken),
			http.StatusBadRequest, []string{"want <shard>-<16 hex digits>"}},
		{"extend bad id", "POST", base + "/items/not-an-id:extendLease", fmt.Sprintf(`{"lease_token":%q}`, held.LeaseToken),
			http.StatusBadRequest, []string{"want <shard>-<16 hex digits>"}},
		{"extend bad token", "POST", base + "/items/" + held.Id + ":extendLease", `{"lease_token":"zz"}`,
			http.StatusBadRequest, []string{"16 hex digits"}},
		{"delete bad id", "DELETE", base + "/items/not-an-id", "", http.StatusBadRequest, []string{"want <shard>-<16 hex digits>"}},
		{"stats unknown namespace", "GET", ib.http + "/v1/namespaces/nope/topics/idle/stats", "", http.StatusNotFound, []string{`unknown namespace "nope"`}},
		{"topics unknown region", "GET", base + "/topics?region=mars", "", http.StatusBadRequest, []string{`region "mars"`}},
		{"get unknown item", "GET", base + "/items/1-00000000000000ff", "", http.StatusNotFound, []string{"not found"}},
	}
	grpcCode := map[int]codes.Code{http.StatusBadRequest: codes.InvalidArgument, http.StatusNotFound: codes.NotFound}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := ib.snapshot(t)
			status, body := httpJSON(t, tc.method, tc.path, tc.body)
			require.Equal(t, tc.status, status, "%v", body)
			require.Equal(t, json.Number(fmt.Sprint(int(grpcCode[tc.status]))), body["code"], "%v", body)
			msg, _ := body["message"].(string)
			require.NotEmpty(t, msg)
			for _, m := range tc.msg {
				require.Contains(t, msg, m)
			}
			before.requireSame(t, ib.snapshot(t))
		})
	}
}

// TestWrongLeaseToken: a well-formed token that is not the item's current
// one is refused per item and leaves the lease with its holder.
func TestWrongLeaseToken(t *testing.T) {
	t.Parallel()
	ib := setupInput(t)
	held := ib.held
	tok, err := store.ParseToken(held.LeaseToken)
	require.NoError(t, err)
	wrong := store.FormatToken(tok ^ 1)
	ctx := ib.ctx()
	before := ib.snapshot(t)
	require.Equal(t, triagev1.ItemState_LEASED, before.held.State)

	ar, err := ib.queue.Ack(ctx, &triagev1.AckRequest{Namespace: "default", Acks: []*triagev1.LeaseRef{{Id: held.Id, LeaseToken: wrong}}})
	require.NoError(t, err)
	require.Len(t, ar.Results, 1)
	require.False(t, ar.Results[0].Ok)
	require.Equal(t, held.Id, ar.Results[0].Id)
	require.Contains(t, ar.Results[0].Error, "stale lease token")
	before.requireSame(t, ib.snapshot(t))

	nr, err := ib.queue.Nack(ctx, &triagev1.NackRequest{Namespace: "default", Nacks: []*triagev1.NackItem{{Id: held.Id, LeaseToken: wrong, Error: "x"}}})
	require.NoError(t, err)
	require.False(t, nr.Results[0].Ok)
	require.Contains(t, nr.Results[0].Error, "stale lease token")
	before.requireSame(t, ib.snapshot(t))

	_, err = ib.queue.ExtendLease(ctx, &triagev1.ExtendLeaseRequest{Namespace: "default", Id: held.Id, LeaseToken: wrong})
	requireCode(t, err, codes.FailedPrecondition, "stale lease token")
	before.requireSame(t, ib.snapshot(t))

	status, body := httpJSON(t, "POST", ib.http+"/v1/namespaces/default:ack", fmt.Sprintf(`{"acks":[{"id":%q,"lease_token":%q}]}`, held.Id, wrong))
	require.Equal(t, http.StatusOK, status, "%v", body)
	res := body["results"].([]any)[0].(map[string]any)
	require.Equal(t, false, res["ok"])
	require.Contains(t, res["error"], "stale lease token")
	before.requireSame(t, ib.snapshot(t))

	// In one batch, the wrong ref fails alone.
	enqueue(t, ib.bed, "second", &triagev1.NewItem{Payload: []byte("second")})
	second := dequeue(t, ib.bed, "second", 1, time.Minute)
	require.Len(t, second, 1)
	ar, err = ib.queue.Ack(ctx, &triagev1.AckRequest{Namespace: "default", Acks: []*triagev1.LeaseRef{
		{Id: held.Id, LeaseToken: wrong}, {Id: second[0].Id, LeaseToken: second[0].LeaseToken}}})
	require.NoError(t, err)
	require.False(t, ar.Results[0].Ok)
	require.True(t, ar.Results[1].Ok, ar.Results[1].Error)
	before.requireSame(t, ib.snapshot(t))

	item := getItem(t, ib.bed, held.Id)
	require.Equal(t, triagev1.ItemState_LEASED, item.State)
	require.True(t, item.LeaseExpiresAt.AsTime().Equal(held.LeaseExpiresAt.AsTime()), "same expiry")
	require.True(t, ack(t, ib.bed, held)[0].Ok, "the right token still acks")
	require.Equal(t, before.rows-1, ib.rowCount("items"))
}

// TestAddShardUnusablePrimaryNamesNoAddress: AddShard of a primary the
// node cannot use (nothing listening, a name that does not resolve, a
// server that is not MySQL) is refused with a message that says which
// step failed as which account, and names neither the address asked for
// nor what the driver or the server said; nothing is published.
func TestAddShardUnusablePrimaryNamesNoAddress(t *testing.T) {
	t.Parallel()
	b := setup(t, bedOpts{})
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	closedAddr := closed.Addr().String()
	closed.Close()
	banner, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { banner.Close() })
	go func() {
		for {
			c, err := banner.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte("SSH-2.0-OpenSSH_9.6p1 secret-banner-7f3a\r\n"))
			c.Close()
		}
	}()
	v0 := b.node.ShardMap().Version
	for _, c := range []struct{ name, primary string }{
		{"nothing listening", closedAddr},
		{"no such host", "db-secret-7f3a.invalid:3306"},
		{"not MySQL", banner.Addr().String()},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := b.admin.AddShard(b.ctx(), &triagev1.AddShardRequest{Shard: &triagev1.Shard{Id: 9, HomeRegion: "us-east", Primary: c.primary}})
			require.Contains(t, []codes.Code{codes.Unavailable, codes.FailedPrecondition}, status.Code(err), "%v", err)
			msg := status.Convert(err).Message()
			require.Contains(t, msg, "shard 9: could not connect to the shard's primary as this node's application account; nothing was added; see the node's log")
			host, port, _ := net.SplitHostPort(c.primary)
			for _, leak := range []string{c.primary, host, port, "7f3a", "OpenSSH", "dial", "refused", "lookup", "invalid connection", "packet", "EOF"} {
				require.NotContains(t, msg, leak)
			}
		})
	}
	require.Equal(t, v0, b.node.ShardMap().Version, "refused changes publish nothing")
}

// TestMaxBodyBytes: the node's max_body_bytes bounds an HTTP body (413,
// unread) and a gRPC message alike.
func TestMaxBodyBytes(t *testing.T) {
	t.Parallel()
	b := setup(t, bedOpts{noNode: true})
	b.startNode(node.Config{MaxBodyBytes: 1 << 20})
	body := `{"items":[{"payload":"` + base64.StdEncoding.EncodeToString(make([]byte, 1<<20)) + `"}]}`
	code, out := httpJSON(t, http.MethodPost, b.http+"/v1/namespaces/default/topics/t/items", body)
	require.Equal(t, http.StatusRequestEntityTooLarge, code, "%v", out)
	require.Contains(t, out["message"], "at most 1048576 (1 MiB) allowed")
	_, err := b.queue.Enqueue(b.ctx(), &triagev1.EnqueueRequest{Namespace: "default", Topic: "t", Items: []*triagev1.NewItem{{Payload: make([]byte, 1<<20)}}})
	require.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
	require.Zero(t, b.rowCount("items"))
}
