package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	localbed "github.com/triage-queue/triage/deploy/bed"
	"github.com/triage-queue/triage/deploy/drill"
)

// RTO bounds the drills assert: fault to the first enqueue and the first
// dequeue (with its ack) of the faulted shard through every surviving
// router.
//
// Primary-kill, region-down and partition assert issue 8's targets: 5 s,
// 10 s and 10 s. On the process bed (2 cores, -race, the drills alone) they
// measured 2.9-3.1 s, 5.0-7.4 s and 5.2-7.6 s in the runs of 2026-11-24,
// after nats-server's Raft timing was tuned (cmd/triage/natsserver: a dead
// stream leader is replaced within 1.5-3.5 s instead of 4-9 s), the
// controller's history read stopped holding the failover lock (a CI run
// failed region-down at 15.5 s before that) and a map watch that does not
// start or go live is restarted (partition reached 10.35 s before). A
// partition's spread is the controller leadership move: when the leader
// is in the cut region, the next one takes the lease 3-3.5 s after the
// cut (LeaseTTL after the last renewal), and detection, the failover and
// the clients take 2-2.5 s more.
//
// The compose bed keeps bounds of its own, about twice what it measured:
// timed honestly (from the kill's request, see deploy/compose) its
// primary-kill took 5.1-6.9 s and its partition 10.6-15.1 s, with 31
// containers on the 2 cores, every controller step a WAN round trip and a
// cut that times out rather than refuses (Detect, not DetectRefused); see
// deploy/compose/README.md. The safety assertions (nothing lost, nothing
// resurrected after ack, no nack undone, no isolated write after
// publication) are exact.
const (
	primaryKillRTO        = 5 * time.Second
	composePrimaryKillRTO = 15 * time.Second
	composePartitionRTO   = 20 * time.Second
	regionDownRTO         = 10 * time.Second
	partitionRTO          = 10 * time.Second
)

// logTail is how many lines of the bed's log a failing test prints.
const logTail = 150

