package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/triage-queue/triage/cmd/triage/node"
	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
	"github.com/triage-queue/triage/routing/auth"
	"github.com/triage-queue/triage/routing/auth/authtest"
	"github.com/triage-queue/triage/routing/console/consoletest"
)

// browseBed is the workload of TestConsoleItemsInBrowser: topic jobs of
// "default" with 20 ready items at priorities 0 to 3, 2 leased and 2
// delayed, across the bed's two shards; 105 dead letters of poison; and
// items of "other" in a topic of the same name, which the console on
// "default" must never show.
type browseBed struct {
	*bed
	t      *testing.T
	tokens map[string]string
	leased []string
	other  []string
	dead   []string
	// deleted is the item the test deletes from the list.
	deleted string
}

func (bb *browseBed) ctx(key string) context.Context {
	return metadata.AppendToOutgoingContext(bb.bed.ctx(), "authorization", "Bearer "+bb.tokens[key])
}

func setupBrowse(t *testing.T) *browseBed {
	b := setup(t, bedOpts{noNode: true})
	keysFile := filepath.Join(t.TempDir(), "keys.json")
	tokens := authtest.Keys(t, keysFile,
		// What the console needs to browse, change and delete items,
		// pause topics and delete dead letters.
		auth.Key{Name: "operator", Namespaces: map[string][]auth.Role{"default": {auth.Reader, auth.Admin, auth.Producer}}},
		auth.Key{Name: "app", Namespaces: map[string][]auth.Role{"default": {auth.Producer, auth.Consumer, auth.Reader}}},
		auth.Key{Name: "tenant", Namespaces: map[string][]auth.Role{"other": {auth.Producer, auth.Reader}}})
	b.startNode(node.Config{KeysFile: keysFile})
	bb := &browseBed{bed: b, t: t, tokens: tokens}
	q := b.queue
	var jobs []*triagev1.NewItem
	for i := range 23 {
		jobs = append(jobs, &triagev1.NewItem{Priority: int32(i % 4), Payload: fmt.Appendf(nil, "job-%02d", i)})
	}
	for range 2 {
		jobs = append(jobs, &triagev1.NewItem{Priority: 1, Payload: []byte("later"), DeliverAfter: timestamppb.New(time.Now().Add(time.Hour))})
	}
	// One call each: a call's items go to one shard, calls to the shards
	// in turn.
	for _, it := range jobs {
		_, err := q.Enqueue(bb.ctx("app"), &triagev1.EnqueueRequest{Namespace: "default", Topic: "jobs", Items: []*triagev1.NewItem{it}})
		require.NoError(t, err)
	}
	resp, err := q.Enqueue(bb.ctx("tenant"), &triagev1.EnqueueRequest{Namespace: "other", Topic: "jobs", Items: copies(5, &triagev1.NewItem{Payload: []byte("theirs")})})
	require.NoError(t, err)
	for _, r := range resp.Results {
		bb.other = append(bb.other, r.Id)
	}
	held := bb.lease("jobs", 3)
	ackResp, err := q.Ack(bb.ctx("app"), &triagev1.AckRequest{Namespace: "default", Acks: []*triagev1.LeaseRef{{Id: held[0].Id, LeaseToken: held[0].LeaseToken}}})
	require.NoError(t, err)
	require.True(t, ackResp.Results[0].Ok)
	bb.leased = []string{held[1].Id, held[2].Id}
	_, err = q.Enqueue(bb.ctx("app"), &triagev1.EnqueueRequest{Namespace: "default", Topic: "poison", Items: copies(105, &triagev1.NewItem{Payload: []byte("poison")})})
	require.NoError(t, err)
	for len(bb.dead) < 105 {
		nack := &triagev1.NackRequest{Namespace: "default"}
		for _, it := range bb.lease("poison", int32(min(50, 105-len(bb.dead)))) {
			nack.Nacks = append(nack.Nacks, &triagev1.NackItem{Id: it.Id, LeaseToken: it.LeaseToken, DeadLetter: true, Error: "unparsable"})
			bb.dead = append(bb.dead, it.Id)
		}
		_, err = q.Nack(bb.ctx("app"), nack)
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool {
		s, err := q.GetTopicStats(bb.ctx("app"), &triagev1.GetTopicStatsRequest{Namespace: "default", Topic: "jobs"})
		require.NoError(t, err)
		return s.Ready == 20 && s.Leased == 2 && s.Delayed == 2
	}, 10*time.Second, 20*time.Millisecond, "jobs as enqueued")
	return bb
}

