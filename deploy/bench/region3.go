package bench

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"runtime"
	"time"

	"github.com/triage-queue/triage/deploy/bed"
)

// enqueue3Region is triage-enqueue-batch100 and -batch1 on the three-region
// bed: every shard has a replica in each other region behind the bed's
// WAN links, a commit waits for the first replica's semi-sync
// acknowledgement, and the enqueue buffer is a JetStream stream replicated
// across the regions' NATS servers. Compared with the one-region scenarios
// it shows what durability across regions costs and how batching hides it.
// Batch 1 runs a second time with each shard's second replica stopped, so
// the report says what that replica costs a single-item enqueue (issue 8
// asked for it: two replicas in two regions are what let a region go down
// without losing an acknowledged write). The bed of the other scenarios is
// stopped by then, so the two never share the box.
func (r *runner) enqueue3Region(ctx context.Context, pids *[]int) (Scenario, error) {
	dir, err := os.MkdirTemp("", "triage-bench-3r-")
	if err != nil {
		return Scenario{}, err
	}
	defer os.RemoveAll(dir)
	perRegion := r.cfg.Shards
	if r.cfg.Quick {
		perRegion = 1
	}
	fmt.Fprintf(r.out, "%s: starting the three-region bed (%d shard(s) per region, each replicated to both other regions)...\n",
		r.label(Enqueue3Region), perRegion)
	b, retried, err := r.start3RegionBed(ctx, dir, perRegion)
	if err != nil {
		return Scenario{}, err
	}
	defer b.Stop()
	res := region3Run{home: b.Layout.Regions[0].Name, retried: retried, wan: "?"}
	dbPIDs := res.databases(b, pids)
	r3, err := newRunner(ctx, r.cfg, r.out, b)
	if err != nil {
		return Scenario{}, err
	}
	defer r3.close()
	r3.step = r.step
	if err := r3.waitReady(ctx); err != nil {
		return Scenario{}, err
	}
	var primaries []*sql.DB
	for _, id := range res.homeShards {
		primaries = append(primaries, r3.shardDB[id])
	}
	if len(b.Layout.Links) > 0 {
		res.wan = fmt.Sprintf("%g ms", b.Layout.Links[0].LatencyMS)
		res.rtt = 2 * b.Layout.Links[0].LatencyMS
	}

	before := takeCPU(dbPIDs)
	yes0, no0 := statusSum(ctx, primaries, "Rpl_semi_sync_master_yes_tx"), statusSum(ctx, primaries, "Rpl_semi_sync_master_no_tx")
	res.b100, res.c100, _, err = r3.enqueueTrials(ctx, Enqueue3Region, b100Topic, []int{r.p.enqueue100Clients}, 100, false)
	if err != nil {
		return Scenario{}, fmt.Errorf("batch 100: %w", err)
	}
	res.clients1 = r.p.enqueue1Clients[len(r.p.enqueue1Clients)-1]
	res.b1, _, _, err = r3.enqueueTrials(ctx, Enqueue3Region, b1Topic, []int{res.clients1}, 1, false)
	if err != nil {
		return Scenario{}, fmt.Errorf("batch 1: %w", err)
	}
	res.yes = statusSum(ctx, primaries, "Rpl_semi_sync_master_yes_tx") - yes0
	res.no = statusSum(ctx, primaries, "Rpl_semi_sync_master_no_tx") - no0
	res.use = cpuSince(before, takeCPU(dbPIDs), runtime.NumCPU())
	err = withOneReplica(ctx, b, res.homeShards, primaries, func() error {
		var err error
		res.solo, _, _, err = r3.enqueueTrials(ctx, Enqueue3Region+" (one replica)", b1Topic, []int{res.clients1}, 1, false)
		return err
	})
	if err != nil {
		return Scenario{}, fmt.Errorf("batch 1 with one replica: %w", err)
	}
	return res.scenario(r.results[EnqueueBatch100].ItemsPerSec, r.results[EnqueueBatch1].ItemsPerSec), nil
}

// start3RegionBed starts the three-region bed in dir. Bringing up twelve
// processes on a small shared box can miss one of the bed's readiness
// deadlines; a second attempt is cheap, and retried says why it was
// needed.
func (r *runner) start3RegionBed(ctx context.Context, dir string, perRegion int) (b *bed.Bed, retried string, err error) {
	for attempt := 1; ; attempt++ {
		// The nodes are not load: they start without the label.
		withoutLoadLabel(ctx, func() {
			b, err = bed.Start(ctx, bed.Config{Dir: dir, Regions: bed.DefaultRegions, ShardsPerRegion: perRegion,
				HTTPBase: 0, GRPCBase: 0, NATSPort: -1, Logger: r.cfg.Logger})
		})
		if err == nil {
			return b, retried, nil
		}
		if attempt == 2 || ctx.Err() != nil {
			return nil, "", fmt.Errorf("start the three-region bed: %w", err)
		}
		retried = fmt.Sprintf("; the bed started at the second attempt (the first: %v)", err)
		fmt.Fprintf(r.out, "%s: the three-region bed did not start (%v); trying once more\n", r.label(Enqueue3Region), err)
	}
}

