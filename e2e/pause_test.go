package e2e

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/triage-queue/triage/cmd/triage/node"
	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
)

// pause pauses (or resumes) topic of "default" and checks the answer.
func pause(t *testing.T, b *bed, topic string, paused bool) *triagev1.TopicPauseState {
	t.Helper()
	var st *triagev1.TopicPauseState
	var err error
	if paused {
		st, err = b.admin.PauseTopic(b.ctx(), &triagev1.PauseTopicRequest{Namespace: "default", Topic: topic})
	} else {
		st, err = b.admin.ResumeTopic(b.ctx(), &triagev1.ResumeTopicRequest{Namespace: "default", Topic: topic})
	}
	require.NoError(t, err)
	require.Equal(t, paused, st.Paused)
	require.Equal(t, topic, st.Topic)
	return st
}

// dequeueTopics leases up to 10 items of each of topics of "default" at
// once, waiting up to wait.
func dequeueTopics(t *testing.T, b *bed, wait time.Duration, topics ...string) []*triagev1.LeasedItem {
	t.Helper()
	req := &triagev1.DequeueRequest{Namespace: "default", LeaseDuration: durationpb.New(time.Minute), Wait: durationpb.New(wait)}
	for _, topic := range topics {
		req.Topics = append(req.Topics, &triagev1.TopicCount{Topic: topic, Count: 10})
	}
	resp, err := b.queue.Dequeue(b.ctx(), req)
	require.NoError(t, err)
	return resp.Items
}

// TestPauseTopic: a paused topic delivers nothing while another topic of
// the same dequeue does; enqueues, extends, acks and nacks of it go on;
// stats, the topic list and the metric say it is paused; a long poll
// parked on it returns once it is resumed, the items in priority order,
// those enqueued during the pause included.
func TestPauseTopic(t *testing.T) {
	t.Parallel()
	b := setup(t, bedOpts{})
	enqueue(t, b, "held", &triagev1.NewItem{Payload: []byte("x0"), Priority: 5}, &triagev1.NewItem{Payload: []byte("x1"), Priority: 3},
		&triagev1.NewItem{Payload: []byte("x2"), Priority: 1})
	var leased []*triagev1.LeasedItem
	require.Eventually(t, func() bool {
		leased = append(leased, dequeue(t, b, "held", int32(2-len(leased)), time.Minute)...)
		return len(leased) == 2
	}, 10*time.Second, 20*time.Millisecond)
	require.Equal(t, []int32{1, 3}, priorities(leased))

	before := b.node.ShardMap().Version
	st := pause(t, b, "held", true)
	require.Greater(t, st.Version, before)
	again := pause(t, b, "held", true)
	require.Equal(t, st.Version, again.Version, "pausing a paused topic publishes nothing")

	// Leases of the paused topic go on: extend and ack one, nack the
	// other (ready again, but not delivered while paused).
	_, err := b.queue.ExtendLease(b.ctx(), &triagev1.ExtendLeaseRequest{Namespace: "default", Id: leased[0].Id, LeaseToken: leased[0].LeaseToken})
	require.NoError(t, err)
	require.True(t, ack(t, b, leased[0])[0].Ok)
	require.True(t, nackOne(t, b, leased[1], durationpb.New(0), "later", nil).Ok)
	// Enqueues go on.
	enqueue(t, b, "held", &triagev1.NewItem{Payload: []byte("y"), Priority: 0}, &triagev1.NewItem{Payload: []byte("z"), Priority: 4})
	enqueue(t, b, "free", &triagev1.NewItem{Payload: []byte("f"), Priority: 9})

	// A dequeue of both topics serves the other one only.
	var got []*triagev1.LeasedItem
	require.Eventually(t, func() bool {
		got = append(got, dequeueTopics(t, b, 0, "held", "free")...)
		return len(got) > 0
	}, 10*time.Second, 20*time.Millisecond)
	require.Len(t, got, 1)
	require.Equal(t, "free", got[0].Topic)
	require.Zero(t, during(300*time.Millisecond, func() int { return len(dequeueTopics(t, b, 0, "held", "free")) }),
		"nothing of the paused topic")

	stats, err := b.queue.GetTopicStats(b.ctx(), &triagev1.GetTopicStatsRequest{Namespace: "default", Topic: "held"})
	require.NoError(t, err)
	require.True(t, stats.Paused)
	require.EqualValues(t, 4, stats.Total, "x0, x1 (nacked), y and z wait")
	list, err := b.queue.ListTopics(b.ctx(), &triagev1.ListTopicsRequest{Namespace: "default"})
	require.NoError(t, err)
	paused := map[string]bool{}
	for _, s := range list.Topics {
		paused[s.Topic] = s.Paused
	}
	require.Equal(t, map[string]bool{"held": true, "free": false}, paused)
	v, ok := value(scrape(t, b.metrics), "triage_topic_paused", lbl("namespace", "default", "topic", "held"))
	require.True(t, ok)
	require.Equal(t, 1.0, v)
	code, body := httpJSON(t, http.MethodGet, b.http+"/v1/namespaces/default/topics/held/stats", "")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, true, body["paused"])

	// A long poll parked on the paused topic waits, and returns after
	// the resume (sent over the JSON gateway), most urgent first.
	polled := make(chan []*triagev1.LeasedItem, 1)
	go func() {
		req := &triagev1.DequeueRequest{Namespace: "default", LeaseDuration: durationpb.New(time.Minute), Wait: durationpb.New(15 * time.Second),
			Topics: []*triagev1.TopicCount{{Topic: "held", Count: 10}}}
		resp, err := b.queue.Dequeue(b.ctx(), req)
		if err != nil {
			t.Errorf("long poll: %v", err)
		}
		polled <- resp.GetItems()
	}()
	select {
	case items := <-polled:
		t.Fatalf("the long poll returned while the topic was paused: %v", items)
	case <-time.After(time.Second):
	}
	resumed := time.Now()
	code, body = httpJSON(t, http.MethodPost, b.http+"/v1/namespaces/default/topics/held:resume", `{}`)
	require.Equal(t, http.StatusOK, code, "%v", body)
	require.Equal(t, false, body["paused"])
	var first []*triagev1.LeasedItem
	select {
	case first = <-polled:
	case <-time.After(5 * time.Second):
		t.Fatal("the long poll did not return after the resume")
	}
	t.Logf("long poll returned %d item(s) %s after the resume", len(first), time.Since(resumed).Round(time.Millisecond))
	require.NotEmpty(t, first)
	all := append([]*triagev1.LeasedItem{}, first...)
	require.Eventually(t, func() bool {
		all = append(all, dequeue(t, b, "held", 10, time.Minute)...)
		return len(all) >= 4
	}, 10*time.Second, 20*time.Millisecond)
	require.Equal(t, []int32{0, 3, 4, 5}, priorities(all), "y, x1, z, x0: by priority")
	require.Equal(t, "y", string(first[0].Payload), "enqueued during the pause, most urgent")
	require.Equal(t, priorities(all)[:len(first)], priorities(first))

	stats, err = b.queue.GetTopicStats(b.ctx(), &triagev1.GetTopicStatsRequest{Namespace: "default", Topic: "held"})
	require.NoError(t, err)
	require.False(t, stats.Paused)
	ns, err := b.admin.GetNamespace(b.ctx(), &triagev1.GetNamespaceRequest{Namespace: "default"})
	require.NoError(t, err)
	require.NotContains(t, ns.Topics, "held", "the config the pause made is gone with it")
}