// lease dequeues n items of topic in "default", for 10 minutes.
func (bb *browseBed) lease(topic string, n int32) []*triagev1.LeasedItem {
	bb.t.Helper()
	var got []*triagev1.LeasedItem
	require.Eventually(bb.t, func() bool {
		resp, err := bb.queue.Dequeue(bb.ctx("app"), &triagev1.DequeueRequest{Namespace: "default",
			Topics: []*triagev1.TopicCount{{Topic: topic, Count: n - int32(len(got))}}, LeaseDuration: durationpb.New(10 * time.Minute)})
		require.NoError(bb.t, err)
		got = append(got, resp.Items...)
		return len(got) == int(n)
	}, 10*time.Second, 20*time.Millisecond, "dequeue %d from %s", n, topic)
	return got
}

// items lists every item of jobs in state through the API.
func (bb *browseBed) items(state string) []*triagev1.Item {
	bb.t.Helper()
	resp, err := bb.queue.ListItems(bb.ctx("app"), &triagev1.ListItemsRequest{Namespace: "default", Topic: "jobs", State: state, PageSize: 500})
	require.NoError(bb.t, err)
	require.Empty(bb.t, resp.NextPageToken)
	return resp.Items
}

const (
	shownIDs        = `[...document.querySelectorAll("#items-table tbody tr[data-id]")].map((tr) => tr.dataset.id)`
	shownPriorities = `[...document.querySelectorAll("#items-table tbody tr[data-id]")].map((tr) => tr.cells[1].textContent)`
)

// TestConsoleItemsInBrowser drives the console's item browser in headless
// Chromium with a key holding reader, producer and admin on "default":
// the throughput chart shows the workload's traffic; a topic's ready
// items page by ten across both shards in the order the API lists them,
// filter by priority and by state; a priority change and a delete from
// the list show in the API; the topic pauses and resumes from its page;
// dead letters page by a hundred and one is deleted from its row. Items
// of namespace "other" never show, and its key cannot read "default"'s
// throughput.
func TestConsoleItemsInBrowser(t *testing.T) {
	t.Parallel()
	consoletest.Need(t)
	bb := setupBrowse(t)
	_, err := bb.queue.GetThroughput(bb.ctx("tenant"), &triagev1.GetThroughputRequest{Namespace: "default"})
	require.Equal(t, codes.PermissionDenied, status.Code(err), "another tenant's figures: %v", err)

	br := consoletest.Start(t, bb.http+"/console/")
	br.UseKey("default", bb.tokens["operator"])
	br.WaitFor("the topics and the throughput chart", `document.getElementById("error").hidden && document.querySelectorAll("#topics-table tbody tr[data-topic]").length === 2 &&
		document.querySelectorAll("#throughput-chart polyline").length === 4`)
	br.Do("stop the auto refresh", chromedp.Click(chromedp.ID("auto")))
	peaks := consoletest.Eval[map[string]float64](br, `Object.fromEntries([...document.querySelectorAll("#throughput-chart polyline")].map((l) => [l.dataset.series, Number(l.dataset.peak)]))`)
	for _, s := range []string{"enqueued", "delivered", "acked", "dead_lettered"} {
		require.Greater(t, peaks[s], 0.0, "the chart's %s line after the workload: %v", s, peaks)
	}
	br.Screenshot("throughput")

	browsePages(t, bb, br)
	browseActions(t, bb, br)
	browseDeadLetters(t, bb, br)

	require.Equal(t, []string{
		"Delete item " + bb.deleted + " for good?",
		"Pause deliveries of jobs? Dequeues get nothing of it until it is resumed; enqueues go on.",
		"Delete 1 dead letter(s) for good?",
	}, br.Dialogs(), "the page asked before deleting and pausing")
	require.Empty(t, br.Problems(), "script errors or CSP refusals in the page")
}

