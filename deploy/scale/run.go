package scale

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime/pprof"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/triage-queue/triage/dequeuer"
	"github.com/triage-queue/triage/proto/triage/peer"
	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
	"github.com/triage-queue/triage/shardmap"
)

// Record is one size's figures (one entry of .triage/scale.json).
type Record struct {
	At         time.Time `json:"at"`
	Shards     int       `json:"shards"`
	Servers    int       `json:"servers"`
	Namespaces int       `json:"namespaces"`
	Topics     int       `json:"topics"`
	// BringUpSeconds is from the first server's start to every node ready.
	BringUpSeconds float64 `json:"bring_up_seconds"`
	// Idle is each process's CPU (share of one core) and memory at rest.
	Idle []Usage `json:"idle"`
	// MapBytes is the stored map's size: its head (HeadBytes, what every
	// change rewrites) and every namespace's value. MapLoadMs is the time
	// to read and build it whole, as a process does at start.
	MapBytes  int     `json:"map_bytes"`
	HeadBytes int     `json:"head_bytes"`
	MapLoadMs float64 `json:"map_load_ms"`
	// NamespaceChangeMs is, per trial, the time from a namespace update's
	// answer until the slowest node held it; AddShardMs likewise for an
	// added shard.
	NamespaceChangeMs []float64 `json:"namespace_change_ms"`
	AddShardMs        float64   `json:"add_shard_ms"`
	Load              Load      `json:"load"`
	Scrapes           []Scrape  `json:"scrapes"`
	Takeover          Takeover  `json:"takeover"`
	// Failover is the failover drill of a bed with Config.Failover; nil
	// without.
	Failover *Failover `json:"failover,omitempty"`
	Checks   []Check   `json:"checks"`
}

// Usage is one process's resource use.
type Usage struct {
	Name       string  `json:"name"`
	PID        int     `json:"pid"`
	CPUPercent float64 `json:"cpu_percent"`
	RSSMiB     float64 `json:"rss_mib"`
}

// Scrape is one node's /metrics.
type Scrape struct {
	Name  string  `json:"name"`
	Bytes int     `json:"bytes"`
	Ms    float64 `json:"ms"`
}

// Takeover is the dequeuer kill: how many shards the killed one owned and
// how long until all of them had a live owner.
type Takeover struct {
	Killed  string  `json:"killed"`
	Shards  int     `json:"shards"`
	Seconds float64 `json:"seconds"`
	// Excess is how many shards the busiest dequeuer owned beyond an even
	// split before the kill.
	Excess int `json:"excess"`
}

// Check is one bound of issue 40 and the figure it was checked against.
type Check struct {
	Name  string  `json:"name"`
	Limit float64 `json:"limit"`
	Value float64 `json:"value"`
	OK    bool    `json:"ok"`
}

// Options of a run.
type Options struct {
	// IdleFor is how long idle CPU is sampled. Default 20s.
	IdleFor time.Duration
	// Rate is the offered enqueue load (items/s), LoadFor its length.
	// Default 200/s for 20s.
	Rate    float64
	LoadFor time.Duration
	// WarmFor of the same load comes first, unmeasured. Default LoadFor.
	WarmFor time.Duration
	// ProfileDir, when set, receives a CPU profile of every node over the
	// idle, map-change and load steps (NAME-STEP.pprof) and each node's
	// scrape (NAME.metrics), to show where the time and bytes go.
	ProfileDir string
	// FailoverHold is how long the failover drill holds the killed
	// server down before restarting it to rejoin (Config.Failover).
	// Default 20s.
	FailoverHold time.Duration
}

