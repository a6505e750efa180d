package regions

import (
	"cmp"
	"context"
	"database/sql"
	"database/sql/driver"
	"encoding/json"
	"errors"
	"expvar"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/triage-queue/triage/proto/triage/peer"
	"github.com/triage-queue/triage/regions/replication"
	"github.com/triage-queue/triage/schema/metrics"
	"github.com/triage-queue/triage/shardmap"
)

// HealthBucket holds the observers' reports.
const HealthBucket = "triage_health"

// HealthSubject is where observers also publish each report on core NATS
// (HealthSubject + "." + shard + "." + region), and the controllers
// subscribe. Core NATS needs no stream leader: when a region goes down
// with the leader of the health bucket's stream, the bucket's watchers see
// nothing until the stream elects a new leader and the watch's consumer
// recovers (a region-down drill saw the new controller hear "down" 10.5 s
// after the fault, 7 s after it took the lead). Reports carry their time
// (At), so one heard twice, or late, counts only while fresh.
const HealthSubject = "triage.health"

// Report is one observer's view of one shard primary.
type Report struct {
	Region string `json:"region"`
	Shard  uint32 `json:"shard"`
	// Primary is the address pinged, Epoch the map epoch it was named in.
	Primary string `json:"primary"`
	Epoch   uint64 `json:"epoch"`
	OK      bool   `json:"ok"`
	// SemiSyncOff: the primary has replicas but semi-sync is not active
	// (someone turned it off, or gave it a timeout: Triage never lets it
	// fall back to async): commits are acknowledged before a replica has
	// them.
	SemiSyncOff bool `json:"semi_sync_off,omitempty"`
	// NoReplicas: the primary has no semi-sync replica connected, so every
	// commit blocks until one reconnects (there is no async fallback);
	// writers see their deadlines expire. Failover does not help while the
	// primary answers; bring a replica back.
	NoReplicas bool `json:"no_replicas,omitempty"`
	// Refused: the ping failed at once because the far side refused or
	// closed the connection (nothing listens on the port; a proxy in
	// front of a dead server closes what it accepted), not by a timeout
	// and not with an error from a live server. A killed or crashed
	// mariadbd on a live host looks like this; a cut network or a dead
	// host times out instead. The controller acts on it sooner
	// (Config.DetectRefused).
	Refused bool   `json:"refused,omitempty"`
	Error   string `json:"error,omitempty"`
	// At is when the ping finished (unix ms).
	At int64 `json:"at"`
}

func healthKey(shard uint32, region string) string {
	return "s" + strconv.FormatUint(uint64(shard), 10) + "." + region
}

// OpenHealth creates or opens the health bucket.
func OpenHealth(ctx context.Context, js jetstream.JetStream, replicas int) (jetstream.KeyValue, error) {
	kv, err := peer.EnsureKeyValue(ctx, js, jetstream.KeyValueConfig{
		Bucket: HealthBucket, TTL: 10 * time.Second, Storage: jetstream.MemoryStorage, Replicas: max(replicas, 1),
	})
	if err != nil {
		return nil, fmt.Errorf("open kv bucket %s: %w", HealthBucket, err)
	}
	return kv, nil
}

// semiSyncFallbacks counts observations of a primary whose semi-sync fell
// back to async: the metric behind the alarm, on /debug/vars.
var semiSyncFallbacks = expvar.NewInt("triage_semisync_async_observations")

// Observer pings every shard primary from one region and reports. It also
// raises the semi-sync alarm (log and metric) when a primary with replicas
// runs async.
type Observer struct {
	Region string
	Maps   shardmap.Source
	// Dial maps an address to the one this region dials (Pool.Addr).
	Dial func(string) string
	// Cred is the account pinged with: the application account, so a
	// primary counts as up when the roles can log in to it.
	Cred shardmap.Credentials
	// Monitor, when set, is the account replica lag is read with (SHOW
	// SLAVE STATUS needs SLAVE MONITOR or more, which the application
	// account lacks). Default Cred.
	Monitor *shardmap.Credentials
	// KV, when set, stores each report (see Detection in doc.go); nil:
	// the observer only sets Metrics.
	KV jetstream.KeyValue
	// NC, when set, also carries each report on HealthSubject.
	NC *nats.Conn
	// Every is the ping period (default ObserveEvery).
	Every  time.Duration
	Logger *slog.Logger
	// Metrics, when set, gets each shard primary's reachability and
	// semi-sync state, and the lag of the replicas in this region.
	Metrics *metrics.Set

	mu      sync.Mutex
	dbs     map[string]*sql.DB
	async   map[uint32]bool   // last semi-sync state seen, for alarm edges
	blocked map[uint32]bool   // last "no replica connected" seen, likewise
	stored  map[uint32]Report // the last report put in KV per shard (see storeDue)
}

