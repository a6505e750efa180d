package routing

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
)

// switchOwners is an OwnerView whose one owner the test sets.
type switchOwners struct {
	fakeOwners
	mu    sync.Mutex
	owner string
}

func (s *switchOwners) Owner(uint32) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.owner, s.owner != ""
}

func (s *switchOwners) set(owner string) {
	s.mu.Lock()
	s.owner = owner
	s.mu.Unlock()
	s.change()
}

// A call to an owner that answers nothing (cut off) ends once the view
// names another owner of one of its shards, with an error followOwners
// asks the next owner after; a view that only changes elsewhere, or loses
// the claim without naming another owner, leaves it waiting; an answer in
// time is returned as it is.
func TestAskWhileOwnerEndsWhenTheShardMoves(t *testing.T) {
	owners := &switchOwners{fakeOwners: fakeOwners{changed: make(chan struct{})}, owner: "o1"}
	silent := func(ctx context.Context) ([]*triagev1.LeasedItem, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	done := make(chan error, 1)
	go func() {
		_, err := askWhileOwner(t.Context(), owners, "o1", []uint32{1, 2}, silent)
		done <- err
	}()
	owners.change()  // another shard's claim
	owners.set("o1") // refreshed
	owners.set("")   // gone from the view (handed over, expired)
	select {
	case err := <-done:
		t.Fatalf("ended without another owner: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	start := time.Now()
	owners.set("o2")
	select {
	case err := <-done:
		require.ErrorIs(t, err, errOwnerChanged)
		require.True(t, ownerMoved(err), "followOwners asks the next owner")
		require.Less(t, time.Since(start), time.Second)
	case <-time.After(5 * time.Second):
		t.Fatal("the call to the old owner went on after the shard moved")
	}

	// Already moved when asked: ends at once.
	_, err := askWhileOwner(t.Context(), owners, "o1", []uint32{1}, silent)
	require.ErrorIs(t, err, errOwnerChanged)

	// The caller's own end is its own error, not a move.
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	_, err = askWhileOwner(ctx, owners, "o2", []uint32{1}, silent)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.False(t, errors.Is(err, errOwnerChanged))

	items, err := askWhileOwner(t.Context(), owners, "o2", []uint32{1}, func(context.Context) ([]*triagev1.LeasedItem, error) {
		return twoItems, nil
	})
	require.NoError(t, err)
	require.Equal(t, twoItems, items)
}