// Run brings a bed of cfg up, measures it and stops it.
func Run(ctx context.Context, cfg Config, opt Options) (*Record, error) {
	if opt.IdleFor == 0 {
		opt.IdleFor = 20 * time.Second
	}
	if opt.Rate == 0 {
		opt.Rate = 200
	}
	if opt.LoadFor == 0 {
		opt.LoadFor = 20 * time.Second
	}
	if opt.WarmFor == 0 {
		opt.WarmFor = opt.LoadFor
	}
	if opt.FailoverHold == 0 {
		opt.FailoverHold = 20 * time.Second
	}
	b, err := Start(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer b.Stop()
	rec := &Record{At: time.Now().UTC(), Shards: b.cfg.Shards, Servers: b.cfg.Servers, Namespaces: b.cfg.Namespaces,
		Topics: b.cfg.Topics, BringUpSeconds: time.Since(b.started).Seconds()}
	m, err := b.measure(ctx, rec, opt)
	if m != nil {
		m.close()
	}
	if err != nil {
		return rec, err
	}
	rec.Checks = check(rec)
	return rec, nil
}

// meter holds a run's connections to the bed.
type meter struct {
	b      *Bed
	nc     *nats.Conn
	kv     jetstream.KeyValue
	conn   *grpc.ClientConn
	q      triagev1.QueueClient
	admin  triagev1.AdminClient
	owners *dequeuer.Owners
	cancel context.CancelFunc
}

func (m *meter) close() {
	m.cancel()
	if m.conn != nil {
		m.conn.Close()
	}
	if m.nc != nil {
		m.nc.Close()
	}
}

// step is one measurement of a run.
type step struct {
	what string
	run  func(context.Context, *Record, Options) error
}

func (b *Bed) measure(ctx context.Context, rec *Record, opt Options) (*meter, error) {
	m := &meter{b: b}
	ctx, m.cancel = context.WithCancel(ctx)
	var err error
	if m.nc, err = nats.Connect(b.NATSURL()); err != nil {
		return m, err
	}
	js, err := jetstream.New(m.nc)
	if err != nil {
		return m, err
	}
	if m.kv, err = js.KeyValue(ctx, shardmap.Bucket); err != nil {
		return m, err
	}
	okv, err := js.KeyValue(ctx, peer.OwnersBucket)
	if err != nil {
		return m, err
	}
	ckv, err := js.KeyValue(ctx, peer.ClaimsBucket)
	if err != nil {
		return m, err
	}
	if m.owners, err = dequeuer.WatchOwners(ctx, okv, ckv); err != nil {
		return m, err
	}
	if m.conn, err = grpc.NewClient(b.Nodes[0].GRPC, grpc.WithTransportCredentials(insecure.NewCredentials())); err != nil {
		return m, err
	}
	m.q, m.admin = triagev1.NewQueueClient(m.conn), triagev1.NewAdminClient(m.conn)
	steps := []step{
		{"every shard owned", m.waitOwned},
		{"idle", m.idle},
		{"shard map", m.mapSize},
		{"map changes", m.mapChanges},
		{"load", m.load},
		{"metrics scrapes", m.scrapes},
		{"dequeuer takeover", m.takeover},
	}
	if b.cfg.Failover {
		steps = append(steps, step{"server failover", m.failover})
	}
	for _, s := range steps {
		b.progress("measuring: %s", s.what)
		if err := s.run(ctx, rec, opt); err != nil {
			return m, fmt.Errorf("%s: %w", s.what, err)
		}
	}
	return m, nil
}

// ownedBy counts the shards of the map each owner holds; "" counts the
// shards nobody holds.
func (m *meter) ownedBy() map[string]int {
	by := map[string]int{}
	for _, s := range m.b.mapShards() {
		o, _ := m.owners.Owner(s)
		by[o]++
	}
	return by
}

// excess is how many shards the busiest dequeuer owns beyond its quota,
// ceil(shards/dequeuers) (see dequeuer's balance).
func (m *meter) excess(by map[string]int) int {
	k := 0
	for _, n := range m.b.Nodes {
		if n.DequeuerID != "" {
			k++
		}
	}
	if k == 0 {
		return 0
	}
	quota := (len(m.b.mapShards()) + k - 1) / k
	most := 0
	for id, c := range by {
		if id != "" {
			most = max(most, c)
		}
	}
	return max(0, most-quota)
}

// mapShards are the IDs of the map's shards: 1 to Config.Shards, and the
// spare once added.
func (b *Bed) mapShards() []uint32 {
	ids := make([]uint32, b.cfg.Shards)
	for i := range ids {
		ids[i] = uint32(i + 1)
	}
	if b.spareAdded {
		ids = append(ids, b.Spare.ID)
	}
	return ids
}

// waitOwned waits until the dequeuers own every shard and have split them
// evenly (none over its quota, see Record.Takeover.Excess), then lets the
// bed settle. A split still uneven after 2 minutes is left to the check.
func (m *meter) waitOwned(ctx context.Context, _ *Record, _ Options) error {
	deadline := time.Now().Add(2 * time.Minute)
	for by := m.ownedBy(); by[""] > 0 || m.excess(by) > 0; by = m.ownedBy() {
		if time.Now().After(deadline) {
			if by[""] == 0 {
				break
			}
			return fmt.Errorf("%d of %d shards have no owner after 2 minutes", m.ownedBy()[""], m.b.cfg.Shards)
		}
		if err := sleep(ctx, 100*time.Millisecond); err != nil {
			return err
		}
	}
	return sleep(ctx, 5*time.Second)
}

func sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

// idle samples every process's CPU time over opt.IdleFor.
func (m *meter) idle(ctx context.Context, rec *Record, opt Options) error {
	profiled := m.profile(ctx, opt, "idle", opt.IdleFor)
	defer profiled()
	done := m.sampleCPU()
	if err := sleep(ctx, opt.IdleFor); err != nil {
		return err
	}
	var err error
	rec.Idle, err = done()
	return err
}

// sampleCPU starts measuring every process of the bed; the function it
// returns gives each one's CPU (share of one core) since, and memory.
func (m *meter) sampleCPU() func() ([]Usage, error) {
	type proc struct {
		name string
		pid  int
	}
	procs := []proc{{"nats+bed", os.Getpid()}}
	for _, n := range m.b.Nodes {
		procs = append(procs, proc{n.Name, n.PID()})
	}
	for i, pid := range m.b.ServerPIDs() {
		procs = append(procs, proc{fmt.Sprintf("mariadbd-%d", i+1), pid})
	}
	for _, region := range replicaRegions {
		for i, pid := range m.b.ReplicaPIDs(region) {
			procs = append(procs, proc{fmt.Sprintf("mariadbd-%s-%d", region, i+1), pid})
		}
	}
	before := make([]float64, len(procs))
	for i, p := range procs {
		before[i], _ = cpuSeconds(p.pid)
	}
	start := time.Now()
	return func() ([]Usage, error) {
		took := time.Since(start).Seconds()
		var out []Usage
		for i, p := range procs {
			after, err := cpuSeconds(p.pid)
			if err != nil {
				return out, fmt.Errorf("%s: %w", p.name, err)
			}
			out = append(out, Usage{Name: p.name, PID: p.pid, CPUPercent: round1(100 * (after - before[i]) / took), RSSMiB: round1(rssMiB(p.pid))})
		}
		return out, nil
	}
}

// profile starts a CPU profile of every node and of the bed process
// (NATS and the load) over the next d, when opt.ProfileDir is set,
// written there as NAME-step.pprof; the function
// it returns waits for them. A failure is logged, not fatal.
func (m *meter) profile(ctx context.Context, opt Options, step string, d time.Duration) (wait func()) {
	var wg sync.WaitGroup
	if opt.ProfileDir == "" {
		return wg.Wait
	}
	secs := max(1, int(d.Seconds())-1)
	if f, err := os.Create(filepath.Join(opt.ProfileDir, "bed-"+step+".pprof")); err == nil {
		if pprof.StartCPUProfile(f) == nil {
			wg.Go(func() {
				_ = sleep(ctx, time.Duration(secs)*time.Second)
				pprof.StopCPUProfile()
				f.Close()
			})
		} else {
			f.Close()
		}
	}
	for _, n := range m.b.Nodes {
		wg.Go(func() {
			body, err := get(ctx, fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", n.Pprof, secs))
			if err == nil {
				err = os.WriteFile(filepath.Join(opt.ProfileDir, n.Name+"-"+step+".pprof"), body, 0o644)
			}
			if err != nil {
				m.b.cfg.Logger.Warn("scale: profile", "node", n.Name, "step", step, "err", err)
			}
		})
	}
	return wg.Wait
}

// clockTicks is USER_HZ, the unit of /proc/PID/stat's times on Linux.
const clockTicks = 100

// cpuSeconds is a process's user plus system CPU time.
func cpuSeconds(pid int) (float64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// Fields after the command name, which may hold spaces: state is
	// field 3, utime 14 and stime 15.
	rest := string(data[strings.LastIndexByte(string(data), ')')+2:])
	f := strings.Fields(rest)
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	u, _ := strconv.ParseFloat(f[11], 64)
	s, _ := strconv.ParseFloat(f[12], 64)
	return (u + s) / clockTicks, nil
}

func rssMiB(pid int) float64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			return kb / 1024
		}
	}
	return 0
}

