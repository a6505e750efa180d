package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/triage-queue/triage/cmd/triage/node"
	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
)

func drillEvents(texts ...string) []*triagev1.DrillEvent {
	out := make([]*triagev1.DrillEvent, len(texts))
	for i, s := range texts {
		out[i] = &triagev1.DrillEvent{Text: s}
	}
	return out
}

func eventTexts(d *triagev1.Drill) []string {
	out := make([]string, len(d.Events))
	for i, e := range d.Events {
		out[i] = e.Text
	}
	return out
}

// findDrill returns the drill id of ListDrills on admin, or nil.
func findDrill(t *testing.T, b *bed, admin triagev1.AdminClient, id string) *triagev1.Drill {
	t.Helper()
	resp, err := admin.ListDrills(b.ctx(), &triagev1.ListDrillsRequest{})
	require.NoError(t, err)
	for _, d := range resp.Drills {
		if d.Id == id {
			return d
		}
	}
	return nil
}

// TestDrills: ReportDrill creates a drill and appends to it (phase,
// done and verdict replaced, events appended in order, the last 200
// kept); ListDrills lists them newest first; concurrent reporters lose no
// event; bad input is refused, saying what is allowed, and changes
// nothing; another router on the same NATS serves the same drills; and
// the JSON gateway does all that as well.
func TestDrills(t *testing.T) {
	t.Parallel()
	b := setup(t, bedOpts{shards: 1})
	ctx := b.ctx()

	// The listing reads the bucket with one watcher, which tells when it
	// has caught up also when there is nothing to deliver.
	empty, err := b.admin.ListDrills(ctx, &triagev1.ListDrillsRequest{})
	require.NoError(t, err)
	require.Empty(t, empty.Drills, "no drill reported yet")

	d, err := b.admin.ReportDrill(ctx, &triagev1.ReportDrillRequest{Id: "primary-kill-1", Scenario: "primary-kill", Phase: "starting",
		Events: drillEvents("drill primary-kill: 2 producers", "fault injected in 120ms")})
	require.NoError(t, err)
	require.Equal(t, "starting", d.Phase)
	require.False(t, d.Done)
	started := d.StartedAt.AsTime()
	d, err = b.admin.ReportDrill(ctx, &triagev1.ReportDrillRequest{Id: "primary-kill-1", Phase: "done", Done: true, Verdict: "PASS",
		Events: drillEvents("healed in 2s", "result  PASS")})
	require.NoError(t, err)
	require.Equal(t, started, d.StartedAt.AsTime(), "started_at is the first report's")
	require.False(t, d.UpdatedAt.AsTime().Before(started))

	got := findDrill(t, b, b.admin, "primary-kill-1")
	require.NotNil(t, got)
	require.Equal(t, "primary-kill", got.Scenario, "the scenario stays when a report leaves it out")
	require.Equal(t, "done", got.Phase)
	require.True(t, got.Done)
	require.Equal(t, "PASS", got.Verdict)
	require.Equal(t, []string{"drill primary-kill: 2 producers", "fault injected in 120ms", "healed in 2s", "result  PASS"}, eventTexts(got))
	for _, e := range got.Events {
		require.NotNil(t, e.At, "an event without a time gets the server's")
	}

	// Newest first: a later drill comes before.
	_, err = b.admin.ReportDrill(ctx, &triagev1.ReportDrillRequest{Id: "partition-2", Scenario: "partition", Phase: "starting"})
	require.NoError(t, err)
	list, err := b.admin.ListDrills(ctx, &triagev1.ListDrillsRequest{})
	require.NoError(t, err)
	require.Len(t, list.Drills, 2)
	require.Equal(t, "partition-2", list.Drills[0].Id)
	require.Equal(t, "primary-kill-1", list.Drills[1].Id)

	t.Run("concurrent reporters lose no event", func(t *testing.T) {
		const n = 40
		var wg sync.WaitGroup
		for g := range 2 {
			wg.Go(func() {
				for i := range n {
					_, err := b.admin.ReportDrill(ctx, &triagev1.ReportDrillRequest{Id: "race", Scenario: "nats-kill",
						Events: drillEvents(fmt.Sprintf("g%d-%d", g, i))})
					if err != nil {
						t.Errorf("report g%d-%d: %v", g, i, err)
					}
				}
			})
		}
		wg.Wait()
		got := findDrill(t, b, b.admin, "race")
		require.NotNil(t, got)
		require.Len(t, got.Events, 2*n)
		next := map[string]int{}
		for _, e := range got.Events {
			var g, i int
			_, err := fmt.Sscanf(e.Text, "g%d-%d", &g, &i)
			require.NoError(t, err)
			require.Equal(t, next[fmt.Sprint(g)], i, "reporter %d's events in order", g)
			next[fmt.Sprint(g)]++
		}
	})

	t.Run("the last 200 events are kept", func(t *testing.T) {
		for i := range 3 {
			var ev []string
			for j := range 100 {
				ev = append(ev, fmt.Sprintf("e%d", i*100+j))
			}
			_, err := b.admin.ReportDrill(ctx, &triagev1.ReportDrillRequest{Id: "long", Events: drillEvents(ev...)})
			require.NoError(t, err)
		}
		got := findDrill(t, b, b.admin, "long")
		require.Len(t, got.Events, 200)
		require.Equal(t, "e100", got.Events[0].Text)
		require.Equal(t, "e299", got.Events[199].Text)
	})

	t.Run("bad input", func(t *testing.T) {
		before, err := b.admin.ListDrills(ctx, &triagev1.ListDrillsRequest{})
		require.NoError(t, err)
		for _, tc := range []struct {
			req  *triagev1.ReportDrillRequest
			want string
		}{
			{&triagev1.ReportDrillRequest{}, `id "": use 1-64 letters, digits, '.', '_' or '-'`},
			{&triagev1.ReportDrillRequest{Id: strings.Repeat("a", 65)}, "use 1-64 letters"},
			{&triagev1.ReportDrillRequest{Id: "primary-kill-1/x"}, "use 1-64 letters"},
			{&triagev1.ReportDrillRequest{Id: "primary-kill-1", Events: drillEvents(strings.Repeat("x", 1001))},
				"events[0].text is 1001 bytes: allowed at most 1000"},
			{&triagev1.ReportDrillRequest{Id: "primary-kill-1", Events: drillEvents(make([]string, 101)...)},
				"101 events: allowed at most 100 per call"},
			{&triagev1.ReportDrillRequest{Id: "primary-kill-1", Phase: strings.Repeat("p", 1001)}, "phase is 1001 bytes: allowed at most 1000"},
		} {
			_, err := b.admin.ReportDrill(ctx, tc.req)
			requireCode(t, err, codes.InvalidArgument, tc.want)
		}
		after, err := b.admin.ListDrills(ctx, &triagev1.ListDrillsRequest{})
		require.NoError(t, err)
		require.True(t, proto.Equal(before, after), "a refused report changed the drills")
	})

	t.Run("another router sees the same drills", func(t *testing.T) {
		other := b.startNode(node.Config{Roles: []string{node.RoleRouter}})
		conn, err := grpc.NewClient(other.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		require.NoError(t, err)
		t.Cleanup(func() { conn.Close() })
		admin2 := triagev1.NewAdminClient(conn)
		mine, err := b.admin.ListDrills(ctx, &triagev1.ListDrillsRequest{})
		require.NoError(t, err)
		theirs, err := admin2.ListDrills(ctx, &triagev1.ListDrillsRequest{})
		require.NoError(t, err)
		require.True(t, proto.Equal(mine, theirs))
		_, err = admin2.ReportDrill(ctx, &triagev1.ReportDrillRequest{Id: "primary-kill-1", Events: drillEvents("from the other router")})
		require.NoError(t, err)
		got := findDrill(t, b, b.admin, "primary-kill-1")
		require.Equal(t, "from the other router", got.Events[len(got.Events)-1].Text)
	})

	t.Run("json gateway", func(t *testing.T) {
		post := func(path, body string) (int, []byte) {
			resp, err := http.Post(b.http+path, "application/json", strings.NewReader(body))
			require.NoError(t, err)
			defer resp.Body.Close()
			data, _ := io.ReadAll(resp.Body)
			return resp.StatusCode, data
		}
		code, data := post("/v1/drills/region-down-3", `{"scenario":"region-down","phase":"fault injected","events":[{"text":"one"},{"text":"two"}]}`)
		require.Equal(t, http.StatusOK, code, "%s", data)
		var d triagev1.Drill
		require.NoError(t, protojson.Unmarshal(data, &d))
		require.Equal(t, "region-down-3", d.Id)
		require.Equal(t, []string{"one", "two"}, eventTexts(&d))

		code, data = post("/v1/drills/bad!id", `{}`)
		require.Equal(t, http.StatusBadRequest, code, "%s", data)
		require.Contains(t, string(data), "use 1-64 letters")

		resp, err := http.Get(b.http + "/v1/drills")
		require.NoError(t, err)
		defer resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
		var list struct {
			Drills []struct {
				ID       string `json:"id"`
				Scenario string `json:"scenario"`
				Phase    string `json:"phase"`
				Events   []struct {
					At   string `json:"at"`
					Text string `json:"text"`
				} `json:"events"`
			} `json:"drills"`
		}
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&list))
		require.NotEmpty(t, list.Drills)
		require.Equal(t, "region-down-3", list.Drills[0].ID, "newest first")
		require.Equal(t, "fault injected", list.Drills[0].Phase)
		require.Len(t, list.Drills[0].Events, 2)
		require.Equal(t, "two", list.Drills[0].Events[1].Text)
		require.NotEmpty(t, list.Drills[0].Events[1].At)
	})
}
