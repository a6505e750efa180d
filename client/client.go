package client

import (
	"cmp"
	"context"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/durationpb"

	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
)

// Client is a connection to a Triage router. It is safe for concurrent use.
type Client struct {
	// Queue is the data plane: every Queue RPC with its full request.
	Queue triagev1.QueueClient
	// Admin is the control plane.
	Admin triagev1.AdminClient

	conn *grpc.ClientConn
}

// Option configures Dial.
type Option func(*options)

type options struct {
	region   string
	dialOpts []grpc.DialOption
}

// WithRegion sets the region put in Enqueue, Dequeue, GetTopicStats and
// ListTopics requests that leave theirs empty. Default: none, so the router
// uses its own region.
func WithRegion(region string) Option {
	return func(o *options) { o.region = region }
}

// WithDialOptions adds gRPC dial options after the defaults (plaintext
// credentials), so transport credentials given here win.
func WithDialOptions(opts ...grpc.DialOption) Option {
	return func(o *options) { o.dialOpts = append(o.dialOpts, opts...) }
}

// Dial creates a client for the router at addr (host:port). It does not
// wait for the connection to come up; ctx only stops a Dial that is already
// cancelled.
func Dial(ctx context.Context, addr string, opts ...Option) (*Client, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	dialOpts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	if o.region != "" {
		dialOpts = append(dialOpts, grpc.WithChainUnaryInterceptor(regionInterceptor(o.region)))
	}
	conn, err := grpc.NewClient(addr, append(dialOpts, o.dialOpts...)...)
	if err != nil {
		return nil, err
	}
	return &Client{
		Queue: triagev1.NewQueueClient(conn),
		Admin: triagev1.NewAdminClient(conn),
		conn:  conn,
	}, nil
}

// Close closes the connection; RPCs in flight fail with codes.Canceled.
func (c *Client) Close() error {
	return c.conn.Close()
}

// regionInterceptor fills an empty region with the default, in every
// request that has a region field. It works on a clone so the caller's
// request stays as it was, even if the caller sends it again or from
// another goroutine.
func regionInterceptor(region string) grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if r, ok := req.(interface {
			proto.Message
			GetRegion() string
		}); ok && r.GetRegion() == "" {
			c := proto.Clone(r)
			if fd := c.ProtoReflect().Descriptor().Fields().ByName("region"); fd != nil && fd.Kind() == protoreflect.StringKind {
				c.ProtoReflect().Set(fd, protoreflect.ValueOfString(region))
				req = c
			}
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
}

// Enqueue stores items in a topic with COMMITTED durability and returns one
// result per item, in order. Use Queue.Enqueue for BUFFERED durability.
func (c *Client) Enqueue(ctx context.Context, namespace, topic string, items ...*triagev1.NewItem) ([]*triagev1.EnqueueResult, error) {
	resp, err := c.Queue.Enqueue(ctx, &triagev1.EnqueueRequest{Namespace: namespace, Topic: topic, Items: items})
	if err != nil {
		return nil, err
	}
	return resp.GetResults(), nil
}

// Dequeue leases up to count items of one topic. A zero lease keeps each
// item's own lease duration; a non-zero wait long-polls up to that long for
// at least one item, so ctx's deadline should be longer than wait.
func (c *Client) Dequeue(ctx context.Context, namespace, topic string, count int, lease, wait time.Duration) ([]*triagev1.LeasedItem, error) {
	req := &triagev1.DequeueRequest{
		Namespace: namespace,
		Topics:    []*triagev1.TopicCount{{Topic: topic, Count: int32(min(count, 1<<31-1))}},
	}
	if lease != 0 {
		req.LeaseDuration = durationpb.New(lease)
	}
	if wait != 0 {
		req.Wait = durationpb.New(wait)
	}
	resp, err := c.Queue.Dequeue(ctx, req)
	if err != nil {
		return nil, err
	}
	return resp.GetItems(), nil
}

// Ack deletes leased items. The error reports the call; each item's outcome
// (a stale token, say) is in its ItemResult, in request order.
func (c *Client) Ack(ctx context.Context, namespace string, items ...*triagev1.LeasedItem) ([]*triagev1.ItemResult, error) {
	req := &triagev1.AckRequest{Namespace: namespace, Acks: make([]*triagev1.LeaseRef, len(items))}
	for i, it := range items {
		req.Acks[i] = &triagev1.LeaseRef{Id: it.GetId(), LeaseToken: it.GetLeaseToken()}
	}
	resp, err := c.Queue.Ack(ctx, req)
	if err != nil {
		return nil, err
	}
	return resp.GetResults(), nil
}

// Nack returns a leased item to its topic after delay (0: at once; below
// 0: the server's exponential backoff), recording errMsg as its last
// error. A refused item (stale token, gone) is an *ItemError.
func (c *Client) Nack(ctx context.Context, namespace string, item *triagev1.LeasedItem, delay time.Duration, errMsg string) error {
	n := &triagev1.NackItem{Id: item.GetId(), LeaseToken: item.GetLeaseToken(), Error: errMsg}
	if delay >= 0 {
		n.Delay = durationpb.New(delay)
	}
	resp, err := c.Queue.Nack(ctx, &triagev1.NackRequest{Namespace: namespace, Nacks: []*triagev1.NackItem{n}})
	if err != nil {
		return err
	}
	for _, r := range resp.GetResults() {
		if !r.GetOk() {
			return &ItemError{ID: cmp.Or(r.GetId(), item.GetId()), Reason: r.GetError()}
		}
	}
	return nil
}
