package bench

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
	"github.com/triage-queue/triage/schema"
)

// Topics of the Triage scenarios; each scenario has its own, so one's
// leftovers never change another's ready head.
const (
	readyTopic   = "bench-ready"
	b1Topic      = "bench-enqueue-b1"
	b100Topic    = "bench-enqueue-b100"
	jsonTopic    = "bench-enqueue-json"
	shallowTopic = "bench-shallow"
	deepTopic    = "bench-deep"
	mixedTopic   = "bench-mixed"
)

// rpcTimeout bounds every RPC, so a stuck call ends a worker instead of a
// run.
const rpcTimeout = 30 * time.Second

// waitReady polls the router until an enqueue commits and a dequeue is
// served: the dequeuer must own the shards and the router must have seen it.
func (r *runner) waitReady(ctx context.Context) error {
	deadline := time.Now().Add(30 * time.Second)
	var err error
	for time.Now().Before(deadline) && ctx.Err() == nil {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err = r.client(0).Enqueue(cctx, &triagev1.EnqueueRequest{Namespace: namespace, Topic: readyTopic,
			Items: []*triagev1.NewItem{{Payload: []byte("ready?")}}})
		if err == nil {
			var resp *triagev1.DequeueResponse
			resp, err = r.client(0).Dequeue(cctx, &triagev1.DequeueRequest{Namespace: namespace,
				Topics: []*triagev1.TopicCount{{Topic: readyTopic, Count: 10}}, Wait: durationpb.New(time.Second)})
			if err == nil && len(resp.Items) > 0 {
				_, err = r.client(0).Ack(cctx, &triagev1.AckRequest{Namespace: namespace, Acks: refs(resp.Items)})
				cancel()
				if err == nil {
					return nil
				}
			} else if err == nil {
				err = fmt.Errorf("dequeue returned nothing")
			}
		}
		cancel()
		schema.Sleep(ctx, 200*time.Millisecond)
	}
	return fmt.Errorf("router at %s not ready: %v", r.bed.Layout.Regions[0].GRPC, err)
}

func refs(items []*triagev1.LeasedItem) []*triagev1.LeaseRef {
	out := make([]*triagev1.LeaseRef, len(items))
	for i, it := range items {
		out[i] = &triagev1.LeaseRef{Id: it.Id, LeaseToken: it.LeaseToken}
	}
	return out
}

func (r *runner) enqueueBatch1(ctx context.Context) (Scenario, error) {
	return r.enqueueGRPC(ctx, EnqueueBatch1, b1Topic, r.p.enqueue1Clients, 1)
}

func (r *runner) enqueueBatch100(ctx context.Context) (Scenario, error) {
	return r.enqueueGRPC(ctx, EnqueueBatch100, b100Topic, []int{r.p.enqueue100Clients}, 100)
}

// truncate empties the items and enqueue_batches tables of dbs, so that
// every enqueue measurement starts from the same empty table: a table that
// outgrows the buffer pool costs page flushes that an earlier trial did
// not pay. Nothing is in flight between scenarios (every enqueue measured
// was answered, so committed).
func truncate(ctx context.Context, dbs []*sql.DB) error {
	for _, db := range dbs {
		for _, table := range []string{"items", "enqueue_batches"} {
			if _, err := db.ExecContext(ctx, "TRUNCATE TABLE "+table); err != nil {
				return fmt.Errorf("truncate %s: %w", table, err)
			}
		}
	}
	return nil
}