// region3Run is what the three-region scenario measured.
type region3Run struct {
	home           string   // the region whose shards take the load
	homeShards     []uint32 // its shards
	wan            string   // the one-way WAN latency, for the notes
	rtt            float64  // the WAN round trip, ms
	retried        string
	b100, b1, solo *sampler // batch 100; batch 1; batch 1 with one replica
	c100, clients1 int      // clients of batch 100 and batch 1
	yes, no        float64  // commits acknowledged by a semi-sync replica; fallen back to async
	use            cpuUse
}

// databases returns the bed's database servers' PIDs, adding them to
// pids as well, and notes the home region's shards.
func (res *region3Run) databases(b *bed.Bed, pids *[]int) []int {
	var dbPIDs []int
	for _, p := range b.Layout.Processes {
		switch p.Role {
		case bed.RolePrimary, bed.RoleReplica:
			dbPIDs = append(dbPIDs, p.PID)
			*pids = append(*pids, p.PID)
			if p.Role == bed.RolePrimary && p.Region == res.home {
				res.homeShards = append(res.homeShards, p.Shard)
			}
		}
	}
	return dbPIDs
}

// scenario reports the run against one region's batch-100 and batch-1
// rates.
func (res *region3Run) scenario(one100, one1 float64) Scenario {
	b100, b1, solo := res.b100, res.b1, res.solo
	notes := fmt.Sprintf("three-region bed: region %s's %d shard(s), each with a replica in both other regions behind a %s one-way WAN link, "+
		"semi-sync AFTER_SYNC, enqueue stream replicated across the regions' NATS servers; gRPC to %s's router, COMMITTED; "+
		"batch 100 from %d clients: %s items/s (%.2fx one region's triage-enqueue-batch100); "+
		"batch 1 from %d clients: %s items/s, p50/p99 %.2f/%.2f ms (%.2fx one region's triage-enqueue-batch1); "+
		"with the second replica stopped: %s items/s, p50/p99 %.2f/%.2f ms; "+
		"commits acknowledged by a semi-sync replica: %.0f, fallen back to async: %.0f",
		res.home, len(res.homeShards), res.wan, res.home,
		res.c100, human(b100.rate()), ratio(b100.rate(), one100),
		res.clients1, human(b1.rate()), b1.pct("op", 50), b1.pct("op", 99), ratio(b1.rate(), one1),
		human(solo.rate()), solo.pct("op", 50), solo.pct("op", 99),
		res.yes, res.no)
	if res.no > 0 {
		notes += " (commits that fell back did not wait for a replica: they are not zero-RPO)"
	}
	notes += errSuffix(b100) + errSuffix(b1) + res.retried + "; " + res.use.note(runtime.NumCPU()) + " (during the load)"
	m := map[string]float64{
		"batch1_items_per_sec": b1.rate(), "batch1_p50_ms": b1.pct("op", 50), "batch1_p99_ms": b1.pct("op", 99),
		"batch100_vs_one_region": ratio(b100.rate(), one100), "batch1_vs_one_region": ratio(b1.rate(), one1),
		"one_replica_batch1_items_per_sec": solo.rate(), "one_replica_batch1_p50_ms": solo.pct("op", 50),
		"one_replica_batch1_p99_ms": solo.pct("op", 99),
		"semi_sync_acked_commits":   res.yes, "semi_sync_async_commits": res.no,
		// The WAN round trip the p50s are judged against.
		"wan_rtt_ms": res.rtt,
	}
	res.use.metrics(m)
	return Scenario{
		ItemsPerSec: b100.rate(),
		P50MS:       b100.pct("op", 50), P99MS: b100.pct("op", 99), P999MS: b100.pct("op", 99.9),
		Latency: "Enqueue RPC of 100 items on the three-region bed, until committed on the primary and received by a replica in another region",
		Notes:   notes,
		Metrics: m,
		cpuDone: true,
	}
}

// withOneReplica runs load while each of shards replicates to its first
// replica only (the next region's): the IO threads of the others are
// stopped, and started again before it returns. It waits until each
// primary counts one semi-sync client, so the load's commits are
// acknowledged by that replica alone.
func withOneReplica(ctx context.Context, b *bed.Bed, shards []uint32, primaries []*sql.DB, load func() error) (err error) {
	var stopped []*sql.DB
	defer func() {
		for _, db := range stopped {
			if _, serr := db.ExecContext(context.WithoutCancel(ctx), "START SLAVE IO_THREAD"); serr != nil {
				err = errors.Join(err, fmt.Errorf("restart a replica: %w", serr))
			}
			db.Close()
		}
	}()
	for _, shard := range shards {
		for _, region := range b.Layout.Regions[2:] {
			srv := b.ReplicaIn(shard, region.Name)
			if srv == nil {
				continue
			}
			db, err := sql.Open("mysql", srv.DSN(""))
			if err != nil {
				return err
			}
			if _, err := db.ExecContext(ctx, "STOP SLAVE IO_THREAD"); err != nil {
				db.Close()
				return fmt.Errorf("stop shard %d's replica in %s: %w", shard, region.Name, err)
			}
			stopped = append(stopped, db)
		}
	}
	want := float64(len(primaries))
	deadline := time.Now().Add(10 * time.Second)
	for statusSum(ctx, primaries, "Rpl_semi_sync_master_clients") != want {
		if time.Now().After(deadline) {
			return fmt.Errorf("the primaries still count %.0f semi-sync clients, want %.0f",
				statusSum(ctx, primaries, "Rpl_semi_sync_master_clients"), want)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return load()
}
