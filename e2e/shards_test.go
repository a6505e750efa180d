package e2e

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/triage-queue/triage/cmd/triage/node"
	"github.com/triage-queue/triage/deploy/mariadb/mariadbtest"
	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
	"github.com/triage-queue/triage/shardmap"
)

// TestShardsOnline grows and shrinks a namespace's shards under steady
// load through two router processes: it adds shard 3 (weight 3; items
// land on it within seconds), drains shard 2 (from both routers at once:
// one wins, one is refused) and retires it once it is empty. Every
// acknowledged enqueue is delivered exactly once (leases are long, so no
// lease expires), dedup keys enqueued before the change, also those on
// the drained shard, still answer with their first ID after it (also
// after their item was acked, within the dedup window), items on the
// draining shard are delivered in priority order with the others, and bad
// admin calls get their gRPC codes and change nothing.
func TestShardsOnline(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 2)
	// Shard 3 is a spare: a database the map does not name yet.
	spare, err := mysql.ParseDSN(mariadbtest.Database(t))
	require.NoError(t, err)
	require.NoError(t, c.app.Grant(t.Context(), spare.Addr, spare.DBName))
	// A short dedup window, so the drained shard's tombstones expire
	// within the test and it can be retired.
	m, err := shardmap.Parse(mustRead(t, c.mapFile))
	require.NoError(t, err)
	next, err := m.WithNamespace(shardmap.Namespace{Name: "default", DedupWindow: ms(3 * time.Second)})
	require.NoError(t, err)
	data, err := next.Marshal()
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(c.mapFile, data, 0o644))

	a := c.start("node-a", node.Config{Roles: []string{node.RoleRouter, node.RoleEnqueuer, node.RoleDequeuer}, DequeuerID: "us-east-a"})
	b := c.start("router-b", node.Config{Roles: []string{node.RoleRouter}})
	qs := []triagev1.QueueClient{c.client(a), c.client(b)}
	admins := []triagev1.AdminClient{c.admin(a), c.admin(b)}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	lease := durationpb.New(time.Minute)

	// Dedup keys and ordered items enqueued before any change.
	firstID := map[string]string{}
	for i := 0; i < 100; i++ {
		key := fmt.Sprintf("k%d", i)
		resp, err := qs[i%2].Enqueue(ctx, &triagev1.EnqueueRequest{Namespace: "default", Topic: "dedup",
			Items: []*triagev1.NewItem{{Payload: []byte(key), DedupKey: key}}})
		require.NoError(t, err)
		firstID[key] = resp.Results[0].Id
	}
	onShard2 := 0
	for _, id := range firstID {
		if strings.HasPrefix(id, "2-") {
			onShard2++
		}
	}
	require.Greater(t, onShard2, 10, "some dedup keys live on shard 2")
	for i := 0; i < 60; i++ {
		_, err := qs[i%2].Enqueue(ctx, &triagev1.EnqueueRequest{Namespace: "default", Topic: "order",
			Items: []*triagev1.NewItem{{Payload: []byte("o"), Priority: int32((i * 37) % 50)}}})
		require.NoError(t, err)
	}

	// Steady load on "work": producers through both routers, consumers
	// through both, acking at once.
	var (
		mu        sync.Mutex
		acked     = map[string]time.Time{} // id -> when acknowledged
		delivered = map[string]int{}
		stop      atomic.Bool
		enqErrs   atomic.Int64
		produced  atomic.Int64
	)
	var prodWG, consWG sync.WaitGroup
	for p := 0; p < 2; p++ {
		prodWG.Add(1)
		go func() {
			defer prodWG.Done()
			for n := 0; !stop.Load(); n++ {
				req := &triagev1.EnqueueRequest{Namespace: "default", Topic: "work"}
				for i := 0; i < 5; i++ {
					req.Items = append(req.Items, &triagev1.NewItem{Payload: []byte(fmt.Sprintf("p%d-%d-%d", p, n, i)), Priority: int32(i % 3)})
				}
				rctx, rcancel := context.WithTimeout(ctx, 15*time.Second)
				resp, err := qs[p].Enqueue(rctx, req)
				rcancel()
				if err != nil {
					enqErrs.Add(1)
					time.Sleep(20 * time.Millisecond)
					continue
				}
				now := time.Now()
				mu.Lock()
				for _, r := range resp.Results {
					acked[r.Id] = now
				}
				mu.Unlock()
				produced.Add(5)
				time.Sleep(10 * time.Millisecond)
			}
		}()
	}
	consume := func(q triagev1.QueueClient, topic string, until func() bool) {
		for !until() {
			rctx, rcancel := context.WithTimeout(ctx, 5*time.Second)
			resp, err := q.Dequeue(rctx, &triagev1.DequeueRequest{Namespace: "default",
				Topics: []*triagev1.TopicCount{{Topic: topic, Count: 20}}, LeaseDuration: lease, Wait: durationpb.New(200 * time.Millisecond)})
			rcancel()
			if err != nil || len(resp.Items) == 0 {
				continue
			}
			ack := &triagev1.AckRequest{Namespace: "default"}
			mu.Lock()
			for _, it := range resp.Items {
				delivered[it.Id]++
				ack.Acks = append(ack.Acks, &triagev1.LeaseRef{Id: it.Id, LeaseToken: it.LeaseToken})
			}
			mu.Unlock()
			rctx, rcancel = context.WithTimeout(ctx, 5*time.Second)
			_, err = q.Ack(rctx, ack)
			rcancel()
			require.NoError(t, err)
		}
	}
	for _, q := range qs {
		consWG.Add(1)
		go func() { defer consWG.Done(); consume(q, "work", stop.Load) }()
	}
	time.Sleep(2 * time.Second)

	// Bad input changes nothing.
	v0 := getMap(ctx, t, admins[0]).Version
	expectCode(t, codes.InvalidArgument, admins[0], func(ctx context.Context, a triagev1.AdminClient) error {
		_, err := a.AddShard(ctx, &triagev1.AddShardRequest{Shard: &triagev1.Shard{Id: 1, HomeRegion: "us-east", Primary: spare.Addr}})
		return err
	})
	expectCode(t, codes.InvalidArgument, admins[0], func(ctx context.Context, a triagev1.AdminClient) error {
		_, err := a.AddShard(ctx, &triagev1.AddShardRequest{Shard: &triagev1.Shard{Id: 3, HomeRegion: "mars", Primary: spare.Addr}})
		return err
	})
	expectCode(t, codes.InvalidArgument, admins[0], func(ctx context.Context, a triagev1.AdminClient) error {
		_, err := a.SetShardWeight(ctx, &triagev1.SetShardWeightRequest{Shard: 1, Weight: 0})
		return err
	})
	expectCode(t, codes.NotFound, admins[0], func(ctx context.Context, a triagev1.AdminClient) error {
		_, err := a.DrainShard(ctx, &triagev1.DrainShardRequest{Shard: 99})
		return err
	})
	expectCode(t, codes.FailedPrecondition, admins[0], func(ctx context.Context, a triagev1.AdminClient) error {
		_, err := a.RetireShard(ctx, &triagev1.RetireShardRequest{Shard: 1})
		return err
	})
	// A server the queue's SQL does not run on (this one reports MySQL
	// 8's version, as a MySQL server would) is refused, saying so.
	mysql8 := mariadbtest.NewServer(t, "--version=8.0.36")
	require.NoError(t, mysql8.CreateDatabase(ctx, "triage"))
	require.NoError(t, c.app.Grant(ctx, mysql8.Addr(), "triage"))
	expectCode(t, codes.FailedPrecondition, admins[0], func(ctx context.Context, a triagev1.AdminClient) error {
		_, err := a.AddShard(ctx, &triagev1.AddShardRequest{Shard: &triagev1.Shard{Id: 3, HomeRegion: "us-east", Primary: mysql8.Addr(), Database: "triage"}})
		require.ErrorContains(t, err, "the server is MySQL 8.0.36")
		require.ErrorContains(t, err, "Triage needs MariaDB 10.11 or later")
		return err
	})
	require.Equal(t, v0, getMap(ctx, t, admins[0]).Version, "refused changes publish nothing")

	// Add shard 3 with weight 3 through router b; items land on it within seconds.
	added := time.Now()
	_, err = admins[1].AddShard(ctx, &triagev1.AddShardRequest{Shard: &triagev1.Shard{Id: 3, HomeRegion: "us-east", Primary: spare.Addr, Database: spare.DBName, Weight: 3}})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		for id := range acked {
			if strings.HasPrefix(id, "3-") {
				return true
			}
		}
		return false
	}, 5*time.Second, 50*time.Millisecond, "no item landed on the new shard 3")
	t.Logf("first item on shard 3 within %s of AddShard", time.Since(added).Round(time.Millisecond))

	// Drain shard 2 from both routers at once: exactly one publishes it.
	var wins, refused atomic.Int32
	var dwg sync.WaitGroup
	for _, ad := range admins {
		dwg.Add(1)
		go func() {
			defer dwg.Done()
			_, err := ad.DrainShard(ctx, &triagev1.DrainShardRequest{Shard: 2})
			switch status.Code(err) {
			case codes.OK:
				wins.Add(1)
			case codes.FailedPrecondition:
				refused.Add(1)
			default:
				t.Errorf("drain: %v", err)
			}
		}()
	}
	dwg.Wait()
	require.Equal(t, int32(1), wins.Load())
	require.Equal(t, int32(1), refused.Load())
	drained := time.Now()

	// Dedup keys answer with their first ID after the change, through
	// either router, including the keys whose slot moved off shard 2.
	for i := 0; i < 100; i++ {
		key := fmt.Sprintf("k%d", i)
		resp, err := qs[(i+1)%2].Enqueue(ctx, &triagev1.EnqueueRequest{Namespace: "default", Topic: "dedup",
			Items: []*triagev1.NewItem{{Payload: []byte(key), DedupKey: key}}})
		require.NoError(t, err)
		require.True(t, resp.Results[0].Duplicate, key)
		require.Equal(t, firstID[key], resp.Results[0].Id, key)
	}
	// Priority order across shards, the draining one included.
	var prios []int32
	for len(prios) < 60 {
		resp, err := qs[0].Dequeue(ctx, &triagev1.DequeueRequest{Namespace: "default", Topics: []*triagev1.TopicCount{{Topic: "order", Count: 7}},
			LeaseDuration: lease, Wait: durationpb.New(time.Second)})
		require.NoError(t, err)
		ack := &triagev1.AckRequest{Namespace: "default"}
		for _, it := range resp.Items {
			prios = append(prios, it.Priority)
			ack.Acks = append(ack.Acks, &triagev1.LeaseRef{Id: it.Id, LeaseToken: it.LeaseToken})
		}
		require.NotEmpty(t, resp.Items)
		_, err = qs[0].Ack(ctx, ack)
		require.NoError(t, err)
	}
	for i := 1; i < len(prios); i++ {
		require.LessOrEqual(t, prios[i-1], prios[i], "priority order across shards: %v", prios)
	}
	// Consume the dedup topic; within the dedup window the keys still
	// answer with their first ID (tombstones, on shard 2 too).
	var dedupDone atomic.Int64
	var dmu sync.Mutex
	seen := map[string]bool{}
	for dedupDone.Load() < 100 {
		resp, err := qs[1].Dequeue(ctx, &triagev1.DequeueRequest{Namespace: "default", Topics: []*triagev1.TopicCount{{Topic: "dedup", Count: 50}},
			LeaseDuration: lease, Wait: durationpb.New(time.Second)})
		require.NoError(t, err)
		ack := &triagev1.AckRequest{Namespace: "default"}
		for _, it := range resp.Items {
			dmu.Lock()
			require.False(t, seen[it.Id], "dedup item delivered twice")
			seen[it.Id] = true
			dmu.Unlock()
			ack.Acks = append(ack.Acks, &triagev1.LeaseRef{Id: it.Id, LeaseToken: it.LeaseToken})
		}
		if len(ack.Acks) > 0 {
			_, err = qs[1].Ack(ctx, ack)
			require.NoError(t, err)
			dedupDone.Add(int64(len(ack.Acks)))
		}
	}
	for i := 0; i < 100; i += 7 {
		key := fmt.Sprintf("k%d", i)
		resp, err := qs[i%2].Enqueue(ctx, &triagev1.EnqueueRequest{Namespace: "default", Topic: "dedup",
			Items: []*triagev1.NewItem{{Payload: []byte(key), DedupKey: key}}})
		require.NoError(t, err)
		require.True(t, resp.Results[0].Duplicate, "%s within the dedup window after its ack", key)
		require.Equal(t, firstID[key], resp.Results[0].Id, key)
	}

	// Retire shard 2 once it allows it: FAILED_PRECONDITION until then.
	var notYet []string
	require.Eventually(t, func() bool {
		_, err := admins[0].RetireShard(ctx, &triagev1.RetireShardRequest{Shard: 2})
		if status.Code(err) == codes.FailedPrecondition {
			if len(notYet) == 0 || notYet[len(notYet)-1] != status.Convert(err).Message() {
				notYet = append(notYet, status.Convert(err).Message())
			}
			return false
		}
		require.NoError(t, err)
		return true
	}, 60*time.Second, 250*time.Millisecond, "retire refused with: %q", notYet)
	t.Logf("retire refused first with: %q", notYet)
	require.NotEmpty(t, notYet)
	// The other router serves the new version within a second (two on
	// these loaded cores with -race).
	require.Eventually(t, func() bool {
		for _, s := range getMap(ctx, t, admins[1]).Shards {
			if s.Id == 2 {
				return false
			}
		}
		return true
	}, 2*time.Second, 20*time.Millisecond, "shard 2 still in router b's map")
	// Load goes on two more seconds on shards 1 and 3, then stops.
	time.Sleep(2 * time.Second)
	stop.Store(true)
	prodWG.Wait()
	consWG.Wait()
	// Drain what is left.
	left := func() bool {
		mu.Lock()
		defer mu.Unlock()
		for id := range acked {
			if delivered[id] == 0 {
				return false
			}
		}
		return true
	}
	var doneWG sync.WaitGroup
	deadline := time.Now().Add(30 * time.Second)
	for _, q := range qs {
		doneWG.Add(1)
		go func() {
			defer doneWG.Done()
			consume(q, "work", func() bool { return left() || time.Now().After(deadline) })
		}()
	}
	doneWG.Wait()

	mu.Lock()
	defer mu.Unlock()
	var lost, dups, late2, on3 int
	for id, at := range acked {
		switch {
		case delivered[id] == 0:
			lost++
		case delivered[id] > 1:
			dups++
		}
		if strings.HasPrefix(id, "2-") && at.After(drained.Add(shardmap.DrainSettle)) {
			late2++
		}
		if strings.HasPrefix(id, "3-") {
			on3++
		}
	}
	t.Logf("produced %d (enqueue errors %d), on shard 3: %d, lost %d, duplicates %d", produced.Load(), enqErrs.Load(), on3, lost, dups)
	require.Zero(t, lost, "acknowledged items never delivered")
	require.Zero(t, dups, "items delivered twice with 1-minute leases")
	require.Zero(t, late2, "items acknowledged on shard 2 after its drain settled")
	require.Greater(t, on3, 0)
}

func (c *cluster) admin(p *proc) triagev1.AdminClient {
	conn, err := grpc.NewClient(p.grpc, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(c.t, err)
	c.t.Cleanup(func() { conn.Close() })
	return triagev1.NewAdminClient(conn)
}

func getMap(ctx context.Context, t *testing.T, a triagev1.AdminClient) *triagev1.ShardMap {
	m, err := a.GetShardMap(ctx, &triagev1.GetShardMapRequest{})
	require.NoError(t, err)
	return m
}

func expectCode(t *testing.T, want codes.Code, a triagev1.AdminClient, call func(context.Context, triagev1.AdminClient) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := call(ctx, a)
	require.Equal(t, want, status.Code(err), "%v", err)
	require.NotEmpty(t, status.Convert(err).Message())
}