// enqueueTrials runs closed-loop Enqueue RPCs of batch items each,
// committed durability, once per client count, and returns the best run.
// With empty set the shards' tables are emptied before each run.
func (r *runner) enqueueTrials(ctx context.Context, name, topic string, clientCounts []int, batch int, empty bool) (best *sampler, bestClients int, trials []string, err error) {
	for _, clients := range clientCounts {
		if empty {
			if err := truncate(ctx, r.shardDBs()); err != nil {
				return nil, 0, nil, err
			}
		}
		reqs := make([]*triagev1.EnqueueRequest, clients)
		for i := range reqs {
			items := make([]*triagev1.NewItem, batch)
			for j := range items {
				items[j] = &triagev1.NewItem{Payload: r.payload, Priority: int32((i + j) % 10)}
			}
			reqs[i] = &triagev1.EnqueueRequest{Namespace: namespace, Topic: topic, Items: items, Durability: triagev1.Durability_COMMITTED}
		}
		prog := r.progress(fmt.Sprintf("%s (%d clients x %d items)", name, clients, batch))
		s := runLoad(ctx, loadSpec{workers: clients, warmup: r.p.warmup, measure: r.p.measure,
			op: func(ctx context.Context, w int, _ *sampler) (int, error) {
				cctx, cancel := context.WithTimeout(ctx, rpcTimeout)
				defer cancel()
				resp, err := r.client(w).Enqueue(cctx, reqs[w])
				if err != nil {
					return 0, err
				}
				if len(resp.Results) != batch {
					return 0, fmt.Errorf("enqueue of %d items returned %d results", batch, len(resp.Results))
				}
				return batch, nil
			}}, prog)
		prog.close()
		trials = append(trials, fmt.Sprintf("%d clients: %s", clients, human(s.rate())))
		if best == nil || s.rate() > best.rate() {
			best, bestClients = s, clients
		}
		if ctx.Err() != nil {
			return nil, 0, nil, ctx.Err()
		}
	}
	if best.items == 0 {
		return nil, 0, nil, fmt.Errorf("no enqueue succeeded: %s", best.errNote())
	}
	return best, bestClients, trials, nil
}

// enqueueGRPC: closed-loop Enqueue RPCs of batch items each, committed
// durability, best of the client counts given, each on empty tables.
func (r *runner) enqueueGRPC(ctx context.Context, name, topic string, clientCounts []int, batch int) (Scenario, error) {
	best, bestClients, trials, err := r.enqueueTrials(ctx, name, topic, clientCounts, batch, true)
	if err != nil {
		return Scenario{}, err
	}
	note := fmt.Sprintf("gRPC, %d concurrent clients over %d connections, %d item(s) per request, COMMITTED, empty items table at start",
		bestClients, len(r.clients), batch)
	if len(trials) > 1 {
		note += "; best of " + strings.Join(trials, ", ")
	}
	return Scenario{
		ItemsPerSec: best.rate(),
		P50MS:       best.pct("op", 50), P99MS: best.pct("op", 99), P999MS: best.pct("op", 99.9),
		Latency: fmt.Sprintf("Enqueue RPC of %d item(s), until committed on the shard", batch),
		Notes:   note + errSuffix(best),
	}, nil
}

// enqueueJSON: as triage-enqueue-batch100, through the JSON gateway.
func (r *runner) enqueueJSON(ctx context.Context) (Scenario, error) {
	const batch = 100
	clients := r.p.jsonClients
	hc := &http.Client{Timeout: rpcTimeout, Transport: &http.Transport{MaxIdleConnsPerHost: clients, MaxConnsPerHost: clients}}
	defer hc.CloseIdleConnections()
	url := r.httpBase + "/v1/namespaces/" + namespace + "/topics/" + jsonTopic + "/items"
	payload := base64.StdEncoding.EncodeToString(r.payload)
	if err := truncate(ctx, r.shardDBs()); err != nil {
		return Scenario{}, err
	}
	bodies := make([][]byte, clients)
	for i := range bodies {
		var b strings.Builder
		b.WriteString(`{"durability":"COMMITTED","items":[`)
		for j := range batch {
			if j > 0 {
				b.WriteByte(',')
			}
			b.WriteString(`{"payload":"` + payload + `","priority":` + strconv.Itoa((i+j)%10) + `}`)
		}
		b.WriteString(`]}`)
		bodies[i] = []byte(b.String())
	}
	prog := r.progress(EnqueueJSON)
	s := runLoad(ctx, loadSpec{workers: clients, warmup: r.p.warmup, measure: r.p.measure,
		op: func(ctx context.Context, w int, _ *sampler) (int, error) {
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(bodies[w]))
			if err != nil {
				return 0, err
			}
			req.Header.Set("Content-Type", "application/json")
			resp, err := hc.Do(req)
			if err != nil {
				return 0, err
			}
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
				return 0, fmt.Errorf("HTTP %d: %s", resp.StatusCode, bytes.TrimSpace(msg))
			}
			var out struct {
				Results []struct {
					ID string `json:"id"`
				} `json:"results"`
			}
			if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
				return 0, err
			}
			if len(out.Results) != batch {
				return 0, fmt.Errorf("enqueue of %d items returned %d results", batch, len(out.Results))
			}
			return batch, nil
		}}, prog)
	prog.close()
	if s.items == 0 {
		return Scenario{}, fmt.Errorf("no enqueue succeeded: %s", s.errNote())
	}
	return Scenario{
		ItemsPerSec: s.rate(),
		P50MS:       s.pct("op", 50), P99MS: s.pct("op", 99), P999MS: s.pct("op", 99.9),
		Latency: fmt.Sprintf("POST of %d items, until committed on the shard", batch),
		Notes: fmt.Sprintf("JSON gateway, %d concurrent HTTP/1.1 clients, %d items per request (base64 payloads), COMMITTED, empty items table at start",
			clients, batch) + errSuffix(s),
	}, nil
}

