package scale

import (
	"context"
	"database/sql"
	"encoding/binary"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
	"github.com/triage-queue/triage/schema/itemid"
)

// Load is the fixed offered load spread over every shard: single-item
// enqueues, open loop, round-robin over namespaces that together cover
// every shard, and a long-polling consumer per namespace that acks what
// it gets.
type Load struct {
	OfferedPerSec float64 `json:"offered_per_sec"`
	// WarmSeconds of load came first, not measured; Seconds were.
	WarmSeconds float64 `json:"warm_seconds"`
	Seconds     float64 `json:"seconds"`
	Enqueued    int     `json:"enqueued"`
	Delivered   int     `json:"delivered"`
	// Missing counts the enqueues answered ok whose item was not
	// delivered within drainWithin of the load's end.
	Missing int `json:"missing"`
	// ShardsHit is how many shards the delivered items came from.
	ShardsHit     int     `json:"shards_hit"`
	Errors        int     `json:"errors"`
	EnqueueP50Ms  float64 `json:"enqueue_p50_ms"`
	EnqueueP99Ms  float64 `json:"enqueue_p99_ms"`
	EndToEndP50Ms float64 `json:"end_to_end_p50_ms"`
	EndToEndP99Ms float64 `json:"end_to_end_p99_ms"`
	AckP99Ms      float64 `json:"ack_p99_ms"`
	// CPU is each process's CPU and memory during the load.
	CPU []Usage `json:"cpu"`
	// Statements is, per primary server, the statements a second it ran
	// during the load, by kind (MariaDB's Com_ counters: select, insert,
	// update, delete, commit; questions: all of them), and what it cost
	// besides (connections, threads_created, opened_tables,
	// opened_table_definitions, table_open_cache_misses, a second).
	Statements []map[string]float64 `json:"statements_per_sec"`
}

// statements reads the servers' statement counters; the function it
// returns gives each one's rate since.
func (b *Bed) statements(ctx context.Context) func() []map[string]float64 {
	read := func() []map[string]float64 {
		var out []map[string]float64
		for _, s := range b.servers {
			counts := map[string]float64{}
			if db, err := sql.Open("mysql", s.DSN("")); err == nil {
				rows, err := db.QueryContext(ctx, "SHOW GLOBAL STATUS WHERE Variable_name = 'Questions' OR Variable_name IN ('Com_select', 'Com_insert', 'Com_update', 'Com_delete', 'Com_commit', "+
					"'Connections', 'Threads_created', 'Opened_tables', 'Opened_table_definitions', 'Table_open_cache_misses')")
				for err == nil && rows.Next() {
					var name string
					var v float64
					if rows.Scan(&name, &v) == nil {
						counts[strings.ToLower(strings.TrimPrefix(name, "Com_"))] = v
					}
				}
				if rows != nil {
					rows.Close()
				}
				db.Close()
			}
			out = append(out, counts)
		}
		return out
	}
	before, start := read(), time.Now()
	return func() []map[string]float64 {
		after, took := read(), time.Since(start).Seconds()
		for i := range after {
			for k, v := range after[i] {
				after[i][k] = round1((v - before[i][k]) / took)
			}
		}
		return after
	}
}

// loadTopic is the topic every namespace of the load uses.
var loadTopic = TopicName(0)

// samples collects latencies (ms) from many goroutines.
type samples struct {
	mu     sync.Mutex
	enq    []float64
	e2e    []float64
	ack    []float64
	shards map[uint32]bool
	// acked are the IDs of the enqueues answered ok, delivered those
	// dequeued: an enqueue answered with an error may still be stored,
	// so counts alone do not tell whether an acknowledged item is
	// missing.
	acked, delivered map[string]bool
	// recording is set once the warm-up is over; only then are
	// latencies kept, and only items enqueued since count end to end.
	recording atomic.Bool
}

func (s *samples) add(to *[]float64, ms float64) {
	if !s.recording.Load() {
		return
	}
	s.mu.Lock()
	*to = append(*to, ms)
	s.mu.Unlock()
}

// missing counts the acknowledged enqueues not delivered yet.
func (s *samples) missing() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.missingLocked()
}

func (s *samples) missingLocked() int {
	n := 0
	for id := range s.acked {
		if !s.delivered[id] {
			n++
		}
	}
	return n
}

func since(t time.Time) float64 { return float64(time.Since(t).Microseconds()) / 1000 }

