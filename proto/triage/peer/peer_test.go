package peer_test

import (
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/triage-queue/triage/proto/triage/peer"
	peerv1 "github.com/triage-queue/triage/proto/triage/peer/v1"
)

// TestRolesDoNotImportEachOther holds the layering this package exists
// for: routing, enqueuer and dequeuer meet on the store, this leaf and the
// shard map, never on each other's insides.
func TestRolesDoNotImportEachOther(t *testing.T) {
	t.Parallel()
	const mod = "github.com/triage-queue/triage/"
	roles := []string{"routing", "enqueuer", "dequeuer"}
	for _, r := range roles {
		out, err := exec.Command("go", "list", "-f", `{{join .Imports "\n"}}`, mod+r).Output()
		if err != nil {
			t.Fatalf("go list %s: %v", r, err)
		}
		for _, imp := range strings.Fields(string(out)) {
			for _, other := range roles {
				if other != r && imp == mod+other {
					t.Errorf("%s imports %s; share what they need through proto/triage/peer or schema/store instead", r, other)
				}
			}
		}
	}
}

// TestReplyErrorKeepsTheKind: what a dequeuer reports over NATS comes back
// to the router as the same kind of error, whatever its wording.
func TestReplyErrorKeepsTheKind(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		err      error
		notOwner bool
	}{
		{"not owner", fmt.Errorf("%w 3", peer.ErrNotOwner), true},
		{"busy", peer.ErrBusy, false},
		{"shard down", errors.New("dial tcp 127.0.0.1:3306: connection refused"), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := peer.ReplyError(peer.ReplyCode(tc.err), tc.err.Error())
			if errors.Is(got, peer.ErrNotOwner) != tc.notOwner {
				t.Fatalf("ReplyError(ReplyCode(%v)) = %v; is ErrNotOwner: %v, want %v", tc.err, got, !tc.notOwner, tc.notOwner)
			}
			if !strings.Contains(got.Error(), tc.err.Error()) {
				t.Fatalf("the remote message %q is lost: %q", tc.err, got)
			}
		})
	}
}

// TestBatchReady: a batch's notice carries its most urgent priority and
// earliest deliver_after; merged notices keep the minima, and one whose
// time is unknown makes the merge's unknown.
func TestBatchReady(t *testing.T) {
	b := &peerv1.EnqueueBatch{Namespace: "n", Topic: "t", Shard: 3, Items: []*peerv1.BufferedItem{
		{Priority: 5, DeliverAfterUs: 100}, {Priority: 2, DeliverAfterUs: 300}, {Priority: 7, DeliverAfterUs: 50}}}
	r := peer.BatchReady(b)
	require.Equal(t, int32(2), r.MinPriority)
	require.Equal(t, int64(50), r.MinDeliverAfterUs)
	require.Equal(t, int32(3), r.Count)
	require.Equal(t, uint32(3), r.Shard)
	peer.MergeReady(r, &peerv1.ItemsReady{MinPriority: 1, MinDeliverAfterUs: 80, Count: 2})
	require.Equal(t, int32(1), r.MinPriority)
	require.Equal(t, int64(50), r.MinDeliverAfterUs)
	require.Equal(t, int32(5), r.Count)
	peer.MergeReady(r, &peerv1.ItemsReady{MinPriority: 9, Count: 1})
	require.Zero(t, r.MinDeliverAfterUs, "a notice of unknown time makes the merge's unknown")
}

// TestCommittedReadyCarriesTheStoredRows: a notice carries a batch's rows
// only when its insert stored them now (a version) and they are small;
// items that were duplicates of live ones stored nothing and are left
// out; a merged notice carries none, since its rows would not share one
// version.
func TestCommittedReadyCarriesTheStoredRows(t *testing.T) {
	b := &peerv1.EnqueueBatch{Namespace: "n", Topic: "t", Shard: 3, EnqueuedAtUs: 40, Items: []*peerv1.BufferedItem{
		{Key: 1, Priority: 5, DeliverAfterUs: 100}, {Key: 2, Priority: 2, DeliverAfterUs: 300}, {Key: 3, Priority: 7, DeliverAfterUs: 50}}}
	r := peer.CommittedReady(b, &peerv1.EnqueueCommitted{VersionUs: 77, DuplicateOf: []uint64{0, 9, 0}})
	require.True(t, peer.Handed(r))
	require.Equal(t, []uint64{1, 3}, []uint64{r.Items[0].Key, r.Items[1].Key}, "the duplicate stored nothing")
	require.Equal(t, int32(2), r.Count)
	require.Equal(t, int64(77), r.VersionUs)
	require.Equal(t, int64(40), r.EnqueuedAtUs)

	require.False(t, peer.Handed(peer.CommittedReady(b, &peerv1.EnqueueCommitted{})), "applied before: no version, no rows")
	require.False(t, peer.Handed(peer.CommittedReady(b, &peerv1.EnqueueCommitted{VersionUs: 77, Error: "x"})))
	require.False(t, peer.Handed(peer.CommittedReady(b, nil)))
	big := &peerv1.EnqueueBatch{Items: []*peerv1.BufferedItem{{Key: 1, Payload: make([]byte, peer.MaxHandedBytes+1)}}}
	require.False(t, peer.Handed(peer.CommittedReady(big, &peerv1.EnqueueCommitted{VersionUs: 77})), "too large to travel")
	plain := peer.CommittedReady(big, &peerv1.EnqueueCommitted{VersionUs: 77})
	require.Equal(t, int32(1), plain.Count, "announced without its rows")

	peer.MergeReady(r, plain)
	require.False(t, peer.Handed(r), "a merged notice carries no rows")
	require.Equal(t, int32(3), r.Count)
}
