package metrics

import (
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Other is the topic label of every topic past a namespace's cap
// (Options.MaxTopics): their series add up under it.
const Other = "_other"

// Bands are the priority band labels: priorities up to 0, 1, 2, 3, and 4
// and up, the weighted policy's default bands.
var Bands = [5]string{"0", "1", "2", "3", "4+"}

// Band returns the index in Bands of a priority.
func Band(priority int32) int { return int(min(max(priority, 0), 4)) }

// Options tune a Set.
type Options struct {
	// MaxTopics caps the topics per namespace that get their own label;
	// the rest are counted under Other. Default 100.
	MaxTopics int
}

// Latency buckets: enqueue and dequeue calls (1 ms .. 20 s: a long poll
// waits up to 20 s), and enqueue-to-delivery (10 ms .. ~3 h).
var (
	rpcBuckets      = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 20}
	deliveryBuckets = prometheus.ExponentialBuckets(0.01, 4, 11)
	attemptBuckets  = []float64{1, 2, 3, 5, 10, 20, 50}
	phaseBuckets    = []float64{.01, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}
	insertBuckets   = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 5}
)

// Set is one node's metrics, registered on the node's own registry (never
// the global default one, so several nodes can run in one test process).
// A nil *Set is valid and records nothing anyone reads: roles built
// without metrics (unit tests) need no checks.
type Set struct {
	// Registry is what /metrics serves.
	Registry *prometheus.Registry
	opts     Options

	enqueued, dequeued, leaseExpiries, deadLettered, redriven *prometheus.CounterVec
	deadLettersDeleted                                        *prometheus.CounterVec
	enqueueSeconds, dequeueSeconds, ackSeconds, nackSeconds   *prometheus.HistogramVec
	deliverySeconds, attempts                                 *prometheus.HistogramVec
	acks, nacks, quota                                        *prometheus.CounterVec
	prefetchHit, prefetchMiss                                 prometheus.Counter
	inserted                                                  *prometheus.CounterVec
	insertSeconds                                             *prometheus.HistogramVec
	bufferPending, bufferAge                                  *prometheus.GaugeVec
	primaryUp, semiSync, semiSyncClients                      *prometheus.GaugeVec
	replicaLag                                                *prometheus.GaugeVec
	failovers                                                 *prometheus.CounterVec
	failoverPhase                                             *prometheus.HistogramVec

	mu     sync.RWMutex
	topics map[string]map[string]*Topic // namespace → topic → metrics
	nss    map[string]*Namespace
	shards map[uint32]*Shard
	rings  map[string]*ring // namespace → its throughput (Throughput)
	// now is the time the rings count at.
	now func() time.Time
}