// ObserveEvery is the observers' default ping period. Detection of a dead
// primary waits for two rounds of reports from two regions, so the period
// sits on the failover's critical path; a ping is one round trip per
// shard primary and region.
const ObserveEvery = 250 * time.Millisecond

// ObserveMetricsEvery is the period of an observer that only keeps a
// node's metrics (no KV, no NC): nothing waits on it.
const ObserveMetricsEvery = 2 * time.Second

// Run pings every o.Every until ctx ends.
func (o *Observer) Run(ctx context.Context) {
	o.dbs = map[string]*sql.DB{}
	o.async = map[uint32]bool{}
	o.stored = map[uint32]Report{}
	o.blocked = map[uint32]bool{}
	defer func() {
		for _, db := range o.dbs {
			db.Close()
		}
	}()
	t := time.NewTicker(cmp.Or(o.Every, ObserveEvery))
	defer t.Stop()
	// The first round at once: a metrics-only observer's period is long
	// enough for its gauges to read "down" (0) for seconds after start.
	o.round(ctx)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		o.round(ctx)
	}
}

// round observes every shard of the current map at once.
func (o *Observer) round(ctx context.Context) {
	var wg sync.WaitGroup
	for _, s := range o.Maps.Current().Shards {
		wg.Go(func() { o.observe(ctx, s) })
	}
	wg.Wait()
}

func (o *Observer) db(addr string) *sql.DB { return o.conn(addr, o.Cred) }

// monitor is the pool of o.Monitor to addr.
func (o *Observer) monitor(addr string) *sql.DB {
	if o.Monitor == nil {
		return o.db(addr)
	}
	return o.conn(addr, *o.Monitor)
}

func (o *Observer) conn(addr string, cred shardmap.Credentials) *sql.DB {
	key := cmp.Or(cred.User, "root") + "@" + addr
	o.mu.Lock()
	defer o.mu.Unlock()
	if db, ok := o.dbs[key]; ok {
		return db
	}
	c := mysql.NewConfig()
	cred.Apply(c)
	c.Net, c.Addr = "tcp", o.Dial(addr)
	c.Timeout, c.ReadTimeout, c.WriteTimeout = time.Second, time.Second, time.Second
	db, _ := sql.Open("mysql", c.FormatDSN())
	db.SetMaxOpenConns(2)
	db.SetConnMaxLifetime(30 * time.Second)
	o.dbs[key] = db
	return db
}

