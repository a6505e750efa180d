package auth

import (
	"context"
	"net/http"

	"google.golang.org/grpc/metadata"

	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
)

// call runs f behind a's checks under method's name, as the gRPC
// interceptor would.
func call[Req, Resp any](ctx context.Context, a *Authorizer, method string, req Req, f func(context.Context, Req) (Resp, error)) (Resp, error) {
	resp, err := a.unary(ctx, method, req, func(ctx context.Context, r any) (any, error) { return f(ctx, r.(Req)) })
	out, _ := resp.(Resp)
	return out, err
}

// GuardQueue guards a Queue server for the JSON gateway, which calls the
// server in-process where no gRPC interceptor runs. It embeds the
// Unimplemented server, so an RPC added to the service and not guarded
// here answers UNIMPLEMENTED over HTTP rather than skipping the checks.
func GuardQueue(inner triagev1.QueueServer, a *Authorizer) triagev1.QueueServer {
	return queueGuard{inner: inner, a: a}
}

type queueGuard struct {
	triagev1.UnimplementedQueueServer
	inner triagev1.QueueServer
	a     *Authorizer
}

func (g queueGuard) Enqueue(ctx context.Context, r *triagev1.EnqueueRequest) (*triagev1.EnqueueResponse, error) {
	return call(ctx, g.a, triagev1.Queue_Enqueue_FullMethodName, r, g.inner.Enqueue)
}

func (g queueGuard) Dequeue(ctx context.Context, r *triagev1.DequeueRequest) (*triagev1.DequeueResponse, error) {
	return call(ctx, g.a, triagev1.Queue_Dequeue_FullMethodName, r, g.inner.Dequeue)
}

func (g queueGuard) Ack(ctx context.Context, r *triagev1.AckRequest) (*triagev1.AckResponse, error) {
	return call(ctx, g.a, triagev1.Queue_Ack_FullMethodName, r, g.inner.Ack)
}

func (g queueGuard) Nack(ctx context.Context, r *triagev1.NackRequest) (*triagev1.NackResponse, error) {
	return call(ctx, g.a, triagev1.Queue_Nack_FullMethodName, r, g.inner.Nack)
}

func (g queueGuard) ExtendLease(ctx context.Context, r *triagev1.ExtendLeaseRequest) (*triagev1.ExtendLeaseResponse, error) {
	return call(ctx, g.a, triagev1.Queue_ExtendLease_FullMethodName, r, g.inner.ExtendLease)
}

func (g queueGuard) GetItem(ctx context.Context, r *triagev1.GetItemRequest) (*triagev1.Item, error) {
	return call(ctx, g.a, triagev1.Queue_GetItem_FullMethodName, r, g.inner.GetItem)
}

func (g queueGuard) UpdateItem(ctx context.Context, r *triagev1.UpdateItemRequest) (*triagev1.Item, error) {
	return call(ctx, g.a, triagev1.Queue_UpdateItem_FullMethodName, r, g.inner.UpdateItem)
}

func (g queueGuard) DeleteItem(ctx context.Context, r *triagev1.DeleteItemRequest) (*triagev1.DeleteItemResponse, error) {
	return call(ctx, g.a, triagev1.Queue_DeleteItem_FullMethodName, r, g.inner.DeleteItem)
}

func (g queueGuard) GetTopicStats(ctx context.Context, r *triagev1.GetTopicStatsRequest) (*triagev1.TopicStats, error) {
	return call(ctx, g.a, triagev1.Queue_GetTopicStats_FullMethodName, r, g.inner.GetTopicStats)
}

func (g queueGuard) ListTopics(ctx context.Context, r *triagev1.ListTopicsRequest) (*triagev1.ListTopicsResponse, error) {
	return call(ctx, g.a, triagev1.Queue_ListTopics_FullMethodName, r, g.inner.ListTopics)
}

func (g queueGuard) ListDeadLetters(ctx context.Context, r *triagev1.ListDeadLettersRequest) (*triagev1.ListDeadLettersResponse, error) {
	return call(ctx, g.a, triagev1.Queue_ListDeadLetters_FullMethodName, r, g.inner.ListDeadLetters)
}

func (g queueGuard) ListItems(ctx context.Context, r *triagev1.ListItemsRequest) (*triagev1.ListItemsResponse, error) {
	return call(ctx, g.a, triagev1.Queue_ListItems_FullMethodName, r, g.inner.ListItems)
}

func (g queueGuard) GetThroughput(ctx context.Context, r *triagev1.GetThroughputRequest) (*triagev1.Throughput, error) {
	return call(ctx, g.a, triagev1.Queue_GetThroughput_FullMethodName, r, g.inner.GetThroughput)
}

func (g queueGuard) RedriveDeadLetters(ctx context.Context, r *triagev1.RedriveDeadLettersRequest) (*triagev1.RedriveDeadLettersResponse, error) {
	return call(ctx, g.a, triagev1.Queue_RedriveDeadLetters_FullMethodName, r, g.inner.RedriveDeadLetters)
}

func (g queueGuard) DeleteDeadLetters(ctx context.Context, r *triagev1.DeleteDeadLettersRequest) (*triagev1.DeleteDeadLettersResponse, error) {
	return call(ctx, g.a, triagev1.Queue_DeleteDeadLetters_FullMethodName, r, g.inner.DeleteDeadLetters)
}

