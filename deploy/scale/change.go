package scale

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/fieldmaskpb"

	triagev1 "github.com/triage-queue/triage/proto/triage/v1"
)

// namespaceTrials is how many namespace updates are timed.
const namespaceTrials = 3

// mapChanges times namespace updates and a shard add, each from the
// request until every node holds the map it made.
func (m *meter) mapChanges(ctx context.Context, rec *Record, opt Options) error {
	defer m.profile(ctx, opt, "change", 10*time.Second)()
	for i := range namespaceTrials {
		took, err := m.timeChange(ctx, func(ctx context.Context) error {
			_, err := m.admin.PutNamespace(ctx, &triagev1.PutNamespaceRequest{Namespace: NamespaceName(i),
				Config:     &triagev1.Namespace{MaxDepth: int64(1_000_000 + i)},
				UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"max_depth"}}})
			return err
		})
		if err != nil {
			return fmt.Errorf("namespace update: %w", err)
		}
		rec.NamespaceChangeMs = append(rec.NamespaceChangeMs, took)
	}
	s := m.b.Spare
	took, err := m.timeChange(ctx, func(ctx context.Context) error {
		_, err := m.admin.AddShard(ctx, &triagev1.AddShardRequest{Shard: &triagev1.Shard{Id: s.ID, HomeRegion: s.HomeRegion, Primary: s.Primary, Database: s.Database,
			Replicas: s.Replicas, ReplicaRegions: s.ReplicaRegions}})
		return err
	})
	if err != nil {
		return fmt.Errorf("add shard %d: %w", s.ID, err)
	}
	rec.AddShardMs = took
	m.b.spareAdded = true
	return nil
}

// timeChange runs change and returns the milliseconds from its start
// until every live node's /shardmap names a version past the one the
// router held before it.
func (m *meter) timeChange(ctx context.Context, change func(context.Context) error) (float64, error) {
	before, err := m.version(ctx, m.b.Nodes[0])
	if err != nil {
		return 0, err
	}
	start := time.Now()
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := change(cctx); err != nil {
		return 0, err
	}
	var mu sync.Mutex
	var slowest time.Duration
	var firstErr error
	var wg sync.WaitGroup
	for _, n := range m.b.Nodes {
		wg.Go(func() {
			for {
				v, err := m.version(cctx, n)
				if err == nil && v > before {
					break
				}
				if cctx.Err() != nil {
					mu.Lock()
					firstErr = fmt.Errorf("%s never held a map past version %d (last: %d, %v)", n.Name, before, v, err)
					mu.Unlock()
					return
				}
				time.Sleep(5 * time.Millisecond)
			}
			mu.Lock()
			slowest = max(slowest, time.Since(start))
			mu.Unlock()
		})
	}
	wg.Wait()
	return round1(float64(slowest.Microseconds()) / 1000), firstErr
}

// version is the map version node n holds.
func (m *meter) version(ctx context.Context, n *Node) (uint64, error) {
	body, err := get(ctx, "http://"+n.Metrics+"/shardmap")
	if err != nil {
		return 0, err
	}
	var v struct {
		Version uint64 `json:"version"`
	}
	return v.Version, json.Unmarshal(body, &v)
}
