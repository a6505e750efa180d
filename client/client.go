package client

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/durationpb"

	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
)

// Client is a connection to one or more Triage routers. It is safe for
// concurrent use.
type Client struct {
	// Queue is the data plane: every Queue RPC with its full request,
	// with failover and retries (see DialEndpoints).
	Queue triagev1.QueueClient
	// Admin is the control plane, with the same failover; its changes are
	// never repeated.
	Admin triagev1.AdminClient

	mc *multiConn
}

// Option configures Dial.
type Option func(*options)

type options struct {
	region   string
	retry    RetryPolicy
	dialOpts []grpc.DialOption
}

// WithRegion sets the region put in Enqueue, Dequeue, GetTopicStats and
// ListTopics requests that leave theirs empty, and makes the endpoints of
// that region preferred. Default: none, so the router uses its own region.
func WithRegion(region string) Option {
	return func(o *options) { o.region = region }
}

// WithRetry sets how calls failing with UNAVAILABLE are retried and
// failed over (RetryPolicy documents the defaults).
func WithRetry(p RetryPolicy) Option {
	return func(o *options) { o.retry = p }
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
	return DialEndpoints(ctx, []Endpoint{{Addr: addr}}, opts...)
}

// DialEndpoints creates a client for several routers. Calls go to the
// first endpoint of the preferred region (WithRegion) that is up, then to
// the others in the order given; a call that fails with UNAVAILABLE moves
// on to the next endpoint at once and, once all were tried, backs off with
// jitter (WithRetry). Any router serves any call, so failover needs no
// state: a lease taken through one router is acked through another.
func DialEndpoints(ctx context.Context, endpoints []Endpoint, opts ...Option) (*Client, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if len(endpoints) == 0 {
		return nil, fmt.Errorf("%w: no endpoints; give at least one router address", ErrInvalid)
	}
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	dialOpts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	if o.region != "" {
		dialOpts = append(dialOpts, grpc.WithChainUnaryInterceptor(regionInterceptor(o.region)))
	}
	mc := &multiConn{policy: o.retry.withDefaults(), sleep: sleepCtx}
	for _, ep := range endpoints {
		conn, err := grpc.NewClient(ep.Addr, append(dialOpts, o.dialOpts...)...)
		if err != nil {
			mc.close()
			return nil, fmt.Errorf("endpoint %s: %w", ep.Addr, err)
		}
		mc.eps = append(mc.eps, &endpoint{Endpoint: ep, conn: conn})
	}
	// Preferred region first, each group in the caller's order.
	slices.SortStableFunc(mc.eps, func(a, b *endpoint) int {
		return cmp.Compare(rank(a.Region, o.region), rank(b.Region, o.region))
	})
	return &Client{
		Queue: triagev1.NewQueueClient(mc),
		Admin: triagev1.NewAdminClient(mc),
		mc:    mc,
	}, nil
}

func rank(region, preferred string) int {
	if preferred != "" && region == preferred {
		return 0
	}
	return 1
}

// Close closes the connections; RPCs in flight fail with codes.Canceled.
func (c *Client) Close() error {
	return c.mc.close()
}

func (m *multiConn) close() error {
	var errs []error
	for _, e := range m.eps {
		errs = append(errs, e.conn.Close())
	}
	return errors.Join(errs...)
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
