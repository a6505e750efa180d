package routing

import (
	"context"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/triage-queue/triage/enqueuer"
	peerv1 "github.com/triage-queue/triage/proto/triage/peer/v1"
)

// Publisher limits: how many batches and bytes one envelope carries, and
// how many envelopes per shard may wait for their PubAck at once.
const (
	maxEnvelopeBatches = 256
	maxEnvelopeBytes   = 4 << 20
	publishersPerShard = 4
	publishTimeout     = 10 * time.Second
)

type pubReq struct {
	batch *peerv1.EnqueueBatch
	size  int
	done  chan error
}

// shardPublisher coalesces the batches of concurrent requests bound for one
// shard into envelopes: a publisher goroutine takes the first waiting batch
// and every other one already queued, and publishes them as one JetStream
// message. Under light load an envelope is one batch and adds no delay;
// under heavy load one PubAck round trip and one stream write serve many
// requests.
type shardPublisher struct {
	subject string
	ch      chan pubReq
}

func (r *Router) publisherFor(subject string) *shardPublisher {
	r.pubMu.Lock()
	defer r.pubMu.Unlock()
	p := r.publishers[subject]
	if p == nil {
		p = &shardPublisher{subject: subject, ch: make(chan pubReq, 4*maxEnvelopeBatches)}
		r.publishers[subject] = p
		for i := 0; i < publishersPerShard; i++ {
			r.pubWG.Add(1)
			go func() {
				defer r.pubWG.Done()
				r.publishLoop(p)
			}()
		}
	}
	return p
}

func (r *Router) publishLoop(p *shardPublisher) {
	var reqs []pubReq
	for {
		select {
		case <-r.stopping:
			return
		case first := <-p.ch:
			reqs = append(reqs[:0], first)
		}
		size := reqs[0].size
	drain:
		for len(reqs) < maxEnvelopeBatches && size < maxEnvelopeBytes {
			select {
			case q := <-p.ch:
				reqs = append(reqs, q)
				size += q.size
			default:
				break drain
			}
		}
		env := &peerv1.EnqueueEnvelope{Batches: make([]*peerv1.EnqueueBatch, len(reqs))}
		for i, q := range reqs {
			env.Batches[i] = q.batch
		}
		err := r.publishEnvelope(p.subject, env)
		for _, q := range reqs {
			q.done <- err
		}
	}
}

func (r *Router) publishEnvelope(subject string, env *peerv1.EnqueueEnvelope) error {
	data, err := proto.Marshal(env)
	if err != nil {
		return err
	}
	msg := nats.NewMsg(subject)
	msg.Data = data
	// The stream drops a retried publish of the same envelope.
	msg.Header.Set(jetstream.MsgIDHeader, strconv.FormatUint(env.Batches[0].BatchId, 16))
	ctx, cancel := context.WithTimeout(context.Background(), publishTimeout)
	defer cancel()
	_, err = r.cfg.JS.PublishMsg(ctx, msg)
	return classifyPublish(err)
}

// publish stores every batch of a request in the region's enqueue stream
// and returns once JetStream has acknowledged them all.
func (r *Router) publish(ctx context.Context, region string, order []*shardBatch) error {
	reqs := make([]pubReq, len(order))
	for i, g := range order {
		reqs[i] = pubReq{batch: g.batch, size: proto.Size(g.batch), done: make(chan error, 1)}
		if reqs[i].size > maxEnvelopeBytes {
			// Too big to share an envelope; it goes alone.
			go func(q pubReq) {
				q.done <- r.publishEnvelope(enqueuer.Subject(region, g.shard), &peerv1.EnqueueEnvelope{Batches: []*peerv1.EnqueueBatch{q.batch}})
			}(reqs[i])
			continue
		}
		select {
		case r.publisherFor(enqueuer.Subject(region, g.shard)).ch <- reqs[i]:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	var errs []error
	for _, q := range reqs {
		select {
		case err := <-q.done:
			if err != nil {
				errs = append(errs, err)
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if len(errs) > 0 {
		return errs[0]
	}
	return nil
}

func classifyPublish(err error) error {
	if err == nil {
		return nil
	}
	// A stream at its limits with DiscardNew answers "maximum messages
	// exceeded" or "maximum bytes exceeded".
	if msg := err.Error(); strings.Contains(msg, "maximum messages") || strings.Contains(msg, "maximum bytes") ||
		strings.Contains(msg, "resource limits exceeded") {
		return errorf(ErrBufferFull, "%v", err)
	}
	return errorf(ErrUnavailable, "enqueue buffer: %v", err)
}
