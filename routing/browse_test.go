package routing

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
	"github.com/triage-queue/triage/schema/store"
)

// TestListItemsParams: what ListItems takes, and what it refuses as
// INVALID_ARGUMENT saying what is allowed.
func TestListItemsParams(t *testing.T) {
	t.Parallel()
	p, state, err := listItemsParams(&triagev1.ListItemsRequest{Namespace: "n", Topic: "t", State: "Ready"})
	require.NoError(t, err)
	require.Equal(t, "ready", state)
	require.Equal(t, store.ItemListParams{Namespace: "n", Topic: "t", State: store.StateReady,
		MinPriority: math.MinInt32, MaxPriority: math.MaxInt32, Limit: DefaultItemPage}, p)
	p, _, err = listItemsParams(&triagev1.ListItemsRequest{State: "DELAYED", PageSize: MaxItemPage, MinPriority: proto.Int32(-2), MaxPriority: proto.Int32(-2)})
	require.NoError(t, err)
	require.Equal(t, store.StateDelayed, p.State)
	require.Equal(t, []int32{-2, -2}, []int32{p.MinPriority, p.MaxPriority})
	require.Equal(t, MaxItemPage, p.Limit)

	for _, c := range []struct {
		req  *triagev1.ListItemsRequest
		want string
	}{
		{&triagev1.ListItemsRequest{}, `state "": allowed ready, leased or delayed`},
		{&triagev1.ListItemsRequest{State: "dead"}, `state "dead": allowed ready, leased or delayed`},
		{&triagev1.ListItemsRequest{State: "ready", PageSize: -1}, "page_size -1: allowed 1 to 500, or 0 for 50"},
		{&triagev1.ListItemsRequest{State: "ready", PageSize: 501}, "page_size 501: allowed 1 to 500, or 0 for 50"},
		{&triagev1.ListItemsRequest{State: "ready", MinPriority: proto.Int32(3), MaxPriority: proto.Int32(2)},
			"min_priority 3 is above max_priority 2: allowed min_priority <= max_priority"},
		{&triagev1.ListItemsRequest{State: "ready", PageToken: "!!"}, `page_token "!!": pass back the next_page_token`},
		{&triagev1.ListItemsRequest{State: "ready", PageToken: itemCursor{state: "leased", row: store.Item{ID: 1}}.String()}, "with the same state"},
		{&triagev1.ListItemsRequest{State: "ready", PageToken: "cmVhZHkuMS4y"}, "pass back the next_page_token"}, // "ready.1.2"
	} {
		_, _, err := listItemsParams(c.req)
		st := status.Convert(toStatus(err))
		require.Equal(t, codes.InvalidArgument, st.Code(), "%v", c.req)
		require.Contains(t, st.Message(), c.want)
	}
}

// TestItemCursorRoundTrips: a page's token starts the next page after
// its last row, whatever the numbers' signs and sizes.
func TestItemCursorRoundTrips(t *testing.T) {
	t.Parallel()
	for _, row := range []store.Item{{Priority: math.MinInt32, DeliverAfter: -5, ID: 0},
		{Priority: 7, DeliverAfter: 1_700_000_000_000_000, ID: math.MaxUint64}} {
		tok := itemCursor{state: "delayed", row: row}.String()
		got, err := parseItemCursor(tok, "delayed")
		require.NoError(t, err)
		require.Equal(t, &store.Item{Priority: row.Priority, DeliverAfter: row.DeliverAfter, ID: row.ID}, got)
	}
	got, err := parseItemCursor("", "ready")
	require.NoError(t, err)
	require.Nil(t, got, "no token: the first page")
}
