package regions

import (
	"context"
	"database/sql"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/triage-queue/triage/deploy/mariadb"
	"github.com/triage-queue/triage/regions/replication"
)

// TestRepeatedPrimaryKills kills the shard's primary again and again under
// a steady write load, bringing each killed server back with RejoinArgs as
// the beds do: every failover must publish a new primary, every write
// answered ok must be on the last primary, and at the end both other
// servers must acknowledge it again. Failovers here meet deposed
// primaries that have not rejoined yet (promoting one, or writing the
// epoch there, forks the shard's history) and replicas that received more
// than the candidate has applied (repointed too early, they stop for good
// on error 1236).
func TestRepeatedPrimaryKills(t *testing.T) {
	t.Parallel()
	c := setup(t, func(cfg *Config) { cfg.Cooldown = time.Millisecond })
	ctx := t.Context()
	servers := map[string]*mariadb.Server{}
	var smu sync.Mutex
	for _, s := range []*mariadb.Server{c.primary, c.replica, c.replica2} {
		servers[s.Addr()] = s
	}
	dbs := map[string]*sql.DB{}
	for addr := range servers {
		dbs[addr] = appDB(t, addr)
	}

	// The writer inserts ids in order into whatever primary the map names
	// and keeps those answered ok.
	var acked []int
	var amu sync.Mutex
	wctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		for id := 1; wctx.Err() == nil; id++ {
			s, _ := c.maps.Current().Shard(1)
			if s.Fenced {
				time.Sleep(20 * time.Millisecond)
				id--
				continue
			}
			ictx, cancel := context.WithTimeout(wctx, 3*time.Second)
			_, err := dbs[s.Primary].ExecContext(ictx, "INSERT INTO t VALUES (?)", id)
			cancel()
			if err == nil {
				amu.Lock()
				acked = append(acked, id)
				amu.Unlock()
			}
		}
	})

	// Each killed server comes back 0-3 s after its failover was
	// published, and the next kill follows a second after publication:
	// failovers meet deposed primaries that are still down, restarted but
	// not rejoined yet, or rejoining.
	const kills = 16
	var restarts sync.WaitGroup
	for i := range kills {
		before, _ := c.maps.Current().Shard(1)
		smu.Lock()
		victim := servers[before.Primary]
		smu.Unlock()
		require.NoError(t, victim.Kill())
		<-victim.Wait()
		require.Eventually(t, func() bool {
			s, _ := c.maps.Current().Shard(1)
			return s.Primary != before.Primary && !s.Fenced
		}, 45*time.Second, 50*time.Millisecond, "kill %d: a new primary is published; events: %+v", i, c.ctl.Events())
		cfg := victim.Config()
		cfg.ExtraArgs = append(cfg.ExtraArgs, replication.RejoinArgs()...)
		restarts.Go(func() {
			time.Sleep(time.Duration(i%4) * time.Second)
			back, err := mariadb.Start(ctx, cfg)
			if err != nil {
				t.Errorf("kill %d: restart %s: %v", i, before.Primary, err)
				return
			}
			t.Cleanup(func() { _ = back.Stop() })
			smu.Lock()
			servers[before.Primary] = back
			smu.Unlock()
		})
		time.Sleep(time.Second)
		after, _ := c.maps.Current().Shard(1)
		t.Logf("kill %d: %s -> %s", i, before.Primary, after.Primary)
		smu.Lock()
		logStatuses(t, servers)
		smu.Unlock()
	}
	restarts.Wait()
	stop()
	wg.Wait()

	s, _ := c.maps.Current().Shard(1)
	var ids []int
	rows, err := dbs[s.Primary].QueryContext(ctx, "SELECT id FROM t")
	require.NoError(t, err)
	for rows.Next() {
		var id int
		require.NoError(t, rows.Scan(&id))
		ids = append(ids, id)
	}
	require.NoError(t, rows.Err())
	have := map[int]bool{}
	for _, id := range ids {
		have[id] = true
	}
	amu.Lock()
	defer amu.Unlock()
	require.NotEmpty(t, acked)
	var lost []int
	for _, id := range acked {
		if !have[id] {
			lost = append(lost, id)
		}
	}
	require.Empty(t, lost, "every insert answered ok is on the last primary (%d acknowledged)", len(acked))
	require.True(t, waitBothAcknowledge(t, s.Primary), "both replicas acknowledge %s at the end; events: %+v", s.Primary, c.ctl.Events())
}

// logStatuses logs each server's replication state, for the story of a
// failure.
func logStatuses(t *testing.T, servers map[string]*mariadb.Server) {
	for addr, srv := range servers {
		a, err := replication.Open(srv.DSN("") + "&timeout=1s")
		if err != nil {
			continue
		}
		st, err := a.Status(t.Context())
		a.Close()
		if err != nil {
			t.Logf("  %s: %v", addr, err)
			continue
		}
		t.Logf("  %s: %s read_only %v current %s binlog %s slave %s io %s from %s io_errno %d", addr, st.Role, st.ReadOnly,
			st.CurrentPos, st.BinlogPos, st.SlavePos, st.IOPos, st.PrimaryAddr, st.LastIOErrno)
	}
}

// waitBothAcknowledge waits up to 30s for primary to have two semi-sync
// clients: both other servers replicate from it again.
func waitBothAcknowledge(t *testing.T, primary string) bool {
	a, err := replication.Open("root@tcp(" + primary + ")/?timeout=2s")
	require.NoError(t, err)
	defer a.Close()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		ss, err := a.SemiSyncStatus(ctx)
		cancel()
		if err == nil && ss.Clients == 2 {
			return true
		}
		time.Sleep(100 * time.Millisecond)
	}
	return false
}
