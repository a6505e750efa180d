package metrics

import (
	"cmp"
	"context"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/triage-queue/triage/schema/store"
	"github.com/triage-queue/triage/shardmap"
)

// DepthConfig configures the depth collector.
type DepthConfig struct {
	// Region whose shards are counted (a router counts its own region's).
	Region string
	Maps   shardmap.Source
	Pool   *shardmap.Pool
	// Clock gives each primary's time; default a Clock of its own.
	Clock *shardmap.Clock
	// MinInterval: a scrape within this long of the last count serves
	// that count instead of querying again. Default 5s; negative: count
	// on every scrape (tests).
	MinInterval time.Duration
	// Timeout bounds one count of all shards. Default 3s.
	Timeout time.Duration
}

var (
	depthDesc   = prometheus.NewDesc("triage_items", "Items by state (ready, leased, delayed) per namespace, topic and priority band, counted on the region's shard primaries.", []string{"namespace", "topic", "band", "state"}, nil)
	oldestDesc  = prometheus.NewDesc("triage_oldest_ready_age_seconds", "Age of the oldest ready item per namespace, topic and band (since its deliver_after); 0 when none.", []string{"namespace", "topic", "band"}, nil)
	deadDesc    = prometheus.NewDesc("triage_dead_letters", "Dead letters per namespace and topic.", []string{"namespace", "topic"}, nil)
	errDesc     = prometheus.NewDesc("triage_depth_collect_errors_total", "Depth counts of a shard that failed (unreachable primary, or over the statement budget).", []string{"shard"}, nil)
	collectDesc = prometheus.NewDesc("triage_depth_collect_duration_seconds", "How long the last depth count of all shards took.", nil, nil)
)

type depthKey struct {
	ns, topic string
	band      int
}

type depthVal struct {
	ready, leased, delayed float64
	oldestUS               int64 // deliver_after of the oldest ready; 0 none
}

// depthCollector counts the items of the region's shards when scraped
// (at most once per MinInterval).
type depthCollector struct {
	cfg DepthConfig
	set *Set

	mu    sync.Mutex
	at    time.Time
	took  time.Duration
	depth map[depthKey]*depthVal
	dead  map[[2]string]float64
	errs  map[uint32]float64
	known map[[2]string]bool // topics ever reported, so a drained one reads 0
	nowUS int64
}

// RegisterDepth registers the depth collector on s's registry.
func (s *Set) RegisterDepth(cfg DepthConfig) {
	if s == nil {
		return
	}
	if cfg.MinInterval == 0 {
		cfg.MinInterval = 5 * time.Second
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 3 * time.Second
	}
	if cfg.Clock == nil {
		cfg.Clock = &shardmap.Clock{}
	}
	s.Registry.MustRegister(&depthCollector{cfg: cfg, set: s, errs: map[uint32]float64{}, known: map[[2]string]bool{}})
}

func (c *depthCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- depthDesc
	ch <- oldestDesc
	ch <- deadDesc
	ch <- errDesc
	ch <- collectDesc
}

func (c *depthCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.depth == nil || time.Since(c.at) >= c.cfg.MinInterval {
		c.count()
	}
	for k, v := range c.depth {
		b := Bands[k.band]
		ch <- prometheus.MustNewConstMetric(depthDesc, prometheus.GaugeValue, v.ready, k.ns, k.topic, b, "ready")
		ch <- prometheus.MustNewConstMetric(depthDesc, prometheus.GaugeValue, v.leased, k.ns, k.topic, b, "leased")
		ch <- prometheus.MustNewConstMetric(depthDesc, prometheus.GaugeValue, v.delayed, k.ns, k.topic, b, "delayed")
		age := 0.0
		if v.oldestUS > 0 {
			age = max(float64(c.nowUS-v.oldestUS)/1e6, 0)
		}
		ch <- prometheus.MustNewConstMetric(oldestDesc, prometheus.GaugeValue, age, k.ns, k.topic, b)
	}
	for k, n := range c.dead {
		ch <- prometheus.MustNewConstMetric(deadDesc, prometheus.GaugeValue, n, k[0], k[1])
	}
	for id, n := range c.errs {
		ch <- prometheus.MustNewConstMetric(errDesc, prometheus.CounterValue, n, strconv.FormatUint(uint64(id), 10))
	}
	ch <- prometheus.MustNewConstMetric(collectDesc, prometheus.GaugeValue, c.took.Seconds())
}