// New returns a Set registered on reg, with Go runtime and process
// collectors.
func New(reg *prometheus.Registry, opts Options) *Set {
	if opts.MaxTopics <= 0 {
		opts.MaxTopics = 100
	}
	s := &Set{Registry: reg, opts: opts,
		topics: map[string]map[string]*Topic{}, nss: map[string]*Namespace{}, shards: map[uint32]*Shard{},
		rings: map[string]*ring{}, now: time.Now}
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		v := prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
		reg.MustRegister(v)
		return v
	}
	hist := func(name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
		v := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets}, labels)
		reg.MustRegister(v)
		return v
	}
	gauge := func(name, help string, labels ...string) *prometheus.GaugeVec {
		v := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, labels)
		reg.MustRegister(v)
		return v
	}
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	s.enqueued = counter("triage_enqueued_items_total", "Items a router accepted (duplicates of a dedup key included).", "namespace", "topic", "band")
	s.dequeued = counter("triage_dequeued_items_total", "Items delivered to consumers by a dequeuer.", "namespace", "topic", "band")
	s.leaseExpiries = counter("triage_lease_expiries_total", "Delivery leases found lapsed when their item was read again (redelivered, dead-lettered or, at-most-once, deleted).", "namespace", "topic")
	s.deadLettered = counter("triage_dead_lettered_items_total", "Items moved to the dead-letter table because their attempts were used up (by a nack or a lapsed lease).", "namespace", "topic")
	s.redriven = counter("triage_redriven_items_total", "Dead letters put back by RedriveDeadLetters.", "namespace", "topic")
	s.deadLettersDeleted = counter("triage_deleted_dead_letters_total", "Dead letters removed by DeleteDeadLetters.", "namespace", "topic")
	s.enqueueSeconds = hist("triage_enqueue_duration_seconds", "Enqueue calls as the router served them.", rpcBuckets, "namespace", "durability")
	s.dequeueSeconds = hist("triage_dequeue_duration_seconds", "Dequeue calls as the router served them (long polls included).", rpcBuckets, "namespace")
	s.ackSeconds = hist("triage_ack_duration_seconds", "Ack calls as the router served them.", rpcBuckets, "namespace")
	s.nackSeconds = hist("triage_nack_duration_seconds", "Nack calls as the router served them.", rpcBuckets, "namespace")
	s.deliverySeconds = hist("triage_enqueue_to_delivery_seconds", "From an item's enqueue to its first delivery (delays and deliver_after included).", deliveryBuckets, "namespace")
	s.attempts = hist("triage_delivery_attempts", "The attempt number of each delivery.", attemptBuckets, "namespace")
	s.acks = counter("triage_acks_total", "Acked items by result: ok, or refused (stale token, unknown item).", "namespace", "result")
	s.nacks = counter("triage_nacks_total", "Nacked items by result: ok, or refused.", "namespace", "result")
	s.quota = counter("triage_quota_refusals_total", "Enqueues refused RESOURCE_EXHAUSTED, by reason: rate, depth, buffer_full.", "namespace", "reason")
	prefetch := counter("triage_prefetch_items_total", "Items a dequeuer served, by whether its prefetch buffer held them when the request came (hit) or a fetch in the request brought them (miss).", "result")
	s.prefetchHit, s.prefetchMiss = prefetch.WithLabelValues("hit"), prefetch.WithLabelValues("miss")
	s.inserted = counter("triage_enqueuer_inserted_items_total", "Items an enqueuer inserted into a shard (per envelope batch).", "shard")
	s.insertSeconds = hist("triage_enqueuer_insert_duration_seconds", "One group-commit insert of enqueue batches into a shard.", insertBuckets, "shard")
	s.bufferPending = gauge("triage_enqueue_buffer_messages", "Enqueue envelopes of a shard waiting in the JetStream buffer (pending plus unacknowledged).", "shard")
	s.bufferAge = gauge("triage_enqueue_buffer_oldest_age_seconds", "Age of the oldest unacknowledged enqueue envelope of a shard; 0 when empty.", "shard")
	s.primaryUp = gauge("triage_shard_primary_up", "1 when this node's observer reached the shard's primary on its last ping.", "shard")
	s.semiSync = gauge("triage_shard_semisync_on", "1 when the shard primary's semi-sync is active (shards with replicas).", "shard")
	s.semiSyncClients = gauge("triage_shard_semisync_clients", "Semi-sync replicas connected to the shard primary.", "shard")
	s.replicaLag = gauge("triage_shard_replication_lag_seconds", "Seconds_Behind_Master of a replica in this node's region; -1 when unknown (not replicating).", "shard", "replica")
	s.failovers = counter("triage_failovers_total", "Failovers the controller ran, by kind (planned, emergency) and result (done, failed).", "shard", "kind", "result")
	s.failoverPhase = hist("triage_failover_phase_duration_seconds", "Time from a failover's previous step (or its start) to this step.", phaseBuckets, "step")
	return s
}

var (
	nopOnce sync.Once
	nopSet  *Set
)

// or returns s, or for a nil s a private Set nobody scrapes.
func (s *Set) or() *Set {
	if s != nil {
		return s
	}
	nopOnce.Do(func() { nopSet = New(prometheus.NewRegistry(), Options{}) })
	return nopSet
}

// Topic is the per-topic metrics, curried once per topic.
type Topic struct {
	// Label is the topic label: the topic, or Other past the cap.
	Label                                 string
	Enqueued, Dequeued                    [5]prometheus.Counter
	LeaseExpiries, DeadLettered, Redriven prometheus.Counter
	DeadLettersDeleted                    prometheus.Counter
}

