package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/triage-queue/triage/cmd/triage/node"
	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
	"github.com/triage-queue/triage/routing/auth"
	"github.com/triage-queue/triage/routing/auth/authtest"
	"github.com/triage-queue/triage/routing/console/consoletest"
)

// TestConsolePauseAndDeleteInBrowser drives the console's topic and
// dead-letter controls in headless Chromium with a key holding reader and
// admin: pausing a topic shows its badge and the API says it is paused,
// resuming clears both; deleting the selected dead letter and then all of
// a topic's leaves the API with none. The page asks before each.
func TestConsolePauseAndDeleteInBrowser(t *testing.T) {
	t.Parallel()
	consoletest.Need(t)
	b := setup(t, bedOpts{noNode: true})
	keysFile := filepath.Join(t.TempDir(), "keys.json")
	tokens := authtest.Keys(t, keysFile,
		auth.Key{Name: "operator", Namespaces: map[string][]auth.Role{"default": {auth.Reader, auth.Admin}}},
		auth.Key{Name: "app", Namespaces: map[string][]auth.Role{"default": {auth.Producer, auth.Consumer, auth.Reader}}})
	b.startNode(node.Config{KeysFile: keysFile})
	ctx := func() context.Context {
		return metadata.AppendToOutgoingContext(b.ctx(), "authorization", "Bearer "+tokens["app"])
	}
	q := b.queue
	_, err := q.Enqueue(ctx(), &triagev1.EnqueueRequest{Namespace: "default", Topic: "alpha", Items: []*triagev1.NewItem{{Payload: []byte("a")}}})
	require.NoError(t, err)
	items := make([]*triagev1.NewItem, 3)
	for i := range items {
		items[i] = &triagev1.NewItem{Payload: fmt.Appendf(nil, "poison %d", i)}
	}
	_, err = q.Enqueue(ctx(), &triagev1.EnqueueRequest{Namespace: "default", Topic: "dead", Items: items})
	require.NoError(t, err)
	dead := 0
	require.Eventually(t, func() bool {
		resp, err := q.Dequeue(ctx(), &triagev1.DequeueRequest{Namespace: "default",
			Topics: []*triagev1.TopicCount{{Topic: "dead", Count: 3}}, LeaseDuration: durationpb.New(time.Minute)})
		require.NoError(t, err)
		nack := &triagev1.NackRequest{Namespace: "default"}
		for _, it := range resp.Items {
			nack.Nacks = append(nack.Nacks, &triagev1.NackItem{Id: it.Id, LeaseToken: it.LeaseToken, DeadLetter: true})
		}
		if len(nack.Nacks) > 0 {
			_, err = q.Nack(ctx(), nack)
			require.NoError(t, err)
			dead += len(nack.Nacks)
		}
		return dead == 3
	}, 10*time.Second, 20*time.Millisecond)
	paused := func(topic string) bool {
		s, err := q.GetTopicStats(ctx(), &triagev1.GetTopicStatsRequest{Namespace: "default", Topic: topic})
		require.NoError(t, err)
		return s.Paused
	}

	br := consoletest.Start(t, b.http+"/console/")
	br.UseKey("default", tokens["operator"])
	br.WaitFor("the two topics", `document.getElementById("error").hidden && document.querySelectorAll("#topics-table tbody tr[data-topic]").length === 2`)
	br.Do("stop the auto refresh", chromedp.Click(chromedp.ID("auto")))

	badge := `document.querySelector('#topics-table tr[data-topic="alpha"] .badge.paused')`
	require.False(t, consoletest.Eval[bool](br, badge+` !== null`))
	br.Do("pause alpha", chromedp.Click(chromedp.CSS(`#topics-table tr[data-topic="alpha"] button.pause`)))
	br.WaitFor("alpha's paused badge", badge+` !== null && document.querySelector('#topics-table tr[data-topic="alpha"] button.resume') !== null`)
	require.True(t, paused("alpha"), "the API says alpha is paused")
	require.False(t, paused("dead"))
	br.Screenshot("topics-paused")
	br.Do("resume alpha", chromedp.Click(chromedp.CSS(`#topics-table tr[data-topic="alpha"] button.resume`)))
	br.WaitFor("alpha without its badge", badge+` === null && document.querySelector('#topics-table tr[data-topic="alpha"] button.pause') !== null`)
	require.False(t, paused("alpha"))

	letters := func() []string { return deadLetterIDsAs(t, b, ctx(), "dead") }
	ids := letters()
	require.Len(t, ids, 3)
	br.Do("open dead's letters", chromedp.Click(chromedp.CSS(`#topics-table tr[data-topic="dead"] a`)))
	pick := fmt.Sprintf(`#dl-table input.dl-pick[value=%q]`, ids[0])
	br.WaitFor("the dead letters listed", fmt.Sprintf(`document.querySelector(%q) !== null && document.querySelectorAll("#dl-table tbody tr").length === 3`, pick))
	br.Do("select one and delete it", chromedp.Click(chromedp.CSS(pick)), chromedp.Click(chromedp.ID("dl-delete-selected")))
	br.WaitFor("the delete's answer", `document.getElementById("dl-status").textContent.startsWith("Deleted: 1.") && document.querySelectorAll("#dl-table tbody tr").length === 2`)
	require.ElementsMatch(t, ids[1:], letters(), "the selected one is gone")
	br.Do("delete all", chromedp.Click(chromedp.ID("dl-delete-all")))
	br.WaitFor("the purge's answer", `document.getElementById("dl-status").textContent.startsWith("Deleted: 2.") && document.querySelectorAll("#dl-table tbody tr").length === 0`)
	require.Empty(t, letters())
	br.Screenshot("deadletters-deleted")

	require.Equal(t, []string{
		"Pause deliveries of alpha? Dequeues get nothing of it until it is resumed; enqueues go on.",
		"Delete 1 dead letter(s) for good?",
		"Delete every dead letter of dead for good?",
	}, br.Dialogs(), "the page asked before pausing and deleting")
	require.Empty(t, br.Problems())
}

// deadLetterIDsAs lists the dead letters of topic in "default" with the
// credentials in ctx.
func deadLetterIDsAs(t *testing.T, b *bed, ctx context.Context, topic string) []string {
	t.Helper()
	resp, err := b.queue.ListDeadLetters(ctx, &triagev1.ListDeadLettersRequest{Namespace: "default", Topic: topic, PageSize: 1000})
	require.NoError(t, err)
	var out []string
	for _, d := range resp.DeadLetters {
		out = append(out, d.Id)
	}
	return out
}