func round1(v float64) float64 { return float64(int64(v*10+0.5)) / 10 }

// mapSize measures the stored map and times a load of it.
func (m *meter) mapSize(ctx context.Context, rec *Record, _ Options) error {
	e, err := m.kv.Get(ctx, shardmap.Key)
	if err != nil {
		return err
	}
	rec.HeadBytes = len(e.Value())
	start := time.Now()
	sm, err := shardmap.Load(ctx, m.kv)
	if err != nil {
		return err
	}
	rec.MapLoadMs = round1(float64(time.Since(start).Microseconds()) / 1000)
	rec.MapBytes = rec.HeadBytes
	for i := range sm.Namespaces {
		data, err := json.Marshal(&sm.Namespaces[i])
		if err != nil {
			return err
		}
		rec.MapBytes += len(data)
	}
	return nil
}

// scrapes reads every node's /metrics once.
func (m *meter) scrapes(ctx context.Context, rec *Record, opt Options) error {
	for _, n := range m.b.Nodes {
		start := time.Now()
		body, err := get(ctx, "http://"+n.Metrics+"/metrics")
		if err != nil {
			return fmt.Errorf("%s: %w", n.Name, err)
		}
		rec.Scrapes = append(rec.Scrapes, Scrape{Name: n.Name, Bytes: len(body), Ms: round1(float64(time.Since(start).Microseconds()) / 1000)})
		if opt.ProfileDir != "" {
			_ = os.WriteFile(filepath.Join(opt.ProfileDir, n.Name+".metrics"), body, 0o644)
		}
	}
	return nil
}

