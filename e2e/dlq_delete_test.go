package e2e

import (
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
	"github.com/triage-queue/triage/schema/itemid"
)

// deadLetterN enqueues n items into topic of ns, one call each (so they
// spread over the shards), delivers them and nacks them to the dead
// letters, and returns their IDs once they are all dead letters of the
// topic.
func deadLetterN(t *testing.T, b *bed, ns, topic string, n int) []string {
	t.Helper()
	var want []string
	for i := range n {
		resp, err := b.queue.Enqueue(b.ctx(), &triagev1.EnqueueRequest{Namespace: ns, Topic: topic,
			Items: []*triagev1.NewItem{{Payload: fmt.Appendf(nil, "%s-%d", topic, i)}}})
		require.NoError(t, err)
		want = append(want, resp.Results[0].Id)
	}
	var got []string
	require.Eventually(t, func() bool {
		resp, err := b.queue.Dequeue(b.ctx(), &triagev1.DequeueRequest{Namespace: ns,
			Topics: []*triagev1.TopicCount{{Topic: topic, Count: int32(n)}}, LeaseDuration: durationpb.New(time.Minute)})
		require.NoError(t, err)
		nack := &triagev1.NackRequest{Namespace: ns}
		for _, it := range resp.Items {
			nack.Nacks = append(nack.Nacks, &triagev1.NackItem{Id: it.Id, LeaseToken: it.LeaseToken, DeadLetter: true, Error: "poison"})
			got = append(got, it.Id)
		}
		if len(nack.Nacks) > 0 {
			res, err := b.queue.Nack(b.ctx(), nack)
			require.NoError(t, err)
			for _, r := range res.Results {
				require.True(t, r.Ok, "%v", r)
			}
		}
		return len(got) == n
	}, 10*time.Second, 20*time.Millisecond)
	require.ElementsMatch(t, want, got)
	require.Subset(t, deadLetterIDs(t, b, ns, topic), want)
	return want
}

// deadLetterIDs lists every dead letter of topic in ns.
func deadLetterIDs(t *testing.T, b *bed, ns, topic string) []string {
	t.Helper()
	resp, err := b.queue.ListDeadLetters(b.ctx(), &triagev1.ListDeadLettersRequest{Namespace: ns, Topic: topic, PageSize: 1000})
	require.NoError(t, err)
	require.Empty(t, resp.NextPageToken)
	var out []string
	for _, d := range resp.DeadLetters {
		out = append(out, d.Id)
	}
	return out
}

func deadCount(t *testing.T, b *bed, ns, topic string) int {
	t.Helper()
	return len(deadLetterIDs(t, b, ns, topic))
}