// TestPauseTopicBadInput: an unknown namespace is NOT_FOUND, a bad topic
// name INVALID_ARGUMENT; neither changes the map.
func TestPauseTopicBadInput(t *testing.T) {
	t.Parallel()
	b := setup(t, bedOpts{})
	before := b.node.ShardMap().Version
	_, err := b.admin.PauseTopic(b.ctx(), &triagev1.PauseTopicRequest{Namespace: "nope", Topic: "t"})
	requireCode(t, err, codes.NotFound, "nope")
	_, err = b.admin.PauseTopic(b.ctx(), &triagev1.PauseTopicRequest{Namespace: "default", Topic: "a b"})
	requireCode(t, err, codes.InvalidArgument, "topic")
	_, err = b.admin.ResumeTopic(b.ctx(), &triagev1.ResumeTopicRequest{Namespace: "default"})
	requireCode(t, err, codes.InvalidArgument, "topic")
	st, err := b.admin.ResumeTopic(b.ctx(), &triagev1.ResumeTopicRequest{Namespace: "default", Topic: "never-paused"})
	require.NoError(t, err)
	require.False(t, st.Paused)
	require.Equal(t, before, b.node.ShardMap().Version)
}

// TestPauseSurvivesRestart: the pause is in the shard map, so a node
// started after the one that paused the topic (on the same map) serves
// none of it, a PutNamespace does not undo it, and it delivers once
// resumed.
func TestPauseSurvivesRestart(t *testing.T) {
	t.Parallel()
	b := setup(t, bedOpts{})
	enqueue(t, b, "held", &triagev1.NewItem{Payload: []byte("a"), Priority: 2}, &triagev1.NewItem{Payload: []byte("b"), Priority: 1})
	pause(t, b, "held", true)
	putNamespace(t, b, &triagev1.Namespace{Name: "default", MaxAttempts: 7})

	b.node.Stop()
	b.node = nil
	b.startNode(node.Config{})
	// The stopped node's claims may still name its dequeuer for a moment.
	require.Eventually(t, func() bool {
		for i := range b.shards {
			if o, _ := b.node.ShardOwner(uint32(i + 1)); o != b.node.Dequeuer().ID() {
				return false
			}
		}
		return true
	}, 30*time.Second, 20*time.Millisecond)
	_, err := b.node.ShardMap().Namespace("default")
	require.NoError(t, err)
	stats, err := b.queue.GetTopicStats(b.ctx(), &triagev1.GetTopicStatsRequest{Namespace: "default", Topic: "held"})
	require.NoError(t, err)
	require.True(t, stats.Paused, "paused after the restart")
	require.EqualValues(t, 2, stats.Total)
	require.Empty(t, dequeueTopics(t, b, 500*time.Millisecond, "held"))

	pause(t, b, "held", false)
	var got []*triagev1.LeasedItem
	require.Eventually(t, func() bool {
		got = append(got, dequeue(t, b, "held", 10, time.Minute)...)
		return len(got) == 2
	}, 10*time.Second, 20*time.Millisecond)
	require.Equal(t, []int32{1, 2}, priorities(got))
}