// multiBed runs `triage-bed up --multi-region` as a user would and stops
// it at cleanup with `triage-bed down`. Its output (log level info) goes to
// bed.log in the test's artifact directory (kept with go test -artifacts);
// a failing test prints its tail.
func multiBed(t *testing.T) string {
	t.Helper()
	_, bedBinary := binaries(t)
	dir := t.TempDir()
	logPath := filepath.Join(t.ArtifactDir(), "bed.log")
	logf, err := os.Create(logPath)
	require.NoError(t, err)
	// Free ports: the developer's own bed may be running on the defaults.
	up := exec.Command(bedBinary, "up", "--multi-region", "--free-ports", "--log-level", "info", "--dir", dir)
	up.Stdout, up.Stderr = logf, logf
	require.NoError(t, up.Start())
	done := make(chan struct{})
	go func() { _ = up.Wait(); logf.Close(); close(done) }()
	t.Cleanup(func() {
		down := exec.Command(bedBinary, "down", "--dir", dir)
		_ = down.Run()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = up.Process.Signal(syscall.SIGKILL)
			<-done
		}
		if t.Failed() {
			t.Logf("--- last %d lines of the bed's log (%s) ---\n%s", logTail, logPath, tail(logPath, logTail, ""))
			// The failover controllers' lines apart: a failing run's last
			// lines are mostly one role's warnings, repeated.
			t.Logf("--- last %d controller lines of the bed's log ---\n%s", logTail, tail(logPath, logTail, "role=controller"))
		}
	})
	deadline := time.Now().Add(2 * time.Minute)
	for {
		if _, err := localbed.ReadLayout(dir); err == nil {
			return dir
		}
		select {
		case <-done:
			t.Fatalf("triage-bed up exited")
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("the bed did not come up within 2 minutes")
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// tail returns the last n lines of the file at path that contain with
// ("" for all).
func tail(path string, n int, with string) string {
	f, err := os.Open(path)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		if !strings.Contains(sc.Text(), with) {
			continue
		}
		lines = append(lines, sc.Text())
		if len(lines) > 2*n {
			lines = append(lines[:0], lines[len(lines)-n:]...)
		}
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// runDrill runs `triage-bed drill --json` with bed, the flags that name
// the bed and the region to fault (--dir DIR --region R, or --bed compose
// --project P --region R). The drill's report (JSON and human), its
// progress and exit status are written to the artifact directory; when
// the test fails, the report and the progress are printed. The drill gets
// a deadline well inside the test's, so a hung drill is killed and
// reported instead of the whole test binary timing out with nothing
// printed.
func runDrill(t *testing.T, scenario string, hold time.Duration, bed ...string) *drill.Report {
	t.Helper()
	_, bedBinary := binaries(t)
	limit := time.Now().Add(4 * time.Minute)
	if d, ok := t.Deadline(); ok && d.Add(-time.Minute).Before(limit) {
		limit = d.Add(-time.Minute)
	}
	ctx, cancel := context.WithDeadline(context.Background(), limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, bedBinary, append(append([]string{"drill"}, bed...), "--hold", hold.String(),
		"--drain", "30s", "--json", scenario)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	runErr := cmd.Run()
	art := t.ArtifactDir()
	_ = os.WriteFile(filepath.Join(art, "drill-"+scenario+".json"), stdout.Bytes(), 0o644)
	_ = os.WriteFile(filepath.Join(art, "drill-"+scenario+".progress"), stderr.Bytes(), 0o644)
	var rep drill.Report
	jsonErr := json.Unmarshal(stdout.Bytes(), &rep)
	var human bytes.Buffer
	if jsonErr == nil {
		rep.Print(&human)
		_ = os.WriteFile(filepath.Join(art, "drill-"+scenario+".txt"), human.Bytes(), 0o644)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("--- drill %s (took %s, exit: %v) progress ---\n%s", scenario, time.Since(start).Round(time.Second), runErr, stderr.String())
			if jsonErr == nil {
				t.Logf("--- drill %s report ---\n%s", scenario, human.String())
			} else {
				t.Logf("--- drill %s stdout (not a report: %v) ---\n%s", scenario, jsonErr, stdout.String())
			}
		}
	})
	require.NoError(t, ctx.Err(), "the drill did not finish by %s", limit.Format(time.TimeOnly))
	require.NoError(t, jsonErr, "the drill printed no report")
	t.Logf("%s (%s): %s", scenario, time.Since(start).Round(time.Second), summary(&rep))
	return &rep
}

// summary is the report's figures on one line, logged by every run.
func summary(r *drill.Report) string {
	s := fmt.Sprintf("RTO dequeue %d ms, enqueue %d ms (by router %v), failover published at %d ms; acknowledged %d, lost %d, "+
		"resurrected after ack %d (items %d), nacks undone %d, early %d, duplicates %v, inversions %d, old primary: %s",
		r.DequeueRTOMS, r.EnqueueRTOMS, r.RTOByRouter, r.FailoverMS, r.Acknowledged, r.Lost,
		r.ResurrectedAfterAck, r.ResurrectedItems, r.NacksUndone, r.EarlyDeliveries, r.Duplicates, r.PriorityInversions, r.OldPrimary)
	if len(r.FailoverSteps) > 0 {
		var steps []string
		for _, st := range r.FailoverSteps {
			steps = append(steps, fmt.Sprintf("%d ms s%d %s (%s)", st.AtMS, st.Shard, st.Step, st.Details))
		}
		s += "; failover steps: " + strings.Join(steps, ", ")
	} else if r.FailoverStepsError != "" {
		s += "; failover steps unavailable: " + r.FailoverStepsError
	}
	if i := r.Isolated; i != nil {
		s += fmt.Sprintf("; isolated %s acknowledged %d writes after publication (enqueues %d, acks %d, nacks %d; %d deliveries), "+
			"%d sent after the cut (%+v)", i.Region, i.Total(), i.Enqueues, i.Acks, i.Nacks, i.Deliveries, i.SentAfterCut.Total(), i.SentAfterCut)
	}
	return s
}

// checkDrill asserts what every failover drill must show. Each figure is
// its own assertion, so one run reports every one that is off.
func checkDrill(t *testing.T, rep *drill.Report, rtoBound time.Duration) {
	t.Helper()
	assert.Zero(t, rep.Lost, "acknowledged items lost: %v", rep.LostIDs)
	assert.Zero(t, rep.ResurrectedAfterAck, "deliveries after an ack answered ok: %v", rep.ResurrectedExamples)
	assert.Zero(t, rep.NacksUndone, "nacks answered ok and undone: %v", rep.NacksUndoneExamples)
	assert.Zero(t, rep.EarlyDeliveries, "early deliveries: %v", rep.EarlyExamples)
	assert.Positive(t, rep.Acknowledged)
	assert.Positive(t, rep.AcksOK)
	assert.GreaterOrEqual(t, rep.Delivered, rep.Acknowledged)
	assert.GreaterOrEqual(t, rep.FailoverMS, int64(0), "no new primary was published during the fault")
	for name, ms := range map[string]int64{"dequeue": rep.DequeueRTOMS, "enqueue": rep.EnqueueRTOMS} {
		if assert.GreaterOrEqual(t, ms, int64(0), "%s never resumed through a surviving router (by router: %v)", name, rep.RTOByRouter) {
			assert.LessOrEqual(t, time.Duration(ms)*time.Millisecond, rtoBound, "%s RTO (by router: %v)", name, rep.RTOByRouter)
		}
	}
	assert.NotEqual(t, rep.MapBefore, rep.MapAfter, "the shard failed over")
	assert.Contains(t, rep.OldPrimary, "rejoined as a read-only replica")
	assert.Empty(t, rep.HealError, "the bed could not heal the fault")
	assert.Empty(t, rep.Violations)
}

// TestDrillPrimaryKill: kill -9 of a shard primary on the three-region
// bed, with clients on all three routers; the shard fails over to its
// replica in another region within 5 s for enqueues and dequeues, no
// acknowledged item is lost, no ack or nack is undone, and the old primary
// rejoins as a replica.
func TestDrillPrimaryKill(t *testing.T) {
	checkDrill(t, runDrill(t, "primary-kill", 10*time.Second, "--dir", multiBed(t), "--region", "us-east"), primaryKillRTO)
}

// TestDrillRegionDown: every process of us-east dies; its shard fails over
// and other regions' enqueuers and dequeuers adopt its work within 10 s.
// The fault is held 20 s: when the controller leader dies with the region,
// a new one is elected after the leader lease before detection starts.
func TestDrillRegionDown(t *testing.T) {
	checkDrill(t, runDrill(t, "region-down", 20*time.Second, "--dir", multiBed(t), "--region", "us-east"), regionDownRTO)
}