// dequeueAck is one consumer step: Dequeue up to count items of topic,
// then Ack them all in one call. It returns the items acked.
func (r *runner) dequeueAck(ctx context.Context, c triagev1.QueueClient, topic string, count int, wait time.Duration, s *sampler) (int, error) {
	items, err := r.dequeueAckItems(ctx, c, topic, count, wait, s)
	return len(items), err
}

// dequeueAckItems leases up to count items of topic (long-polling wait),
// acks them and returns those acked.
func (r *runner) dequeueAckItems(ctx context.Context, c triagev1.QueueClient, topic string, count int, wait time.Duration, s *sampler) ([]*triagev1.LeasedItem, error) {
	cctx, cancel := context.WithTimeout(ctx, rpcTimeout)
	defer cancel()
	t0 := time.Now()
	resp, err := c.Dequeue(cctx, &triagev1.DequeueRequest{Namespace: namespace,
		Topics: []*triagev1.TopicCount{{Topic: topic, Count: int32(count)}}, Wait: durationpb.New(wait)})
	if err != nil {
		return nil, fmt.Errorf("dequeue: %w", err)
	}
	t1 := time.Now()
	s.observe("dequeue", t1, t1.Sub(t0))
	if len(resp.Items) == 0 {
		return nil, nil
	}
	// Ack even when the run is being cancelled, so no lease is left behind.
	actx, cancel2 := context.WithTimeout(context.WithoutCancel(ctx), rpcTimeout)
	defer cancel2()
	ar, err := c.Ack(actx, &triagev1.AckRequest{Namespace: namespace, Acks: refs(resp.Items)})
	if err != nil {
		return nil, fmt.Errorf("ack: %w", err)
	}
	t2 := time.Now()
	s.observe("ack", t2, t2.Sub(t1))
	acked := resp.Items[:0]
	var bad string
	for i, res := range ar.Results {
		if res.Ok {
			acked = append(acked, resp.Items[i])
		} else if bad == "" {
			bad = res.Id + ": " + res.Error
		}
	}
	if bad != "" {
		return acked, fmt.Errorf("%d of %d acks refused (first %s)", len(ar.Results)-len(acked), len(ar.Results), bad)
	}
	return acked, nil
}

// dequeueCarrying leases up to count items of topic (long-polling wait)
// for steadyLease in a Dequeue that acks the items of the worker's last
// one (acks), the way a consumer that works one batch at a time can, and
// returns the items and when the Dequeue answered. A ref it did not ack
// is an error; its items are returned all the same.
func (r *runner) dequeueCarrying(ctx context.Context, c triagev1.QueueClient, topic string, count int, wait time.Duration,
	acks []*triagev1.LeaseRef, s *sampler) ([]*triagev1.LeasedItem, time.Time, error) {
	cctx, cancel := context.WithTimeout(ctx, rpcTimeout)
	defer cancel()
	t0 := time.Now()
	resp, err := c.Dequeue(cctx, &triagev1.DequeueRequest{Namespace: namespace, LeaseDuration: durationpb.New(steadyLease),
		Topics: []*triagev1.TopicCount{{Topic: topic, Count: int32(count)}}, Wait: durationpb.New(wait), Acks: acks})
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("dequeue: %w", err)
	}
	t1 := time.Now()
	s.observe("dequeue", t1, t1.Sub(t0))
	for _, res := range resp.AckResults {
		if !res.Ok {
			return resp.Items, t1, fmt.Errorf("an ack carried by a Dequeue was refused: %s: %s", res.Id, res.Error)
		}
	}
	return resp.Items, t1, nil
}

