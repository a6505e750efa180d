package e2e

import (
	"context"
	"database/sql"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	localbed "github.com/triage-queue/triage/deploy/bed"
	"github.com/triage-queue/triage/deploy/drill"
	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
)

// TestPartitionedOldPrimaryAcceptsNoWriteAfterFailover cuts us-east off
// while its router keeps sending writes for its shard. The majority side
// fails the shard over to eu-west. From the moment the new primary is
// published, the old primary (still running, in the partition) must not
// accept a single write: its binary log position stays where it was.
func TestPartitionedOldPrimaryAcceptsNoWriteAfterFailover(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	b, err := localbed.Start(ctx, localbed.Config{Dir: t.TempDir(), Regions: localbed.DefaultRegions, NATSPort: -1,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	defer b.Stop()
	l := b.Layout
	dial := func(addr string) triagev1.QueueClient {
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		require.NoError(t, err)
		t.Cleanup(func() { conn.Close() })
		return triagev1.NewQueueClient(conn)
	}
	east, west := dial(l.Regions[0].GRPC), l.Regions[1].GRPC
	conn, err := grpc.NewClient(west, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	admin := triagev1.NewAdminClient(conn)

	old := b.Server(1, "primary")
	cfg := mysql.NewConfig()
	cfg.User, cfg.Net, cfg.Addr = "root", "tcp", old.Addr() // direct, not through the WAN links
	root, err := sql.Open("mysql", cfg.FormatDSN())
	require.NoError(t, err)
	defer root.Close()
	binlogPos := func() string {
		var pos string
		require.NoError(t, root.QueryRow("SELECT @@gtid_binlog_pos").Scan(&pos))
		return pos
	}

	// Writers inside the partition: enqueues for us-east through us-east's
	// own router, as fast as it answers.
	var acked, refused atomic.Int64
	wctx, stopWriters := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for wctx.Err() == nil {
				rctx, cancel := context.WithTimeout(wctx, 3*time.Second)
				_, err := east.Enqueue(rctx, &triagev1.EnqueueRequest{Namespace: "default", Topic: "split", Region: "us-east",
					Items: []*triagev1.NewItem{{Payload: []byte("x")}}})
				cancel()
				if err == nil {
					acked.Add(1)
				} else {
					refused.Add(1)
					time.Sleep(50 * time.Millisecond)
				}
			}
		})
	}
	require.Eventually(t, func() bool { return acked.Load() > 10 }, time.Minute, 50*time.Millisecond)
	require.NoError(t, b.Cut("us-east"))
	cutAt := time.Now()

	// The majority publishes a new primary for shard 1.
	var newPrimary string
	require.Eventually(t, func() bool {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		m, err := admin.GetShardMap(rctx, &triagev1.GetShardMapRequest{})
		if err != nil {
			return false
		}
		for _, s := range m.Shards {
			if s.Id == 1 && s.Primary != old.Addr() && !s.Fenced {
				newPrimary = s.Primary
				return true
			}
		}
		return false
	}, 60*time.Second, 100*time.Millisecond)
	published := time.Now()
	atPublish := binlogPos()
	ackedAtPublish := acked.Load()
	t.Logf("new primary %s published %s after the cut; old primary at %s; %d enqueues acknowledged in the partition so far",
		newPrimary, published.Sub(cutAt).Round(time.Millisecond), atPublish, ackedAtPublish)

	// The partition holds; the writers keep trying.
	time.Sleep(8 * time.Second)
	require.Equal(t, atPublish, binlogPos(), "the old primary accepted a write after the new primary was published")
	require.Equal(t, ackedAtPublish, acked.Load(), "an enqueue was acknowledged inside the partition after the failover")
	require.Positive(t, refused.Load())
	stopWriters()
	wg.Wait()
}

// TestDrillPartition cuts every cross-region link of us-east for 25 s
// (as in the run that found acks undone: fault 5 s into the run, healed 25 s
// later)
// while producers and consumers run on all three routers, us-east's own
// included, all with region preference us-east; the links are healed
// before the drain. No acknowledged item may be lost, no item acked ok may
// be delivered again, and us-east's router, which can reach only the old
// primary while cut off, must not acknowledge a single enqueue, ack or
// nack after the new primary is published.
func TestDrillPartition(t *testing.T) {
	checkPartition(t, runDrill(t, "partition", 25*time.Second, "--dir", multiBed(t), "--region", "us-east"), partitionRTO)
}

// checkPartition asserts what checkDrill does, with rtoBound, and that the
// cut-off region acknowledged nothing after the new primary was published.
func checkPartition(t *testing.T, rep *drill.Report, rtoBound time.Duration) {
	t.Helper()
	require.NotNil(t, rep.Isolated, "the partition drill counts the isolated side's writes")
	assert.GreaterOrEqual(t, rep.Isolated.PublishedMS, int64(0), "no new primary was published while %s was cut off: nothing checked", rep.Isolated.Region)
	assert.Zero(t, rep.Isolated.Total(), "writes %s acknowledged after the new primary was published: %v", rep.Isolated.Region, rep.Isolated.Examples)
	checkDrill(t, rep, rtoBound)
}
