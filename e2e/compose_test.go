package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/triage-queue/triage/cmd/triage/natsserver"
	"github.com/triage-queue/triage/deploy/compose"
	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
	"github.com/triage-queue/triage/regions/replication"
	"github.com/triage-queue/triage/shardmap"
)

// composeRegions are the compose bed's regions, in port order.
var composeRegions = []string{"us-east", "eu-west", "ap-south"}

// composeBed is a running compose bed of a project of its own.
type composeBed struct {
	t       *testing.T
	project string
	env     []string
	// http is each region's JSON gateway (host:port), by region.
	http map[string]string
	// bedDir is the bed directory up.sh makes (TRIAGE_BED_DIR) and token
	// the bed's API key (cluster-admin) in it.
	bedDir, token string
}

// TestCompose brings the three-region docker-compose bed up from nothing
// under a project name of its own (deploy/compose/up.sh: images built
// without a registry, bootstrap, health checks), then:
//
//   - keys and NATS logins, as on the process bed: a call to a router
//     without the bed's API key is refused UNAUTHENTICATED (gRPC) and 401
//     (HTTP), one with it is served; NATS speaks TLS only, with a
//     certificate of the bed's own CA, and wants a login; the client login
//     is refused publishing on triage.> and subscribing to the default
//     inbox and to every subject Triage uses, while Triage's login uses
//     JetStream; and the client login's subscription to ">" gets none of
//     Triage's traffic while the tour below runs;
//   - MySQL TLS, as on the process bed: the application account's login
//     over plain TCP to any MariaDB server is refused (1045, REQUIRE SSL)
//     and over TLS verified with the bed's CA it is served, and every
//     replica replicates over TLS (Master_SSL_Allowed); after the drills
//     too, which repoint and rejoin replicas;
//   - the WAN: a round trip from each region to a MariaDB server of each
//     other region, as a client there sees it, takes at least 40 ms
//     (20 ms one way through the gateways), and a region's containers
//     cannot even resolve another region's servers: their gateway is the
//     only way out;
//   - a tour: enqueue through every region's JSON gateway, into its own
//     region and into the next one, dequeue each item back (through the
//     same gateway, and through the third region's) and ack it;
//   - Prometheus: the bed's scrapes every role container of every region
//     and finds it up, and evaluates every alert rule of
//     deploy/prometheus/alerts.yml without an error;
//   - the partition drill on us-east (its gateway disconnected from the
//     network between regions for 25 s) and then the primary-kill drill
//     on eu-west (docker kill of shard 2's primary), with clients on all
//     three routers, asserting what the process bed's drills assert:
//     nothing lost, resurrected after ack or nack undone, nothing
//     acknowledged by the cut-off region after the new primary was
//     published, the old primary rejoined as a replica, and RTO within
//     20 s and 15 s (composePartitionRTO, composePrimaryKillRTO). Partition first: a primary-kill of us-east's shard
//     would move it to another region, and the partition would not fault
//     it;
//   - growing online: the spare shard 4 (SPARE_SHARDS=1), started and
//     replicated outside the map, is added through a router that holds
//     no admin account, and items land on it and are served.
//
// Then it removes the bed and asserts that no container, network or
// volume of the project is left. Set TRIAGE_SKIP_DOCKER=1 to skip it
// where Docker is missing.
func TestCompose(t *testing.T) {
	t.Parallel()
	rec := &recap{t: t, step: "bring the bed up"}
	t.Cleanup(rec.print) // first registered, so it prints last
	start := time.Now()
	b := startCompose(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	rec.at("WAN round trips and name isolation")
	bed, err := compose.Open(ctx, b.project)
	require.NoError(t, err)
	require.Equal(t, b.token, bed.Token(), "compose.Open finds the bed directory up.sh made")
	for _, r := range must(bed.Routers(ctx)) {
		require.Equal(t, b.token, r.Token, "the drills send the key to %s", r.Region)
	}

	rec.at("keys and NATS logins")
	b.checkKeys(ctx, bed)
	snooped := b.checkNATSLogins(ctx, bed)
	rec.at("MySQL TLS")
	checkMySQLTLS(ctx, t, bed)
	for _, from := range composeRegions {
		rtts, err := bed.RoundTrips(ctx, from)
		require.NoError(t, err)
		require.Len(t, rtts, len(composeRegions)-1)
		for to, rtt := range rtts {
			t.Logf("WAN round trip %-8s -> %-8s %v", from, to, rtt)
			require.GreaterOrEqual(t, rtt, 40*time.Millisecond, "a round trip from %s to a server of %s: want 2 x 20 ms through the gateways", from, to)
		}
	}
	out, err := exec.Command("docker", "exec", b.container("mariadb-s1-us-east"), "getent", "hosts", "mariadb-s2-eu-west").CombinedOutput()
	require.Error(t, err, "us-east resolves eu-west's server directly: %s", out)

	rec.at("tour")
	topic := fmt.Sprintf("compose-%d", time.Now().UnixNano())
	for i, via := range composeRegions {
		for _, store := range []string{via, composeRegions[(i+1)%3]} {
			payload := fmt.Sprintf("from %s into %s", via, store)
			id := b.enqueue(ctx, via, store, topic, payload)
			require.True(t, strings.HasPrefix(id, fmt.Sprint(shardOf(store), "-")), "item %s stored in %s: want an id of shard %d", id, store, shardOf(store))
			// Read it back through the region after via, asking for store's shards.
			reader := composeRegions[(i+2)%3]
			if store == via {
				reader = via
			}
			got := b.dequeue(ctx, reader, store, topic)
			require.Equal(t, id, got.ID, "dequeued through %s from %s", reader, store)
			require.Equal(t, payload, got.Payload)
			b.ack(ctx, reader, got)
			t.Logf("%-9s -> stored in %-9s -> dequeued and acked through %s: %s", via, store, reader, id)
		}
	}
	t.Logf("compose bed up and toured %.1fs after the start", time.Since(start).Seconds())
	require.Empty(t, snooped(), "the client login's subscription to \">\" received Triage's traffic during the tour")
	b.checkPrometheus(rec)

	drills := time.Now()
	rec.at("partition drill")
	rep := runDrill(t, "partition", 25*time.Second, "--bed", "compose", "--project", b.project, "--region", "us-east")
	rec.add("partition: " + summary(rep))
	checkPartition(t, rep, composePartitionRTO)
	rec.at("primary-kill drill")
	rep = runDrill(t, "primary-kill", 10*time.Second, "--bed", "compose", "--project", b.project, "--region", "eu-west")
	rec.add("primary-kill: " + summary(rep))
	checkDrill(t, rep, composePrimaryKillRTO)
	t.Logf("drills took %.1fs", time.Since(drills).Seconds())
	rec.at("MySQL TLS after the drills")
	dctx, dcancel := context.WithTimeout(context.Background(), time.Minute)
	defer dcancel()
	checkMySQLTLS(dctx, t, bed)

	rec.at("grow online (shard 4)")

	grow := time.Now()
	gctx, gcancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer gcancel()
	b.addSpareShard(gctx, topic)
	t.Logf("spare shard added and served %.1fs after the drills", time.Since(grow).Seconds())
}

// checkMySQLTLS checks, on every MariaDB server of the bed's map, that the
// application account cannot log in over plain TCP (1045: the bootstrap
// made it REQUIRE SSL) but can over TLS with the bed's CA, and that every
// replica connects to its primary over TLS (Master_SSL_Allowed = Yes):
// the bootstrap's replication_tls at start, the controllers' after a
// failover's repoint and a deposed primary's rejoin. Root's plain login,
// which ServerStatus uses, is what the bed's fault injection uses too.
func checkMySQLTLS(ctx context.Context, t *testing.T, bed *compose.Bed) {
	t.Helper()
	replicas := 0
	for i := range composeRegions {
		for _, r := range composeRegions {
			svc := fmt.Sprintf("mariadb-s%d-%s", i+1, r)
			err := bed.AppLogin(ctx, svc, false)
			var me *mysql.MySQLError
			require.ErrorAs(t, err, &me, "%s: the application account's plain TCP login", svc)
			require.Equal(t, uint16(1045), me.Number, "%s: %v", svc, err)
			require.NoError(t, bed.AppLogin(ctx, svc, true), "%s: the application account over TLS", svc)
			st, err := bed.ServerStatus(ctx, svc)
			require.NoError(t, err, svc)
			if st.Role == replication.RoleReplica {
				replicas++
				require.True(t, st.TLS, "%s replicates from %s without TLS (Master_SSL_Allowed)", svc, st.PrimaryAddr)
			}
		}
	}
	require.Equal(t, len(composeRegions)*(len(composeRegions)-1), replicas, "every shard's servers but its primary replicate")
}

// recap repeats, at the very end of a failed run's output, the step it
// failed in and the drills' figures. CI shows only the tail of a failed
// test's output, and TestCompose's tail is the bed's logs and the drills'
// reports, printed by cleanups after the failed check's message.
type recap struct {
	t     *testing.T
	mu    sync.Mutex
	step  string
	lines []string
}

func (r *recap) at(step string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.step = step
}

func (r *recap) add(line string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lines = append(r.lines, line)
}

func (r *recap) print() {
	if !r.t.Failed() {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.t.Logf("--- recap: TestCompose failed in step %q (its failed checks are printed above the bed's logs) ---\n%s",
		r.step, strings.Join(r.lines, "\n"))
}

// addSpareShard adds the spare shard 4 (docker-compose.spare.yml, homed in
// us-east, weight 3) through us-east's gateway as deploy/compose/README.md
// says, on a router that holds only the application account: the
// bootstrap migrated the spare's schema. Then single-item enqueues into
// us-east land on it (each has a 3 in 4 chance; 12 without one would be
// one in 16 million), and every item, on shard 4 or 1, is dequeued through
// eu-west and acked.
func (b *composeBed) addSpareShard(ctx context.Context, topic string) {
	t := b.t
	var changed struct {
		Version string `json:"version"`
	}
	b.post(ctx, "us-east", "/v1/shards", map[string]any{
		"id": 4, "home_region": "us-east", "primary": "mariadb-s4-us-east:3306", "weight": 3,
		"replicas":        []string{"mariadb-s4-eu-west:3306", "mariadb-s4-ap-south:3306"},
		"replica_regions": []string{"eu-west", "ap-south"},
	}, &changed)
	t.Logf("shard 4 added: map version %s", changed.Version)
	topic += "-grown"
	// No dedup keys: a key hashes to a slot of the namespace's dedup slot
	// table, and a new shard takes no slots (shardmap), so keyed items
	// would never land on shard 4.
	// Every enqueue must be confirmed: the first ones into shard 4 used
	// to wait out a lost first pull of its new enqueue consumer (504
	// after 10 s, inserted half a minute later).
	ids := map[string]bool{}
	onSpare := 0
	for i := 0; i < 12 && onSpare == 0; i++ {
		id := b.enqueue(ctx, "us-east", "us-east", topic, fmt.Sprint("grown ", i))
		ids[id] = true
		if strings.HasPrefix(id, "4-") {
			onSpare++
		}
	}
	require.Equal(t, 1, onSpare, "no enqueue landed on the added shard 4: %v", ids)
	for len(ids) > 0 {
		got := b.dequeue(ctx, "eu-west", "us-east", topic)
		require.True(t, ids[got.ID], "dequeued %s (%q), not one of %v", got.ID, got.Payload, ids)
		delete(ids, got.ID)
		b.ack(ctx, "eu-west", got)
	}
}

// shardOf is the shard whose home is region (compose.DefaultTopology: region i's
// shard is i+1).
func shardOf(region string) int {
	for i, r := range composeRegions {
		if r == region {
			return i + 1
		}
	}
	return 0
}

// startCompose runs deploy/compose/up.sh under a unique project name with
// free host ports, and registers the teardown (also on failure) with the
// check that nothing of the project is left.
func startCompose(t *testing.T) *composeBed {
	if os.Getenv("TRIAGE_SKIP_DOCKER") == "1" {
		t.Skip("TRIAGE_SKIP_DOCKER=1")
	}
	for _, tool := range [][]string{{"docker", "version"}, {"docker-compose", "version"}} {
		if out, err := exec.Command(tool[0], tool[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("the compose bed needs a Docker Engine and docker-compose (apt-get install docker.io docker-compose; "+
				"debootstrap is installed on demand), or TRIAGE_SKIP_DOCKER=1 to skip: %s: %v\n%s", strings.Join(tool, " "), err, out)
		}
	}
	b := &composeBed{t: t, project: fmt.Sprintf("triage-e2e-%d-%d", os.Getpid(), time.Now().UnixNano()%1e6), http: map[string]string{}}
	tmp := t.TempDir()
	b.bedDir = filepath.Join(tmp, "bed") // the key, NATS passwords and certificates; down.sh removes it
	b.env = append(os.Environ(), "COMPOSE_PROJECT_NAME="+b.project, "IMAGES_ENV="+filepath.Join(tmp, "images.env"),
		"TRIAGE_BED_DIR="+b.bedDir,
		"SPARE_SHARDS=1") // shard 4, outside the map until addSpareShard
	for _, r := range composeRegions {
		k := strings.ToUpper(strings.ReplaceAll(r, "-", "_"))
		b.env = append(b.env, "TRIAGE_HTTP_"+k+"=0", "TRIAGE_GRPC_"+k+"=0") // free ports, beside make compose-up
	}
	b.env = append(b.env, "TRIAGE_PROMETHEUS=0")
	t.Cleanup(b.down)
	start := time.Now()
	out, err := b.script(15*time.Minute, "up.sh") // a first build takes 5-8 minutes on 2 cores
	require.NoError(t, err, "deploy/compose/up.sh:\n%s", out)
	t.Logf("compose bed %s up in %.1fs (images included)", b.project, time.Since(start).Seconds())
	// Where the time went: the scripts' timed steps ("[ 12.3s] ...").
	for line := range strings.Lines(out) {
		if strings.HasPrefix(line, "[") {
			t.Logf("  up.sh %s", strings.TrimSpace(line))
		}
	}
	for _, r := range composeRegions {
		out, err := exec.Command("docker", "port", b.container("router-"+r), "8080/tcp").CombinedOutput()
		require.NoError(t, err, "%s", out)
		b.http[r] = strings.Fields(string(out))[0]
	}
	token, err := os.ReadFile(filepath.Join(b.bedDir, "token"))
	require.NoError(t, err, "up.sh makes the bed directory")
	b.token = strings.TrimSpace(string(token))
	require.True(t, strings.HasPrefix(b.token, "trk_"), "the bed's API key: %q", b.token)
	return b
}

// must is v, or a panic: for calls that cannot fail here.
func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// checkKeys: every router refuses a call without the bed's API key,
// UNAUTHENTICATED over gRPC and 401 over HTTP, and serves the same call
// with it.
func (b *composeBed) checkKeys(ctx context.Context, bed *compose.Bed) {
	t := b.t
	for _, r := range must(bed.Routers(ctx)) {
		conn, err := grpc.NewClient(r.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		require.NoError(t, err)
		admin, queue := triagev1.NewAdminClient(conn), triagev1.NewQueueClient(conn)
		_, err = admin.GetShardMap(ctx, &triagev1.GetShardMapRequest{})
		require.Equal(t, codes.Unauthenticated, status.Code(err), "GetShardMap via %s without a key: %v", r.Region, err)
		_, err = queue.Enqueue(ctx, &triagev1.EnqueueRequest{Namespace: "default", Topic: "keys", Items: []*triagev1.NewItem{{Payload: []byte("no key")}}})
		require.Equal(t, codes.Unauthenticated, status.Code(err), "Enqueue via %s without a key: %v", r.Region, err)
		_, err = admin.GetShardMap(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer trk_not-the-key"), &triagev1.GetShardMapRequest{})
		require.Equal(t, codes.Unauthenticated, status.Code(err), "GetShardMap via %s with a wrong key: %v", r.Region, err)
		m, err := admin.GetShardMap(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+b.token), &triagev1.GetShardMapRequest{})
		require.NoError(t, err, "GetShardMap via %s with the bed's key", r.Region)
		require.Len(t, m.Shards, len(composeRegions))
		conn.Close()

		code, raw := b.postAs(ctx, "", r.Region, "/v1/namespaces/default/topics/keys/items", map[string]any{
			"items": []map[string]any{{"payload": base64.StdEncoding.EncodeToString([]byte("no key"))}}})
		require.Equal(t, http.StatusUnauthorized, code, "enqueue via %s's JSON gateway without a key: %s", r.Region, raw)
		t.Logf("router of %s: without the key GetShardMap and Enqueue are UNAUTHENTICATED and the JSON gateway answers %d; with it GetShardMap lists %d shards",
			r.Region, code, len(m.Shards))
	}
}

// checkNATSLogins checks us-east's NATS server from the Docker host as an
// application would reach it: TLS only, with the bed's CA; a login
// required; Triage's login allowed JetStream; the client login refused
// publishing on triage.> and subscribing to the default inbox and to
// every subject Triage uses (natsserver.Internal), while its own subjects
// work. It leaves the client login subscribed to ">" and returns what
// that subscription received of anything but its own subjects, which is
// to stay empty.
func (b *composeBed) checkNATSLogins(ctx context.Context, bed *compose.Bed) (snooped func() []string) {
	t := b.t
	url, login, natsTLS, err := bed.NATSClient(ctx, "us-east")
	require.NoError(t, err)
	t.Logf("NATS of us-east from the host: %s (server name %s, CA %s)", url, natsTLS.ServerName, natsTLS.CAFile)

	// The server announces that it takes TLS only, and its certificate is
	// of the bed's own CA: the system roots do not verify it.
	raw, err := net.DialTimeout("tcp", strings.TrimPrefix(url, "tls://"), 10*time.Second)
	require.NoError(t, err)
	info, err := bufio.NewReader(raw).ReadString('\n')
	raw.Close()
	require.NoError(t, err)
	require.Contains(t, info, `"tls_required":true`, "the server's INFO")
	pw := must(os.ReadFile(login.PasswordFile))
	_, err = nats.Connect(url, nats.UserInfo(login.User, strings.TrimSpace(string(pw))), nats.MaxReconnects(0), nats.Timeout(10*time.Second),
		nats.Secure(&tls.Config{ServerName: natsTLS.ServerName, MinVersion: tls.VersionTLS12}))
	require.ErrorContains(t, err, "certificate signed by unknown authority", "a client without the bed's CA")
	withCA, err := natsTLS.Option()
	require.NoError(t, err)
	_, err = nats.Connect(url, withCA, nats.MaxReconnects(0), nats.Timeout(10*time.Second))
	require.ErrorIs(t, err, nats.ErrAuthorization, "no login")

	// Triage's login uses JetStream, over TLS.
	turl, tlogin, ttls, err := bed.NATSTriage(ctx, "us-east")
	require.NoError(t, err)
	triOpts, err := shardmap.NATSOptions(tlogin, ttls)
	require.NoError(t, err)
	tri, err := nats.Connect(turl, append(triOpts, nats.MaxReconnects(0), nats.Timeout(10*time.Second))...)
	require.NoError(t, err, "Triage's login")
	t.Cleanup(tri.Close)
	state, err := tri.TLSConnectionState()
	require.NoError(t, err)
	require.True(t, state.HandshakeComplete)
	_, err = tri.Request("$JS.API.INFO", nil, 10*time.Second)
	require.NoError(t, err, "Triage's login asks JetStream")

	var (
		mu         sync.Mutex
		violations []string
		seen       []string // subjects the client login received
	)
	violated := func(what string) bool {
		mu.Lock()
		defer mu.Unlock()
		return slices.ContainsFunc(violations, func(v string) bool { return strings.Contains(v, what) })
	}
	clientOpt, err := login.Option()
	require.NoError(t, err)
	cli, err := nats.Connect(url, clientOpt, withCA, nats.CustomInboxPrefix(natsserver.ClientInboxPrefix(login.User)),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			mu.Lock()
			violations = append(violations, err.Error())
			mu.Unlock()
		}))
	require.NoError(t, err, "the client login with the bed's CA")
	t.Cleanup(cli.Close)
	require.NoError(t, cli.Publish("triage.enq.us-east.1", []byte("raw")))
	require.NoError(t, cli.Flush())
	require.Eventually(t, func() bool { return violated(`Permissions Violation for Publish to "triage.enq.us-east.1"`) },
		10*time.Second, 10*time.Millisecond, "the client login published on triage.> unrefused")
	record := func(m *nats.Msg) {
		mu.Lock()
		seen = append(seen, m.Subject)
		mu.Unlock()
	}
	denied := append([]string{natsserver.DefaultInbox}, natsserver.Internal...)
	for _, subj := range denied {
		_, err := cli.Subscribe(subj, record)
		require.NoError(t, err, subj)
	}
	_, err = cli.Subscribe(">", record)
	require.NoError(t, err)
	require.NoError(t, cli.Flush())
	for _, subj := range denied {
		require.Eventually(t, func() bool { return violated(`Permissions Violation for Subscription to "` + subj + `"`) },
			10*time.Second, 10*time.Millisecond, "the client login subscribed to %s unrefused", subj)
	}
	t.Logf("NATS client login: %d refusals: %s", len(violations), strings.Join(violations, "; "))
	// Its own subjects work: the refusals are permissions, not a broken
	// connection.
	own, err := cli.SubscribeSync("app.hello")
	require.NoError(t, err)
	require.NoError(t, cli.Publish("app.hello", []byte("hi")))
	_, err = own.NextMsg(10 * time.Second)
	require.NoError(t, err, "the client login's own subject")
	return func() []string {
		require.NoError(t, tri.Flush())
		require.NoError(t, cli.Flush())
		mu.Lock()
		defer mu.Unlock()
		var out []string
		for _, s := range seen {
			if !strings.HasPrefix(s, "app.") {
				out = append(out, s)
			}
		}
		return out
	}
}

// container is the ID of service's container.
func (b *composeBed) container(service string) string {
	out, err := exec.Command("docker", "ps", "-q", "--filter", "label=com.docker.compose.project="+b.project,
		"--filter", "label=com.docker.compose.service="+service).CombinedOutput()
	require.NoError(b.t, err, "%s", out)
	id := strings.TrimSpace(string(out))
	require.NotEmpty(b.t, id, "no running container of service %s", service)
	return id
}

// script runs deploy/compose/NAME with the bed's environment.
func (b *composeBed) script(timeout time.Duration, name string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join("..", "deploy", "compose", name))
	cmd.Env = b.env
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func (b *composeBed) compose(args ...string) (string, error) {
	env := ""
	for _, e := range b.env {
		if v, ok := strings.CutPrefix(e, "IMAGES_ENV="); ok {
			env = v
		}
	}
	cmd := exec.Command("docker-compose", append([]string{"-f", filepath.Join("..", "deploy", "compose", "docker-compose.yml"),
		"--env-file", env, "-p", b.project}, args...)...)
	cmd.Env = b.env
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// down removes the bed and fails the test if any container, network or
// volume of the project is left.
func (b *composeBed) down() {
	t := b.t
	if t.Failed() {
		if out, err := b.compose("ps"); err == nil {
			t.Logf("docker-compose ps:\n%s", out)
		}
		b.keepLogs()
	}
	start := time.Now()
	if out, err := b.script(3*time.Minute, "down.sh"); err != nil {
		t.Errorf("deploy/compose/down.sh: %v\n%s", err, out)
	}
	t.Logf("compose bed %s removed in %.1fs", b.project, time.Since(start).Seconds())
	label := "label=com.docker.compose.project=" + b.project
	for _, what := range [][]string{{"ps", "-a"}, {"network", "ls"}, {"volume", "ls"}} {
		out, err := exec.Command("docker", append(what, "-q", "--filter", label)...).CombinedOutput()
		if err != nil || strings.TrimSpace(string(out)) != "" {
			t.Errorf("docker %s --filter %s after down: %v\n%s", strings.Join(what, " "), label, err, out)
		}
	}
	if _, err := os.Stat(b.bedDir); !os.IsNotExist(err) {
		t.Errorf("the bed directory %s after down: %v", b.bedDir, err)
	}
}

// keepLogs writes every container's log to $TRIAGE_ARTIFACTS/TestCompose
// or the test's artifact directory (kept with go test -artifacts) and prints the tail of the controllers', where
// a failover's steps are.
func (b *composeBed) keepLogs() {
	t := b.t
	out, err := exec.Command("docker", "ps", "-a", "--filter", "label=com.docker.compose.project="+b.project,
		"--format", `{{.ID}} {{.Label "com.docker.compose.service"}}`).CombinedOutput()
	if err != nil {
		t.Logf("docker ps: %v\n%s", err, out)
		return
	}
	// make test sets TRIAGE_ARTIFACTS, so a CI failure keeps them.
	dir := filepath.Join(t.ArtifactDir(), "compose-logs")
	if root := os.Getenv("TRIAGE_ARTIFACTS"); root != "" {
		dir = filepath.Join(root, t.Name(), b.project)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Log(err)
		return
	}
	for line := range strings.Lines(string(out)) {
		f := strings.Fields(line)
		if len(f) != 2 {
			continue
		}
		logs, _ := exec.Command("docker", "logs", "--timestamps", f[0]).CombinedOutput()
		_ = os.WriteFile(filepath.Join(dir, f[1]+".log"), logs, 0o644)
		switch {
		case strings.HasPrefix(f[1], "controller-"):
			t.Logf("--- last 40 lines of %s (all logs in %s) ---\n%s", f[1], dir, tailLines(string(logs), 40))
		case strings.HasPrefix(f[1], "router-"), strings.HasPrefix(f[1], "enqueuer-"), strings.HasPrefix(f[1], "dequeuer-"):
			// Without the MySQL driver's connection noise: a failed
			// request's cause is in these, and CI keeps only the output.
			t.Logf("--- last 15 lines of %s, MySQL driver lines left out ---\n%s", f[1], tailLines(withoutDriverNoise(string(logs)), 15))
		case strings.HasPrefix(f[1], "nats-"):
			// Which routes the server has: core NATS replies cross only
			// direct routes.
			routes, _ := exec.Command("docker", "exec", f[0], "/triage", "probe", "--nats-peers", "2", "http://127.0.0.1:8222").CombinedOutput()
			t.Logf("--- %s routes: %s", f[1], strings.TrimSpace(string(routes)))
		}
	}
}

// withoutDriverNoise drops the MySQL driver's own log lines ("[mysql] ...
// unexpected EOF"), which the bed's dropped connections produce by the
// hundred.
func withoutDriverNoise(logs string) string {
	var b strings.Builder
	for line := range strings.Lines(logs) {
		if !strings.Contains(line, " [mysql] ") {
			b.WriteString(line)
		}
	}
	return b.String()
}

// tailLines is the last n lines of s.
func tailLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// post sends a JSON body to region's gateway and decodes the answer,
// failing the test on a non-200 status.
func (b *composeBed) post(ctx context.Context, region, path string, body, answer any) {
	code, raw := b.postStatus(ctx, region, path, body)
	require.Equal(b.t, http.StatusOK, code, "POST %s via %s: %s", path, region, raw)
	require.NoError(b.t, json.Unmarshal(raw, answer), "%s", raw)
}

// postStatus sends a JSON body to region's gateway with the bed's API key
// and returns the status and the answer.
func (b *composeBed) postStatus(ctx context.Context, region, path string, body any) (int, json.RawMessage) {
	return b.postAs(ctx, b.token, region, path, body)
}

// postAs is postStatus with key token, or none ("").
func (b *composeBed) postAs(ctx context.Context, token, region, path string, body any) (int, json.RawMessage) {
	t := b.t
	data, err := json.Marshal(body)
	require.NoError(t, err)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+b.http[region]+path, bytes.NewReader(data))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err, "POST %s via %s", path, region)
	defer resp.Body.Close()
	var raw json.RawMessage
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&raw))
	return resp.StatusCode, raw
}