// get reads url, within a minute.
func get(ctx context.Context, url string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return io.ReadAll(resp.Body)
}

// takeover kills the dequeuer that owns the most shards and times until
// every shard has a live owner again.
func (m *meter) takeover(ctx context.Context, rec *Record, _ Options) error {
	by := m.ownedBy()
	var victim *Node
	for _, n := range m.b.Nodes {
		if n.DequeuerID != "" && (victim == nil || by[n.DequeuerID] > by[victim.DequeuerID]) {
			victim = n
		}
	}
	if victim == nil || by[victim.DequeuerID] == 0 {
		return fmt.Errorf("no dequeuer owns a shard: %v", by)
	}
	rec.Takeover.Killed, rec.Takeover.Shards = victim.Name, by[victim.DequeuerID]
	rec.Takeover.Excess = m.excess(by)
	start := time.Now()
	victim.Kill()
	deadline := start.Add(time.Minute)
	for {
		by := m.ownedBy()
		if by[victim.DequeuerID] == 0 && by[""] == 0 {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("a minute after the kill: %d shards still %s's, %d with no owner", by[victim.DequeuerID], victim.Name, by[""])
		}
		if err := sleep(ctx, 20*time.Millisecond); err != nil {
			return err
		}
	}
	rec.Takeover.Seconds = round1(time.Since(start).Seconds()*10) / 10
	return nil
}

// percentile of sorted values (ms), p in [0, 1].
func percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	sort.Float64s(sorted)
	return round1(sorted[min(len(sorted)-1, int(p*float64(len(sorted))))])
}
