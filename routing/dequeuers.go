package routing

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/triage-queue/triage/proto/triage/peer"
	peerv1 "github.com/triage-queue/triage/proto/triage/peer/v1"
	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
)

// Dequeuers reaches the dequeuer that owns a shard, by its ID: the router
// serves Dequeue calls and unbuffers items through it. Errors that mean
// "ask someone else" are recognisable with errors.Is: nats.ErrNoResponders
// (the owner is gone) and peer.ErrNotOwner (it handed the shard over).
type Dequeuers interface {
	Dequeue(ctx context.Context, owner string, req *triagev1.DequeueRequest, shards []uint32) ([]*triagev1.LeasedItem, error)
	Unbuffer(ctx context.Context, owner, ns string, shard uint32, keys []uint64) error
}

// LocalDequeuer is a dequeuer in the same process, called directly instead
// of over NATS.
type LocalDequeuer interface {
	ID() string
	Dequeue(ctx context.Context, req *triagev1.DequeueRequest, shards []uint32) ([]*triagev1.LeasedItem, error)
	Ready(*peerv1.ItemsReady)
	Unbuffer(ctx context.Context, ns string, shard uint32, keys []uint64) error
}

// NATSDequeuers reaches dequeuers with NATS requests on their subjects
// (peer.DequeueSubject, peer.UnbufferSubject).
type NATSDequeuers struct{ NC *nats.Conn }

// Dequeue sends a ShardDequeue to owner and waits up to the request's wait
// plus 5 s for the answer.
func (d NATSDequeuers) Dequeue(ctx context.Context, owner string, req *triagev1.DequeueRequest, shards []uint32) ([]*triagev1.LeasedItem, error) {
	data, err := proto.Marshal(&peerv1.ShardDequeue{Request: req, Shards: shards})
	if err != nil {
		return nil, err
	}
	rctx, cancel := context.WithTimeout(ctx, req.GetWait().AsDuration()+5*time.Second)
	defer cancel()
	msg, err := d.NC.RequestWithContext(rctx, peer.DequeueSubject(owner), data)
	if err != nil {
		return nil, err
	}
	var resp peerv1.ShardDequeueResponse
	if err := proto.Unmarshal(msg.Data, &resp); err != nil {
		return nil, err
	}
	if resp.Error != "" {
		return resp.Items, peer.ReplyError(codes.Code(resp.Code), resp.Error)
	}
	return resp.Items, nil
}

// Unbuffer sends an Unbuffer to owner.
func (d NATSDequeuers) Unbuffer(ctx context.Context, owner, ns string, shard uint32, keys []uint64) error {
	data, err := proto.Marshal(&peerv1.Unbuffer{Namespace: ns, Shard: shard, Keys: keys})
	if err != nil {
		return err
	}
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	msg, err := d.NC.RequestWithContext(rctx, peer.UnbufferSubject(owner), data)
	if err != nil {
		return err
	}
	var resp peerv1.UnbufferResponse
	if err := proto.Unmarshal(msg.Data, &resp); err != nil {
		return err
	}
	if resp.Error != "" {
		return errors.New(resp.Error)
	}
	return nil
}

// localFirst calls the in-process dequeuer directly when it is the owner,
// and the others through remote.
type localFirst struct {
	local  LocalDequeuer
	remote Dequeuers
}

func (d localFirst) Dequeue(ctx context.Context, owner string, req *triagev1.DequeueRequest, shards []uint32) ([]*triagev1.LeasedItem, error) {
	if d.local != nil && d.local.ID() == owner {
		return d.local.Dequeue(ctx, req, shards)
	}
	return d.remote.Dequeue(ctx, owner, req, shards)
}

func (d localFirst) Unbuffer(ctx context.Context, owner, ns string, shard uint32, keys []uint64) error {
	if d.local != nil && d.local.ID() == owner {
		return d.local.Unbuffer(ctx, ns, shard, keys)
	}
	return d.remote.Unbuffer(ctx, owner, ns, shard, keys)
}

// forward asks owner for the request's items of shards. An owner that is
// gone or handed the shards over makes the ownership view re-read them,
// so the client's retry reaches whoever holds them now.
func (r *Router) forward(ctx context.Context, owner string, req *triagev1.DequeueRequest, shards []uint32) ([]*triagev1.LeasedItem, error) {
	items, err := r.dq.Dequeue(ctx, owner, req, shards)
	if errors.Is(err, nats.ErrNoResponders) || errors.Is(err, peer.ErrNotOwner) {
		r.cfg.Owners.Reload(ctx, shards)
	}
	if err != nil {
		return items, fmt.Errorf("%w: dequeuer %s: %w", ErrUnavailable, owner, err)
	}
	return items, nil
}
