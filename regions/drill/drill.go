// Package drill runs failover drills against a running local bed: a
// workload of idempotent producers and consumers that ack, nack and
// sometimes crash holding a lease runs through a router while a fault is
// injected and later healed; then the queue is drained and the report says
// how long dequeues and enqueues were down (RTO), whether any
// acknowledged item was lost, every duplicate and its cause, early
// deliveries, priority inversions, and what became of the old primary.
//
// Faults are injected by the bed process itself, through its control
// endpoint (bed.json "control"): it owns the processes, links and NATS
// servers. A scenario names what to break:
//
//	primary-kill   kill -9 the primary of one of the region's shards
//	region-down    kill every process of the region (its mariadbds, NATS, node)
//	partition      cut every cross-region link of the region
//	nats-kill      stop the region's NATS server abruptly
//	dequeuer-kill  stop the region's dequeuer abruptly (no lease hand-back)
package drill

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
)

// Scenarios are the drills Run knows.
var Scenarios = []string{"primary-kill", "region-down", "partition", "nats-kill", "dequeuer-kill"}

// Config of one drill.
type Config struct {
	Scenario string
	// Control is the bed's control endpoint (host:port).
	Control string
	// Router is the gRPC address the workload talks to; it must survive
	// the fault (not in the faulted region for region-down and partition).
	Router string
	// Region is the faulted region; the workload's items live there.
	Region string
	// Shard to kill for primary-kill (0: the first of the region).
	Shard uint32
	// Warmup before the fault, Hold of the fault, Drain limit after heal.
	Warmup, Hold, Drain time.Duration
	// Producers and Consumers of the workload. Default 4 and 4.
	Producers, Consumers int
	// Lease consumers take. Default 3s.
	Lease time.Duration
	// Progress gets a line per phase.
	Progress io.Writer
}

// Run runs one drill and returns its report.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if !slices.Contains(Scenarios, cfg.Scenario) {
		return nil, fmt.Errorf("unknown scenario %q: allowed %s", cfg.Scenario, strings.Join(Scenarios, ", "))
	}
	if cfg.Warmup == 0 {
		cfg.Warmup = 5 * time.Second
	}
	if cfg.Hold == 0 {
		cfg.Hold = 15 * time.Second
	}
	if cfg.Drain == 0 {
		cfg.Drain = 90 * time.Second
	}
	cfg.Producers = max(cfg.Producers, 1)
	cfg.Consumers = max(cfg.Consumers, 1)
	if cfg.Lease == 0 {
		cfg.Lease = 3 * time.Second
	}
	progress := cfg.Progress
	if progress == nil {
		progress = io.Discard
	}
	conn, err := grpc.NewClient(cfg.Router, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	q := triagev1.NewQueueClient(conn)
	admin := triagev1.NewAdminClient(conn)
	rep := &Report{Scenario: cfg.Scenario}
	rep.MapBefore = describeMap(ctx, admin, cfg.Region)

	topic := "drill-" + cfg.Scenario
	w := newWorkload(q, "default", topic, cfg.Region, cfg.Lease)
	prodCtx, stopProd := context.WithCancel(ctx)
	consCtx, stopCons := context.WithCancel(ctx)
	defer stopProd()
	defer stopCons()
	var prodWG, consWG sync.WaitGroup
	for i := range cfg.Producers {
		prodWG.Go(func() { w.produce(prodCtx, rand.New(rand.NewPCG(uint64(i), 1))) })
	}
	for i := range cfg.Consumers {
		consWG.Go(func() { w.consume(consCtx, rand.New(rand.NewPCG(uint64(i), 2)), true) })
	}
	fmt.Fprintf(progress, "drill %s: workload running against region %s via %s\n", cfg.Scenario, cfg.Region, cfg.Router)
	sleep(ctx, cfg.Warmup)

	rep.FaultAt = time.Now()
	desc, err := control(ctx, cfg.Control, "fault", cfg.Scenario, cfg.Region, cfg.Shard)
	if err != nil {
		return nil, fmt.Errorf("inject %s: %w", cfg.Scenario, err)
	}
	rep.Fault = desc
	fmt.Fprintf(progress, "fault injected: %s; holding %s\n", desc, cfg.Hold)
	sleep(ctx, cfg.Hold)
	if _, err := control(ctx, cfg.Control, "heal", cfg.Scenario, cfg.Region, cfg.Shard); err != nil {
		return nil, fmt.Errorf("heal %s: %w", cfg.Scenario, err)
	}
	rep.HealedAt = time.Now()
	fmt.Fprintf(progress, "healed; producing 5s more, then draining (up to %s)\n", cfg.Drain)
	sleep(ctx, 5*time.Second)
	stopProd()
	prodWG.Wait()
	deadline := time.Now().Add(cfg.Drain)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if w.undelivered() == 0 {
			break
		}
		sleep(ctx, 200*time.Millisecond)
	}
	// Let items a crashed consumer held come back once more, so their
	// redelivery is counted.
	sleep(ctx, cfg.Lease+time.Second)
	stopCons()
	consWG.Wait()

	rep.DequeueRTOMS = rtoMS(rep.FaultAt, w.firstDequeueAfter(rep.FaultAt))
	rep.EnqueueRTOMS = rtoMS(rep.FaultAt, w.firstEnqueueAfter(rep.FaultAt))
	w.analyze(rep, rep.FaultAt)
	rep.MapAfter = describeMap(ctx, admin, cfg.Region)
	if fate, err := control(ctx, cfg.Control, "fate", cfg.Scenario, cfg.Region, cfg.Shard); err == nil {
		rep.OldPrimary = fate
	}
	return rep, nil
}

