package regions

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/triage-queue/triage/cmd/triage/natsserver/natstest"
	"github.com/triage-queue/triage/deploy/mariadb"
	"github.com/triage-queue/triage/deploy/mariadb/mariadbtest"
	"github.com/triage-queue/triage/schema/metrics"
	"github.com/triage-queue/triage/shardmap"
)

// TestHealthReportsReachTheControllerWithoutTheBucket: an observer's
// report reaches the controller's health view over core NATS even when
// the health bucket delivers nothing (here: the observer writes to a
// bucket nobody watches; in a region-down, the bucket's stream has no
// leader for seconds), so detection does not wait for the stream.
func TestHealthReportsReachTheControllerWithoutTheBucket(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	nc, js := natstest.JetStream(t)
	hkv, err := OpenHealth(ctx, js, 1)
	require.NoError(t, err)
	view, err := watchHealth(ctx, hkv, nc)
	require.NoError(t, err)

	// A bucket the view does not watch stands for one that delivers
	// nothing.
	elsewhere, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "elsewhere", Storage: jetstream.MemoryStorage})
	require.NoError(t, err)
	m, err := shardmap.New(shardmap.Map{Version: 1, Regions: []string{"a", "b"}, Shards: []shardmap.Shard{
		{ID: 1, HomeRegion: "a", Primary: "127.0.0.1:1", Database: "d", Replicas: []string{"127.0.0.1:2"}, ReplicaRegions: []string{"b"}},
	}})
	require.NoError(t, err)
	o := &Observer{Region: "b", Maps: shardmap.NewHolder(m), Dial: func(a string) string { return a }, KV: elsewhere, NC: nc, Logger: discard()}
	octx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	go o.Run(octx)

	s, _ := m.Shard(1)
	require.Eventually(t, func() bool {
		_, down, refused := view.verdict(s.Primary, time.Now(), 3*time.Second)
		// Nothing listens on port 1: the report says refused, which
		// the controller acts on after DetectRefused rather than Detect.
		return len(down) == 1 && down[0] == "b" && refused
	}, 10*time.Second, 50*time.Millisecond, "the controller must hear the observer's report of a dead primary, refused")
}

// TestVerdictRefusedOnlyWhenEveryDownReportIs: the controller's shortcut
// for a dead server (DetectRefused) applies only when every region that
// reports the primary down was refused the connection; one timeout among
// them means the network may be at fault, and Detect applies.
func TestVerdictRefusedOnlyWhenEveryDownReportIs(t *testing.T) {
	now := time.Now()
	report := func(region string, ok, refused bool, age time.Duration) Report {
		return Report{Region: region, Primary: "p:1", OK: ok, Refused: refused, At: now.Add(-age).UnixMilli()}
	}
	for _, tc := range []struct {
		name    string
		reports []Report
		down    int
		refused bool
	}{
		{"all refused", []Report{report("a", false, true, 0), report("b", false, true, 0), report("c", true, false, 0)}, 2, true},
		{"one timeout", []Report{report("a", false, true, 0), report("b", false, false, 0)}, 2, false},
		{"timeout first", []Report{report("a", false, false, 0), report("b", false, true, 0)}, 2, false},
		{"stale refusal ignored", []Report{report("a", false, true, 5*time.Second), report("b", false, false, 0)}, 1, false},
		{"none down", []Report{report("a", true, false, 0)}, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHealthView()
			for _, r := range tc.reports {
				h.put(r)
			}
			_, down, refused := h.verdict("p:1", now, 3*time.Second)
			require.Len(t, down, tc.down)
			require.Equal(t, tc.refused, refused)
		})
	}
}

// TestRefusedAtOnce: which ping failures count as a dead server.
func TestRefusedAtOnce(t *testing.T) {
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{refused, true},
		{fmt.Errorf("ping: %w", refused), true},
		{mysql.ErrInvalidConn, true}, // a proxy closed what it accepted, or a pooled connection died
		{io.ErrUnexpectedEOF, true},
		{context.DeadlineExceeded, false},
		{&net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}, false},
		{&mysql.MySQLError{Number: 1040, Message: "Too many connections"}, false},
		{errors.New("something else"), false},
	} {
		require.Equal(t, tc.want, refusedAtOnce(tc.err), "%v", tc.err)
	}
}