// TestDeleteDeadLetters: bad input is INVALID_ARGUMENT saying what is
// allowed and deletes nothing; a delete by ID deletes only those of the
// topic; a purge bounded by before deletes only the older ones; a purge
// (over the JSON gateway) empties the topic's dead letters on every
// shard, and another topic's and another namespace's stay.
func TestDeleteDeadLetters(t *testing.T) {
	t.Parallel()
	b := setup(t, bedOpts{})
	older := deadLetterN(t, b, "default", "purge", 6)
	time.Sleep(50 * time.Millisecond)
	between := time.Now()
	time.Sleep(50 * time.Millisecond)
	newer := deadLetterN(t, b, "default", "purge", 6)
	keep := deadLetterN(t, b, "default", "keep", 3)
	otherNS := deadLetterN(t, b, "other", "purge", 3)
	shards := map[uint32]bool{}
	for _, s := range append(slices.Clone(older), newer...) {
		id, err := itemid.Parse(s)
		require.NoError(t, err)
		shards[id.Shard] = true
	}
	require.Len(t, shards, 2, "the topic's dead letters live on both shards")

	del := func(req *triagev1.DeleteDeadLettersRequest) (int64, error) {
		if req.Namespace == "" {
			req.Namespace = "default"
		}
		if req.Topic == "" {
			req.Topic = "purge"
		}
		resp, err := b.queue.DeleteDeadLetters(b.ctx(), req)
		return resp.GetDeleted(), err
	}
	tooMany := make([]string, 1001)
	for i := range tooMany {
		tooMany[i] = older[0]
	}
	for _, c := range []struct {
		name string
		req  *triagev1.DeleteDeadLettersRequest
		says string
	}{
		{"neither ids nor all", &triagev1.DeleteDeadLettersRequest{}, "give ids (1 to 1000 dead letter IDs) or all: true"},
		{"both", &triagev1.DeleteDeadLettersRequest{Ids: older[:1], All: true}, "not both"},
		{"too many ids", &triagev1.DeleteDeadLettersRequest{Ids: tooMany}, "at most 1000"},
		{"a bad id among good ones", &triagev1.DeleteDeadLettersRequest{Ids: []string{older[0], "nope"}}, "want <shard>-<16 hex digits>"},
		{"an id of no shard of the namespace", &triagev1.DeleteDeadLettersRequest{Ids: []string{older[0], "99-0000000000000001"}}, "does not serve namespace"},
		{"a bad before", &triagev1.DeleteDeadLettersRequest{All: true, Before: &timestamppb.Timestamp{Seconds: 1, Nanos: -1}}, "before"},
		{"a before at the epoch", &triagev1.DeleteDeadLettersRequest{All: true, Before: &timestamppb.Timestamp{}}, "after 1970"},
		{"a bad topic", &triagev1.DeleteDeadLettersRequest{Topic: "no spaces", All: true}, "topic"},
	} {
		_, err := del(c.req)
		requireCode(t, err, codes.InvalidArgument, c.says)
	}
	require.Equal(t, 12, deadCount(t, b, "default", "purge"), "bad input deleted nothing")

	// By ID: two of purge's and one of keep's, which this topic's delete
	// does not touch; one listed twice counts once.
	n, err := del(&triagev1.DeleteDeadLettersRequest{Ids: []string{newer[0], newer[1], keep[0], newer[0]}})
	require.NoError(t, err)
	require.Equal(t, int64(2), n)
	require.ElementsMatch(t, append(slices.Clone(older), newer[2:]...), deadLetterIDs(t, b, "default", "purge"))
	require.ElementsMatch(t, keep, deadLetterIDs(t, b, "default", "keep"))
	n, err = del(&triagev1.DeleteDeadLettersRequest{Ids: newer[:2]})
	require.NoError(t, err)
	require.Zero(t, n, "already deleted: nothing left to delete")

	// A purge of the ones that died before the second group.
	n, err = del(&triagev1.DeleteDeadLettersRequest{All: true, Before: timestamppb.New(between)})
	require.NoError(t, err)
	require.Equal(t, int64(6), n)
	require.ElementsMatch(t, newer[2:], deadLetterIDs(t, b, "default", "purge"))

	// The rest, over the JSON gateway; its bad input is a 400 too.
	url := b.http + "/v1/namespaces/default/topics/purge/deadletters:delete"
	code, body := httpJSON(t, http.MethodPost, url, `{"ids":[],"all":false}`)
	require.Equal(t, http.StatusBadRequest, code, "%v", body)
	require.Contains(t, body["message"], "all: true")
	code, body = httpJSON(t, http.MethodPost, url, `{"all":true,"before":"`+time.Now().Add(time.Hour).UTC().Format(time.RFC3339)+`"}`)
	require.Equal(t, http.StatusOK, code, "%v", body)
	require.Equal(t, "4", fmt.Sprint(body["deleted"]))
	require.Empty(t, deadLetterIDs(t, b, "default", "purge"))
	st, err := b.queue.GetTopicStats(b.ctx(), &triagev1.GetTopicStatsRequest{Namespace: "default", Topic: "purge"})
	require.NoError(t, err)
	require.Zero(t, st.DeadLetters)

	require.ElementsMatch(t, keep, deadLetterIDs(t, b, "default", "keep"), "another topic's dead letters stay")
	require.ElementsMatch(t, otherNS, deadLetterIDs(t, b, "other", "purge"), "another namespace's dead letters stay")
	require.Equal(t, 6, b.rowCount("dead_letters"))

	// The counter of deletes per topic.
	v, ok := value(scrape(t, b.metrics), "triage_deleted_dead_letters_total", lbl("namespace", "default", "topic", "purge"))
	require.True(t, ok)
	require.Equal(t, 12.0, v)
}
