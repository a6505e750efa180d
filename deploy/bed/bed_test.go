package bed

import (
	"context"
	"database/sql"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/triage-queue/triage/cmd/triage/natsserver"
	"github.com/triage-queue/triage/deploy/drill"
	"github.com/triage-queue/triage/deploy/testlog"
	"github.com/triage-queue/triage/regions/replication"
	"github.com/triage-queue/triage/schema/itemid"
	"github.com/triage-queue/triage/shardmap"
)

// TestBedUpAndDown starts a one-region bed on free ports, checks the layout
// file and the gateway, then stops it with Down's PID logic and checks every
// listed mariadbd is gone.
func TestBedUpAndDown(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b, err := Start(ctx, Config{Dir: dir, NATSPort: -1, Auth: true, Logger: testlog.New(t, slog.LevelInfo)})
	require.NoError(t, err)
	defer b.Stop()

	l, err := ReadLayout(dir)
	require.NoError(t, err)
	require.Len(t, l.Regions, 1)
	require.Equal(t, "us-east", l.Regions[0].Name)
	roles := map[string]int{}
	for _, p := range l.Processes {
		roles[p.Role]++
		require.Positive(t, p.PID)
	}
	require.Equal(t, map[string]int{"mysql-primary": 2, "nats": 1, "triage": 1}, roles)
	requireMetrics(t, l.Regions[0])

	// make up's bed has authentication on: its key in bed.json works, no
	// key does not.
	require.NotEmpty(t, l.Token)
	enqueue := func(token string) *http.Response {
		req, err := http.NewRequest(http.MethodPost, "http://"+l.Regions[0].HTTP+"/v1/namespaces/default/topics/t/items",
			strings.NewReader(`{"items":[{"payload":"aGk="}]}`))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		return resp
	}
	resp := enqueue("")
	resp.Body.Close()
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	resp = enqueue(l.Token)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
	require.Contains(t, string(body), `"id"`)

	// The node logs in to MariaDB as the application account (password
	// from a file), which can change rows but not tables or read_only. It
	// is REQUIRE SSL: over plain TCP it is refused, over TLS verified with
	// the bed's CA (bed.json's mysql_tls) the session is encrypted.
	require.FileExists(t, filepath.Join(dir, "mysql-app.password"))
	require.NotNil(t, l.MySQLTLS)
	app := b.AppCredentials()
	require.True(t, app.RequireSSL)
	for _, srv := range b.Shards {
		plain := openT(t, app.User+":"+app.Password+"@tcp("+srv.Addr()+")/"+app.Database)
		var me *mysql.MySQLError
		require.ErrorAs(t, plain.PingContext(ctx), &me)
		require.EqualValues(t, 1045, me.Number, "REQUIRE SSL refuses the application account over plain TCP")
		db := openT(t, tlsDSN(t, l.MySQLTLS, app, srv.Addr()))
		var name, cipher string
		require.NoError(t, db.QueryRowContext(ctx, "SHOW SESSION STATUS LIKE 'Ssl_cipher'").Scan(&name, &cipher))
		require.NotEmpty(t, cipher)
		var n int
		require.NoError(t, db.QueryRowContext(ctx, "SELECT COUNT(*) FROM items").Scan(&n))
		for _, stmt := range []string{"CREATE TABLE evil (id INT)", "DROP TABLE items", "SET GLOBAL read_only = ON"} {
			_, err := db.ExecContext(ctx, stmt)
			var me *mysql.MySQLError
			require.ErrorAs(t, err, &me, stmt)
			require.Contains(t, []uint16{1142, 1227}, me.Number, "%s: %v", stmt, err)
		}
		db.Close()
	}

	// NATS wants TLS, verified with the bed's throwaway CA, and a login:
	// bed.json's Triage login uses the internal subjects and its replies,
	// its client login is refused them and gets none of the node's
	// traffic while items are enqueued and dequeued, not even through a
	// subscription to the default inbox ("_INBOX.>") or to ">".
	require.NotNil(t, l.NATSAuth)
	require.NotNil(t, l.NATSClient)
	require.NotNil(t, l.NATSTLS)
	require.True(t, strings.HasPrefix(l.NATS, "tls://"), l.NATS)
	_, err = nats.Connect(l.NATS, nats.MaxReconnects(0))
	require.ErrorContains(t, err, "certificate signed by unknown authority", "a client without the bed's CA")
	natsTLS, err := l.NATSTLS.Option()
	require.NoError(t, err)
	_, err = nats.Connect(l.NATS, natsTLS, nats.MaxReconnects(0))
	require.ErrorIs(t, err, nats.ErrAuthorization)
	triOpts, err := shardmap.NATSOptions(l.NATSAuth, l.NATSTLS)
	require.NoError(t, err)
	tri, err := nats.Connect(l.NATS, triOpts...)
	require.NoError(t, err)
	defer tri.Close()
	state, err := tri.TLSConnectionState()
	require.NoError(t, err)
	require.True(t, state.HandshakeComplete)
	for _, f := range []string{"ca.crt", "nats-server.crt", "nats-server.key", "mysql-server.crt", "mysql-server.key"} {
		fi, err := os.Stat(filepath.Join(dir, f))
		require.NoError(t, err, f)
		require.Equal(t, os.FileMode(0o600), fi.Mode().Perm(), f)
	}
	_, err = tri.Request("$JS.API.INFO", nil, 5*time.Second)
	require.NoError(t, err)
	var (
		mu         sync.Mutex
		violations []string
		snooped    []string // subjects the client login received
	)
	violated := func(what string) bool {
		mu.Lock()
		defer mu.Unlock()
		return slices.ContainsFunc(violations, func(v string) bool { return strings.Contains(v, what) })
	}
	login, err := l.NATSClient.Option()
	require.NoError(t, err)
	cli, err := nats.Connect(l.NATS, login, natsTLS, nats.CustomInboxPrefix(natsserver.ClientInboxPrefix(l.NATSClient.User)),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			mu.Lock()
			violations = append(violations, err.Error())
			mu.Unlock()
		}))
	require.NoError(t, err)
	defer cli.Close()
	require.NoError(t, cli.Publish("triage.enq.us-east.1", []byte("raw")))
	require.NoError(t, cli.Flush())
	require.Eventually(t, func() bool { return violated(`Permissions Violation for Publish to "triage.enq.us-east.1"`) },
		10*time.Second, 10*time.Millisecond, "the client login published on triage.* unrefused")
	snoop := func(m *nats.Msg) {
		mu.Lock()
		snooped = append(snooped, m.Subject)
		mu.Unlock()
	}
	_, err = cli.Subscribe(natsserver.DefaultInbox, snoop)
	require.NoError(t, err)
	_, err = cli.Subscribe(">", snoop)
	require.NoError(t, err)
	require.NoError(t, cli.Flush())
	require.Eventually(t, func() bool { return violated(`Permissions Violation for Subscription to "_INBOX.>"`) },
		10*time.Second, 10*time.Millisecond, "the client login subscribed to every connection's replies")
	resp = enqueue(l.Token)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var leased []string
	require.Eventually(t, func() bool {
		req, _ := http.NewRequest(http.MethodPost, "http://"+l.Regions[0].HTTP+"/v1/namespaces/default:dequeue",
			strings.NewReader(`{"topics":[{"topic":"t","count":2}],"lease_duration":"30s","wait":"1s"}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+l.Token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Log(err)
			return false
		}
		defer resp.Body.Close()
		var deq struct{ Items []struct{ LeaseToken string } }
		if data, _ := io.ReadAll(resp.Body); resp.StatusCode != http.StatusOK || json.Unmarshal(data, &deq) != nil {
			t.Logf("dequeue: %d %s", resp.StatusCode, data)
			return false
		}
		for _, it := range deq.Items {
			leased = append(leased, it.LeaseToken)
		}
		return len(leased) == 2
	}, 30*time.Second, 100*time.Millisecond, "the two enqueued items are dequeued")
	require.NoError(t, tri.Flush())
	require.NoError(t, cli.Flush())
	mu.Lock()
	require.Empty(t, snooped, "the client login received Triage's traffic")
	mu.Unlock()

	// A second bed in the same dir is refused while this one runs.
	_, err = Start(ctx, Config{Dir: dir, NATSPort: -1})
	require.ErrorContains(t, err, "already running")

	b.Stop()
	for _, p := range l.Processes {
		if p.Role == "mysql-primary" {
			require.ErrorIs(t, syscall.Kill(p.PID, 0), syscall.ESRCH, "mariadbd %d still running", p.PID)
		}
	}
	_, err = ReadLayout(dir)
	require.Error(t, err, "bed.json is removed on stop")
}

// TestThreeRegionBed starts the multi-region bed and checks what the drills
// rely on: the layout, region preference across routers, replication
// through the WAN with semi-sync and over TLS (MySQLTLS, as make up's
// multi-region bed), the replicas' fence, the latency, that NATS routes
// cannot bypass a cut, and that Stop leaves nothing running.
func TestThreeRegionBed(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const latency = 20 * time.Millisecond
	b, err := Start(ctx, Config{Dir: dir, Regions: DefaultRegions, NATSPort: -1, WANLatency: latency, MySQLTLS: true,
		Logger: testlog.New(t, slog.LevelInfo)})
	require.NoError(t, err)
	defer b.Stop()

	l, err := ReadLayout(dir)
	require.NoError(t, err)
	require.Len(t, l.Regions, 3)
	roles := map[string]int{}
	shardOf := map[string]uint32{} // region -> its shard
	for _, p := range l.Processes {
		roles[p.Role]++
		require.Positive(t, p.PID)
		require.NotEmpty(t, p.Region, "%+v", p)
		if p.Role == RolePrimary {
			shardOf[p.Region] = p.Shard
		}
	}
	require.Equal(t, map[string]int{RolePrimary: 3, RoleReplica: 6, RoleNATS: 3, RoleTriage: 3}, roles)
	// Each of 9 mariadbd is reached from 2 other regions; 6 directed NATS routes.
	require.Len(t, l.Links, 9*2+6)
	for _, k := range l.Links {
		require.True(t, k.Enabled)
		require.Equal(t, float64(latency/time.Millisecond), k.LatencyMS)
		require.NotEqual(t, k.From, k.To)
	}

	t.Run("checks", func(t *testing.T) {
		t.Run("region preference across routers", func(t *testing.T) {
			t.Parallel()
			topic := "pref"
			var enq struct {
				Results []struct{ ID, Region string }
			}
			postJSON(t, l.Regions[0].HTTP, "/v1/namespaces/default/topics/"+topic+"/items",
				`{"region":"eu-west","items":[{"payload":"aGk="}]}`, &enq)
			require.Len(t, enq.Results, 1)
			require.Equal(t, "eu-west", enq.Results[0].Region)
			id, err := itemid.Parse(enq.Results[0].ID)
			require.NoError(t, err)
			require.Equal(t, shardOf["eu-west"], id.Shard, "stored on eu-west's shard")

			var got []string
			require.Eventually(t, func() bool {
				var deq struct {
					Items []struct{ ID string }
				}
				if !tryPostJSON(t, l.Regions[2].HTTP, "/v1/namespaces/default:dequeue",
					`{"region":"eu-west","topics":[{"topic":"`+topic+`","count":1}],"lease_duration":"30s","wait":"1s"}`, &deq) {
					return false
				}
				for _, it := range deq.Items {
					got = append(got, it.ID)
				}
				return len(got) > 0
			}, 30*time.Second, 100*time.Millisecond)
			require.Equal(t, []string{enq.Results[0].ID}, got, "dequeued through ap-south's router")
		})
		t.Run("replication through the WAN", func(t *testing.T) {
			t.Parallel()
			for region, shard := range shardOf {
				for k := 1; k <= 2; k++ {
					replicaRegion := DefaultRegions[(slices.Index(DefaultRegions, region)+k)%3]
					p, r := b.Server(shard, "primary"), b.ReplicaIn(shard, replicaRegion)
					require.NotNil(t, p)
					require.NotNil(t, r)
					if k == 1 {
						require.Same(t, r, b.Server(shard, "replica"), "the first replica is in the next region")
					}
					pdb := openT(t, p.DSN(""))
					_, err := pdb.Exec(`CREATE DATABASE IF NOT EXISTS bedcheck;
					CREATE TABLE IF NOT EXISTS bedcheck.t (shard INT PRIMARY KEY);
					INSERT IGNORE INTO bedcheck.t VALUES (?)`, shard)
					require.NoError(t, err)
					rdb := openT(t, r.DSN(""))
					require.Eventually(t, func() bool {
						var n int
						return rdb.QueryRow("SELECT shard FROM bedcheck.t").Scan(&n) == nil && n == int(shard)
					}, 10*time.Second, 50*time.Millisecond, "shard %d's row on its replica", shard)

					ra, err := replication.Open(r.DSN(""))
					require.NoError(t, err)
					st, err := ra.Status(ctx)
					ra.Close()
					require.NoError(t, err)
					require.Equal(t, replication.RoleReplica, st.Role)
					require.True(t, st.ReadOnly)
					require.Equal(t, b.Via(replicaRegion, p.Addr()), st.PrimaryAddr, "replicates through the link")
					require.NotEqual(t, p.Addr(), st.PrimaryAddr)
					require.True(t, st.TLS, "replicates over TLS (Master_SSL_Allowed)")

					pa, err := replication.Open(p.DSN(""))
					require.NoError(t, err)
					ss, err := pa.SemiSyncStatus(ctx)
					pa.Close()
					require.NoError(t, err)
					require.True(t, ss.PrimaryEnabled)
					require.True(t, ss.Active, "semi-sync ON on shard %d's primary: %+v", shard, ss)
					require.Equal(t, "AFTER_SYNC", ss.WaitPoint)
					require.Equal(t, 2, ss.Clients, "both replicas acknowledge")
					require.Equal(t, replication.NoFallback, ss.Timeout, "no async fallback")
					require.True(t, ss.WaitNoReplica)
				}
			}
		})
		t.Run("the app user cannot write a replica", func(t *testing.T) {
			t.Parallel()
			r := b.Server(shardOf["us-east"], "replica")
			root := openT(t, r.DSN(""))
			require.Eventually(t, func() bool {
				var n int
				return root.QueryRow("SELECT COUNT(*) FROM triage.schema_migrations").Scan(&n) == nil && n > 0
			}, 10*time.Second, 50*time.Millisecond, "schema replicated")
			acc := b.AppCredentials()
			app := openT(t, tlsDSN(t, l.MySQLTLS, acc, r.Addr()))
			var one int
			require.NoError(t, app.QueryRow("SELECT 1 FROM schema_migrations LIMIT 1").Scan(&one), "the app user can read")
			_, err := app.Exec("INSERT INTO schema_migrations (version, name, applied_at) VALUES (9999, 'x', 0)")
			require.ErrorContains(t, err, "read-only", "read_only fences the app user")
			_, err = app.Exec("CREATE TABLE nope (id INT)")
			require.ErrorContains(t, err, "read-only")
		})
		t.Run("a round trip through a link costs twice the latency", func(t *testing.T) {
			t.Parallel()
			p := b.Server(shardOf["eu-west"], "primary")
			via := b.Via("us-east", p.Addr())
			require.NotEqual(t, p.Addr(), via)
			db := openT(t, "root@tcp("+via+")/")
			db.SetMaxOpenConns(1)
			require.NoError(t, db.Ping())
			for range 3 {
				start := time.Now()
				var one int
				require.NoError(t, db.QueryRow("SELECT 1").Scan(&one))
				require.GreaterOrEqual(t, time.Since(start), 2*latency)
			}
		})
	})

	t.Run("a cut partitions NATS too", func(t *testing.T) {
		for _, r := range b.regions {
			require.Equal(t, 2, r.nats.NumRemotes(), r.name)
		}
		require.NoError(t, b.Cut("eu-west"))
		cut, err := ReadLayout(dir)
		require.NoError(t, err)
		for _, k := range cut.Links {
			require.Equal(t, k.From != "eu-west" && k.To != "eu-west", k.Enabled, k.Name)
		}
		eu, us := b.regions[1], b.regions[0]
		require.Eventually(t, func() bool { return eu.nats.NumRemotes() == 0 && us.nats.NumRemotes() == 1 },
			10*time.Second, 50*time.Millisecond, "no route survives the cut (none bypasses the proxies)")
		require.NoError(t, b.Net().Heal("eu-west"))
		require.Eventually(t, func() bool { return eu.nats.NumRemotes() == 2 && us.nats.NumRemotes() == 2 },
			15*time.Second, 50*time.Millisecond, "routes come back through the healed links")
	})

	t.Run("a region dies, the control plane stays", func(t *testing.T) {
		ap := b.regions[2]
		victims := []int{b.Server(shardOf["ap-south"], "primary").PID(), b.Server(shardOf["eu-west"], "replica").PID()}
		require.NoError(t, b.KillRegion("ap-south"))
		require.ErrorContains(t, b.KillRegion("ap-south"), "already down")
		for _, pid := range victims {
			require.ErrorIs(t, syscall.Kill(pid, 0), syscall.ESRCH, "mariadbd %d of ap-south", pid)
		}
		require.False(t, ap.nats.Running())
		// Replicated KV and streams keep us-east working with 2 of 3 servers.
		require.Eventually(t, func() bool {
			var enq struct{ Results []struct{ ID string } }
			return tryPostJSON(t, l.Regions[0].HTTP, "/v1/namespaces/default/topics/after/items",
				`{"region":"us-east","items":[{"payload":"aGk="}]}`, &enq) && len(enq.Results) == 1
		}, 30*time.Second, 200*time.Millisecond)

		// A killed server comes back on its datadir and port, and catches up.
		require.NoError(t, b.Heal("ap-south"))
		r, err := b.Restart(ctx, shardOf["eu-west"], "replica")
		require.NoError(t, err)
		require.Same(t, r, b.Server(shardOf["eu-west"], "replica"))
		_, err = openT(t, b.Server(shardOf["eu-west"], "primary").DSN("")).Exec("INSERT INTO bedcheck.t VALUES (100)")
		require.NoError(t, err)
		rdb := openT(t, r.DSN(""))
		require.Eventually(t, func() bool {
			var n int
			return rdb.QueryRow("SELECT COUNT(*) FROM bedcheck.t WHERE shard = 100").Scan(&n) == nil && n == 1
		}, 15*time.Second, 50*time.Millisecond)
		l2, err := ReadLayout(dir)
		require.NoError(t, err)
		require.Contains(t, l2.Processes, Process{Role: RoleReplica, Region: "ap-south", Shard: shardOf["eu-west"], Port: r.Port(), PID: r.PID()})
		l.Processes = append(l.Processes, Process{Role: RoleReplica, PID: r.PID()})
	})

	b.Stop()
	for _, p := range l.Processes {
		if p.Role == RolePrimary || p.Role == RoleReplica {
			require.ErrorIs(t, syscall.Kill(p.PID, 0), syscall.ESRCH, "mariadbd %d still running", p.PID)
		}
	}
	for _, r := range b.regions {
		require.False(t, r.nats.Running(), "nats of %s", r.name)
	}
	for _, reg := range l.Regions {
		_, err := net.DialTimeout("tcp", reg.HTTP, time.Second)
		require.Error(t, err, "gateway of %s still listening", reg.Name)
	}
	for _, k := range l.Links {
		_, err := net.DialTimeout("tcp", k.Listen, time.Second)
		require.Error(t, err, "link %s still listening", k.Name)
	}
	_, err = ReadLayout(dir)
	require.Error(t, err, "bed.json is removed on stop")
}

// tlsDSN is the DSN of acc on the server at addr over TLS as the bed's
// mysql_tls says.
func tlsDSN(t *testing.T, tlsCfg *shardmap.MySQLTLS, acc replication.Credentials, addr string) string {
	t.Helper()
	c, err := shardmap.Credentials{User: acc.User, Password: acc.Password, TLS: tlsCfg}.Resolve()
	require.NoError(t, err)
	mc := mysql.NewConfig()
	c.Apply(mc)
	mc.Net, mc.Addr, mc.DBName = "tcp", addr, acc.Database
	return mc.FormatDSN()
}

func openT(t *testing.T, dsn string) *sql.DB {
	t.Helper()
	db, err := sql.Open("mysql", dsn)
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	return db
}

func postJSON(t *testing.T, addr, path, body string, out any) {
	t.Helper()
	resp, err := http.Post("http://"+addr+path, "application/json", strings.NewReader(body))
	require.NoError(t, err)
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	require.Equal(t, http.StatusOK, resp.StatusCode, string(data))
	require.NoError(t, json.Unmarshal(data, out), string(data))
}

// tryPostJSON is postJSON for polling: a non-200 answer (no dequeuer owns
// the shard yet) is logged and reported false.
func tryPostJSON(t *testing.T, addr, path, body string, out any) bool {
	t.Helper()
	resp, err := http.Post("http://"+addr+path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Log(err)
		return false
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Logf("%s: %d %s", path, resp.StatusCode, data)
		return false
	}
	require.NoError(t, json.Unmarshal(data, out), string(data))
	return true
}

// TestSuperviseRestartsADeposedWritableServer: after a heal the bed plays
// the operator the controller's alarm asks for: a server the map does
// not name primary that is writable (a deposed primary no heal of its
// own restarted) is crashed and restarted to rejoin, read-only; the
// primary is left alone.
func TestSuperviseRestartsADeposedWritableServer(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	b, err := Start(ctx, Config{Dir: t.TempDir(), Regions: DefaultRegions, NATSPort: -1, Logger: testlog.New(t, slog.LevelWarn)})
	require.NoError(t, err)
	defer b.Stop()
	require.Empty(t, b.superviseDeposed(ctx), "nothing to do on a bed as it started")

	replica := b.replicasOf(1)[0]
	primaryPID := b.currentPrimary(1).srv.PID()
	db, err := sql.Open("mysql", replica.srv.DSN(""))
	require.NoError(t, err)
	_, err = db.ExecContext(ctx, "SET GLOBAL read_only = OFF")
	db.Close()
	require.NoError(t, err)

	desc := b.superviseDeposed(ctx)
	require.Contains(t, desc, "supervisor: "+replica.srv.Addr())
	require.Contains(t, desc, "to rejoin as a replica")
	live, state, err := drill.DeposedState(ctx, replica.srv.DSN(""))
	require.NoError(t, err)
	require.False(t, live, "restarted fenced (RejoinArgs), no commit waiting: %s", state)
	require.Equal(t, primaryPID, b.currentPrimary(1).srv.PID(), "the primary is left alone")
}