// GuardAdmin guards an Admin server for the JSON gateway, as GuardQueue does.
func GuardAdmin(inner triagev1.AdminServer, a *Authorizer) triagev1.AdminServer {
	return adminGuard{inner: inner, a: a}
}

type adminGuard struct {
	triagev1.UnimplementedAdminServer
	inner triagev1.AdminServer
	a     *Authorizer
}

func (g adminGuard) GetShardMap(ctx context.Context, r *triagev1.GetShardMapRequest) (*triagev1.ShardMap, error) {
	return call(ctx, g.a, triagev1.Admin_GetShardMap_FullMethodName, r, g.inner.GetShardMap)
}

func (g adminGuard) Failover(ctx context.Context, r *triagev1.FailoverRequest) (*triagev1.FailoverResponse, error) {
	return call(ctx, g.a, triagev1.Admin_Failover_FullMethodName, r, g.inner.Failover)
}

func (g adminGuard) GetNamespace(ctx context.Context, r *triagev1.GetNamespaceRequest) (*triagev1.Namespace, error) {
	return call(ctx, g.a, triagev1.Admin_GetNamespace_FullMethodName, r, g.inner.GetNamespace)
}

func (g adminGuard) PutNamespace(ctx context.Context, r *triagev1.PutNamespaceRequest) (*triagev1.Namespace, error) {
	return call(ctx, g.a, triagev1.Admin_PutNamespace_FullMethodName, r, g.inner.PutNamespace)
}

func (g adminGuard) PauseTopic(ctx context.Context, r *triagev1.PauseTopicRequest) (*triagev1.TopicPauseState, error) {
	return call(ctx, g.a, triagev1.Admin_PauseTopic_FullMethodName, r, g.inner.PauseTopic)
}

func (g adminGuard) ResumeTopic(ctx context.Context, r *triagev1.ResumeTopicRequest) (*triagev1.TopicPauseState, error) {
	return call(ctx, g.a, triagev1.Admin_ResumeTopic_FullMethodName, r, g.inner.ResumeTopic)
}

func (g adminGuard) AddShard(ctx context.Context, r *triagev1.AddShardRequest) (*triagev1.ShardChange, error) {
	return call(ctx, g.a, triagev1.Admin_AddShard_FullMethodName, r, g.inner.AddShard)
}

func (g adminGuard) AddNamespaceShard(ctx context.Context, r *triagev1.AddNamespaceShardRequest) (*triagev1.ShardChange, error) {
	return call(ctx, g.a, triagev1.Admin_AddNamespaceShard_FullMethodName, r, g.inner.AddNamespaceShard)
}

func (g adminGuard) SetShardWeight(ctx context.Context, r *triagev1.SetShardWeightRequest) (*triagev1.ShardChange, error) {
	return call(ctx, g.a, triagev1.Admin_SetShardWeight_FullMethodName, r, g.inner.SetShardWeight)
}

func (g adminGuard) DrainShard(ctx context.Context, r *triagev1.DrainShardRequest) (*triagev1.ShardChange, error) {
	return call(ctx, g.a, triagev1.Admin_DrainShard_FullMethodName, r, g.inner.DrainShard)
}

func (g adminGuard) RetireShard(ctx context.Context, r *triagev1.RetireShardRequest) (*triagev1.ShardChange, error) {
	return call(ctx, g.a, triagev1.Admin_RetireShard_FullMethodName, r, g.inner.RetireShard)
}

func (g adminGuard) ListFailoverEvents(ctx context.Context, r *triagev1.ListFailoverEventsRequest) (*triagev1.ListFailoverEventsResponse, error) {
	return call(ctx, g.a, triagev1.Admin_ListFailoverEvents_FullMethodName, r, g.inner.ListFailoverEvents)
}

func (g adminGuard) ReportDrill(ctx context.Context, r *triagev1.ReportDrillRequest) (*triagev1.Drill, error) {
	return call(ctx, g.a, triagev1.Admin_ReportDrill_FullMethodName, r, g.inner.ReportDrill)
}

func (g adminGuard) ListDrills(ctx context.Context, r *triagev1.ListDrillsRequest) (*triagev1.ListDrillsResponse, error) {
	return call(ctx, g.a, triagev1.Admin_ListDrills_FullMethodName, r, g.inner.ListDrills)
}

// AuthenticateHTTP checks an HTTP request's credentials (its
// authorization header, else its verified client certificate) against
// the keys, as the guards will, but before the gateway reads its body:
// the gateway reads only a small body of a request that fails it (see
// routing.WithAuthenticate). It returns nil when authentication is off
// (no keys file), else the UNAUTHENTICATED error the guard would answer.
// Whether the identity may call the RPC is left to the guard, which
// sees the request's namespace.
func (a *Authorizer) AuthenticateHTTP(r *http.Request) error {
	if a.keys == nil {
		return nil
	}
	ctx := r.Context()
	if vals := r.Header.Values("Authorization"); len(vals) > 0 {
		ctx = metadata.NewIncomingContext(ctx, metadata.MD{"authorization": vals})
	}
	if r.TLS != nil {
		ctx = WithTLSState(ctx, r.TLS)
	}
	_, err := a.authenticate(ctx)
	return err
}

// HTTP passes each request's TLS state (its client certificate) to the
// gateway's in-process calls, where the guards look for it.
func HTTP(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.TLS != nil {
			r = r.WithContext(WithTLSState(r.Context(), r.TLS))
		}
		next.ServeHTTP(w, r)
	})
}