// TestTopicAdminIsPerNamespace: an admin of namespace "other" may neither
// pause, resume nor purge a topic of "default" (PERMISSION_DENIED, over
// gRPC and HTTP, nothing changed); default's admin may.
func TestTopicAdminIsPerNamespace(t *testing.T) {
	t.Parallel()
	s := setupSecure(t)
	pub := s.conn(t, s.node.GRPCAddr, s.client)
	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: s.client}}
	as := func(key string) context.Context {
		return metadata.AppendToOutgoingContext(s.ctx(), "authorization", "Bearer "+s.tokens[key])
	}
	admin, queue := triagev1.NewAdminClient(pub), triagev1.NewQueueClient(pub)
	before := s.node.ShardMap().Version

	_, err := admin.PauseTopic(as("other"), &triagev1.PauseTopicRequest{Namespace: "default", Topic: "jobs"})
	requireCode(t, err, codes.PermissionDenied, `"other"`)
	_, err = admin.ResumeTopic(as("other"), &triagev1.ResumeTopicRequest{Namespace: "default", Topic: "jobs"})
	requireCode(t, err, codes.PermissionDenied)
	_, err = queue.DeleteDeadLetters(as("other"), &triagev1.DeleteDeadLettersRequest{Namespace: "default", Topic: "jobs", All: true})
	requireCode(t, err, codes.PermissionDenied)
	for path, body := range map[string]string{"/v1/namespaces/default/topics/jobs:pause": `{}`, "/v1/namespaces/default/topics/jobs/deadletters:delete": `{"all":true}`} {
		req, err := http.NewRequest(http.MethodPost, "https://"+s.node.HTTPAddr+path, strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+s.tokens["other"])
		resp, err := hc.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusForbidden, resp.StatusCode, path)
	}
	require.Equal(t, before, s.node.ShardMap().Version, "the refusals changed nothing")

	// Its own namespace's topics it may pause.
	st, err := admin.PauseTopic(as("other"), &triagev1.PauseTopicRequest{Namespace: "other", Topic: "jobs"})
	require.NoError(t, err)
	require.True(t, st.Paused)
	st, err = admin.PauseTopic(as("admin"), &triagev1.PauseTopicRequest{Namespace: "default", Topic: "jobs"})
	require.NoError(t, err)
	require.True(t, st.Paused)
	m := s.node.ShardMap()
	for _, ns := range []string{"default", "other"} {
		n, err := m.Namespace(ns)
		require.NoError(t, err)
		require.True(t, n.Topics["jobs"].Paused, ns)
	}
	_, err = queue.DeleteDeadLetters(as("admin"), &triagev1.DeleteDeadLettersRequest{Namespace: "default", Topic: "jobs", All: true})
	require.NoError(t, err)
}

// TestPausedTopicDoesNotAge: aging skips a paused topic (nothing of it is
// served, so nothing starves; aging through a long pause would flatten
// its backlog to priority 0), and picks it up again on the resume.
func TestPausedTopicDoesNotAge(t *testing.T) {
	t.Parallel()
	b := setup(t, bedOpts{})
	putNamespace(t, b, &triagev1.Namespace{Name: "agp", Topics: map[string]*triagev1.TopicConfig{
		"held": {AgingThreshold: durationpb.New(200 * time.Millisecond)}}})
	_, err := b.admin.PauseTopic(b.ctx(), &triagev1.PauseTopicRequest{Namespace: "agp", Topic: "held"})
	require.NoError(t, err)
	time.Sleep(time.Second) // the dequeuer's map has the pause (a KV watch, milliseconds)
	resp, err := b.queue.Enqueue(b.ctx(), &triagev1.EnqueueRequest{Namespace: "agp", Topic: "held", Items: []*triagev1.NewItem{{Priority: 3}}})
	require.NoError(t, err)
	id := resp.Results[0].Id
	priority := func() int32 {
		it, err := b.queue.GetItem(b.ctx(), &triagev1.GetItemRequest{Namespace: "agp", Id: id})
		require.NoError(t, err)
		return it.Priority
	}
	time.Sleep(1500 * time.Millisecond) // seven thresholds: three promotions were due
	require.Equal(t, int32(3), priority(), "a paused topic's items keep their priority")

	_, err = b.admin.ResumeTopic(b.ctx(), &triagev1.ResumeTopicRequest{Namespace: "agp", Topic: "held"})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return priority() < 3 }, 10*time.Second, 50*time.Millisecond, "aging resumes with the topic")
}