// TestStoreDue: a report goes to KV when what it says changes, and an
// unchanged one only every storeEvery, so that the bucket stays fresh for
// a controller that reads only it without taking a replicated write per
// ping.
func TestStoreDue(t *testing.T) {
	o := &Observer{}
	o.init()
	at := time.Now()
	r := func(after time.Duration, ok, refused bool) Report {
		return Report{Primary: "p:1", OK: ok, Refused: refused, Error: after.String(), At: at.Add(after).UnixMilli()}
	}
	require.True(t, o.storeDue(r(0, true, false)), "the first report")
	require.False(t, o.storeDue(r(250*time.Millisecond, true, false)), "unchanged, 250 ms later (a new error text is no change)")
	require.True(t, o.storeDue(r(500*time.Millisecond, false, false)), "the primary is down now")
	require.False(t, o.storeDue(r(750*time.Millisecond, false, false)))
	require.True(t, o.storeDue(r(time.Second, false, true)), "refused now")
	require.False(t, o.storeDue(r(1900*time.Millisecond, false, true)))
	require.True(t, o.storeDue(r(2*time.Second, false, true)), "storeEvery after the last stored")
	require.True(t, o.storeDue(Report{Primary: "q:1", At: at.UnixMilli()}), "servers apart")
}

// TestDownSince: the time from which two regions have both reported the
// current primary down, each without an up report since: the second
// region's first down report. A report of it up restarts that region's
// run, a report of another primary or a stale one does not count, and
// one region alone gives nothing.
func TestDownSince(t *testing.T) {
	t0 := time.Now().Add(-5 * time.Second).Truncate(time.Millisecond)
	at := func(d time.Duration) int64 { return t0.Add(d).UnixMilli() }
	report := func(region string, d time.Duration, ok bool) Report {
		return Report{Region: region, Primary: "p:1", OK: ok, At: at(d)}
	}
	h := newHealthView()
	put := h.put
	now := t0.Add(5 * time.Second)

	put(report("a", 0, true))
	put(report("a", time.Second, false))
	put(report("a", 2*time.Second, false))
	require.Zero(t, h.downSince("p:1", now, 10*time.Second), "one region")
	put(report("b", 1500*time.Millisecond, false))
	put(report("b", 2500*time.Millisecond, false))
	require.Equal(t, t0.Add(1500*time.Millisecond), h.downSince("p:1", now, 10*time.Second), "b's first down report: both down from then")
	put(report("a", 3*time.Second, true))
	put(report("a", 3500*time.Millisecond, false))
	require.Equal(t, t0.Add(3500*time.Millisecond), h.downSince("p:1", now, 10*time.Second), "a reported it up in between")
	put(report("a", 3200*time.Millisecond, true))
	require.Equal(t, t0.Add(3500*time.Millisecond), h.downSince("p:1", now, 10*time.Second), "an older report changes nothing")
	require.Zero(t, h.downSince("p:1", now, 2*time.Second), "b's last report is stale")
	require.Zero(t, h.downSince("q:1", now, 10*time.Second), "reports of another primary")
	put(Report{Region: "c", Primary: "q:1", At: at(4 * time.Second)})
	require.Equal(t, t0.Add(3500*time.Millisecond), h.downSince("p:1", now, 10*time.Second), "c reports another primary")
}

