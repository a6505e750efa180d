package routing

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/triage-queue/triage/proto/triage/peer"
	peerv1 "github.com/triage-queue/triage/proto/triage/peer/v1"
	"github.com/triage-queue/triage/schema/tracing"
)

// Publisher limits: how many batches and bytes one envelope carries, and
// how many envelopes per shard may wait for their PubAck at once.
const (
	maxEnvelopeBatches = 256
	maxEnvelopeBytes   = 4 << 20
	publishersPerShard = 4
	publishTimeout     = 10 * time.Second
	// publishAttempt is how long one publish waits for its PubAck before
	// it is sent again (publishMsg): a healthy stream answers within
	// milliseconds, and 200 ms over a WAN under load.
	publishAttempt = 2 * time.Second
	// msgOverhead is what a JetStream message carries beside its envelope
	// (the Nats-Msg-Id header and framing), with room to spare.
	msgOverhead = 1 << 10
	// batchOverhead bounds an EnqueueBatch's fields other than its items and
	// names (shard, IDs, time, reply inbox, framing).
	batchOverhead = 256
	// defaultMaxMsg is NATS's default max_payload, used while the
	// connection has not learnt the server's.
	defaultMaxMsg = 1 << 20
)

// maxMsg is the largest message the NATS server takes (its max_payload).
func (r *Router) maxMsg() int {
	if n := int(r.cfg.NC.MaxPayload()); n > 0 {
		return n
	}
	return defaultMaxMsg
}

// envelopeLimit is how many bytes of batches one envelope may carry: what
// fits one NATS message, and no more than maxEnvelopeBytes.
func (r *Router) envelopeLimit() int {
	return min(maxEnvelopeBytes, r.maxMsg()-msgOverhead)
}

// batchLimit is how many bytes of items one batch of namespace and topic
// may carry so that the batch alone fits one message. An item larger than
// this can never be buffered and is refused before anything is published.
func (r *Router) batchLimit(namespace, topic string) int {
	return r.maxMsg() - msgOverhead - batchOverhead - len(namespace) - len(topic) - len(r.inbox)
}

// MaxPayloadFor is the largest max_payload_bytes a namespace may have with
// this NATS server: an item of that payload and the largest metadata must
// fit one message alone.
func (r *Router) MaxPayloadFor(namespace string) int {
	return r.batchLimit(namespace, strings.Repeat("t", 128)) - MaxMetadataBytes - maxItemFields
}

// maxItemFields bounds a BufferedItem's fields other than payload and
// metadata (key, priority, times, lease, dedup key, framing).
const maxItemFields = 64 + MaxDedupKeyBytes

type pubReq struct {
	batch *peerv1.EnqueueBatch
	size  int
	// traceparent is the request's publish span ("" without tracing),
	// carried beside the batch to the enqueuer's insert.
	traceparent string
	done        chan error
}

// shardPublisher coalesces the batches of concurrent requests bound for one
// shard into envelopes: a publisher goroutine takes the first waiting batch
// and every other one already queued, and publishes them as one JetStream
// message. Under light load an envelope is one batch and adds no delay;
// under heavy load one PubAck round trip and one stream write serve many
// requests.
type shardPublisher struct {
	subject string
	home    string
	shard   uint32
	ch      chan pubReq
}

func (r *Router) publisherFor(home string, shard uint32) *shardPublisher {
	subject := peer.EnqueueSubject(home, shard)
	r.pubMu.Lock()
	defer r.pubMu.Unlock()
	p := r.publishers[subject]
	if p == nil {
		p = &shardPublisher{subject: subject, home: home, shard: shard, ch: make(chan pubReq, 4*maxEnvelopeBatches)}
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
		limit := r.envelopeLimit()
	drain:
		for len(reqs) < maxEnvelopeBatches && size < limit {
			select {
			case q := <-p.ch:
				if size+q.size > limit {
					// Not in this envelope: it goes alone, so that no
					// message is larger than the server takes.
					go func() {
						q.done <- r.publishEnvelope(p.home, p.shard, &peerv1.EnqueueEnvelope{Batches: []*peerv1.EnqueueBatch{q.batch}}, []string{q.traceparent})
					}()
					break drain
				}
				reqs = append(reqs, q)
				size += q.size
			default:
				break drain
			}
		}
		env := &peerv1.EnqueueEnvelope{Batches: make([]*peerv1.EnqueueBatch, len(reqs))}
		tps := make([]string, len(reqs))
		for i, q := range reqs {
			env.Batches[i] = q.batch
			tps[i] = q.traceparent
		}
		err := r.publishEnvelope(p.home, p.shard, env, tps)
		for _, q := range reqs {
			q.done <- err
		}
	}
}

