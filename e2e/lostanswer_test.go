package e2e

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/triage-queue/triage/cmd/triage/node"
	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
	"github.com/triage-queue/triage/schema/store/cuttest"
	"github.com/triage-queue/triage/shardmap"
)

// TestLostAnswersOverTheAPI: the router's answers for lease writes whose
// connection to the shard broke mid-call. An ack whose query committed
// and whose answer was lost answers ok, and its retry with the same
// tokens answers "item not found"; a nack whose connection broke before
// its UPDATE reached the shard answers UNAVAILABLE saying nothing was
// changed, and its retry applies it. The shard's primary in the map is a
// cuttest.Proxy, the only fake: it loses the connection.
func TestLostAnswersOverTheAPI(t *testing.T) {
	t.Parallel()
	b := setup(t, bedOpts{shards: 1, noNode: true})
	m, err := shardmap.Parse(mustRead(t, b.mapFile))
	require.NoError(t, err)
	proxy := cuttest.Start(t, m.Shards[0].Primary)
	m.Shards[0].Primary = proxy.Addr()
	sm, err := shardmap.New(*m)
	require.NoError(t, err)
	data, err := sm.Marshal()
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(b.mapFile, data, 0o644))
	b.startNode(node.Config{})

	enqueue(t, b, "lost", &triagev1.NewItem{Payload: []byte("a")}, &triagev1.NewItem{Payload: []byte("b")}, &triagev1.NewItem{Payload: []byte("c")})
	got := dequeue(t, b, "lost", 3, 0)
	require.Len(t, got, 3)

	proxy.Arm(true, func(q string) bool { return strings.Contains(q, "@triage_acked") })
	for _, r := range ack(t, b, got[:2]...) {
		require.True(t, r.Ok, r.Error)
	}
	proxy.Cut()
	require.Equal(t, 1, b.rowCount("items"))
	for _, r := range ack(t, b, got[:2]...) {
		require.False(t, r.Ok)
		require.True(t, strings.HasPrefix(r.Error, "item not found"), r.Error)
	}

	nack := &triagev1.NackRequest{Namespace: "default", Nacks: []*triagev1.NackItem{{Id: got[2].Id, LeaseToken: got[2].LeaseToken, Delay: durationpb.New(time.Hour)}}}
	proxy.Arm(false, func(q string) bool { return strings.HasPrefix(q, "UPDATE items SET lease_token = 0") })
	_, err = b.queue.Nack(b.ctx(), nack)
	proxy.Cut()
	require.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
	require.Contains(t, err.Error(), "nothing was changed")
	require.NotContains(t, err.Error(), "outcome unknown")
	it, err := b.queue.GetItem(b.ctx(), &triagev1.GetItemRequest{Namespace: "default", Id: got[2].Id})
	require.NoError(t, err)
	require.Equal(t, triagev1.ItemState_LEASED, it.State)

	resp, err := b.queue.Nack(b.ctx(), nack)
	require.NoError(t, err)
	require.True(t, resp.Results[0].Ok, resp.Results[0].Error)
	it, err = b.queue.GetItem(b.ctx(), &triagev1.GetItemRequest{Namespace: "default", Id: got[2].Id})
	require.NoError(t, err)
	require.Equal(t, triagev1.ItemState_DELAYED, it.State)
}