func (o *Observer) observe(ctx context.Context, s shardmap.Shard) {
	r := Report{Region: o.Region, Shard: s.ID, Primary: s.Primary, Epoch: s.Epoch}
	pctx, cancel := context.WithTimeout(ctx, 900*time.Millisecond)
	defer cancel()
	err := o.db(s.Primary).PingContext(pctx)
	if err == nil {
		_, err = o.db(s.Primary).ExecContext(pctx, "DO 1")
	}
	var semi [2]int // semi-sync status, clients; -1 unknown
	semi[0], semi[1] = -1, -1
	if err == nil && len(s.Replicas) > 0 {
		// A read-only server commits nothing: it is a deposed primary
		// that an observer with a stale map still calls primary (the
		// failover fenced it and turned its semi-sync off), and neither
		// alarm applies to it.
		var status, clients, readOnly int
		if qerr := o.db(s.Primary).QueryRowContext(pctx, `SELECT
			SUM(variable_name = 'RPL_SEMI_SYNC_MASTER_STATUS' AND variable_value = 'ON'),
			SUM(IF(variable_name = 'RPL_SEMI_SYNC_MASTER_CLIENTS', variable_value, 0)),
			MAX(@@global.read_only) -- bare, MariaDB answers 0 beside SUM
			FROM information_schema.global_status
			WHERE variable_name IN ('RPL_SEMI_SYNC_MASTER_STATUS', 'RPL_SEMI_SYNC_MASTER_CLIENTS')`).Scan(&status, &clients, &readOnly); qerr == nil && readOnly == 0 {
			r.SemiSyncOff = status == 0
			semi[0], semi[1] = status, clients
			r.NoReplicas = !r.SemiSyncOff && clients == 0
			if r.SemiSyncOff {
				semiSyncFallbacks.Add(1)
			}
		}
	}
	o.mu.Lock()
	was, wasBlocked := o.async[s.ID], o.blocked[s.ID]
	o.async[s.ID], o.blocked[s.ID] = r.SemiSyncOff, r.NoReplicas
	o.mu.Unlock()
	if r.NoReplicas && !wasBlocked {
		o.Logger.Warn("ALARM: primary has no semi-sync replica connected; its commits block until one acknowledges (no async fallback), writers time out",
			"shard", s.ID, "primary", s.Primary, "replicas", s.Replicas)
	} else if wasBlocked && !r.NoReplicas && err == nil {
		o.Logger.Info("a semi-sync replica is connected again; commits complete", "shard", s.ID, "primary", s.Primary)
	}
	if r.SemiSyncOff && !was {
		o.Logger.Warn("ALARM: semi-sync is off on a primary with replicas; commits are acknowledged before a replica has them",
			"shard", s.ID, "primary", s.Primary)
	} else if was && !r.SemiSyncOff && err == nil {
		o.Logger.Info("semi-sync active again", "shard", s.ID, "primary", s.Primary)
	}
	r.OK = err == nil
	if err != nil {
		r.Error = err.Error()
		r.Refused = refusedAtOnce(err)
	}
	if o.Metrics != nil {
		o.measure(pctx, s, r, semi)
	}
	r.At = time.Now().UnixMilli()
	data, _ := json.Marshal(r)
	if o.NC != nil {
		_ = o.NC.Publish(HealthSubject+"."+healthKey(s.ID, o.Region), data)
	}
	if o.KV != nil && o.storeDue(r) {
		kctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		_, _ = o.KV.Put(kctx, healthKey(s.ID, o.Region), data)
	}
}

// storeEvery is how often an unchanged report is stored again in KV:
// within the controllers' 3 s freshness window, so a controller that
// reads only the bucket (its core NATS subscription cut off) still sees
// a fresh report of every observer.
const storeEvery = time.Second

// storeDue tells whether r goes to KV: when what it says differs from the
// report last stored for its shard, or that one is storeEvery old. Every
// report goes out on core NATS, which the controllers follow; the bucket
// is what a controller reads when it starts, and its replicated write per
// report (every ObserveEvery, per shard and region) was most of an idle
// cluster's JetStream traffic.
func (o *Observer) storeDue(r Report) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	last, ok := o.stored[r.Shard]
	// The same report but for when it was taken and its error's words
	// (addresses, timings): every other field, including any added later.
	a, b := last, r
	a.At, b.At, a.Error, b.Error = 0, 0, "", ""
	if ok && a == b && time.UnixMilli(r.At).Sub(time.UnixMilli(last.At)) < storeEvery {
		return false
	}
	o.stored[r.Shard] = r
	return true
}

// measure sets the shard's gauges from one observation, and reads the
// lag of the shard's replicas in this observer's region (one each, so
// every replica is measured by the observers of its own region).
func (o *Observer) measure(ctx context.Context, s shardmap.Shard, r Report, semi [2]int) {
	sm := o.Metrics.Shard(s.ID)
	up := 0.0
	if r.OK {
		up = 1
	}
	sm.PrimaryUp.Set(up)
	if semi[0] >= 0 {
		sm.SemiSync(semi[0] > 0, semi[1])
	}
	for i, addr := range s.Replicas {
		if i >= len(s.ReplicaRegions) || s.ReplicaRegions[i] != o.Region {
			continue
		}
		a, err := replication.New(o.monitor(addr), addr, replication.MariaDB)
		if err != nil {
			continue
		}
		st, err := a.Status(ctx)
		if noPrivilege(err) {
			// This node's account may not read replica status; the
			// controller's monitor account does, and reports the lag. A
			// -1 from every other node would read as a stopped replica.
			continue
		}
		if err != nil {
			sm.ReplicaLag(addr, 0, false)
			continue
		}
		sm.ReplicaLag(addr, st.Lag, st.LagKnown)
	}
}

// noPrivilege tells a statement refused for want of a privilege (1044,
// 1142, 1227) from one that failed.
func noPrivilege(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && (me.Number == 1044 || me.Number == 1142 || me.Number == 1227)
}