// count queries every shard of the region in parallel and folds the rows
// into bounded labels. A shard that fails keeps no numbers this round
// (its error counter says so) rather than stale ones.
func (c *depthCollector) count() {
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.Timeout)
	defer cancel()
	m := c.cfg.Maps.Current()
	ids := m.RegionShards(c.cfg.Region)
	type result struct {
		rows  []store.BandDepth
		dead  []store.TopicDead
		nowUS int64
		err   error
	}
	res := make([]result, len(ids))
	var wg sync.WaitGroup
	for i, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			db, _, err := c.cfg.Pool.Primary(m, id)
			if err != nil {
				res[i].err = err
				return
			}
			now := c.cfg.Clock.Now(ctx, db).UnixMicro()
			res[i].nowUS = now
			res[i].rows, res[i].dead, res[i].err = store.New(db).ItemDepth(ctx, store.ItemDepthParams{NowUS: now, Budget: c.cfg.Timeout})
		}()
	}
	wg.Wait()
	depth := map[depthKey]*depthVal{}
	dead := map[[2]string]float64{}
	// Topics seen before read 0 when drained, rather than vanishing.
	for k := range c.known {
		for b := range Bands {
			depth[depthKey{k[0], k[1], b}] = &depthVal{}
		}
	}
	c.nowUS = time.Now().UnixMicro()
	for i, r := range res {
		if r.err != nil {
			c.errs[ids[i]]++
			continue
		}
		c.nowUS = max(c.nowUS, r.nowUS)
		for _, row := range r.rows {
			t := c.set.TopicLabel(row.Namespace, row.Topic)
			c.known[[2]string{row.Namespace, t}] = true
			k := depthKey{row.Namespace, t, min(max(row.Band, 0), 4)}
			v := depth[k]
			if v == nil {
				v = &depthVal{}
				depth[k] = v
			}
			v.ready += float64(row.Ready)
			v.leased += float64(row.Leased)
			v.delayed += float64(row.Delayed())
			if row.Oldest > 0 && (v.oldestUS == 0 || row.Oldest < v.oldestUS) {
				v.oldestUS = row.Oldest
			}
		}
		for _, d := range r.dead {
			t := c.set.TopicLabel(d.Namespace, d.Topic)
			dead[[2]string{d.Namespace, t}] += float64(d.N)
		}
	}
	for k := range c.known {
		if _, ok := dead[k]; !ok {
			dead[k] = 0
		}
	}
	c.depth, c.dead, c.at, c.took = depth, dead, time.Now(), time.Since(start)
}

var (
	epochDesc   = prometheus.NewDesc("triage_shard_epoch", "The shard's epoch in this node's shard map.", []string{"shard"}, nil)
	fencedDesc  = prometheus.NewDesc("triage_shard_fenced", "1 while the shard is fenced (a failover is under way).", []string{"shard"}, nil)
	primaryDesc = prometheus.NewDesc("triage_shard_primary_info", "1 for the shard's current primary: address, region it runs in, home region.", []string{"shard", "primary", "primary_region", "home_region"}, nil)
	versionDesc = prometheus.NewDesc("triage_shardmap_version", "Version of this node's shard map.", nil, nil)
	ageDesc     = prometheus.NewDesc("triage_shardmap_confirmed_age_seconds", "Time since the store last confirmed this node's shard map (writers stop past 2 s).", nil, nil)
	pausedDesc  = prometheus.NewDesc("triage_topic_paused", "1 while PauseTopic holds the topic's deliveries; topics not paused have no series (under topic \"_other\": how many of those topics are paused).", []string{"namespace", "topic"}, nil)
)

// MapSource is what the shard-map collector reads: the current map and
// how long ago the store confirmed it (shardmap.Holder).
type MapSource interface {
	Current() *shardmap.Map
	Age() time.Duration
}

type mapCollector struct {
	src MapSource
	set *Set
}

// RegisterShardMap registers gauges read from the node's shard map on
// every scrape: epoch, fencing and primary per shard, map version and age,
// and which topics are paused.
func (s *Set) RegisterShardMap(src MapSource) {
	if s != nil {
		s.Registry.MustRegister(mapCollector{src, s})
	}
}

func (c mapCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- epochDesc
	ch <- fencedDesc
	ch <- primaryDesc
	ch <- versionDesc
	ch <- ageDesc
	ch <- pausedDesc
}

func (c mapCollector) Collect(ch chan<- prometheus.Metric) {
	m := c.src.Current()
	for _, s := range m.Shards {
		id := strconv.FormatUint(uint64(s.ID), 10)
		fenced := 0.0
		if s.Fenced {
			fenced = 1
		}
		ch <- prometheus.MustNewConstMetric(epochDesc, prometheus.GaugeValue, float64(s.Epoch), id)
		ch <- prometheus.MustNewConstMetric(fencedDesc, prometheus.GaugeValue, fenced, id)
		ch <- prometheus.MustNewConstMetric(primaryDesc, prometheus.GaugeValue, 1, id, s.Primary, cmp.Or(s.PrimaryRegion, s.HomeRegion), s.HomeRegion)
	}
	ch <- prometheus.MustNewConstMetric(versionDesc, prometheus.GaugeValue, float64(m.Version))
	ch <- prometheus.MustNewConstMetric(ageDesc, prometheus.GaugeValue, c.src.Age().Seconds())
	for k, n := range c.paused(m) {
		ch <- prometheus.MustNewConstMetric(pausedDesc, prometheus.GaugeValue, n, k[0], k[1])
	}
}

// paused counts, per namespace and topic label, the topics on pause;
// topics past the label cap add up under Other as every per-topic series
// does. A topic that is not paused has no series: a map of 100,000 topic
// configurations made 100,000 zeros, 8 of a node's 9 MB of /metrics.
func (c mapCollector) paused(m *shardmap.Map) map[[2]string]float64 {
	out := map[[2]string]float64{}
	for _, ns := range m.Namespaces {
		for topic, tc := range ns.Topics {
			if tc.Paused {
				out[[2]string{ns.Name, c.set.TopicLabel(ns.Name, topic)}]++
			}
		}
	}
	return out
}
