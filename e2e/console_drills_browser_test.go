package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/metadata"

	"github.com/triage-queue/triage/cmd/triage/node"
	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
	"github.com/triage-queue/triage/routing/auth"
	"github.com/triage-queue/triage/routing/auth/authtest"
	"github.com/triage-queue/triage/routing/console/consoletest"
)

// drillRow is one row of the console's drills table as shown.
type drillRow struct {
	ID       string `json:"id"`
	Scenario string `json:"scenario"`
	Phase    string `json:"phase"`
	Result   string `json:"result"`
	Selected bool   `json:"selected"`
}

const readDrillRows = `[...document.querySelectorAll("#drills-table tbody tr[data-drill]")].map((tr) => ({
	id: tr.dataset.drill, scenario: tr.cells[1].textContent, phase: tr.cells[3].textContent, result: tr.cells[5].textContent,
	selected: tr.classList.contains("selected"),
}))`

const readDrillLog = `[...document.querySelectorAll("#drill-log li span")].map((s) => s.textContent)`

// TestConsoleDrillsInBrowser drives the console's Drills view in headless
// Chromium: drills reported through the API are listed as ListDrills
// answers, newest first, the newest selected with its events as a log; a
// key without cluster-admin gets the shards view's refusal; an event
// reported while the page is shown appears within a few seconds (the page
// polls every second), and clicking another drill shows its events.
func TestConsoleDrillsInBrowser(t *testing.T) {
	t.Parallel()
	consoletest.Need(t)
	b := setup(t, bedOpts{noNode: true, shards: 1})
	keys := []auth.Key{
		{Name: "operator", Namespaces: map[string][]auth.Role{"default": {auth.Reader, auth.Admin}}},
		{Name: "ops", ClusterAdmin: true},
	}
	keysFile := filepath.Join(t.TempDir(), "keys.json")
	tokens := authtest.Keys(t, keysFile, keys...)
	b.startNode(node.Config{KeysFile: keysFile})
	ctx := func() context.Context {
		return metadata.AppendToOutgoingContext(b.ctx(), "authorization", "Bearer "+tokens["ops"])
	}
	report := func(req *triagev1.ReportDrillRequest) {
		t.Helper()
		_, err := b.admin.ReportDrill(ctx(), req)
		require.NoError(t, err)
	}
	report(&triagev1.ReportDrillRequest{Id: "primary-kill-20261123T100000Z", Scenario: "primary-kill", Phase: "done", Done: true, Verdict: "PASS",
		Events: drillEvents("drill primary-kill: 2 producers and 2 consumers on each router (us-east)", "fault injected in 41ms",
			"shard 1: new primary 127.0.0.1:3307 (us-east, epoch 2) published 2.1s after the fault", "result  PASS")})
	time.Sleep(10 * time.Millisecond) // a later start: listed first
	report(&triagev1.ReportDrillRequest{Id: "partition-20261123T101500Z", Scenario: "partition", Phase: "fault injected",
		Events: drillEvents("drill partition: 2 producers and 2 consumers on each router (us-east)",
			"fault injected in 12ms, in effect 0s before that: cut us-east off; holding 15s")})

	br := consoletest.Start(t, b.http+"/console/#drills")
	br.WaitFor("the drills page", `!document.getElementById("view-drills").hidden`)
	// A key without cluster-admin gets what the shards page says.
	br.UseKey("default", tokens["operator"])
	br.WaitFor("the refusal of the operator's key", `!document.getElementById("error").hidden && document.getElementById("error").textContent.includes("This key may not do that")`)
	refusal := consoletest.Eval[string](br, `document.getElementById("error").textContent`)
	br.Show("shards")
	// The drills page's refusal stays shown until the shards page's own
	// call is refused, so wait for the text that names its method.
	br.WaitFor("the shards page's refusal", `!document.getElementById("error").hidden && document.getElementById("error").textContent.includes("GetShardMap")`)
	require.Equal(t, strings.ReplaceAll(refusal, "ListDrills", "GetShardMap"), consoletest.Eval[string](br, `document.getElementById("error").textContent`),
		"the same refusal as the shards page, but for the method")

	br.UseKey("default", tokens["ops"])
	br.Show("drills")
	br.WaitFor("two drills", `document.getElementById("error").hidden && document.querySelectorAll("#drills-table tbody tr[data-drill]").length === 2 && document.querySelectorAll("#drill-log li").length === 2`)
	list, err := b.admin.ListDrills(ctx(), &triagev1.ListDrillsRequest{})
	require.NoError(t, err)
	require.Len(t, list.Drills, 2)
	rows := consoletest.Eval[[]drillRow](br, readDrillRows)
	require.Len(t, rows, len(list.Drills))
	for i, d := range list.Drills {
		result := "running"
		if d.Done {
			result = d.Verdict
		}
		require.Equal(t, drillRow{ID: d.Id, Scenario: d.Scenario, Phase: d.Phase, Result: result, Selected: i == 0}, rows[i])
	}
	require.Equal(t, eventTexts(list.Drills[0]), consoletest.Eval[[]string](br, readDrillLog), "the newest drill's events")

	// Live: a report while the page is shown appears within seconds.
	sent := time.Now()
	report(&triagev1.ReportDrillRequest{Id: "partition-20261123T101500Z", Phase: "healed",
		Events: drillEvents("healed in 1.2s: reconnected us-east; producing 5s more, then draining (up to 1m30s)")})
	br.WaitFor("the new event", `[...document.querySelectorAll("#drill-log li span")].some((s) => s.textContent.startsWith("healed in 1.2s")) &&
		document.querySelector("#drills-table tbody tr.selected").cells[3].textContent === "healed"`)
	require.Less(t, time.Since(sent), 10*time.Second, "the page showed the event late (it polls every second; the bound leaves room for a loaded machine)")
	list, err = b.admin.ListDrills(ctx(), &triagev1.ListDrillsRequest{})
	require.NoError(t, err)
	require.Equal(t, eventTexts(list.Drills[0]), consoletest.Eval[[]string](br, readDrillLog))
	br.Screenshot("drills")

	// Another drill's events, by clicking its row; the selection stays
	// across the polls.
	br.Do("select the older drill", chromedp.Click(chromedp.CSS(`#drills-table tr[data-drill="primary-kill-20261123T100000Z"]`)))
	br.WaitFor("its events", fmt.Sprintf(`document.querySelectorAll("#drill-log li").length === %d && document.getElementById("drill-selected").textContent === "primary-kill-20261123T100000Z"`, len(list.Drills[1].Events)))
	require.Equal(t, eventTexts(list.Drills[1]), consoletest.Eval[[]string](br, readDrillLog))
	time.Sleep(1500 * time.Millisecond)
	require.Equal(t, "primary-kill-20261123T100000Z", consoletest.Eval[string](br, `document.getElementById("drill-selected").textContent`))
	br.Screenshot("drills-selected")

	require.Empty(t, br.Problems(), "script errors or CSP refusals in the page")
}