// TestSemiSyncAlarmOnlyForAWritablePrimary: the observer raises "semi-sync
// is off" for a primary that can commit without a replica's
// acknowledgement, and not for a read-only server a stale map still
// names primary (a deposed primary, fenced and with semi-sync off, seen
// by an observer cut off from the new map).
func TestSemiSyncAlarmOnlyForAWritablePrimary(t *testing.T) {
	t.Parallel()
	srv := mariadbtest.NewServer(t, "--read-only=ON")
	c, err := mysql.ParseDSN(srv.DSN(""))
	require.NoError(t, err)
	var logs lockedBuffer
	o := &Observer{Region: "b", Dial: func(a string) string { return a }, Cred: shardmap.Credentials{User: c.User, Password: c.Passwd},
		Logger: slog.New(slog.NewTextHandler(&logs, nil))}
	o.init()
	t.Cleanup(func() {
		for _, db := range o.dbs {
			db.Close()
		}
	})
	s := shardmap.Shard{ID: 1, HomeRegion: "a", Primary: srv.Addr(), Database: "d", Replicas: []string{"127.0.0.1:2"}, ReplicaRegions: []string{"b"}}

	o.observe(t.Context(), s.Primary, []shardmap.Shard{s})
	require.NotContains(t, logs.String(), "semi-sync is off", "a read-only server commits nothing: %s", logs.String())

	db, err := sql.Open("mysql", srv.DSN(""))
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	_, err = db.ExecContext(t.Context(), "SET GLOBAL read_only = OFF")
	require.NoError(t, err)
	clear(o.semi) // the next read is due (SemiSyncEvery)
	o.observe(t.Context(), s.Primary, []shardmap.Shard{s})
	require.Contains(t, logs.String(), "ALARM: semi-sync is off on a primary with replicas")
}