// browsePages pages through jobs' ready items ten at a time, filters by
// priority and lists the other states.
func browsePages(t *testing.T, bb *browseBed, br *consoletest.Browser) {
	ready := bb.items("ready")
	require.Len(t, ready, 20)
	var want []string
	for i, it := range ready {
		want = append(want, it.Id)
		require.NotContains(t, bb.leased, it.Id)
		if i > 0 {
			require.LessOrEqual(t, ready[i-1].Priority, it.Priority, "the API lists in priority order")
		}
	}
	shards := map[string]bool{}
	byPriority := map[int32]int{}
	for _, it := range ready {
		shard, _, _ := strings.Cut(it.Id, "-")
		shards[shard] = true
		byPriority[it.Priority]++
	}
	require.Len(t, shards, 2, "ready items on both shards: %v", want)

	br.Do("browse jobs", chromedp.Click(chromedp.CSS(`#topics-table tr[data-topic="jobs"] button.browse`)))
	br.WaitFor("jobs' ready items", `!document.getElementById("view-items").hidden && document.querySelectorAll("#items-table tbody tr[data-id]").length === 20`)
	require.Equal(t, want, consoletest.Eval[[]string](br, shownIDs), "one page of 50: as the API lists them")
	br.Do("ten per page", chromedp.SetValue(chromedp.ID("items-size"), "10"), chromedp.Click(chromedp.CSS(`#items-form button[type="submit"]`)))
	br.WaitFor("page 1", `document.getElementById("items-page").textContent === "page 1, 10 ready item(s)" && !document.getElementById("items-next").disabled`)
	require.Equal(t, want[:10], consoletest.Eval[[]string](br, shownIDs))
	br.Screenshot("items")
	br.Do("next page", chromedp.Click(chromedp.ID("items-next")))
	br.WaitFor("page 2, the last", `document.getElementById("items-page").textContent === "page 2, 10 ready item(s)" && document.getElementById("items-next").disabled`)
	require.Equal(t, want[10:], consoletest.Eval[[]string](br, shownIDs), "the second page goes on where the first stopped, across shards")
	br.Do("previous page", chromedp.Click(chromedp.ID("items-prev")))
	br.WaitFor("page 1 again", `document.getElementById("items-page").textContent.startsWith("page 1,") && document.getElementById("items-prev").disabled`)
	require.Equal(t, want[:10], consoletest.Eval[[]string](br, shownIDs))

	br.Do("priorities 1 to 2, 50 per page", chromedp.SetValue(chromedp.ID("items-size"), "50"), chromedp.SetValue(chromedp.ID("items-min"), "1"),
		chromedp.SetValue(chromedp.ID("items-max"), "2"), chromedp.Click(chromedp.CSS(`#items-form button[type="submit"]`)))
	n1, n2 := byPriority[1], byPriority[2]
	require.NotZero(t, n1*n2, "ready items of priority 1 and 2: %v", byPriority)
	br.WaitFor("priorities 1 and 2", fmt.Sprintf(`document.getElementById("items-page").textContent === "page 1, %d ready item(s)" &&
		%s.every((p) => p === "1" || p === "2")`, n1+n2, shownPriorities))
	require.Equal(t, append(slices.Repeat([]string{"1"}, n1), slices.Repeat([]string{"2"}, n2)...), consoletest.Eval[[]string](br, shownPriorities))

	br.Do("leased", chromedp.SetValue(chromedp.ID("items-min"), ""), chromedp.SetValue(chromedp.ID("items-max"), ""),
		chromedp.SetValue(chromedp.ID("items-state"), "leased"), chromedp.Click(chromedp.CSS(`#items-form button[type="submit"]`)))
	br.WaitFor("the leased items", `document.getElementById("items-page").textContent === "page 1, 2 leased item(s)"`)
	require.ElementsMatch(t, bb.leased, consoletest.Eval[[]string](br, shownIDs))
	br.Do("delayed", chromedp.SetValue(chromedp.ID("items-state"), "delayed"), chromedp.Click(chromedp.CSS(`#items-form button[type="submit"]`)))
	br.WaitFor("the delayed items", `document.getElementById("items-page").textContent === "page 1, 2 delayed item(s)"`)
	var delayed []string
	for _, it := range bb.items("delayed") {
		delayed = append(delayed, it.Id)
	}
	require.Equal(t, delayed, consoletest.Eval[[]string](br, shownIDs))
	for _, id := range bb.other {
		require.NotContains(t, want, id, "another namespace's item")
	}
}