// enqueue stores payload in region store through via's gateway and returns
// the item's ID.
func (b *composeBed) enqueue(ctx context.Context, via, store, topic, payload string) string {
	var resp struct {
		Results []struct {
			ID     string `json:"id"`
			Region string `json:"region"`
		} `json:"results"`
	}
	b.post(ctx, via, "/v1/namespaces/default/topics/"+topic+"/items", map[string]any{
		"region": store,
		"items":  []map[string]any{{"payload": base64.StdEncoding.EncodeToString([]byte(payload)), "priority": 1}},
	}, &resp)
	require.Len(b.t, resp.Results, 1)
	require.Equal(b.t, store, resp.Results[0].Region)
	return resp.Results[0].ID
}

type leased struct {
	ID, Token, Payload string
}

// dequeue long-polls via's gateway for one item of topic from region
// store's shards.
func (b *composeBed) dequeue(ctx context.Context, via, store, topic string) leased {
	var resp struct {
		Items []struct {
			ID         string `json:"id"`
			Payload    []byte `json:"payload"`
			LeaseToken string `json:"lease_token"`
		} `json:"items"`
	}
	deadline := time.Now().Add(30 * time.Second)
	for len(resp.Items) == 0 && time.Now().Before(deadline) {
		b.post(ctx, via, "/v1/namespaces/default:dequeue", map[string]any{
			"region": store, "topics": []map[string]any{{"topic": topic, "count": 1}},
			"lease_duration": "30s", "wait": "5s",
		}, &resp)
	}
	require.Len(b.t, resp.Items, 1, "dequeue via %s from %s", via, store)
	it := resp.Items[0]
	return leased{ID: it.ID, Token: it.LeaseToken, Payload: string(it.Payload)}
}

func (b *composeBed) ack(ctx context.Context, via string, it leased) {
	var resp struct {
		Results []struct {
			ID    string `json:"id"`
			OK    bool   `json:"ok"`
			Error string `json:"error"`
		} `json:"results"`
	}
	b.post(ctx, via, "/v1/namespaces/default:ack", map[string]any{
		"acks": []map[string]any{{"id": it.ID, "lease_token": it.Token}},
	}, &resp)
	require.Len(b.t, resp.Results, 1)
	require.True(b.t, resp.Results[0].OK, "ack %s via %s: %s", it.ID, via, resp.Results[0].Error)
}