// lockedBuffer is a bytes.Buffer safe for a logger's writes and a test's
// reads from other goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestObserverPingsEachServerOnce: with many shards as databases on a few
// servers, an observer's round sends one ping, one DO 1 and one
// semi-sync read to each primary server, not one per shard; it still
// sets every shard's gauges, and the controller's verdict on every shard
// of a dead server is "down" (refused) in both observing regions, while
// the shards of the live one are up.
func TestObserverPingsEachServerOnce(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	srv, root := serverAndRoot(t)
	const perServer = 50
	dead := "127.0.0.1:1" // nothing listens: refused
	var shards []shardmap.Shard
	for i := range 2 * perServer {
		s := shardmap.Shard{ID: uint32(i + 1), HomeRegion: "a", Primary: srv.Addr(), Database: fmt.Sprintf("d%d", i),
			Replicas: []string{"127.0.0.1:2"}, ReplicaRegions: []string{"b"}}
		if i >= perServer {
			s.Primary = dead
		}
		shards = append(shards, s)
	}
	m, err := shardmap.New(shardmap.Map{Version: 1, Regions: []string{"a", "b"}, Shards: shards})
	require.NoError(t, err)
	nc, _ := natstest.JetStream(t)
	view := newHealthView()
	sub, err := nc.Subscribe(HealthSubject+".>", func(msg *nats.Msg) {
		var r Report
		if json.Unmarshal(msg.Data, &r) == nil {
			view.put(r)
		}
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	c, err := mysql.ParseDSN(srv.DSN(""))
	require.NoError(t, err)
	var observers []*Observer
	for _, region := range []string{"a", "b"} {
		o := &Observer{Region: region, Maps: shardmap.NewHolder(m), Dial: func(a string) string { return a }, NC: nc,
			Cred: shardmap.Credentials{User: c.User, Password: c.Passwd}, Logger: discard(),
			Metrics: metrics.New(prometheus.NewRegistry(), metrics.Options{})}
		o.init()
		t.Cleanup(func() {
			for _, db := range o.dbs {
				db.Close()
			}
		})
		observers = append(observers, o)
	}
	const rounds = 5
	before := comCounts(t, root)
	for range rounds {
		for _, o := range observers {
			o.round(ctx)
		}
	}
	after := comCounts(t, root)
	sent := len(observers) * rounds
	t.Logf("%d rounds of %d observers over %d shards on 2 servers: %d DO, %d SELECT on the live server (one per shard: %d each)",
		rounds, len(observers), len(shards), after["Com_do"]-before["Com_do"], after["Com_select"]-before["Com_select"], sent*perServer)
	require.Equal(t, sent, after["Com_do"]-before["Com_do"], "one DO 1 per server and round")
	require.Equal(t, len(observers), int(after["Com_select"]-before["Com_select"]), "one semi-sync read per server and SemiSyncEvery")

	for _, o := range observers {
		for _, s := range shards {
			want := 1.0
			if s.Primary == dead {
				want = 0
			}
			require.Equal(t, want, testutil.ToFloat64(o.Metrics.Shard(s.ID).PrimaryUp), "shard %d in %s", s.ID, o.Region)
		}
	}
	require.NoError(t, nc.Flush())
	require.Eventually(t, func() bool {
		for _, s := range shards {
			up, down, refused := view.verdict(s.Primary, time.Now(), 3*time.Second)
			if s.Primary == dead && (len(down) != 2 || !refused) || s.Primary != dead && len(up) != 2 {
				return false
			}
		}
		return true
	}, 5*time.Second, 20*time.Millisecond, "every shard of the dead server is down in both regions, refused")
}

// serverAndRoot starts a mariadbd for the test and opens its root account.
func serverAndRoot(t *testing.T) (*mariadb.Server, *sql.DB) {
	t.Helper()
	srv := mariadbtest.NewServer(t)
	root, err := sql.Open("mysql", srv.DSN(""))
	require.NoError(t, err)
	t.Cleanup(func() { root.Close() })
	return srv, root
}

// comCounts reads the server's Com_do and Com_select counters (SHOW
// STATUS counts as neither).
func comCounts(t *testing.T, db *sql.DB) map[string]int {
	rows, err := db.QueryContext(t.Context(), "SHOW GLOBAL STATUS WHERE Variable_name IN ('Com_do', 'Com_select')")
	require.NoError(t, err)
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var name string
		var n int
		require.NoError(t, rows.Scan(&name, &n))
		out[name] = n
	}
	require.NoError(t, rows.Err())
	return out
}

// TestReplicaLagOnlyFromAnAccountThatMayReadIt: a node on an account
// refused SHOW SLAVE STATUS reports no lag for a replica, also when its
// reads failed for another reason first (a server that refused
// connections while starting), since no later read would clear a -1 it
// set; the monitor account reports such a replica as -1 (unknown).
func TestReplicaLagOnlyFromAnAccountThatMayReadIt(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	srv, root := serverAndRoot(t)
	for _, q := range []string{"CREATE USER app@'%' IDENTIFIED BY 'app'", "GRANT SELECT ON mysql.* TO app@'%'"} {
		_, err := root.ExecContext(ctx, q)
		require.NoError(t, err, q)
	}
	c, err := mysql.ParseDSN(srv.DSN(""))
	require.NoError(t, err)
	dead := "127.0.0.1:1" // nothing listens: refused
	m, err := shardmap.New(shardmap.Map{Version: 1, Regions: []string{"a"}, Shards: []shardmap.Shard{
		{ID: 1, HomeRegion: "a", Primary: srv.Addr(), Database: "d1", Replicas: []string{dead}, ReplicaRegions: []string{"a"}},
		{ID: 2, HomeRegion: "a", Primary: srv.Addr(), Database: "d2", Replicas: []string{srv.Addr()}, ReplicaRegions: []string{"a"}},
	}})
	require.NoError(t, err)
	observe := func(monitor *shardmap.Credentials) map[string]float64 {
		reg := prometheus.NewRegistry()
		o := &Observer{Region: "a", Maps: shardmap.NewHolder(m), Dial: func(a string) string { return a },
			Cred: shardmap.Credentials{User: "app", Password: "app"}, Monitor: monitor, Logger: discard(),
			Metrics: metrics.New(reg, metrics.Options{})}
		o.init()
		t.Cleanup(func() {
			for _, db := range o.dbs {
				db.Close()
			}
		})
		// The dead replica first alone, as a starting server is met.
		dead := *m
		dead.Shards = dead.Shards[:1]
		o.measureLag(ctx, dead.Shards)
		o.measureLag(ctx, m.Shards)
		fams, err := reg.Gather()
		require.NoError(t, err)
		out := map[string]float64{}
		for _, f := range fams {
			if f.GetName() != "triage_shard_replication_lag_seconds" {
				continue
			}
			for _, s := range f.GetMetric() {
				var shard, replica string
				for _, l := range s.GetLabel() {
					switch l.GetName() {
					case "shard":
						shard = l.GetValue()
					case "replica":
						replica = l.GetValue()
					}
				}
				out[shard+"/"+replica] = s.GetGauge().GetValue()
			}
		}
		return out
	}
	require.Empty(t, observe(nil), "the application account reports no replica")
	require.Equal(t, map[string]float64{"1/" + dead: -1, "2/" + srv.Addr(): -1},
		observe(&shardmap.Credentials{User: c.User, Password: c.Passwd}),
		"the monitor account reports the dead replica and the server that replicates nothing as unknown")
}