// load offers opt.Rate enqueues a second for opt.WarmFor and then
// opt.LoadFor, records latencies, CPU and statements over the second part
// only (the first opens every node's connections to the shards it
// touches: at a thousand shards, most enqueues of a cold bed are a shard's
// first), then waits up to drainWithin for every acknowledged item to be
// delivered.
func (m *meter) load(ctx context.Context, rec *Record, opt Options) error {
	cfg := m.b.cfg
	targets := min(cfg.Namespaces, (cfg.Shards+cfg.ShardsPerNamespace-1)/cfg.ShardsPerNamespace)
	s := &samples{shards: map[uint32]bool{}, acked: map[string]bool{}, delivered: map[string]bool{}}
	var enqueued, delivered, errs atomic.Int64
	cctx, stopConsumers := context.WithCancel(ctx)
	defer stopConsumers()
	var consumers sync.WaitGroup
	for i := range targets {
		consumers.Go(func() { m.consume(cctx, NamespaceName(i), s, &delivered, &errs) })
	}
	start := time.Now()
	every := time.Duration(float64(time.Second) / opt.Rate)
	sem := make(chan struct{}, 256)
	var producers sync.WaitGroup
	var measured time.Time
	var cpu func() ([]Usage, error)
	var stmts func() []map[string]float64
	var profiled func()
	for k := 0; ctx.Err() == nil && time.Since(start) < opt.WarmFor+opt.LoadFor; k++ {
		if d := time.Until(start.Add(time.Duration(k) * every)); d > 0 {
			time.Sleep(d)
		}
		if measured.IsZero() && time.Since(start) >= opt.WarmFor {
			measured = time.Now()
			cpu, stmts, profiled = m.sampleCPU(), m.b.statements(ctx), m.profile(ctx, opt, "load", opt.LoadFor)
			s.recording.Store(true)
		}
		sem <- struct{}{}
		producers.Go(func() {
			defer func() { <-sem }()
			if m.enqueue(ctx, NamespaceName(k%targets), s) == nil {
				enqueued.Add(1)
			} else {
				errs.Add(1)
			}
		})
	}
	producers.Wait()
	if ctx.Err() != nil { // interrupted: nothing to record
		stopConsumers()
		consumers.Wait()
		if profiled != nil {
			profiled()
		}
		return ctx.Err()
	}
	defer profiled()
	rec.Load.Seconds = round1(time.Since(measured).Seconds())
	usage, _ := cpu()
	statements := stmts()
	deadline := time.Now().Add(drainWithin)
	for s.missing() > 0 && time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(20 * time.Millisecond)
	}
	stopConsumers()
	consumers.Wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	rec.Load = Load{OfferedPerSec: opt.Rate, WarmSeconds: opt.WarmFor.Seconds(), Seconds: rec.Load.Seconds, Enqueued: int(enqueued.Load()), Delivered: int(delivered.Load()),
		ShardsHit: len(s.shards), Errors: int(errs.Load()), Missing: s.missingLocked(),
		EnqueueP50Ms: percentile(s.enq, 0.5), EnqueueP99Ms: percentile(s.enq, 0.99),
		EndToEndP50Ms: percentile(s.e2e, 0.5), EndToEndP99Ms: percentile(s.e2e, 0.99), AckP99Ms: percentile(s.ack, 0.99), CPU: usage, Statements: statements}
	// Items not delivered in time are a failed check (Record.Checks), not
	// a failed run: the rest of the record says why.
	return nil
}

// drainWithin bounds the wait for the last items after the load: a lease
// and then some, so that an item served to a reply that was lost (a
// dequeue answered too late) comes back and counts as delivered, and
// only a lost one, or one stuck past its lease, counts as missing.
const drainWithin = loadLease + 10*time.Second

// loadLease is the lease the load's consumers take.
const loadLease = 15 * time.Second

func (m *meter) enqueue(ctx context.Context, ns string, s *samples) error {
	// The enqueue time, and whether it is in the measured part.
	payload := binary.BigEndian.AppendUint64(nil, uint64(time.Now().UnixNano()))
	if s.recording.Load() {
		payload = append(payload, 1)
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := m.q.Enqueue(ctx, &triagev1.EnqueueRequest{Namespace: ns, Topic: loadTopic, Items: []*triagev1.NewItem{{Payload: payload}}})
	if err == nil {
		s.add(&s.enq, since(start))
		s.mu.Lock()
		for _, r := range resp.Results {
			s.acked[r.Id] = true
		}
		s.mu.Unlock()
	}
	return err
}

// consume long-polls ns's load topic and acks what it gets until ctx ends.
func (m *meter) consume(ctx context.Context, ns string, s *samples, delivered, errs *atomic.Int64) {
	for ctx.Err() == nil {
		resp, err := m.q.Dequeue(ctx, &triagev1.DequeueRequest{Namespace: ns, Topics: []*triagev1.TopicCount{{Topic: loadTopic, Count: 10}},
			Wait: durationpb.New(time.Second), LeaseDuration: durationpb.New(loadLease)})
		if err != nil {
			if ctx.Err() == nil {
				errs.Add(1)
				time.Sleep(50 * time.Millisecond)
			}
			continue
		}
		if len(resp.Items) == 0 {
			continue
		}
		ack := &triagev1.AckRequest{Namespace: ns}
		for _, it := range resp.Items {
			if len(it.Payload) == 9 {
				s.add(&s.e2e, float64(time.Now().UnixNano()-int64(binary.BigEndian.Uint64(it.Payload)))/1e6)
			}
			s.mu.Lock()
			s.delivered[it.Id] = true
			if id, err := itemid.Parse(it.Id); err == nil {
				s.shards[id.Shard] = true
			}
			s.mu.Unlock()
			ack.Acks = append(ack.Acks, &triagev1.LeaseRef{Id: it.Id, LeaseToken: it.LeaseToken})
		}
		start := time.Now()
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		_, err = m.q.Ack(actx, ack)
		cancel()
		if err != nil {
			errs.Add(1)
			continue
		}
		s.add(&s.ack, since(start))
		delivered.Add(int64(len(resp.Items)))
	}
}
