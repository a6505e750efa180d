package regions

import (
	"cmp"
	"context"
	"database/sql"
	"database/sql/driver"
	"encoding/hex"
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
// (HealthSubject + "." + the report's key), and the controllers
// subscribe. Core NATS needs no stream leader: when a region goes down
// with the leader of the health bucket's stream, the bucket's watchers see
// nothing until the stream elects a new leader and the watch's consumer
// recovers (a region-down drill saw the new controller hear "down" 10.5 s
// after the fault, 7 s after it took the lead). Reports carry their time
// (At), so one heard twice, or late, counts only while fresh.
const HealthSubject = "triage.health"

// Report is one observer's view of one primary server, which every shard
// whose primary it is shares: many shards can be databases on one
// mariadbd, and a server answers or not for all of them.
type Report struct {
	Region string `json:"region"`
	// Primary is the server's address as the map names it.
	Primary string `json:"primary"`
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

// healthKey is the KV key of region's reports on the server at addr:
// "a<addr in hex>.<region>" (keys allow only [-/_=.a-zA-Z0-9], and an
// address has ':' and, in IPv6, brackets).
func healthKey(addr, region string) string {
	return "a" + hex.EncodeToString([]byte(addr)) + "." + region
}

// parseHealthKey returns the server and region of a healthKey; ok is
// false for any other key.
func parseHealthKey(key string) (addr, region string, ok bool) {
	h, region, ok := strings.Cut(key, ".")
	if !ok || !strings.HasPrefix(h, "a") {
		return "", "", false
	}
	b, err := hex.DecodeString(h[1:])
	return string(b), region, err == nil
}

// OpenHealth creates or opens the health bucket, in memory: its writes
// make it again after a restart of NATS lost it (peer.KeepKeyValue).
func OpenHealth(ctx context.Context, js jetstream.JetStream, replicas int) (jetstream.KeyValue, error) {
	kv, err := peer.KeepKeyValue(ctx, js, jetstream.KeyValueConfig{
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

// Observer pings every primary server from one region and reports, once
// per server however many shards it holds. It also raises the semi-sync
// alarms (log and metric) when a primary with replicas runs async or has
// no replica connected.
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
	// semi-sync state (those of its server), and the lag of the replicas
	// in this region.
	Metrics *metrics.Set

	mu      sync.Mutex
	dbs     map[string]*sql.DB
	async   map[string]bool   // by server: last semi-sync state seen, for alarm edges
	blocked map[string]bool   // by server: last "no replica connected" seen, likewise
	stored  map[string]Report // by server: the last report put in KV (see storeDue)
	semi    map[string]semiRead
	// readable holds each replica server whose status this node's
	// account has read (see lag).
	readable map[string]bool
}

// semiRead is a server's semi-sync state as last read, and when.
type semiRead struct {
	at    time.Time
	state [2]int // status, clients
}

// SemiSyncEvery is how often an observer reads a primary server's
// semi-sync state; pings in between report the last reading. MariaDB
// answers a read of information_schema.global_status by summing the
// status of every connection: with a thousand shard databases on a
// server (thousands of connections), three regions' observers reading it
// at every 250 ms ping took 15 % of the server's CPU. The state feeds
// alarms and gauges, which a couple of seconds do not change; detection
// of a dead primary rides on the ping alone.
const SemiSyncEvery = 2 * time.Second

// ObserveEvery is the observers' default ping period. Detection of a dead
// primary waits for two rounds of reports from two regions, so the period
// sits on the failover's critical path; a ping is one round trip per
// primary server and region.
const ObserveEvery = 250 * time.Millisecond

// ObserveMetricsEvery is the period of an observer that only keeps a
// node's metrics (no KV, no NC): nothing waits on it.
const ObserveMetricsEvery = 2 * time.Second

// init makes the observer's maps.
func (o *Observer) init() {
	o.dbs = map[string]*sql.DB{}
	o.async = map[string]bool{}
	o.stored = map[string]Report{}
	o.blocked = map[string]bool{}
	o.semi = map[string]semiRead{}
	o.readable = map[string]bool{}
}

// Run pings every o.Every until ctx ends.
func (o *Observer) Run(ctx context.Context) {
	o.init()
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

// round observes every primary server of the current map at once, each
// once for all its shards, and the replica servers of this region.
func (o *Observer) round(ctx context.Context) {
	shards := o.Maps.Current().Shards
	var wg sync.WaitGroup
	for addr, on := range byPrimary(shards) {
		wg.Go(func() { o.observe(ctx, addr, on) })
	}
	if o.Metrics != nil {
		wg.Go(func() { o.measureLag(ctx, shards) })
	}
	wg.Wait()
}

// byPrimary groups shards by their primary server.
func byPrimary(shards []shardmap.Shard) map[string][]shardmap.Shard {
	out := map[string][]shardmap.Shard{}
	for _, s := range shards {
		out[s.Primary] = append(out[s.Primary], s)
	}
	return out
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

// observe pings the server at addr, the primary of shards, and reads its
// semi-sync state when any of them has replicas; it reports once for all
// of them and sets each one's gauges.
func (o *Observer) observe(ctx context.Context, addr string, shards []shardmap.Shard) {
	r := Report{Region: o.Region, Primary: addr}
	pctx, cancel := context.WithTimeout(ctx, 900*time.Millisecond)
	defer cancel()
	err := o.db(addr).PingContext(pctx)
	if err == nil {
		_, err = o.db(addr).ExecContext(pctx, "DO 1")
	}
	semi := [2]int{-1, -1} // semi-sync status, clients; -1 unknown
	if err == nil && slices.ContainsFunc(shards, hasReplicas) {
		semi = o.semiSync(pctx, &r)
	}
	r.OK = err == nil
	if err != nil {
		r.Error = err.Error()
		r.Refused = refusedAtOnce(err)
	}
	o.alarm(r, shards)
	if o.Metrics != nil {
		o.setGauges(shards, r, semi)
	}
	r.At = time.Now().UnixMilli()
	o.send(ctx, r)
}

func hasReplicas(s shardmap.Shard) bool { return len(s.Replicas) > 0 }

// semiSync returns the semi-sync state of r's server, read at most every
// SemiSyncEvery, and sets it in r (status, clients; -1 each when
// unknown). A read-only server commits nothing: it is a deposed primary
// that an observer with a stale map still calls primary (the failover
// fenced it and turned its semi-sync off), and neither alarm applies to
// it.
func (o *Observer) semiSync(ctx context.Context, r *Report) [2]int {
	o.mu.Lock()
	last, ok := o.semi[r.Primary]
	o.mu.Unlock()
	if ok && time.Since(last.at) < SemiSyncEvery {
		if last.state[0] >= 0 {
			r.SemiSyncOff = last.state[0] == 0
			r.NoReplicas = !r.SemiSyncOff && last.state[1] == 0
		}
		return last.state
	}
	state := o.readSemiSync(ctx, r)
	o.mu.Lock()
	o.semi[r.Primary] = semiRead{at: time.Now(), state: state}
	o.mu.Unlock()
	return state
}

// readSemiSync is semiSync's read of the server.
func (o *Observer) readSemiSync(ctx context.Context, r *Report) [2]int {
	var status, clients, readOnly int
	if err := o.db(r.Primary).QueryRowContext(ctx, `SELECT
			SUM(variable_name = 'RPL_SEMI_SYNC_MASTER_STATUS' AND variable_value = 'ON'),
			SUM(IF(variable_name = 'RPL_SEMI_SYNC_MASTER_CLIENTS', variable_value, 0)),
			MAX(@@global.read_only) -- bare, MariaDB answers 0 beside SUM
			FROM information_schema.global_status
			WHERE variable_name IN ('RPL_SEMI_SYNC_MASTER_STATUS', 'RPL_SEMI_SYNC_MASTER_CLIENTS')`).Scan(&status, &clients, &readOnly); err != nil || readOnly != 0 {
		return [2]int{-1, -1}
	}
	r.SemiSyncOff = status == 0
	r.NoReplicas = !r.SemiSyncOff && clients == 0
	if r.SemiSyncOff {
		semiSyncFallbacks.Add(1)
	}
	return [2]int{status, clients}
}

// alarm logs the semi-sync alarms of r's server on their edges, once per
// server, naming its shards.
func (o *Observer) alarm(r Report, shards []shardmap.Shard) {
	o.mu.Lock()
	was, wasBlocked := o.async[r.Primary], o.blocked[r.Primary]
	o.async[r.Primary], o.blocked[r.Primary] = r.SemiSyncOff, r.NoReplicas
	o.mu.Unlock()
	ids := shardIDs(shards)
	if r.NoReplicas && !wasBlocked {
		o.Logger.Warn("ALARM: primary has no semi-sync replica connected; its commits block until one acknowledges (no async fallback), writers time out",
			"primary", r.Primary, "shards", len(shards), "shard_ids", ids, "replicas", shards[0].Replicas)
	} else if wasBlocked && !r.NoReplicas && r.OK {
		o.Logger.Info("a semi-sync replica is connected again; commits complete", "primary", r.Primary, "shards", len(shards), "shard_ids", ids)
	}
	if r.SemiSyncOff && !was {
		o.Logger.Warn("ALARM: semi-sync is off on a primary with replicas; commits are acknowledged before a replica has them",
			"primary", r.Primary, "shards", len(shards), "shard_ids", ids)
	} else if was && !r.SemiSyncOff && r.OK {
		o.Logger.Info("semi-sync active again", "primary", r.Primary, "shards", len(shards), "shard_ids", ids)
	}
}

// maxLoggedShards bounds the shard IDs a log line lists.
const maxLoggedShards = 10

// shardIDs returns the IDs of shards, the first maxLoggedShards of them
// and "..." after if there are more.
func shardIDs(shards []shardmap.Shard) string {
	var b strings.Builder
	for i, s := range shards {
		if i == maxLoggedShards {
			b.WriteString(" ...")
			break
		}
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(strconv.FormatUint(uint64(s.ID), 10))
	}
	return b.String()
}

// send publishes r on core NATS and stores it in KV when due.
func (o *Observer) send(ctx context.Context, r Report) {
	data, _ := json.Marshal(r)
	key := healthKey(r.Primary, o.Region)
	if o.NC != nil {
		_ = o.NC.Publish(HealthSubject+"."+key, data)
	}
	if o.KV != nil && o.storeDue(r) {
		kctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		_, _ = o.KV.Put(kctx, key, data)
	}
}

// storeEvery is how often an unchanged report is stored again in KV:
// within the controllers' 3 s freshness window, so a controller that
// reads only the bucket (its core NATS subscription cut off) still sees
// a fresh report of every observer.
const storeEvery = time.Second

// storeDue tells whether r goes to KV: when what it says differs from the
// report last stored for its server, or that one is storeEvery old. Every
// report goes out on core NATS, which the controllers follow; the bucket
// is what a controller reads when it starts, and its replicated write per
// report (every ObserveEvery, per server and region) was most of an idle
// cluster's JetStream traffic.
func (o *Observer) storeDue(r Report) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	last, ok := o.stored[r.Primary]
	// The same report but for when it was taken and its error's words
	// (addresses, timings): every other field, including any added later.
	a, b := last, r
	a.At, b.At, a.Error, b.Error = 0, 0, "", ""
	if ok && a == b && time.UnixMilli(r.At).Sub(time.UnixMilli(last.At)) < storeEvery {
		return false
	}
	o.stored[r.Primary] = r
	return true
}

// setGauges sets the gauges of each of shards from one observation of
// their primary server.
func (o *Observer) setGauges(shards []shardmap.Shard, r Report, semi [2]int) {
	up := 0.0
	if r.OK {
		up = 1
	}
	for _, s := range shards {
		sm := o.Metrics.Shard(s.ID)
		sm.PrimaryUp.Set(up)
		if semi[0] >= 0 && hasReplicas(s) {
			sm.SemiSync(semi[0] > 0, semi[1])
		}
	}
}

// measureLag reads the lag of every replica server in this observer's
// region once (so every replica is measured by the observers of its own
// region) and sets it on each shard that lists the server.
func (o *Observer) measureLag(ctx context.Context, shards []shardmap.Shard) {
	ctx, cancel := context.WithTimeout(ctx, 900*time.Millisecond)
	defer cancel()
	listing := map[string][]uint32{} // replica server: the shards listing it
	for _, s := range shards {
		for i, addr := range s.Replicas {
			if i < len(s.ReplicaRegions) && s.ReplicaRegions[i] == o.Region {
				listing[addr] = append(listing[addr], s.ID)
			}
		}
	}
	var wg sync.WaitGroup
	for addr, ids := range listing {
		wg.Go(func() {
			lag, known, ok := o.lag(ctx, addr)
			if !ok {
				return
			}
			for _, id := range ids {
				o.Metrics.Shard(id).ReplicaLag(addr, lag, known)
			}
		})
	}
	wg.Wait()
}

// lag reads the replication lag of the server at addr; ok is false when
// this node cannot tell whether its account may read it. The controller's
// monitor account may, and reports the lag, or -1 when the read fails; a
// node on the application account is refused (1227) and reports nothing,
// as its -1 would read as a stopped replica. Until such a node has read a
// server's status once, a failed read (a timeout, a connection the server
// refused while starting) says nothing either: reported as -1, it would
// stay, since every later read is refused and sets nothing.
func (o *Observer) lag(ctx context.Context, addr string) (lag time.Duration, known, ok bool) {
	a, err := replication.New(o.monitor(addr), addr, replication.MariaDB)
	if err != nil {
		return 0, false, false
	}
	st, err := a.Status(ctx)
	o.mu.Lock()
	defer o.mu.Unlock()
	switch {
	case noPrivilege(err):
		o.readable[addr] = false
		return 0, false, false
	case err != nil:
		return 0, false, o.Monitor != nil || o.readable[addr]
	}
	o.readable[addr] = true
	return st.Lag, st.LagKnown, true
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

// healthView is the leader's copy of the health reports, by primary
// server, so that the verdict on a shard's primary is a lookup of its
// server, not a scan of every report.
type healthView struct {
	mu sync.Mutex
	// servers holds, per primary address and observer region, the
	// observer's last report of that server and since when its reports
	// have said down.
	servers map[string]map[string]observed
}

// observed is one observer's last report of one server.
type observed struct {
	last Report
	// downFrom is when its reports of the server began saying down
	// (Report.At, unix ms) without one of it up since; 0 while it
	// reports up. See downSince.
	downFrom int64
}

func newHealthView() *healthView {
	return &healthView{servers: map[string]map[string]observed{}}
}

// watchHealth builds the view from the health bucket and, when nc is
// set, from the reports on HealthSubject, whichever comes first; a report
// never replaces a newer one of the same observer.
func watchHealth(ctx context.Context, kv jetstream.KeyValue, nc *nats.Conn) (*healthView, error) {
	h := newHealthView()
	if nc != nil {
		sub, err := nc.Subscribe(HealthSubject+".>", func(m *nats.Msg) {
			var r Report
			if json.Unmarshal(m.Data, &r) == nil {
				h.put(r)
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
					h.put(r)
				}
			} else if addr, region, ok := parseHealthKey(e.Key()); ok {
				h.mu.Lock()
				delete(h.servers[addr], region)
				h.mu.Unlock()
			}
		}
	}()
	return h, nil
}

// put records r as its observer's view of its server unless a newer
// report is there already. The report says which: a key from elsewhere
// (another version's) cannot count one region twice.
func (h *healthView) put(r Report) {
	if r.Primary == "" {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	byRegion := h.servers[r.Primary]
	if byRegion == nil {
		byRegion = map[string]observed{}
		h.servers[r.Primary] = byRegion
	}
	o, ok := byRegion[r.Region]
	if ok && o.last.At > r.At {
		return
	}
	switch {
	case r.OK:
		o.downFrom = 0
	case !ok || o.last.OK:
		o.downFrom = r.At
	}
	o.last = r
	byRegion[r.Region] = o
}

// downSince is when the primary server at addr began to be reported down
// by two regions at once, each without a report of it up since and each
// still fresh (the second region's first report of the run): the time
// from which verdict has found it down in two regions all along, as every
// controller heard it, leader or not. Zero while fewer than two regions
// report it down. A controller that takes the lead during an outage
// starts its Detect wait from here rather than from its first tick as the
// leader: the evidence is the same reports either way, and the region
// that lost the old leader is often the one whose primary is down (a
// partition, a region down), so counting afresh only adds Detect to the
// outage.
func (h *healthView) downSince(addr string, now time.Time, fresh time.Duration) time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	var from []int64
	for _, o := range h.servers[addr] {
		if !o.last.OK && o.downFrom != 0 && now.Sub(time.UnixMilli(o.last.At)) <= fresh {
			from = append(from, o.downFrom)
		}
	}
	if len(from) < 2 {
		return time.Time{}
	}
	slices.Sort(from)
	return time.UnixMilli(from[1])
}

// verdict counts fresh reports on the primary server at addr: the
// regions that reach it and those that do not; refused is set when every
// report of the latter is a refused connection (Report.Refused).
func (h *healthView) verdict(addr string, now time.Time, fresh time.Duration) (up, down []string, refused bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for region, o := range h.servers[addr] {
		if now.Sub(time.UnixMilli(o.last.At)) > fresh {
			continue
		}
		if o.last.OK {
			up = append(up, region)
		} else {
			down = append(down, region)
			refused = (len(down) == 1 || refused) && o.last.Refused
		}
	}
	return up, down, refused
}
