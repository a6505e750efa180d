package regions

import (
	"bytes"
	"context"
	"database/sql"
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
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/triage-queue/triage/cmd/triage/natsserver/natstest"
	"github.com/triage-queue/triage/deploy/mariadb/mariadbtest"
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
		_, down, refused := view.verdict(s, time.Now(), 3*time.Second)
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
	s := shardmap.Shard{ID: 7, Primary: "p:1"}
	now := time.Now()
	report := func(region string, ok, refused bool, age time.Duration) Report {
		return Report{Region: region, Shard: 7, Primary: "p:1", OK: ok, Refused: refused, At: now.Add(-age).UnixMilli()}
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
			h := &healthView{reports: map[string]Report{}}
			for _, r := range tc.reports {
				h.put(healthKey(r.Shard, r.Region), r)
			}
			_, down, refused := h.verdict(s, now, 3*time.Second)
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
	o := &Observer{stored: map[uint32]Report{}}
	at := time.Now()
	r := func(after time.Duration, ok bool, epoch uint64) Report {
		return Report{Shard: 1, Primary: "p:1", Epoch: epoch, OK: ok, Error: after.String(), At: at.Add(after).UnixMilli()}
	}
	require.True(t, o.storeDue(r(0, true, 1)), "the first report")
	require.False(t, o.storeDue(r(250*time.Millisecond, true, 1)), "unchanged, 250 ms later (a new error text is no change)")
	require.True(t, o.storeDue(r(500*time.Millisecond, false, 1)), "the primary is down now")
	require.False(t, o.storeDue(r(750*time.Millisecond, false, 1)))
	require.True(t, o.storeDue(r(time.Second, false, 2)), "a new epoch")
	require.False(t, o.storeDue(r(1900*time.Millisecond, false, 2)))
	require.True(t, o.storeDue(r(2*time.Second, false, 2)), "storeEvery after the last stored")
	require.True(t, o.storeDue(Report{Shard: 2, At: at.UnixMilli()}), "shards apart")
}

// TestDownSince: the time from which two regions have both reported the
// current primary down, each without an up report since: the second
// region's first down report. A report of it up restarts that region's
// run, a report of another primary or a stale one does not count, and
// one region alone gives nothing.
func TestDownSince(t *testing.T) {
	s := shardmap.Shard{ID: 3, Primary: "p:1"}
	t0 := time.Now().Add(-5 * time.Second).Truncate(time.Millisecond)
	at := func(d time.Duration) int64 { return t0.Add(d).UnixMilli() }
	report := func(region string, d time.Duration, ok bool) Report {
		return Report{Region: region, Shard: 3, Primary: "p:1", OK: ok, At: at(d)}
	}
	h := &healthView{reports: map[string]Report{}}
	put := func(r Report) { h.put(healthKey(r.Shard, r.Region), r) }
	now := t0.Add(5 * time.Second)

	put(report("a", 0, true))
	put(report("a", time.Second, false))
	put(report("a", 2*time.Second, false))
	require.Zero(t, h.downSince(s, now, 10*time.Second), "one region")
	put(report("b", 1500*time.Millisecond, false))
	put(report("b", 2500*time.Millisecond, false))
	require.Equal(t, t0.Add(1500*time.Millisecond), h.downSince(s, now, 10*time.Second), "b's first down report: both down from then")
	put(report("a", 3*time.Second, true))
	put(report("a", 3500*time.Millisecond, false))
	require.Equal(t, t0.Add(3500*time.Millisecond), h.downSince(s, now, 10*time.Second), "a reported it up in between")
	put(report("a", 3200*time.Millisecond, true))
	require.Equal(t, t0.Add(3500*time.Millisecond), h.downSince(s, now, 10*time.Second), "an older report changes nothing")
	require.Zero(t, h.downSince(s, now, 2*time.Second), "b's last report is stale")
	require.Zero(t, h.downSince(shardmap.Shard{ID: 3, Primary: "q:1"}, now, 10*time.Second), "reports of another primary")
	put(Report{Region: "c", Shard: 3, Primary: "q:1", At: at(4 * time.Second)})
	require.Equal(t, t0.Add(3500*time.Millisecond), h.downSince(s, now, 10*time.Second), "c reports another primary")
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
		Logger: slog.New(slog.NewTextHandler(&logs, nil)), dbs: map[string]*sql.DB{}, async: map[uint32]bool{}, blocked: map[uint32]bool{}, stored: map[uint32]Report{}}
	t.Cleanup(func() {
		for _, db := range o.dbs {
			db.Close()
		}
	})
	s := shardmap.Shard{ID: 1, HomeRegion: "a", Primary: srv.Addr(), Database: "d", Replicas: []string{"127.0.0.1:2"}, ReplicaRegions: []string{"b"}}

	o.observe(t.Context(), s)
	require.NotContains(t, logs.String(), "semi-sync is off", "a read-only server commits nothing: %s", logs.String())

	db, err := sql.Open("mysql", srv.DSN(""))
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	_, err = db.ExecContext(t.Context(), "SET GLOBAL read_only = OFF")
	require.NoError(t, err)
	o.observe(t.Context(), s)
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
