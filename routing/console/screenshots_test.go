package console_test

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/triage-queue/triage/deploy/bed"
	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
	"github.com/triage-queue/triage/routing/console/consoletest"
)

var screenshots = flag.String("screenshots", "", "TestConsoleScreenshots writes the README's screenshots of the console into this directory (screenshots, from this package)")

// TestConsoleScreenshots refreshes the README's screenshots of the console
// (routing/console/screenshots): it starts the three-region bed with
// authentication in this process, puts some load on it (topics at several
// priorities, leased and delayed items, dead letters, so the throughput
// chart has lines), fails a shard over
// (planned) for the failover history, and photographs each page through
// headless Chromium, as an operator with the bed's key sees it:
//
//	go test ./routing/console -run TestConsoleScreenshots -screenshots screenshots
//
// Without -screenshots it does nothing: TestConsoleInBrowser
// (e2e) is the console's test.
func TestConsoleScreenshots(t *testing.T) {
	if *screenshots == "" {
		t.Skip("a generator, not a test: -screenshots DIR writes the README's screenshots")
	}
	consoletest.Need(t)
	out, err := filepath.Abs(*screenshots)
	require.NoError(t, err)
	require.NoError(t, os.MkdirAll(out, 0o755))

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	b, err := bed.Start(ctx, bed.Config{Dir: t.TempDir(), Regions: bed.DefaultRegions, NATSPort: -1, Auth: true,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	defer b.Stop()
	l := b.Layout
	rctx := func() context.Context {
		return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+l.Token)
	}
	conn, err := grpc.NewClient(l.Regions[0].GRPC, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	q, admin := triagev1.NewQueueClient(conn), triagev1.NewAdminClient(conn)

	// Load: topics with items at several priorities, some leased, some
	// delayed, and dead letters with the errors their consumers gave.
	rng := rand.New(rand.NewPCG(14, 1))
	var itemID string
	for _, tp := range []struct {
		topic      string
		n, maxPrio int
		delayed    int
	}{{"emails", 180, 4, 10}, {"invoices", 60, 2, 0}, {"thumbnails", 320, 1, 0}, {"webhooks", 90, 3, 25}, {"reports", 12, 0, 12}} {
		var items []*triagev1.NewItem
		for i := range tp.n {
			it := &triagev1.NewItem{Priority: int32(rng.IntN(tp.maxPrio + 1)),
				Payload: fmt.Appendf(nil, `{"%s_id": %d, "customer": "c-%04d"}`, tp.topic[:len(tp.topic)-1], 1000+i, rng.IntN(10000))}
			if i < tp.delayed {
				it.DeliverAfter = timestamppb.New(time.Now().Add(time.Duration(5+rng.IntN(55)) * time.Minute))
			}
			if tp.topic == "invoices" && i == 7 {
				it.Metadata = map[string]string{"tenant": "acme", "trace": "checkout"}
				it.DedupKey = "invoice-1007"
			}
			items = append(items, it)
		}
		resp, err := q.Enqueue(rctx(), &triagev1.EnqueueRequest{Namespace: "default", Topic: tp.topic, Items: items})
		require.NoError(t, err)
		if tp.topic == "invoices" {
			itemID = resp.Results[7].Id
		}
	}
	lease := func(topic string, n int32) []*triagev1.LeasedItem {
		var got []*triagev1.LeasedItem
		require.Eventually(t, func() bool {
			resp, err := q.Dequeue(rctx(), &triagev1.DequeueRequest{Namespace: "default", Topics: []*triagev1.TopicCount{{Topic: topic, Count: n - int32(len(got))}},
				LeaseDuration: durationpb.New(30 * time.Minute)})
			require.NoError(t, err)
			got = append(got, resp.Items...)
			return len(got) == int(n)
		}, 30*time.Second, 50*time.Millisecond)
		return got
	}
	lease("emails", 24)
	lease("thumbnails", 40)
	var nacks []*triagev1.NackItem
	errs := []string{"POST https://hooks.example.com/orders: 503 Service Unavailable", "POST https://crm.example.net/events: context deadline exceeded", "invalid JSON in payload: unexpected end of input"}
	for i, it := range lease("webhooks", 7) {
		nacks = append(nacks, &triagev1.NackItem{Id: it.Id, LeaseToken: it.LeaseToken, DeadLetter: true, Error: errs[i%len(errs)]})
	}
	res, err := q.Nack(rctx(), &triagev1.NackRequest{Namespace: "default", Nacks: nacks})
	require.NoError(t, err)
	for _, r := range res.Results {
		require.True(t, r.Ok, "%v", r)
	}

	// A planned failover of us-east's shard to its replica in eu-west,
	// for the failover history.
	m, err := admin.GetShardMap(rctx(), &triagev1.GetShardMapRequest{})
	require.NoError(t, err)
	fo, err := admin.Failover(rctx(), &triagev1.FailoverRequest{Shard: m.Shards[0].Id, ToRegion: "eu-west", Planned: true})
	require.NoError(t, err)
	t.Logf("shard %d failed over to %s (epoch %d)", m.Shards[0].Id, fo.NewPrimary, fo.Epoch)

	br := consoletest.Start(t, "http://"+l.Regions[0].HTTP+"/console/")
	br.UseKey("default", l.Token)
	br.WaitFor("the topics", `document.getElementById("error").hidden && document.querySelectorAll("#topics-table tbody tr[data-topic]").length === 5`)
	shot := func(name string) {
		data, err := os.ReadFile(br.Screenshot(name))
		require.NoError(t, err)
		require.Less(t, len(data), 200<<10, "%s.png is too big for the README", name)
		require.NoError(t, os.WriteFile(filepath.Join(out, name+".png"), data, 0o644))
		t.Logf("%s.png: %d KB", name, len(data)>>10)
	}
	br.WaitFor("the throughput chart", `document.querySelectorAll("#throughput-chart polyline").length === 4`)
	shot("topics")

	// The item browser: emails' ready items of priority 1 to 3, the first
	// page of ten.
	br.Do("stop the auto refresh", chromedp.Click(chromedp.ID("auto")))
	br.Do("browse emails", chromedp.Click(chromedp.CSS(`#topics-table tr[data-topic="emails"] button.browse`)))
	br.WaitFor("emails' items", `!document.getElementById("view-items").hidden && document.querySelectorAll("#items-table tbody tr[data-id]").length > 0`)
	br.Do("filter and page", chromedp.SetValue(chromedp.ID("items-min"), "1"), chromedp.SetValue(chromedp.ID("items-max"), "3"),
		chromedp.SetValue(chromedp.ID("items-size"), "10"), chromedp.Click(chromedp.CSS(`#items-form button[type="submit"]`)))
	br.WaitFor("the first page of ten", `document.getElementById("items-page").textContent === "page 1, 10 ready item(s)"`)
	shot("items")

	br.Show("item")
	br.Do("look up an item", chromedp.SetValue(chromedp.ID("item-id"), itemID), chromedp.Click(chromedp.CSS(`#item-form button[type="submit"]`)))
	br.WaitFor("the item", fmt.Sprintf(`[...document.querySelectorAll("#item-detail dd")].some((d) => d.textContent === %q)`, itemID))
	shot("item")

	br.Show("deadletters")
	br.Do("list webhooks' dead letters", chromedp.SetValue(chromedp.ID("dl-topic"), "webhooks"), chromedp.Click(chromedp.CSS(`#dl-form button[type="submit"]`)))
	br.WaitFor("the dead letters", `document.querySelectorAll("#dl-table input.dl-pick").length === 7`)
	br.Do("select two", chromedp.Click(chromedp.CSS(`#dl-table tbody tr:nth-child(1) input.dl-pick`)), chromedp.Click(chromedp.CSS(`#dl-table tbody tr:nth-child(3) input.dl-pick`)))
	shot("deadletters")

	br.Show("shards")
	br.WaitFor("the shard map and the failover history", `document.querySelectorAll("#shards-table tbody tr").length === 3 && document.querySelectorAll("#failovers-table tbody tr").length > 0`)
	shot("shards")

	// Drills as triage-bed drill reports them: one done, and the newest
	// halfway through, the fault healed, the queue draining.
	_, err = admin.ReportDrill(rctx(), &triagev1.ReportDrillRequest{Id: "partition-20261123T094210Z", Scenario: "partition",
		Phase: "done", Done: true, Verdict: "PASS", Events: []*triagev1.DrillEvent{{Text: "result  PASS"}}})
	require.NoError(t, err)
	progress := []string{
		"drill primary-kill: 2 producers and 2 consumers on each router (us-east, eu-west, ap-south), items in region eu-west (shards [2])",
		"fault injected in 38ms, in effect 0s before that: killed the primary of shard 2 (kill -9); holding 15s",
		"shard 2: new primary 127.0.0.1:33517 (eu-west, epoch 3) published 2.412s after the fault",
		"healed in 1.06s: restarted the old primary with the rejoin flags; producing 5s more, then draining (up to 1m30s)",
		"producers stopped; draining 41 undelivered items",
	}
	phases := []string{"starting", "fault injected", "failed over", "healed", "draining"}
	for i, line := range progress {
		_, err := admin.ReportDrill(rctx(), &triagev1.ReportDrillRequest{Id: "primary-kill-20261123T101502Z", Scenario: "primary-kill",
			Phase: phases[i], Events: []*triagev1.DrillEvent{{Text: line}}})
		require.NoError(t, err)
	}
	br.Show("drills")
	br.WaitFor("the drill's progress", `document.querySelectorAll("#drills-table tbody tr[data-drill]").length === 2 && document.querySelectorAll("#drill-log li").length === 5`)
	shot("drills")
	require.Empty(t, br.Problems())
}