// publishEnvelope publishes env to the enqueue stream of home's shard,
// its batches' trace contexts (traceparents, in order) in the message
// header. With Config.FastCopies, once the stream has acknowledged it,
// a copy goes to the shard's worker over core NATS (see package
// enqueuer, Fast copies): lost or late, it costs nothing.
func (r *Router) publishEnvelope(home string, shard uint32, env *peerv1.EnqueueEnvelope, traceparents []string) error {
	data, err := proto.Marshal(env)
	if err != nil {
		return err
	}
	msg := nats.NewMsg(peer.EnqueueSubject(home, shard))
	msg.Data = data
	// The stream drops a retried publish of the same envelope.
	msg.Header.Set(jetstream.MsgIDHeader, strconv.FormatUint(env.Batches[0].BatchId, 16))
	tracing.Inject(msg.Header, traceparents)
	err = r.publishMsg(msg)
	if err == nil && r.cfg.FastCopies {
		fast := nats.NewMsg(peer.EnqueueNowSubject(home, shard))
		fast.Data, fast.Header = data, msg.Header
		_ = r.cfg.NC.PublishMsg(fast)
	}
	return classifyPublish(err)
}

// publishMsg publishes msg to its stream within publishTimeout, sending it
// again when an attempt has had no answer for publishAttempt or found no
// stream to answer it. A stream leader that steps down (the enqueuers
// move leaders near their region, see package enqueuer) or is lost with
// its server drops the publishes it had not yet stored without a word,
// and the client library only retries "no responders": with a single
// attempt, such an envelope's requests waited the whole publishTimeout
// and failed, unstored. The resent message carries the same Nats-Msg-Id,
// so the stream stores it once whether or not the first one got in.
func (r *Router) publishMsg(msg *nats.Msg) error {
	deadline := time.Now().Add(publishTimeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), min(time.Until(deadline), publishAttempt))
		_, err := r.cfg.JS.PublishMsg(ctx, msg)
		cancel()
		lost := errors.Is(err, context.DeadlineExceeded) || errors.Is(err, jetstream.ErrNoStreamResponse)
		if !lost || !time.Now().Before(deadline) {
			return err
		}
	}
}

// publish stores every batch of a request in the enqueue stream of its
// shard's home region (the stream that region's enqueuers drain into the
// shard) and returns once JetStream has acknowledged them all.
func (r *Router) publish(ctx context.Context, order []*shardBatch) (err error) {
	ctx, span := r.tracer.Start(ctx, "enqueue.publish", trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(attribute.Int("triage.batches", len(order))))
	defer func() { tracing.End(span, err) }()
	tp := tracing.Traceparent(ctx)
	reqs := make([]pubReq, len(order))
	for i, g := range order {
		// The envelope's framing of the batch: a tag and a length.
		reqs[i] = pubReq{batch: g.batch, size: protowire.SizeBytes(proto.Size(g.batch)) + 1, traceparent: tp, done: make(chan error, 1)}
		if reqs[i].size > r.envelopeLimit()/2 {
			// Too big to share an envelope; it goes alone.
			go func(q pubReq) {
				q.done <- r.publishEnvelope(g.home, g.shard, &peerv1.EnqueueEnvelope{Batches: []*peerv1.EnqueueBatch{q.batch}}, []string{q.traceparent})
			}(reqs[i])
			continue
		}
		select {
		case r.publisherFor(g.home, g.shard).ch <- reqs[i]:
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
