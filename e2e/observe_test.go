package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/triage-queue/triage/cmd/triage/node"
	"github.com/triage-queue/triage/deploy/mariadb"
	"github.com/triage-queue/triage/deploy/mariadb/mariadbtest"
	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
	"github.com/triage-queue/triage/shardmap"
)

// scrape reads base/metrics and parses it.
func scrape(t *testing.T, base string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	require.NoError(t, err)
	return fams
}

// value returns the value of the sample of family name whose labels
// include want (a counter, gauge, or a histogram's count); ok false when
// there is none.
func value(fams map[string]*dto.MetricFamily, name string, want map[string]string) (float64, bool) {
	f := fams[name]
	if f == nil {
		return 0, false
	}
next:
	for _, m := range f.Metric {
		have := map[string]string{}
		for _, l := range m.Label {
			have[l.GetName()] = l.GetValue()
		}
		for k, v := range want {
			if have[k] != v {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			return m.Counter.GetValue(), true
		case m.Gauge != nil:
			return m.Gauge.GetValue(), true
		case m.Histogram != nil:
			return float64(m.Histogram.GetSampleCount()), true
		}
	}
	return 0, false
}

// sum adds every sample of family name whose labels include want.
func sum(fams map[string]*dto.MetricFamily, name string, want map[string]string) float64 {
	total := 0.0
	f := fams[name]
	if f == nil {
		return 0
	}
next:
	for _, m := range f.Metric {
		for _, l := range m.Label {
			if v, ok := want[l.GetName()]; ok && v != l.GetValue() {
				continue next
			}
		}
		total += m.GetCounter().GetValue() + m.GetGauge().GetValue()
	}
	return total
}

func lbl(kv ...string) map[string]string {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return m
}

// TestMetricsAfterWorkload runs a known workload and checks the counts
// and depths /metrics reports.
func TestMetricsAfterWorkload(t *testing.T) {
	t.Parallel()
	b := setup(t, bedOpts{maxAttempts: 2, noNode: true})
	b.startNode(node.Config{DepthEvery: shardmap.Duration(time.Nanosecond)})
	ctx := b.ctx()
	enq := func(topic string, items ...*triagev1.NewItem) []string {
		resp, err := b.queue.Enqueue(ctx, &triagev1.EnqueueRequest{Namespace: "default", Topic: topic, Items: items})
		require.NoError(t, err)
		var ids []string
		for _, r := range resp.Results {
			ids = append(ids, r.Id)
		}
		return ids
	}
	deq := func(topic string, n int32, lease time.Duration) []*triagev1.LeasedItem {
		resp, err := b.queue.Dequeue(ctx, &triagev1.DequeueRequest{Namespace: "default", Topics: []*triagev1.TopicCount{{Topic: topic, Count: n}},
			LeaseDuration: durationpb.New(lease)})
		require.NoError(t, err)
		return resp.Items
	}

	// work: three items in band 0, two in band 4+, one delayed in band 1.
	enq("work", &triagev1.NewItem{Payload: []byte("a")}, &triagev1.NewItem{Payload: []byte("b")}, &triagev1.NewItem{Payload: []byte("c")},
		&triagev1.NewItem{Payload: []byte("d"), Priority: 5}, &triagev1.NewItem{Payload: []byte("e"), Priority: 7})
	enq("work", &triagev1.NewItem{Payload: []byte("later"), Priority: 1, DeliverAfter: timestamppb.New(time.Now().Add(time.Hour))})
	got := deq("work", 2, time.Minute)
	require.Len(t, got, 2)
	for _, it := range got {
		require.Zero(t, it.Priority)
	}
	ack, err := b.queue.Ack(ctx, &triagev1.AckRequest{Namespace: "default", Acks: []*triagev1.LeaseRef{
		{Id: got[0].Id, LeaseToken: got[0].LeaseToken},
		{Id: got[1].Id, LeaseToken: "0000000000000001"}, // stale: refused
	}})
	require.NoError(t, err)
	require.True(t, ack.Results[0].Ok)
	require.False(t, ack.Results[1].Ok)
	nack, err := b.queue.Nack(ctx, &triagev1.NackRequest{Namespace: "default", Nacks: []*triagev1.NackItem{
		{Id: got[1].Id, LeaseToken: got[1].LeaseToken, Delay: durationpb.New(0)}}})
	require.NoError(t, err)
	require.True(t, nack.Results[0].Ok)

	// held: one item under a running lease.
	enq("held", &triagev1.NewItem{Payload: []byte("h")})
	require.Len(t, deq("held", 1, time.Minute), 1)

	// expire: leased twice with a lease that lapses; max_attempts 2, so
	// the next read dead-letters it. Then redrive it.
	enq("expire", &triagev1.NewItem{Payload: []byte("x")})
	require.Len(t, deq("expire", 1, 100*time.Millisecond), 1)
	require.Eventually(t, func() bool { return len(deq("expire", 1, 100*time.Millisecond)) == 1 }, 10*time.Second, 50*time.Millisecond)
	require.Eventually(t, func() bool {
		deq("expire", 1, 100*time.Millisecond)
		v, _ := value(scrape(t, b.metrics), "triage_dead_letters", lbl("namespace", "default", "topic", "expire"))
		return v == 1
	}, 10*time.Second, 100*time.Millisecond)
	red, err := b.queue.RedriveDeadLetters(ctx, &triagev1.RedriveDeadLettersRequest{Namespace: "default", Topic: "expire"})
	require.NoError(t, err)
	require.EqualValues(t, 1, red.Redriven)

	// A quota refusal: one item a second allowed, two sent at once.
	_, err = b.admin.PutNamespace(ctx, &triagev1.PutNamespaceRequest{Namespace: "limited", Config: &triagev1.Namespace{EnqueueRateLimit: 1, EnqueueBurst: 1}})
	require.NoError(t, err)
	admitted := 0 // on a slow machine a second may pass between two calls
	require.Eventually(t, func() bool {
		_, err := b.queue.Enqueue(ctx, &triagev1.EnqueueRequest{Namespace: "limited", Topic: "q", Items: []*triagev1.NewItem{{Payload: []byte("1")}}})
		if err == nil {
			admitted++
		}
		return status.Code(err) == codes.ResourceExhausted
	}, 5*time.Second, 50*time.Millisecond)

	// aged: one ready item nobody dequeues, at least a second old.
	enq("aged", &triagev1.NewItem{Payload: []byte("old"), Priority: 2})
	var fams map[string]*dto.MetricFamily
	require.Eventually(t, func() bool {
		fams = scrape(t, b.metrics)
		v, _ := value(fams, "triage_oldest_ready_age_seconds", lbl("namespace", "default", "topic", "aged", "band", "2"))
		return v >= 1
	}, 10*time.Second, 100*time.Millisecond)

	type sample struct {
		name   string
		labels map[string]string
		want   float64
	}
	ns := func(kv ...string) map[string]string { return lbl(append([]string{"namespace", "default"}, kv...)...) }
	for _, s := range []sample{
		{"triage_enqueued_items_total", ns("topic", "work", "band", "0"), 3},
		{"triage_enqueued_items_total", ns("topic", "work", "band", "4+"), 2},
		{"triage_enqueued_items_total", ns("topic", "work", "band", "1"), 1},
		{"triage_dequeued_items_total", ns("topic", "work", "band", "0"), 2},
		{"triage_dequeued_items_total", ns("topic", "held", "band", "0"), 1},
		{"triage_dequeued_items_total", ns("topic", "expire", "band", "0"), 2},
		{"triage_acks_total", ns("result", "ok"), 1},
		{"triage_acks_total", ns("result", "refused"), 1},
		{"triage_nacks_total", ns("result", "ok"), 1},
		{"triage_lease_expiries_total", ns("topic", "expire"), 2},
		{"triage_dead_lettered_items_total", ns("topic", "expire"), 1},
		{"triage_redriven_items_total", ns("topic", "expire"), 1},
		{"triage_quota_refusals_total", lbl("namespace", "limited", "reason", "rate"), 1},
		// work: of a, b, c in band 0 one was acked, one nacked (ready
		// again) and one never delivered; d and e ready in 4+; one
		// delayed in band 1.
		{"triage_items", ns("topic", "work", "band", "0", "state", "ready"), 2},
		{"triage_items", ns("topic", "work", "band", "0", "state", "leased"), 0},
		{"triage_items", ns("topic", "work", "band", "4+", "state", "ready"), 2},
		{"triage_items", ns("topic", "work", "band", "1", "state", "delayed"), 1},
		{"triage_items", ns("topic", "work", "band", "1", "state", "ready"), 0},
		{"triage_items", ns("topic", "held", "band", "0", "state", "leased"), 1},
		{"triage_items", ns("topic", "expire", "band", "0", "state", "ready"), 1},
		{"triage_dead_letters", ns("topic", "expire"), 0},
		// Histograms: counts of calls and deliveries. First deliveries:
		// two of work, held, expire.
		{"triage_enqueue_to_delivery_seconds", ns(), 4},
		{"triage_delivery_attempts", ns(), 5},
		{"triage_ack_duration_seconds", ns(), 1},
		{"triage_nack_duration_seconds", ns(), 1},
		{"triage_enqueue_duration_seconds", ns("durability", "committed"), 5}, // calls
		// RPC metrics from the go-grpc-middleware provider.
		{"grpc_server_handled_total", lbl("grpc_method", "Ack", "grpc_code", "OK"), 1},
		{"grpc_server_handled_total", lbl("grpc_method", "RedriveDeadLetters", "grpc_code", "OK"), 1},
		{"triage_shard_epoch", lbl("shard", "1"), 0},
		{"triage_shard_fenced", lbl("shard", "2"), 0},
	} {
		v, ok := value(fams, s.name, s.labels)
		if !ok || v != s.want {
			for _, m := range fams[s.name].GetMetric() {
				t.Logf("%v", m)
			}
		}
		require.True(t, ok, "%s%v missing", s.name, s.labels)
		require.Equal(t, s.want, v, "%s%v", s.name, s.labels)
	}
	// Every committed item was inserted by the enqueuer: 6 work, held,
	// expire, aged, and the "limited" items admitted.
	require.Equal(t, float64(9+admitted), sum(fams, "triage_enqueuer_inserted_items_total", nil))
	// Every delivery was a prefetch hit or miss.
	require.Equal(t, 5.0, sum(fams, "triage_prefetch_items_total", nil))
	v, ok := value(fams, "triage_shard_primary_up", lbl("shard", "1"))
	require.True(t, ok)
	require.Equal(t, 1.0, v)
	for _, name := range []string{"triage_enqueue_buffer_messages", "triage_dequeue_duration_seconds", "triage_shardmap_version", "go_goroutines"} {
		require.Contains(t, fams, name)
	}
	// The Grafana dashboard asks only for metrics that exist: those this
	// one-region bed without replicas or failovers cannot show are listed.
	dash, err := os.ReadFile("../deploy/grafana/triage.json")
	require.NoError(t, err)
	absent := map[string]bool{"triage_shard_replication_lag_seconds": true, "triage_shard_semisync_on": true,
		"triage_shard_semisync_clients": true, "triage_failovers_total": true, "triage_failover_phase_duration_seconds": true}
	names := regexp.MustCompile(`\b(triage|grpc)_[a-z_]+`).FindAllString(string(dash), -1)
	require.NotEmpty(t, names)
	for _, name := range names {
		name = strings.TrimSuffix(name, "_bucket")
		if strings.HasPrefix(name, "grpc_") && !strings.HasPrefix(name, "grpc_server_") {
			continue // a label (grpc_method, grpc_code)
		}
		if !absent[name] {
			_, ok := fams[name]
			require.True(t, ok, "deploy/grafana/triage.json asks for %s, which /metrics lacks", name)
		}
	}
}

// TestMetricsOnlyOnTheMetricsListener: the router's public HTTP listener
// answers /metrics with 404 and names no namespace, topic or shard primary
// there, while it still answers the probes and the console to anyone; the
// metrics listener serves them all, triage_shard_primary_info included.
func TestMetricsOnlyOnTheMetricsListener(t *testing.T) {
	t.Parallel()
	b := setup(t, bedOpts{shards: 1})
	_, err := b.queue.Enqueue(b.ctx(), &triagev1.EnqueueRequest{Namespace: "other", Topic: "payroll-runs",
		Items: []*triagev1.NewItem{{Payload: []byte("x")}}})
	require.NoError(t, err)
	primary := b.node.ShardMap().Shards[0].Primary
	get := func(url string) (int, string) {
		resp, err := http.Get(url)
		require.NoError(t, err)
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(body)
	}

	require.Eventually(t, func() bool {
		code, body := get(b.metrics + "/metrics")
		return code == http.StatusOK && strings.Contains(body, `namespace="other",topic="payroll-runs"`) &&
			strings.Contains(body, "triage_shard_primary_info") && strings.Contains(body, primary)
	}, 10*time.Second, 50*time.Millisecond, "the metrics listener serves the queue's metrics")

	for _, path := range []string{"/metrics", "/metrics/", "/metrics?format=text"} {
		code, body := get(b.http + path)
		require.Equal(t, http.StatusNotFound, code, path)
		for _, secret := range []string{"payroll-runs", `"other"`, primary, "triage_"} {
			require.NotContains(t, body, secret, path)
		}
	}
	require.Eventually(t, func() bool { code, _ := get(b.http + "/readyz"); return code == http.StatusOK }, 10*time.Second, 50*time.Millisecond)
	for _, path := range []string{"/livez", "/healthz", "/console/", node.OpenAPIPath} {
		code, _ := get(b.http + path)
		require.Equal(t, http.StatusOK, code, path)
	}
	_, doc := get(b.http + node.OpenAPIPath)
	var openAPI map[string]any
	require.NoError(t, json.Unmarshal([]byte(doc), &openAPI))
	require.Equal(t, "2.0", openAPI["swagger"])
}

// TestTopicLabelsAreCapped: past MaxTopicLabels a namespace's topics add
// up under "_other".
func TestTopicLabelsAreCapped(t *testing.T) {
	t.Parallel()
	b := setup(t, bedOpts{noNode: true})
	b.startNode(node.Config{MaxTopicLabels: 2})
	for i := range 4 {
		_, err := b.queue.Enqueue(b.ctx(), &triagev1.EnqueueRequest{Namespace: "default", Topic: fmt.Sprintf("t%d", i),
			Items: []*triagev1.NewItem{{Payload: []byte("x")}}})
		require.NoError(t, err)
	}
	fams := scrape(t, b.metrics)
	for _, topic := range []string{"t0", "t1"} {
		v, _ := value(fams, "triage_enqueued_items_total", lbl("namespace", "default", "topic", topic, "band", "0"))
		require.Equal(t, 1.0, v, topic)
	}
	v, _ := value(fams, "triage_enqueued_items_total", lbl("namespace", "default", "topic", "_other", "band", "0"))
	require.Equal(t, 2.0, v)
	_, ok := value(fams, "triage_enqueued_items_total", lbl("topic", "t2"))
	require.False(t, ok)
}

// TestReadinessFollowsDependencies: /readyz and gRPC health say
// NOT_SERVING while a shard primary or NATS is down, and SERVING again
// once it is back; /livez stays ok throughout.
func TestReadinessFollowsDependencies(t *testing.T) {
	t.Parallel()
	// Shard 1 on the package's server, shard 2 on a server of its own,
	// which the test stops.
	own := mariadbtest.NewServer(t)
	require.NoError(t, own.CreateDatabase(t.Context(), "triage"))
	b := &bed{region: newRegion(t, regionOpts{shards: 1, namespaces: []shardmap.Namespace{{Name: "default"}},
		more: []shardmap.Shard{{ID: 2, HomeRegion: "us-east", Primary: own.Addr(), Database: "triage"}}})}
	n := b.startNode(node.Config{})

	conn, err := grpc.NewClient(n.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	hc := healthpb.NewHealthClient(conn)
	ready := func(want bool) {
		t.Helper()
		wantStatus, wantCode := healthpb.HealthCheckResponse_SERVING, http.StatusOK
		if !want {
			wantStatus, wantCode = healthpb.HealthCheckResponse_NOT_SERVING, http.StatusServiceUnavailable
		}
		require.Eventually(t, func() bool {
			resp, err := hc.Check(b.ctx(), &healthpb.HealthCheckRequest{Service: "triage.v1.Queue"})
			if err != nil || resp.Status != wantStatus {
				return false
			}
			r, err := http.Get(b.http + "/readyz")
			if err != nil {
				return false
			}
			body, _ := io.ReadAll(r.Body)
			r.Body.Close()
			t.Logf("/readyz: %d %s", r.StatusCode, strings.TrimSpace(string(body)))
			return r.StatusCode == wantCode
		}, 30*time.Second, 100*time.Millisecond)
		r, err := http.Get(b.http + "/livez")
		require.NoError(t, err)
		r.Body.Close()
		require.Equal(t, http.StatusOK, r.StatusCode)
	}
	ready(true)

	// A shard primary stops, then comes back on the same data and port.
	require.NoError(t, own.Stop())
	ready(false)
	// The reason names the primary: the metrics listener's /readyz says
	// it, the public one does not.
	reason := func(base string) string {
		r, err := http.Get(base + "/readyz")
		require.NoError(t, err)
		defer r.Body.Close()
		body, _ := io.ReadAll(r.Body)
		return string(body)
	}
	require.Eventually(t, func() bool { return strings.Contains(reason(b.metrics), own.Addr()) }, 10*time.Second, 50*time.Millisecond)
	require.NotContains(t, reason(b.http), own.Addr())
	require.Contains(t, reason(b.http), "not ready")
	restarted, err := mariadb.Start(t.Context(), own.Config())
	require.NoError(t, err)
	t.Cleanup(func() { _ = restarted.Stop() })
	ready(true)

	// NATS stops, then comes back on the same port and store.
	b.stopNATS()
	ready(false)
	b.startNATS()
	ready(true)
}
