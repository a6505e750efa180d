package bed

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/triage-queue/triage/cmd/triage/provision"
	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
)

// readyTopic is where the bed proves each region works before it says it
// is up.
const readyTopic = "bed-ready"

// waitReady enqueues one item into every region's shards through that
// region's router and dequeues and acks it: a bed is "up" only once the
// whole path works (consumers of the replicated enqueue streams and shard
// ownership are set up asynchronously after the nodes start).
func (b *Bed) waitReady(ctx context.Context) error {
	b.progress("checking every region end to end (enqueue, dequeue, ack)")
	ctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	return provision.Parallel(len(b.regions), func(i int) error {
		r := b.regions[i]
		conn, err := grpc.NewClient(r.node.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return err
		}
		defer conn.Close()
		q := triagev1.NewQueueClient(conn)
		return provision.Poll(ctx, 200*time.Millisecond, func(ctx context.Context) error {
			rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			if b.Layout.Token != "" {
				rctx = metadata.AppendToOutgoingContext(rctx, "authorization", "Bearer "+b.Layout.Token)
			}
			_, err := q.Enqueue(rctx, &triagev1.EnqueueRequest{Namespace: "default", Topic: readyTopic, Region: r.name,
				Items: []*triagev1.NewItem{{Payload: []byte("ready")}}})
			if err != nil {
				return fmt.Errorf("region %s enqueue: %w", r.name, err)
			}
			for got := 0; ; {
				resp, err := q.Dequeue(rctx, &triagev1.DequeueRequest{Namespace: "default", Region: r.name,
					Topics: []*triagev1.TopicCount{{Topic: readyTopic, Count: 10}}, Wait: durationpb.New(time.Second)})
				if err != nil {
					return fmt.Errorf("region %s dequeue: %w", r.name, err)
				}
				if len(resp.Items) == 0 {
					if got == 0 {
						return fmt.Errorf("region %s: the item did not come back yet", r.name)
					}
					return nil
				}
				got += len(resp.Items)
				ack := &triagev1.AckRequest{Namespace: "default"}
				for _, it := range resp.Items {
					ack.Acks = append(ack.Acks, &triagev1.LeaseRef{Id: it.Id, LeaseToken: it.LeaseToken})
				}
				if _, err := q.Ack(rctx, ack); err != nil {
					return fmt.Errorf("region %s ack: %w", r.name, err)
				}
			}
		})
	})
}