func rtoMS(fault, first time.Time) int64 {
	if first.IsZero() {
		return -1
	}
	return first.Sub(fault).Milliseconds()
}

// undelivered counts acknowledged items not delivered yet.
func (w *workload) undelivered() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	seen := make(map[string]bool, len(w.deliveries))
	for _, d := range w.deliveries {
		seen[d.id] = true
	}
	n := 0
	for id := range w.sent {
		if !seen[id] {
			n++
		}
	}
	return n
}

func (w *workload) firstDequeueAfter(t time.Time) time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, d := range w.deliveries {
		if d.at.After(t) {
			return d.at
		}
	}
	return time.Time{}
}

func (w *workload) firstEnqueueAfter(t time.Time) time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	var first time.Time
	for _, s := range w.sent {
		if s.ackedAt.After(t) && (first.IsZero() || s.ackedAt.Before(first)) {
			first = s.ackedAt
		}
	}
	return first
}

// describeMap summarizes the region's shards: primary, its region, epoch.
func describeMap(ctx context.Context, admin triagev1.AdminClient, region string) string {
	rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	m, err := admin.GetShardMap(rctx, &triagev1.GetShardMapRequest{})
	if err != nil {
		return "unavailable: " + err.Error()
	}
	var parts []string
	for _, s := range m.Shards {
		if s.HomeRegion == region {
			parts = append(parts, fmt.Sprintf("shard %d primary %s (%s) epoch %d", s.Id, s.Primary, s.PrimaryRegion, s.Epoch))
		}
	}
	return fmt.Sprintf("v%d: %s", m.Version, strings.Join(parts, "; "))
}

// control asks the bed to inject, heal or describe a fault.
func control(ctx context.Context, addr, action, scenario, region string, shard uint32) (string, error) {
	u := url.URL{Scheme: "http", Host: addr, Path: "/" + action + "/" + scenario,
		RawQuery: url.Values{"region": {region}, "shard": {fmt.Sprint(shard)}}.Encode()}
	rctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, http.MethodPost, u.String(), nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var out struct {
		Description string `json:"description"`
		Error       string `json:"error"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return "", fmt.Errorf("bed control %s: %s", u.Path, resp.Status)
	}
	if out.Error != "" {
		return "", fmt.Errorf("bed control %s: %s", u.Path, out.Error)
	}
	return out.Description, nil
}