// dequeueAckScenario: consumers lease and ack from the deep backlog, best
// of a few consumer counts and batch sizes.
func (r *runner) dequeueAckScenario(ctx context.Context) (Scenario, error) {
	var need int64
	for range r.p.dequeueTrials {
		// At up to 40k/s, the deep backlog stays deep for every trial.
		need += int64(40_000 * (r.p.warmup + r.p.measure).Seconds())
	}
	need = max(need, int64(r.p.deepBacklog))
	if d := r.deepDepth.Load(); d < need {
		if err := r.fill(ctx, r.shardDBs(), deepTopic, int(need-d), r.label(DequeueAck)); err != nil {
			return Scenario{}, err
		}
		r.deepDepth.Add(need - d)
		r.settle(ctx, r.shardDBs(), r.label(DequeueAck))
	}
	depth := r.deepDepth.Load()
	var best, first *sampler
	var bestTrial dequeueTrial
	var trials []string
	var errs []string
	for i, t := range r.p.dequeueTrials {
		prog := r.progress(fmt.Sprintf("%s (%d consumers, count %d)", DequeueAck, t.consumers, t.count))
		s := runLoad(ctx, loadSpec{workers: t.consumers, warmup: r.p.warmup, measure: r.p.measure,
			op: func(ctx context.Context, w int, s *sampler) (int, error) {
				n, err := r.dequeueAck(ctx, r.client(w), deepTopic, t.count, 500*time.Millisecond, s)
				r.deepDepth.Add(-int64(n))
				return n, err
			}}, prog)
		prog.close()
		trials = append(trials, fmt.Sprintf("%dx%d: %s", t.consumers, t.count, human(s.rate())))
		if e := s.errNote(); e != "" {
			errs = append(errs, fmt.Sprintf("%dx%d: %s", t.consumers, t.count, e))
		}
		if best == nil || s.rate() > best.rate() {
			best, bestTrial = s, t
		}
		if i == 0 {
			first = s
		}
		if ctx.Err() != nil {
			return Scenario{}, ctx.Err()
		}
	}
	if best.items == 0 {
		return Scenario{}, fmt.Errorf("no dequeue+ack succeeded: %s", best.errNote())
	}
	// The latency target is judged at one configuration, the first trial's,
	// whichever trial is fastest: the best one's latency compared
	// different loads from run to run (8 consumers in one, 32 in the next).
	lt := r.p.dequeueTrials[0]
	note := fmt.Sprintf("gRPC, best: %d consumers x Dequeue(count %d) + Ack of the batch; all (consumers x count): %s; backlog %s items over %d shards; ack p99 %.2f ms; "+
		"at %dx%d (the latency target's configuration): Dequeue p99 %.2f ms, Ack p99 %.2f ms",
		bestTrial.consumers, bestTrial.count, strings.Join(trials, ", "), human(float64(depth)), len(r.shardIDs), best.pct("ack", 99),
		lt.consumers, lt.count, first.pct("dequeue", 99), first.pct("ack", 99))
	if len(errs) > 0 {
		note += "; " + strings.Join(errs, "; ")
	}
	return Scenario{
		ItemsPerSec: best.rate(),
		P50MS:       best.pct("dequeue", 50), P99MS: best.pct("dequeue", 99), P999MS: best.pct("dequeue", 99.9),
		Latency: fmt.Sprintf("Dequeue RPC (count %d)", bestTrial.count),
		Notes:   note,
		Metrics: map[string]float64{"ack_p50_ms": best.pct("ack", 50), "ack_p99_ms": best.pct("ack", 99), "backlog_items": float64(depth),
			"fixed_consumers": float64(lt.consumers), "fixed_dequeue_p99_ms": first.pct("dequeue", 99), "fixed_ack_p99_ms": first.pct("ack", 99)},
	}, nil
}

func (r *runner) shardDBs() []*sql.DB {
	out := make([]*sql.DB, 0, len(r.shardIDs))
	for _, id := range r.shardIDs {
		out = append(out, r.shardDB[id])
	}
	return out
}