// Topic returns topic's metrics in namespace ns. The first
// Options.MaxTopics topics of a namespace seen by this node get their own
// label, the rest share Other. Callers pass only namespaces that exist
// (configured), so namespaces are bounded too.
func (s *Set) Topic(ns, topic string) *Topic {
	s = s.or()
	s.mu.RLock()
	t := s.topics[ns][topic]
	s.mu.RUnlock()
	if t != nil {
		return t
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.topics[ns]
	if m == nil {
		m = map[string]*Topic{}
		s.topics[ns] = m
	}
	if t = m[topic]; t != nil {
		return t
	}
	label := topic
	if len(m) >= s.opts.MaxTopics && topic != Other {
		if t = m[Other]; t == nil {
			t = s.newTopic(ns, Other)
			m[Other] = t
		}
		return t // not stored under topic: the map stays bounded
	}
	t = s.newTopic(ns, label)
	m[topic] = t
	return t
}

// TopicLabel is the label topic gets in ns (see Topic).
func (s *Set) TopicLabel(ns, topic string) string { return s.Topic(ns, topic).Label }

func (s *Set) newTopic(ns, label string) *Topic {
	t := &Topic{Label: label,
		LeaseExpiries:      s.leaseExpiries.WithLabelValues(ns, label),
		DeadLettered:       s.counting(s.deadLettered.WithLabelValues(ns, label), ns, RateDeadLettered),
		Redriven:           s.redriven.WithLabelValues(ns, label),
		DeadLettersDeleted: s.deadLettersDeleted.WithLabelValues(ns, label),
	}
	for i, b := range Bands {
		t.Enqueued[i] = s.counting(s.enqueued.WithLabelValues(ns, label, b), ns, RateEnqueued)
		t.Dequeued[i] = s.counting(s.dequeued.WithLabelValues(ns, label, b), ns, RateDelivered)
	}
	return t
}

// Namespace is the per-namespace metrics, curried once per namespace.
type Namespace struct {
	EnqueueCommitted, EnqueueBuffered      prometheus.Observer
	Dequeue, Ack, Nack                     prometheus.Observer
	EnqueueToDelivery, Attempts            prometheus.Observer
	AckOK, AckRefused, NackOK, NackRefused prometheus.Counter
	QuotaRate, QuotaDepth, QuotaBufferFull prometheus.Counter
}

// Namespace returns ns's metrics.
func (s *Set) Namespace(ns string) *Namespace {
	s = s.or()
	s.mu.RLock()
	n := s.nss[ns]
	s.mu.RUnlock()
	if n != nil {
		return n
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if n = s.nss[ns]; n != nil {
		return n
	}
	n = &Namespace{
		EnqueueCommitted:  s.enqueueSeconds.WithLabelValues(ns, "committed"),
		EnqueueBuffered:   s.enqueueSeconds.WithLabelValues(ns, "buffered"),
		Dequeue:           s.dequeueSeconds.WithLabelValues(ns),
		Ack:               s.ackSeconds.WithLabelValues(ns),
		Nack:              s.nackSeconds.WithLabelValues(ns),
		EnqueueToDelivery: s.deliverySeconds.WithLabelValues(ns),
		Attempts:          s.attempts.WithLabelValues(ns),
		AckOK:             s.counting(s.acks.WithLabelValues(ns, "ok"), ns, RateAcked),
		AckRefused:        s.acks.WithLabelValues(ns, "refused"),
		NackOK:            s.nacks.WithLabelValues(ns, "ok"),
		NackRefused:       s.nacks.WithLabelValues(ns, "refused"),
		QuotaRate:         s.quota.WithLabelValues(ns, "rate"),
		QuotaDepth:        s.quota.WithLabelValues(ns, "depth"),
		QuotaBufferFull:   s.quota.WithLabelValues(ns, "buffer_full"),
	}
	s.nss[ns] = n
	return n
}

// Shard is the per-shard metrics.
type Shard struct {
	Inserted                  prometheus.Counter
	InsertSeconds             prometheus.Observer
	BufferMessages, BufferAge prometheus.Gauge
	PrimaryUp, SemiSyncOn     prometheus.Gauge
	SemiSyncClients           prometheus.Gauge
	label                     string
	set                       *Set
}

// Shard returns shard id's metrics.
func (s *Set) Shard(id uint32) *Shard {
	s = s.or()
	s.mu.RLock()
	sh := s.shards[id]
	s.mu.RUnlock()
	if sh != nil {
		return sh
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if sh = s.shards[id]; sh != nil {
		return sh
	}
	l := strconv.FormatUint(uint64(id), 10)
	sh = &Shard{label: l, set: s,
		Inserted:       s.inserted.WithLabelValues(l),
		InsertSeconds:  s.insertSeconds.WithLabelValues(l),
		BufferMessages: s.bufferPending.WithLabelValues(l),
		BufferAge:      s.bufferAge.WithLabelValues(l),
		PrimaryUp:      s.primaryUp.WithLabelValues(l),
	}
	s.shards[id] = sh
	return sh
}

// SemiSync sets the primary's semi-sync state. Only shards with replicas
// get these series: a shard without any reads as nothing, not as off.
func (sh *Shard) SemiSync(on bool, clients int) {
	v := 0.0
	if on {
		v = 1
	}
	sh.set.semiSync.WithLabelValues(sh.label).Set(v)
	sh.set.semiSyncClients.WithLabelValues(sh.label).Set(float64(clients))
}

// ReplicaLag sets the lag of replica (an address) of the shard; lag < 0
// means unknown.
func (sh *Shard) ReplicaLag(replica string, lag time.Duration, known bool) {
	v := lag.Seconds()
	if !known {
		v = -1
	}
	sh.set.replicaLag.WithLabelValues(sh.label, replica).Set(v)
}

// Prefetch counts n items served from a prefetch buffer: hit when the
// buffer held them as the request came, else miss.
func (s *Set) Prefetch(hit bool, n int) {
	s = s.or()
	if hit {
		s.prefetchHit.Add(float64(n))
	} else {
		s.prefetchMiss.Add(float64(n))
	}
}

// FailoverStep records that a failover of shard reached step after d
// since its previous step.
func (s *Set) FailoverStep(step string, d time.Duration) {
	s.or().failoverPhase.WithLabelValues(step).Observe(d.Seconds())
}

// Failover counts a finished failover of shard: kind planned or
// emergency, result done or failed.
func (s *Set) Failover(shard uint32, kind, result string) {
	s.or().failovers.WithLabelValues(strconv.FormatUint(uint64(shard), 10), kind, result).Inc()
}
