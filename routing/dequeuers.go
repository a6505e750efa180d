package routing

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/triage-queue/triage/proto/triage/peer"
	peerv1 "github.com/triage-queue/triage/proto/triage/peer/v1"
	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
	"github.com/triage-queue/triage/schema/tracing"
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
type NATSDequeuers struct {
	NC *nats.Conn
	// Late receives the items of answers that arrived after Dequeue's
	// caller had gone (its ctx ended): the owner leased them and counted
	// an attempt, and no consumer will ever see them, so they must go back
	// to the ready set. Nil drops them (they come back when their lease
	// lapses, the attempt counted).
	Late func(namespace string, items []*triagev1.LeasedItem)
}

// Dequeue sends a ShardDequeue to owner and waits up to the request's wait
// plus peer.CallerSlack for the answer. The trace context of ctx rides in
// the request's traceparent header, so the dequeuer's span joins the trace.
//
// It does not use nats.Conn.Request: when ctx ends first, the owner is
// still working and will answer (within the wait plus peer.AnswerWithin),
// and a Request's reply subscription is gone by then, so the answer and
// its leased items would be lost. Dequeue keeps its own reply subscription
// open until that bound and hands whatever arrives to Late.
func (d NATSDequeuers) Dequeue(ctx context.Context, owner string, req *triagev1.DequeueRequest, shards []uint32) ([]*triagev1.LeasedItem, error) {
	data, err := proto.Marshal(&peerv1.ShardDequeue{Request: req, Shards: shards})
	if err != nil {
		return nil, err
	}
	wait := req.GetWait().AsDuration()
	sent := time.Now()
	// The connection's inbox (peer.InboxPrefix), not nats.NewInbox's
	// "_INBOX.", which the servers refuse Triage's login.
	sub, err := d.NC.SubscribeSync(d.NC.NewInbox())
	if err != nil {
		return nil, err
	}
	out := nats.NewMsg(peer.DequeueSubject(owner))
	out.Data = data
	out.Reply = sub.Subject
	if tp := tracing.Traceparent(ctx); tp != "" {
		out.Header.Set(tracing.Header, tp)
	}
	if err := d.NC.PublishMsg(out); err != nil {
		_ = sub.Unsubscribe()
		return nil, err
	}
	rctx, cancel := context.WithTimeout(ctx, wait+peer.CallerSlack)
	defer cancel()
	msg, err := sub.NextMsgWithContext(rctx)
	if err != nil {
		// Gone or timed out: the answer may still come.
		go d.late(sub, req.Namespace, sent.Add(wait+peer.AnswerWithin+peer.LateSlack))
		if ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("%w: no answer within %s", nats.ErrTimeout, wait+peer.CallerSlack)
		}
		return nil, err
	}
	_ = sub.Unsubscribe()
	return decodeDequeueAnswer(msg)
}

// late waits until deadline for the answer of a Dequeue whose caller has
// gone, and hands its items to Late.
func (d NATSDequeuers) late(sub *nats.Subscription, ns string, deadline time.Time) {
	defer func() { _ = sub.Unsubscribe() }()
	msg, err := sub.NextMsg(time.Until(deadline))
	if err != nil {
		return
	}
	items, _ := decodeDequeueAnswer(msg)
	if len(items) > 0 && d.Late != nil {
		d.Late(ns, items)
	}
}

// decodeDequeueAnswer reads a ShardDequeue's answer: its items, and its
// error with the code the owner gave it. An owner with an error may still
// have served items (its answer carries both).
func decodeDequeueAnswer(msg *nats.Msg) ([]*triagev1.LeasedItem, error) {
	if len(msg.Data) == 0 && msg.Header.Get("Status") == "503" {
		return nil, nats.ErrNoResponders
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
// so the client's retry reaches whoever holds them now. Each call is a
// "dequeue.forward" span, the parent of the dequeuer's.
func (r *Router) forward(ctx context.Context, owner string, req *triagev1.DequeueRequest, shards []uint32) (items []*triagev1.LeasedItem, err error) {
	ctx, span := r.tracer.Start(ctx, "dequeue.forward", trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attribute.String("triage.dequeuer", owner), attribute.Int("triage.shards", len(shards))))
	defer func() { tracing.End(span, err, attribute.Int("triage.items", len(items))) }()
	items, err = askWhileOwner(ctx, r.cfg.Owners, owner, shards, func(ctx context.Context) ([]*triagev1.LeasedItem, error) {
		return r.dq.Dequeue(ctx, owner, req, shards)
	})
	if errors.Is(err, nats.ErrNoResponders) || errors.Is(err, peer.ErrNotOwner) {
		r.cfg.Owners.Reload(ctx, shards)
	}
	if err != nil {
		return items, fmt.Errorf("%w: dequeuer %s: %w", ErrUnavailable, owner, err)
	}
	return items, nil
}
