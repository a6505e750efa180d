package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/triage-queue/triage/cmd/triage/node"
	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
	"github.com/triage-queue/triage/routing/auth"
	"github.com/triage-queue/triage/routing/auth/authtest"
	"github.com/triage-queue/triage/routing/console/consoletest"
)

// topicRow is one row of the console's topics table as shown, with the
// titles of its priority chart's bars.
type topicRow struct {
	Topic    string   `json:"topic"`
	Ready    string   `json:"ready"`
	Leased   string   `json:"leased"`
	Delayed  string   `json:"delayed"`
	Total    string   `json:"total"`
	Oldest   string   `json:"oldest"`
	Dead     string   `json:"dead"`
	Priority []string `json:"priority"`
}

const readTopicRows = `[...document.querySelectorAll("#topics-table tbody tr[data-topic]")].map((tr) => ({
	topic: tr.dataset.topic,
	ready: tr.cells[1].textContent, leased: tr.cells[2].textContent, delayed: tr.cells[3].textContent,
	total: tr.cells[4].textContent, oldest: tr.cells[5].textContent, dead: tr.cells[6].textContent,
	priority: [...tr.cells[7].querySelectorAll("rect > title")].map((t) => t.textContent),
}))`

// TestConsoleInBrowser drives the web console in headless Chromium against
// a node with a keys file: the operator types a key with the reader and
// admin roles, the topics page shows what GetTopicStats answers, a dead
// letter is redriven by clicking through the page (and the API shows it
// back in its topic), the item page shows an item, and a cluster-admin key
// shows the shard map. A screenshot of each page is saved (consoletest:
// $TRIAGE_ARTIFACTS or the test's artifact directory). Without Chromium
// the test fails; make deps installs it.
func TestConsoleInBrowser(t *testing.T) {
	t.Parallel()
	consoletest.Need(t)
	start := time.Now()
	b := setup(t, bedOpts{noNode: true})
	keys := []auth.Key{
		// What the console needs for topics, items, dead letters and redrive.
		{Name: "operator", Namespaces: map[string][]auth.Role{"default": {auth.Reader, auth.Admin}}},
		// The test's own client.
		{Name: "app", Namespaces: map[string][]auth.Role{"default": {auth.Producer, auth.Consumer, auth.Reader}}},
		{Name: "ops", ClusterAdmin: true},
	}
	keysFile := filepath.Join(t.TempDir(), "keys.json")
	tokens := authtest.Keys(t, keysFile, keys...)
	b.startNode(node.Config{KeysFile: keysFile})
	ctx := func(key string) context.Context {
		return metadata.AppendToOutgoingContext(b.ctx(), "authorization", "Bearer "+tokens[key])
	}
	q := b.queue

	// Workload. alpha: ready at priorities 0, 0 and 2, one delayed;
	// beta: two at priority 1, one of them leased; dead: its one item
	// nacked to the dead letters, so the topic holds dead letters only
	// (ListTopics lists it all the same).
	enq := func(topic string, items ...*triagev1.NewItem) []string {
		t.Helper()
		resp, err := q.Enqueue(ctx("app"), &triagev1.EnqueueRequest{Namespace: "default", Topic: topic, Items: items})
		require.NoError(t, err)
		var ids []string
		for _, r := range resp.Results {
			ids = append(ids, r.Id)
		}
		return ids
	}
	deq := func(topic string) *triagev1.LeasedItem {
		t.Helper()
		var got []*triagev1.LeasedItem
		require.Eventually(t, func() bool {
			resp, err := q.Dequeue(ctx("app"), &triagev1.DequeueRequest{Namespace: "default",
				Topics: []*triagev1.TopicCount{{Topic: topic, Count: 1}}, LeaseDuration: durationpb.New(10 * time.Minute)})
			require.NoError(t, err)
			got = resp.Items
			return len(got) == 1
		}, 10*time.Second, 20*time.Millisecond, "dequeue from %s", topic)
		return got[0]
	}
	alpha := enq("alpha", &triagev1.NewItem{Payload: []byte("a1")}, &triagev1.NewItem{Payload: []byte("a2")},
		&triagev1.NewItem{Payload: []byte(`{"order": 42}`), Priority: 2, Metadata: map[string]string{"source": "browser test"}},
		&triagev1.NewItem{Payload: []byte("later"), Priority: 1, DeliverAfter: timestamppb.New(time.Now().Add(time.Hour))})
	enq("beta", &triagev1.NewItem{Payload: []byte("b1"), Priority: 1}, &triagev1.NewItem{Payload: []byte("b2"), Priority: 1})
	deq("beta")
	dead := enq("dead", &triagev1.NewItem{Payload: []byte("poison"), Priority: 3})[0]
	it := deq("dead")
	require.Equal(t, dead, it.Id)
	nack, err := q.Nack(ctx("app"), &triagev1.NackRequest{Namespace: "default", Nacks: []*triagev1.NackItem{
		{Id: dead, LeaseToken: it.LeaseToken, DeadLetter: true, Error: "cannot parse the payload"}}})
	require.NoError(t, err)
	require.True(t, nack.Results[0].Ok, "%v", nack.Results[0])

	stats := func() map[string]*triagev1.TopicStats {
		t.Helper()
		out := map[string]*triagev1.TopicStats{}
		for _, topic := range []string{"alpha", "beta", "dead"} {
			s, err := q.GetTopicStats(ctx("app"), &triagev1.GetTopicStatsRequest{Namespace: "default", Topic: topic})
			require.NoError(t, err)
			out[topic] = s
		}
		return out
	}
	// The enqueues are stored when the API counts them all.
	var before map[string]*triagev1.TopicStats
	require.Eventually(t, func() bool {
		before = stats()
		return before["alpha"].Total == 4 && before["beta"].Total == 2 && before["dead"].Total == 0 && before["dead"].DeadLetters == 1
	}, 10*time.Second, 20*time.Millisecond)

	br := consoletest.Start(t, b.http+"/console/")

	// Without a key the API refuses, and the page says why.
	br.WaitFor("the refusal without a key", `!document.getElementById("error").hidden`)
	require.Contains(t, consoletest.Eval[string](br, `document.getElementById("error").textContent`), "The API wants a key")

	// Topics page, with the operator's key.
	br.UseKey("default", tokens["operator"])
	br.WaitFor("the three topics", `document.getElementById("error").hidden && document.querySelectorAll("#topics-table tbody tr[data-topic]").length === 3`)
	rows := consoletest.Eval[[]topicRow](br, readTopicRows)
	chart := consoletest.Eval[[]string](br, `[...document.querySelectorAll("#topics-chart rect > title")].map((t) => t.textContent)`)
	after := stats()
	shot := br.Screenshot("topics")

	var wantChart []string
	for _, row := range rows {
		s := after[row.Topic]
		require.NotNil(t, s, "the page shows topic %q, which the test never used", row.Topic)
		require.Equal(t, before[row.Topic].Ready, after[row.Topic].Ready, "the workload is still")
		require.Equal(t, fmt.Sprint(s.Ready), row.Ready, "%s ready", row.Topic)
		require.Equal(t, fmt.Sprint(s.Leased), row.Leased, "%s leased", row.Topic)
		require.Equal(t, fmt.Sprint(s.Delayed), row.Delayed, "%s delayed", row.Topic)
		require.Equal(t, fmt.Sprint(s.Total), row.Total, "%s total", row.Topic)
		require.Equal(t, fmt.Sprint(s.DeadLetters), row.Dead, "%s dead letters", row.Topic)
		prio := []string{}
		for _, p := range s.ReadyByPriority {
			prio = append(prio, fmt.Sprintf("priority %d: %d ready", p.Priority, p.Ready))
		}
		require.Equal(t, prio, row.Priority, "%s ready by priority", row.Topic)
		// The page computed the age between the two reads of the API. Every
		// topic with ready items has one, also when they all wait in a
		// dequeuer's prefetch buffer (beta's second item often does, after
		// the dequeue above): store.TopicStats reads their ready_since.
		if s.Ready == 0 {
			require.Nil(t, s.OldestReadyAge, "%s has nothing ready", row.Topic)
			require.Equal(t, "–", row.Oldest, "%s has no oldest ready age", row.Topic)
		} else {
			require.NotNil(t, before[row.Topic].OldestReadyAge, "%s has ready items, so an oldest ready age", row.Topic)
			require.NotNil(t, s.OldestReadyAge, "%s has ready items, so an oldest ready age", row.Topic)
			lo, hi := before[row.Topic].OldestReadyAge.AsDuration(), s.OldestReadyAge.AsDuration()
			shown := parseAge(t, row.Oldest)
			require.True(t, shown >= lo-100*time.Millisecond && shown <= hi+100*time.Millisecond,
				"%s oldest ready %q is not within the API's %s..%s", row.Topic, row.Oldest, lo, hi)
		}
		for part, n := range map[string]int64{"ready": s.Ready, "leased": s.Leased, "delayed": s.Delayed} {
			if n > 0 {
				wantChart = append(wantChart, fmt.Sprintf("%s: %d", part, n))
			}
		}
	}
	require.Len(t, rows, 3)
	require.ElementsMatch(t, wantChart, chart, "the depth chart's bars")
	require.Equal(t, []string{"alpha", "beta", "dead"}, []string{rows[0].Topic, rows[1].Topic, rows[2].Topic})
	require.Equal(t, []string{"3", "0", "1", "4", "0"}, []string{rows[0].Ready, rows[0].Leased, rows[0].Delayed, rows[0].Total, rows[0].Dead},
		"alpha as enqueued")
	require.Equal(t, []string{"1", "1", "0", "2"}, []string{rows[1].Ready, rows[1].Leased, rows[1].Delayed, rows[1].Total}, "beta as enqueued")
	require.Equal(t, []string{"0", "0", "1"}, []string{rows[2].Ready, rows[2].Total, rows[2].Dead}, "dead: its one item dead-lettered")
	t.Logf("topics page matches GetTopicStats: %s", shot)

	// Dead letters: from the topic's count, select the letter, redrive.
	br.Do("open dead's letters", chromedp.Click(chromedp.CSS(`#topics-table tr[data-topic="dead"] a`)))
	pick := fmt.Sprintf(`#dl-table input.dl-pick[value=%q]`, dead)
	br.WaitFor("the dead letter listed", fmt.Sprintf(`!document.getElementById("view-deadletters").hidden && document.querySelector(%q) !== null`, pick))
	letter := consoletest.Eval[[]string](br, fmt.Sprintf(`[...document.querySelector(%q).closest("tr").cells].map((c) => c.textContent)`, pick))
	require.Equal(t, dead, letter[1])
	require.Equal(t, "3", letter[2], "priority")
	require.Equal(t, "1", letter[3], "attempts")
	require.Equal(t, "cannot parse the payload", letter[4])
	require.Equal(t, "poison", letter[7], "payload decoded")
	require.Equal(t, "1 dead letter(s)", consoletest.Eval[string](br, `document.getElementById("dl-status").textContent`))
	br.Screenshot("deadletters")
	br.Do("select and redrive", chromedp.Click(chromedp.CSS(pick)), chromedp.Click(chromedp.ID("dl-redrive-selected")))
	br.WaitFor("the redrive's answer", `document.getElementById("dl-status").textContent.startsWith("Redriven: 1.") && document.querySelectorAll("#dl-table tbody tr").length === 0`)
	require.Equal(t, []string{"Redrive 1 dead letter(s)?"}, br.Dialogs(), "the page asked first")
	br.Screenshot("deadletters-redriven")
	// The API agrees: back in its topic, ready, and no dead letter left.
	left, err := q.ListDeadLetters(ctx("app"), &triagev1.ListDeadLettersRequest{Namespace: "default", Topic: "dead", PageSize: 100})
	require.NoError(t, err)
	require.Empty(t, left.DeadLetters)
	item, err := q.GetItem(ctx("app"), &triagev1.GetItemRequest{Namespace: "default", Id: dead})
	require.NoError(t, err)
	require.Equal(t, "dead", item.Topic)
	require.Equal(t, triagev1.ItemState_READY, item.State)
	s, err := q.GetTopicStats(ctx("app"), &triagev1.GetTopicStatsRequest{Namespace: "default", Topic: "dead"})
	require.NoError(t, err)
	require.Equal(t, []int64{1, 0}, []int64{s.Ready, s.DeadLetters})
	require.Equal(t, dead, deq("dead").Id, "delivered again")

	// Item page.
	br.Show("item")
	br.Do("look up an item", chromedp.SetValue(chromedp.ID("item-id"), alpha[2]), chromedp.Click(chromedp.CSS(`#item-form button[type="submit"]`)))
	br.WaitFor("the item's detail", fmt.Sprintf(`[...document.querySelectorAll("#item-detail dd")].some((d) => d.textContent === %q)`, alpha[2]))
	detail := consoletest.Eval[map[string]string](br, `Object.fromEntries([...document.querySelectorAll("#item-detail dt")].map((dt) => [dt.textContent, dt.nextElementSibling.textContent]))`)
	require.Equal(t, "alpha", detail["Topic"])
	require.Equal(t, "READY", detail["State"])
	require.Equal(t, "2", detail["Priority"])
	require.Equal(t, `{"order": 42}`, detail["Payload"])
	require.Contains(t, detail["Metadata"], `"source": "browser test"`)
	br.Screenshot("item")

	// Shards page: the operator's key is refused (cluster-admin), ops'
	// shows the map; no controller runs, which the page says.
	br.Show("shards")
	br.WaitFor("the refusal of the operator's key", `!document.getElementById("error").hidden`)
	require.Contains(t, consoletest.Eval[string](br, `document.getElementById("error").textContent`), "This key may not do that")
	br.UseKey("default", tokens["ops"])
	br.WaitFor("the shard map", `document.getElementById("error").hidden && document.querySelectorAll("#shards-table tbody tr").length === 2 && !document.getElementById("failovers-note").hidden`)
	m, err := b.admin.GetShardMap(ctx("ops"), &triagev1.GetShardMapRequest{})
	require.NoError(t, err)
	shown := consoletest.Eval[[][]string](br, `[...document.querySelectorAll("#shards-table tbody tr")].map((tr) => [...tr.cells].map((c) => c.textContent))`)
	for i, sh := range m.Shards {
		require.Equal(t, []string{fmt.Sprint(sh.Id), sh.HomeRegion, sh.Primary, "us-east", "–", fmt.Sprint(sh.Epoch), "serving", "1"}, shown[i])
	}
	require.Equal(t, fmt.Sprintf("version %d", m.Version), consoletest.Eval[string](br, `document.getElementById("map-version").textContent`))
	require.Contains(t, consoletest.Eval[string](br, `document.getElementById("failovers-note").textContent`), "Failover history unavailable")
	br.Screenshot("shards")

	require.Empty(t, br.Problems(), "script errors or CSP refusals in the page")
	t.Logf("took %s", time.Since(start).Round(time.Millisecond))
}

// parseAge reads an age as the console formats it ("850 ms", "12.3 s",
// "4 min").
func parseAge(t *testing.T, s string) time.Duration {
	t.Helper()
	m := regexp.MustCompile(`^([\d.]+) (ms|s|min|h|d)$`).FindStringSubmatch(strings.TrimSpace(s))
	require.NotNil(t, m, "age %q", s)
	v, err := strconv.ParseFloat(m[1], 64)
	require.NoError(t, err)
	unit := map[string]time.Duration{"ms": time.Millisecond, "s": time.Second, "min": time.Minute, "h": time.Hour, "d": 24 * time.Hour}[m[2]]
	return time.Duration(v * float64(unit))
}
