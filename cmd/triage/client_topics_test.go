package main

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
)

func (f *fakeRouter) DeleteDeadLetters(_ context.Context, r *triagev1.DeleteDeadLettersRequest) (*triagev1.DeleteDeadLettersResponse, error) {
	return answer[*triagev1.DeleteDeadLettersResponse](f, "DeleteDeadLetters", r)
}

func (f *fakeRouter) PauseTopic(_ context.Context, r *triagev1.PauseTopicRequest) (*triagev1.TopicPauseState, error) {
	return answer[*triagev1.TopicPauseState](f, "PauseTopic", r)
}

func (f *fakeRouter) ResumeTopic(_ context.Context, r *triagev1.ResumeTopicRequest) (*triagev1.TopicPauseState, error) {
	return answer[*triagev1.TopicPauseState](f, "ResumeTopic", r)
}

func TestDeleteDeadLetters(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.fake.set("DeleteDeadLetters", &triagev1.DeleteDeadLettersResponse{Deleted: 7})

	r := b.run(t, "", "delete-deadletters", "-n", "shop", "--region", "us", "--all", "emails")
	require.Equal(t, 0, r.code, r.stderr)
	require.Equal(t, "deleted: 7\n", r.stdout)
	req := b.fake.got("DeleteDeadLetters")[0].(*triagev1.DeleteDeadLettersRequest)
	require.Equal(t, "shop", req.Namespace)
	require.Equal(t, "emails", req.Topic)
	require.Equal(t, "us", req.Region)
	require.True(t, req.All)
	require.Empty(t, req.Ids)
	require.Nil(t, req.Before)

	r = b.run(t, "", "delete-deadletters", "--json", "--all", "--before", "2025-06-01T12:00:00Z", "emails")
	require.Equal(t, 0, r.code, r.stderr)
	require.EqualValues(t, 7, parseJSON(t, r.stdout, &triagev1.DeleteDeadLettersResponse{}).Deleted)
	req = b.fake.got("DeleteDeadLetters")[1].(*triagev1.DeleteDeadLettersRequest)
	require.Equal(t, time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC), req.Before.AsTime())

	start := time.Now()
	r = b.run(t, "", "delete-deadletters", "--all", "--older-than", "24h", "emails")
	require.Equal(t, 0, r.code, r.stderr)
	req = b.fake.got("DeleteDeadLetters")[2].(*triagev1.DeleteDeadLettersRequest)
	require.WithinRange(t, req.Before.AsTime(), start.Add(-24*time.Hour-time.Second), time.Now().Add(-24*time.Hour))

	// Listed IDs, one twice: each asked for once; fewer deleted than
	// listed fails the command.
	b.fake.set("DeleteDeadLetters", &triagev1.DeleteDeadLettersResponse{Deleted: 1})
	r = b.run(t, "", "delete-deadletters", "emails", "2-a", "3-b", "2-a")
	require.Equal(t, 1, r.code)
	require.Equal(t, "deleted: 1\n", r.stdout)
	require.Contains(t, r.stderr, "triage: 1 of 2 not deleted")
	req = b.fake.got("DeleteDeadLetters")[3].(*triagev1.DeleteDeadLettersRequest)
	require.Equal(t, []string{"2-a", "3-b"}, req.Ids)
	require.False(t, req.All)

	// Bad command lines send nothing.
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "missing TOPIC"},
		{[]string{"emails"}, "nothing to delete"},
		{[]string{"--all", "emails", "2-a"}, "not both"},
		{[]string{"--all", "--before", "yesterday", "emails"}, "not an RFC3339 time"},
		{[]string{"--all", "--before", "2025-06-01T12:00:00Z", "--older-than", "1h", "emails"}, "--before or --older-than"},
		{[]string{"--all", "--older-than", "-1h", "emails"}, "positive"},
	} {
		r = b.run(t, "", "delete-deadletters", c.args...)
		require.Equal(t, 2, r.code, "%v: %s", c.args, r.stderr)
		require.Contains(t, r.stderr, c.want, c.args)
	}
	require.Len(t, b.fake.got("DeleteDeadLetters"), 4)

	b.fake.fail("DeleteDeadLetters", status.Error(codes.InvalidArgument, `id "x": not an item ID`))
	r = b.run(t, "", "delete-deadletters", "emails", "x")
	require.Equal(t, 1, r.code)
	require.Empty(t, r.stdout)
	require.Equal(t, "triage: InvalidArgument: id \"x\": not an item ID\n", r.stderr)
}

func TestDeleteDeadLettersChunksIDs(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.fake.set("DeleteDeadLetters", &triagev1.DeleteDeadLettersResponse{Deleted: 1000})
	args := []string{"emails"}
	for i := range 1500 {
		args = append(args, fmt.Sprintf("1-%016x", i))
	}
	r := b.run(t, "", "delete-deadletters", args...)
	require.Equal(t, 0, r.code, r.stderr)
	require.Equal(t, "deleted: 2000\n", r.stdout, "the counts of every call add up")
	reqs := b.fake.got("DeleteDeadLetters")
	require.Len(t, reqs, 2, "at most 1000 IDs a call")
	require.Len(t, reqs[0].(*triagev1.DeleteDeadLettersRequest).Ids, 1000)
	require.Len(t, reqs[1].(*triagev1.DeleteDeadLettersRequest).Ids, 500)
}

func TestPauseResume(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.fake.set("PauseTopic", &triagev1.TopicPauseState{Namespace: "shop", Topic: "emails", Paused: true, Version: 12})
	b.fake.set("ResumeTopic", &triagev1.TopicPauseState{Namespace: "shop", Topic: "emails", Version: 13})

	r := b.run(t, "", "pause", "-n", "shop", "emails")
	require.Equal(t, 0, r.code, r.stderr)
	require.Equal(t, "emails  paused (shard map version 12)\n", r.stdout)
	req := b.fake.got("PauseTopic")[0].(*triagev1.PauseTopicRequest)
	require.Equal(t, "shop", req.Namespace)
	require.Equal(t, "emails", req.Topic)

	r = b.run(t, "", "resume", "-n", "shop", "--json", "emails")
	require.Equal(t, 0, r.code, r.stderr)
	st := parseJSON(t, r.stdout, &triagev1.TopicPauseState{})
	require.False(t, st.Paused)
	require.EqualValues(t, 13, st.Version)
	require.Equal(t, "emails", b.fake.got("ResumeTopic")[0].(*triagev1.ResumeTopicRequest).Topic)

	r = b.run(t, "", "pause")
	require.Equal(t, 2, r.code)

	b.fake.fail("PauseTopic", status.Error(codes.PermissionDenied, "PauseTopic needs role admin"))
	r = b.run(t, "", "pause", "emails")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "PermissionDenied")
}

// TestStatsShowsPaused: stats says whether its topic is paused.
func TestStatsShowsPaused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.fake.set("GetTopicStats", &triagev1.TopicStats{Namespace: "default", Topic: "emails", Paused: true})
	r := b.run(t, "", "stats", "emails")
	require.Equal(t, 0, r.code, r.stderr)
	require.Regexp(t, `(?m)^paused\s+true$`, r.stdout)
}