// browseActions changes an item's priority and deletes another from
// the list of priority 3, then pauses and resumes jobs from its page.
func browseActions(t *testing.T, bb *browseBed, br *consoletest.Browser) {
	br.Do("priority 3", chromedp.SetValue(chromedp.ID("items-state"), "ready"), chromedp.SetValue(chromedp.ID("items-min"), "3"),
		chromedp.SetValue(chromedp.ID("items-max"), "3"), chromedp.Click(chromedp.CSS(`#items-form button[type="submit"]`)))
	n := 0
	for _, it := range bb.items("ready") {
		if it.Priority == 3 {
			n++
		}
	}
	require.GreaterOrEqual(t, n, 3)
	br.WaitFor("the ready items of priority 3", fmt.Sprintf(`document.getElementById("items-page").textContent === "page 1, %d ready item(s)"`, n))
	ids := consoletest.Eval[[]string](br, shownIDs)
	row := fmt.Sprintf(`#items-table tr[data-id=%q]`, ids[0])
	br.Do("set its priority to 0", chromedp.SetValue(chromedp.CSS(row+` input.prio-input`), "0"), chromedp.Click(chromedp.CSS(row+` button.set-priority`)))
	br.WaitFor("the change's answer", fmt.Sprintf(`document.getElementById("items-status").textContent === "Priority of %s set to 0." &&
		document.querySelectorAll("#items-table tbody tr[data-id]").length === %d`, ids[0], n-1))
	it, err := bb.queue.GetItem(bb.ctx("app"), &triagev1.GetItemRequest{Namespace: "default", Id: ids[0]})
	require.NoError(t, err)
	require.Equal(t, []any{int32(0), int32(3), "console"}, []any{it.Priority, it.OriginalPriority, it.PriorityChangedBy})

	bb.deleted = ids[1]
	br.Do("delete another", chromedp.Click(chromedp.CSS(fmt.Sprintf(`#items-table tr[data-id=%q] button.delete-item`, ids[1]))))
	br.WaitFor("the delete's answer", fmt.Sprintf(`document.getElementById("items-status").textContent === "Deleted %s." &&
		document.querySelectorAll("#items-table tbody tr[data-id]").length === %d`, ids[1], n-2))
	require.Equal(t, ids[2:], consoletest.Eval[[]string](br, shownIDs))
	_, err = bb.queue.GetItem(bb.ctx("app"), &triagev1.GetItemRequest{Namespace: "default", Id: ids[1]})
	require.Equal(t, codes.NotFound, status.Code(err), "deleted: %v", err)

	paused := func() bool {
		s, err := bb.queue.GetTopicStats(bb.ctx("app"), &triagev1.GetTopicStatsRequest{Namespace: "default", Topic: "jobs"})
		require.NoError(t, err)
		return s.Paused
	}
	require.True(t, consoletest.Eval[bool](br, `document.getElementById("items-paused").hidden`))
	br.Do("pause jobs", chromedp.Click(chromedp.CSS(`#items-toggle.pause`)))
	br.WaitFor("the paused badge", `!document.getElementById("items-paused").hidden && document.getElementById("items-toggle").textContent === "Resume"`)
	require.True(t, paused(), "the API says jobs is paused")
	br.Screenshot("items-paused")
	br.Do("resume jobs", chromedp.Click(chromedp.CSS(`#items-toggle.resume`)))
	br.WaitFor("no badge", `document.getElementById("items-paused").hidden && document.getElementById("items-toggle").textContent === "Pause"`)
	require.False(t, paused())
}

// browseDeadLetters pages through poison's 105 dead letters and deletes
// one from its row.
func browseDeadLetters(t *testing.T, bb *browseBed, br *consoletest.Browser) {
	letters := func() []string {
		resp, err := bb.queue.ListDeadLetters(bb.ctx("app"), &triagev1.ListDeadLettersRequest{Namespace: "default", Topic: "poison", PageSize: 1000})
		require.NoError(t, err)
		var out []string
		for _, d := range resp.DeadLetters {
			out = append(out, d.Id)
		}
		return out
	}
	all := letters()
	require.ElementsMatch(t, bb.dead, all)
	shown := `[...document.querySelectorAll("#dl-table tbody tr[data-id]")].map((tr) => tr.dataset.id)`
	br.Show("deadletters")
	br.Do("list poison's", chromedp.SetValue(chromedp.ID("dl-topic"), "poison"), chromedp.Click(chromedp.CSS(`#dl-form button[type="submit"]`)))
	br.WaitFor("the first hundred", `document.getElementById("dl-page").textContent === "page 1" && document.querySelectorAll("#dl-table tbody tr[data-id]").length === 100 &&
		!document.getElementById("dl-next").disabled`)
	require.Equal(t, all[:100], consoletest.Eval[[]string](br, shown))
	br.Do("next page", chromedp.Click(chromedp.ID("dl-next")))
	br.WaitFor("the last five", `document.getElementById("dl-page").textContent === "page 2" && document.querySelectorAll("#dl-table tbody tr[data-id]").length === 5 &&
		document.getElementById("dl-next").disabled`)
	require.Equal(t, all[100:], consoletest.Eval[[]string](br, shown))
	br.Do("delete one from its row", chromedp.Click(chromedp.CSS(fmt.Sprintf(`#dl-table tr[data-id=%q] button.delete-one`, all[101]))))
	br.WaitFor("the delete's answer", `document.getElementById("dl-status").textContent.startsWith("Deleted: 1.") && document.querySelectorAll("#dl-table tbody tr[data-id]").length === 4`)
	require.Equal(t, append(slices.Clone(all[:101]), all[102:]...), letters(), "that one is gone, the others stay")
	br.Do("previous page", chromedp.Click(chromedp.ID("dl-prev")))
	br.WaitFor("the first hundred again", `document.getElementById("dl-page").textContent === "page 1" && document.querySelectorAll("#dl-table tbody tr[data-id]").length === 100`)
}
