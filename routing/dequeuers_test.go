package routing

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/triage-queue/triage/cmd/triage/natsserver/natstest"
	"github.com/triage-queue/triage/proto/triage/peer"
	peerv1 "github.com/triage-queue/triage/proto/triage/peer/v1"
	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
)

// owner answers ShardDequeues on owner "o1" with answer, after release is
// closed (nil: at once). It returns the requests it got.
func owner(t *testing.T, nc *nats.Conn, release <-chan struct{}, answer *peerv1.ShardDequeueResponse) <-chan *peerv1.ShardDequeue {
	t.Helper()
	got := make(chan *peerv1.ShardDequeue, 10)
	sub, err := nc.Subscribe(peer.DequeueSubject("o1"), func(m *nats.Msg) {
		var req peerv1.ShardDequeue
		if err := proto.Unmarshal(m.Data, &req); err != nil {
			t.Errorf("owner: %v", err)
			return
		}
		got <- &req
		go func() {
			if release != nil {
				<-release
			}
			data, _ := proto.Marshal(answer)
			_ = m.Respond(data)
		}()
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	return got
}

func dequeueReq() *triagev1.DequeueRequest {
	return &triagev1.DequeueRequest{Namespace: "ns", Topics: []*triagev1.TopicCount{{Topic: "t", Count: 2}},
		Wait: durationpb.New(200 * time.Millisecond)}
}

var twoItems = []*triagev1.LeasedItem{{Id: "1-1", Topic: "t"}, {Id: "1-2", Topic: "t"}}

// The owner answers after the caller has gone: the items it leased for
// nobody reach Late, with their namespace, instead of being dropped.
func TestNATSDequeuersHandsBackLateAnswers(t *testing.T) {
	nc, _ := natstest.JetStream(t)
	type late struct {
		ns    string
		items []*triagev1.LeasedItem
	}
	lates := make(chan late, 1)
	d := NATSDequeuers{NC: nc, Late: func(ns string, items []*triagev1.LeasedItem) { lates <- late{ns, items} }}
	release := make(chan struct{})
	got := owner(t, nc, release, &peerv1.ShardDequeueResponse{Items: twoItems})

	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-got // the owner is working on it
		cancel()
	}()
	items, err := d.Dequeue(ctx, "o1", dequeueReq(), []uint32{1})
	require.ErrorIs(t, err, context.Canceled)
	require.Empty(t, items)
	select {
	case l := <-lates:
		t.Fatalf("Late called before the owner answered: %v", l)
	default:
	}
	close(release)
	select {
	case l := <-lates:
		require.Equal(t, "ns", l.ns)
		require.Len(t, l.items, 2)
		require.True(t, proto.Equal(twoItems[0], l.items[0]) && proto.Equal(twoItems[1], l.items[1]))
	case <-time.After(5 * time.Second):
		t.Fatal("the late answer's items never reached Late")
	}
}

// An answer in time is returned and nothing reaches Late; an answer with
// an error returns its items too (the caller hands them back), with the
// owner's code kept; no owner is nats.ErrNoResponders at once.
func TestNATSDequeuersAnswers(t *testing.T) {
	nc, _ := natstest.JetStream(t)
	lates := make(chan []*triagev1.LeasedItem, 1)
	d := NATSDequeuers{NC: nc, Late: func(_ string, items []*triagev1.LeasedItem) { lates <- items }}

	start := time.Now()
	_, err := d.Dequeue(context.Background(), "o1", dequeueReq(), []uint32{1})
	require.ErrorIs(t, err, nats.ErrNoResponders)
	require.Less(t, time.Since(start), 2*time.Second, "no responders is known at once, not after the wait")

	answer := &peerv1.ShardDequeueResponse{Items: twoItems}
	got := owner(t, nc, nil, answer)
	items, err := d.Dequeue(context.Background(), "o1", dequeueReq(), []uint32{1, 3})
	require.NoError(t, err)
	require.Len(t, items, 2)
	req := <-got
	require.Equal(t, []uint32{1, 3}, req.Shards)
	require.Equal(t, "ns", req.Request.Namespace)

	answer.Code, answer.Error = int32(codes.FailedPrecondition), "not the owner of shard 3"
	items, err = d.Dequeue(context.Background(), "o1", dequeueReq(), []uint32{1, 3})
	require.ErrorIs(t, err, peer.ErrNotOwner)
	require.Len(t, items, 2, "items served before the error come back with it")

	select {
	case l := <-lates:
		t.Fatalf("Late called for answers received in time: %v", l)
	case <-time.After(300 * time.Millisecond):
	}
	require.False(t, errors.Is(err, context.Canceled))
}

// fakeOwners is an OwnerView whose changes the test makes.
type fakeOwners struct {
	mu      sync.Mutex
	changed chan struct{}
}

func (f *fakeOwners) Owner(uint32) (string, bool)      { return "", false }
func (f *fakeOwners) Reload(context.Context, []uint32) {}
func (f *fakeOwners) Changed() <-chan struct{}         { f.mu.Lock(); defer f.mu.Unlock(); return f.changed }
func (f *fakeOwners) change() {
	f.mu.Lock()
	defer f.mu.Unlock()
	close(f.changed)
	f.changed = make(chan struct{})
}

// A Dequeue that finds its shard handed over, its owner gone or no owner
// yet asks again when the ownership view changes, within HandOverWait and
// what is left of its long poll, instead of answering UNAVAILABLE; other
// errors, and answers with items, are returned at once.
func TestFollowOwnersAsksTheNextOwner(t *testing.T) {
	owners := &fakeOwners{changed: make(chan struct{})}
	moved := []error{
		fmt.Errorf("%w: dequeuer o1: %w", ErrUnavailable, peer.ErrNotOwner),
		fmt.Errorf("%w: dequeuer o1: %w", ErrUnavailable, nats.ErrNoResponders),
		fmt.Errorf("%w: %w: shards [1]", ErrUnavailable, errNoOwner),
	}
	var asked []time.Duration
	start := time.Now()
	items, err := followOwners(t.Context(), owners, dequeueReq(), func(_ context.Context, req *triagev1.DequeueRequest) ([]*triagev1.LeasedItem, error) {
		asked = append(asked, req.Wait.AsDuration())
		if n := len(asked); n <= len(moved) {
			if n == 2 {
				go owners.change() // the view learns of the claim
			}
			return nil, moved[n-1]
		}
		return twoItems, nil
	})
	require.NoError(t, err)
	require.Equal(t, twoItems, items)
	require.Len(t, asked, 4, "asked again after each hand-over error")
	require.Equal(t, 200*time.Millisecond, asked[0])
	for i := 1; i < len(asked); i++ {
		require.Less(t, asked[i], asked[i-1], "each ask waits for what is left of the long poll")
	}
	require.Less(t, time.Since(start), HandOverWait)

	// Any other error is the answer.
	calls := 0
	_, err = followOwners(t.Context(), owners, dequeueReq(), func(context.Context, *triagev1.DequeueRequest) ([]*triagev1.LeasedItem, error) {
		calls++
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, nats.ErrTimeout)
	})
	require.ErrorIs(t, err, nats.ErrTimeout)
	require.Equal(t, 1, calls)

	// An owner that keeps answering "not owner" is given up on after
	// HandOverWait, with its error.
	calls = 0
	start = time.Now()
	_, err = followOwners(t.Context(), owners, dequeueReq(), func(context.Context, *triagev1.DequeueRequest) ([]*triagev1.LeasedItem, error) {
		calls++
		return nil, moved[0]
	})
	require.ErrorIs(t, err, peer.ErrNotOwner)
	require.GreaterOrEqual(t, time.Since(start), HandOverWait)
	require.Greater(t, calls, 5, "asked again every reloadPace without a change of the view")
}