// refusedAtOnce tells a ping that failed because the far side refused or
// dropped the connection from one that timed out or that a live server
// answered with an error (too many connections, access denied: alive).
func refusedAtOnce(err error) bool {
	var serverErr *mysql.MySQLError
	var netErr net.Error
	switch {
	case errors.As(err, &serverErr),
		errors.Is(err, context.DeadlineExceeded),
		errors.As(err, &netErr) && netErr.Timeout():
		return false
	}
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, mysql.ErrInvalidConn) || errors.Is(err, driver.ErrBadConn)
}

// healthView is the leader's copy of the health bucket.
type healthView struct {
	mu      sync.Mutex
	reports map[string]Report
	// downFrom is, per observer key, when its reports of the primary it
	// last named began saying down (Report.At, unix ms) without one of
	// that primary up since; absent while it reports up. See downSince.
	downFrom map[string]int64
}

// watchHealth builds the view from the health bucket and, when nc is
// set, from the reports on HealthSubject, whichever comes first; a report
// never replaces a newer one of the same observer.
func watchHealth(ctx context.Context, kv jetstream.KeyValue, nc *nats.Conn) (*healthView, error) {
	h := &healthView{reports: map[string]Report{}, downFrom: map[string]int64{}}
	if nc != nil {
		sub, err := nc.Subscribe(HealthSubject+".>", func(m *nats.Msg) {
			var r Report
			if json.Unmarshal(m.Data, &r) == nil {
				h.put(healthKey(r.Shard, r.Region), r)
			}
		})
		if err != nil {
			return nil, err
		}
		context.AfterFunc(ctx, func() { _ = sub.Unsubscribe() })
	}
	w, err := kv.WatchAll(ctx)
	if err != nil {
		return nil, err
	}
	go func() {
		defer w.Stop()
		for e := range w.Updates() {
			if e == nil {
				continue
			}
			if e.Operation() == jetstream.KeyValuePut {
				var r Report
				if json.Unmarshal(e.Value(), &r) == nil {
					h.put(e.Key(), r)
				}
			} else {
				h.mu.Lock()
				delete(h.reports, e.Key())
				delete(h.downFrom, e.Key())
				h.mu.Unlock()
			}
		}
	}()
	return h, nil
}

// put records r under key unless a newer report is there already.
func (h *healthView) put(key string, r Report) {
	h.mu.Lock()
	defer h.mu.Unlock()
	old, ok := h.reports[key]
	if ok && old.At > r.At {
		return
	}
	h.reports[key] = r
	switch {
	case r.OK:
		delete(h.downFrom, key)
	case !ok || old.OK || old.Primary != r.Primary:
		if h.downFrom == nil {
			h.downFrom = map[string]int64{}
		}
		h.downFrom[key] = r.At
	}
}

// downSince is when shard's current primary began to be reported down by
// two regions at once, each without a report of it up since and each
// still fresh (the second region's first report of the run): the time
// from which verdict has found it down in two regions all along, as every
// controller heard it, leader or not. Zero while fewer than two regions
// report it down. A controller that takes the lead during an outage
// starts its Detect wait from here rather than from its first tick as the
// leader: the evidence is the same reports either way, and the region
// that lost the old leader is often the one whose primary is down (a
// partition, a region down), so counting afresh only adds Detect to the
// outage.
func (h *healthView) downSince(s shardmap.Shard, now time.Time, fresh time.Duration) time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	prefix := healthKey(s.ID, "")
	var from []int64
	for k, r := range h.reports {
		if !strings.HasPrefix(k, prefix) || r.Primary != s.Primary || r.OK || now.Sub(time.UnixMilli(r.At)) > fresh {
			continue
		}
		if f, ok := h.downFrom[k]; ok {
			from = append(from, f)
		}
	}
	if len(from) < 2 {
		return time.Time{}
	}
	slices.Sort(from)
	return time.UnixMilli(from[1])
}

// verdict counts fresh reports on shard's current primary: the regions
// that reach it and those that do not; refused is set when every report
// of the latter is a refused connection (Report.Refused).
func (h *healthView) verdict(s shardmap.Shard, now time.Time, fresh time.Duration) (up, down []string, refused bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	prefix := healthKey(s.ID, "")
	for k, r := range h.reports {
		if !strings.HasPrefix(k, prefix) || r.Primary != s.Primary || now.Sub(time.UnixMilli(r.At)) > fresh {
			continue
		}
		if r.OK {
			up = append(up, r.Region)
		} else {
			down = append(down, r.Region)
			refused = (len(down) == 1 || refused) && r.Refused
		}
	}
	return up, down, refused
}
