package scale

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/triage-queue/triage/deploy/drill"
	"github.com/triage-queue/triage/deploy/mariadb"
	"github.com/triage-queue/triage/regions/replication"
	"github.com/triage-queue/triage/shardmap"
)

// Failover is the failover step of a bed with Config.Failover: a
// primary-kill drill (deploy/drill) of the server holding shard 1's
// primary, which is the primary of every shard of that server, run
// through Region's router while the map is watched.
type Failover struct {
	// Server is the killed mariadbd (host:port), Shards the number of
	// shards it was the primary of.
	Server string `json:"server"`
	Shards int    `json:"shards"`
	// NewPrimary is the server most of them were published on, Moved how
	// many were, and NewPrimaries how many servers they went to (1: the
	// group moved as one).
	NewPrimary   string `json:"new_primary"`
	Moved        int    `json:"moved"`
	NewPrimaries int    `json:"new_primaries"`
	// Seconds is from the kill until the last of Shards was published on
	// a new, unfenced primary; -1 if some never was during the drill.
	Seconds float64 `json:"seconds"`
	// From the drill's report (drill.Report): the acknowledged enqueues,
	// those never delivered (Lost), nacks and acks undone, early
	// deliveries, and the slowest router's RTO of enqueues and dequeues
	// on the killed server's shards (-1: never served again).
	Acknowledged int   `json:"acknowledged"`
	Lost         int   `json:"lost"`
	NacksUndone  int   `json:"nacks_undone"`
	AcksUndone   int   `json:"acks_undone"`
	Early        int   `json:"early"`
	EnqueueRTOMs int64 `json:"enqueue_rto_ms"`
	DequeueRTOMs int64 `json:"dequeue_rto_ms"`
	// Violations are the drill's broken invariants; OldPrimary what the
	// killed server became after its restart with the rejoin arguments.
	Violations []string `json:"violations,omitempty"`
	OldPrimary string   `json:"old_primary"`
	// After the drill, the stored map's view of shard 1: NewRegion is its
	// primary's region; Others its other replicas (neither the killed
	// server nor the new primary), each "ADDR (REGION): STATE", of which
	// Following replicate from the new primary, both threads running (the
	// controller repoints them); SemiSyncClients is the new primary's
	// connected semi-sync replicas (-1: unknown). Without one every
	// commit there waits: semi-sync never falls back to async.
	NewRegion       string   `json:"new_region"`
	Others          []string `json:"others"`
	Following       int      `json:"following"`
	SemiSyncClients int      `json:"semi_sync_clients"`
}

// failoverShard is the shard whose primary the drill kills: the lowest,
// on the first server, with the spare (added by the map-changes step).
const failoverShard = 1

// failover runs the primary-kill drill against the bed (Config.Failover
// only) and records the server's shards' moves and the drill's checks.
func (m *meter) failover(ctx context.Context, rec *Record, opt Options) error {
	before, err := m.storedMap(ctx)
	if err != nil {
		return err
	}
	s, ok := before.Shard(failoverShard)
	if !ok {
		return fmt.Errorf("shard %d is not in the map", failoverShard)
	}
	w, err := m.watchMoves(ctx, before, s.Primary)
	if err != nil {
		return err
	}
	fb := &failoverBed{m: m}
	rep, err := drill.Run(ctx, drill.Config{Scenario: "primary-kill", Bed: fb, Via: []string{Region}, Region: Region,
		Shard: failoverShard, Hold: opt.FailoverHold, Progress: lineWriter(func(l string) { m.b.progress("  drill: %s", l) })})
	moves := w.stop()
	if err != nil {
		return err
	}
	m.keepReport(rep)
	f := summarize(s.Primary, w.shards, moves, fb.killedAt())
	f.Acknowledged, f.Lost, f.NacksUndone, f.AcksUndone = rep.Acknowledged, rep.Lost, rep.NacksUndone, rep.ResurrectedAfterAck
	f.Early, f.EnqueueRTOMs, f.DequeueRTOMs = rep.EarlyDeliveries, rep.EnqueueRTOMS, rep.DequeueRTOMS
	f.Violations, f.OldPrimary = rep.Violations, rep.OldPrimary
	rec.Failover = f
	return m.settled(ctx, f)
}

// keepReport writes the drill's report beside the nodes' logs, as text
// (drill.txt: recovery per router, the failover's steps) and as JSON
// (drill.json): the record keeps only its totals.
func (m *meter) keepReport(rep *drill.Report) {
	var txt bytes.Buffer
	rep.Print(&txt)
	if err := os.WriteFile(filepath.Join(m.b.cfg.Dir, "drill.txt"), txt.Bytes(), 0o644); err != nil {
		m.b.progress("  drill report not kept: %v", err)
	}
	if b, err := json.MarshalIndent(rep, "", "  "); err == nil {
		_ = os.WriteFile(filepath.Join(m.b.cfg.Dir, "drill.json"), b, 0o644)
	}
}

// settled records, into f, what shard 1's new primary and its other
// replicas are after the drill, waiting up to 10 s for every other
// replica to follow the new primary and for a semi-sync replica to be
// connected to it.
func (m *meter) settled(ctx context.Context, f *Failover) error {
	sm, err := m.storedMap(ctx)
	if err != nil {
		return err
	}
	s, ok := sm.Shard(failoverShard)
	if !ok {
		return fmt.Errorf("shard %d is not in the map", failoverShard)
	}
	f.NewRegion = s.PrimaryRegion
	for deadline := time.Now().Add(10 * time.Second); ; {
		f.Others, f.Following = nil, 0
		for j, r := range s.Replicas {
			if r == f.Server {
				continue
			}
			state, follows := m.b.follows(ctx, r, s.Primary)
			f.Others = append(f.Others, fmt.Sprintf("%s (%s): %s", r, s.ReplicaRegions[min(j, len(s.ReplicaRegions)-1)], state))
			if follows {
				f.Following++
			}
		}
		f.SemiSyncClients = m.b.semiSyncClients(ctx, s.Primary)
		if f.Following == len(f.Others) && f.SemiSyncClients > 0 || time.Now().After(deadline) {
			return nil
		}
		if err := sleep(ctx, 500*time.Millisecond); err != nil {
			return err
		}
	}
}

// follows says what the bed's server at addr replicates from, and
// whether it replicates from primary with both threads running.
func (b *Bed) follows(ctx context.Context, addr, primary string) (string, bool) {
	slot := b.slotOf(addr)
	if slot == nil {
		return "no server of the bed", false
	}
	a, err := replication.Open((*slot).DSN(""))
	if err != nil {
		return err.Error(), false
	}
	defer a.Close()
	sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	st, err := a.Status(sctx)
	if err != nil {
		return err.Error(), false
	}
	state := fmt.Sprintf("replicates %q (IO %s, SQL running %v, read_only=%v)", st.PrimaryAddr, st.IORunning, st.SQLRunning, st.ReadOnly)
	return state, st.PrimaryAddr == primary && st.IOThreadRunning() && st.SQLRunning
}

// semiSyncClients is the number of semi-sync replicas connected to the
// bed's server at addr, -1 if it cannot be read.
func (b *Bed) semiSyncClients(ctx context.Context, addr string) int {
	slot := b.slotOf(addr)
	if slot == nil {
		return -1
	}
	a, err := replication.Open((*slot).DSN(""))
	if err != nil {
		return -1
	}
	defer a.Close()
	sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	ss, err := a.SemiSyncStatus(sctx)
	if err != nil {
		return -1
	}
	return ss.Clients
}

// move is a shard's first publish on a new, unfenced primary.
type move struct {
	to string
	at time.Time
}

// summarize counts the moves of the shards that were on server, killed
// at killed.
func summarize(server string, shards []uint32, moves map[uint32]move, killed time.Time) *Failover {
	f := &Failover{Server: server, Shards: len(shards), Seconds: -1}
	to := map[string]int{}
	var last time.Time
	for _, mv := range moves {
		to[mv.to]++
		if mv.at.After(last) {
			last = mv.at
		}
	}
	for addr, n := range to {
		if n > f.Moved {
			f.NewPrimary, f.Moved = addr, n
		}
	}
	f.NewPrimaries = len(to)
	if len(moves) == len(shards) && !killed.IsZero() {
		f.Seconds = round1(last.Sub(killed).Seconds()*10) / 10
	}
	return f
}

// storedMap is the map in the KV bucket.
func (m *meter) storedMap(ctx context.Context) (*shardmap.Map, error) {
	return shardmap.Load(ctx, m.kv)
}

// moveWatch records, per shard of a server, the first stored map that
// names another primary for it, unfenced.
type moveWatch struct {
	shards []uint32
	mu     sync.Mutex
	moves  map[uint32]move
	cancel context.CancelFunc
	done   chan struct{}
}

// watchMoves watches the stored map for the moves of the shards whose
// primary is server in m, from now until stop.
func (m *meter) watchMoves(ctx context.Context, before *shardmap.Map, server string) (*moveWatch, error) {
	w := &moveWatch{moves: map[uint32]move{}, done: make(chan struct{})}
	on := map[uint32]bool{}
	for _, s := range before.Shards {
		if s.Primary == server {
			w.shards = append(w.shards, s.ID)
			on[s.ID] = true
		}
	}
	ctx, w.cancel = context.WithCancel(ctx)
	kw, err := m.kv.Watch(ctx, shardmap.Key, jetstream.UpdatesOnly())
	if err != nil {
		w.cancel()
		return nil, err
	}
	go func() {
		defer close(w.done)
		defer func() { _ = kw.Stop() }()
		for e := range kw.Updates() {
			if e == nil || e.Operation() != jetstream.KeyValuePut {
				continue
			}
			at := time.Now()
			// The head alone: its shards are all this watch needs.
			var next struct {
				Shards []shardmap.Shard `json:"shards"`
			}
			if err := json.Unmarshal(e.Value(), &next); err != nil {
				continue
			}
			w.mu.Lock()
			for _, s := range next.Shards {
				if _, seen := w.moves[s.ID]; on[s.ID] && !seen && !s.Fenced && s.Primary != server {
					w.moves[s.ID] = move{to: s.Primary, at: at}
				}
			}
			w.mu.Unlock()
		}
	}()
	return w, nil
}

// stop ends the watch and returns the moves it saw.
func (w *moveWatch) stop() map[uint32]move {
	w.cancel()
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.moves
}

// lineWriter hands each line written to it to a function.
type lineWriter func(line string)

func (w lineWriter) Write(p []byte) (int, error) {
	for _, l := range strings.Split(strings.TrimRight(string(p), "\n"), "\n") {
		w(l)
	}
	return len(p), nil
}

// failoverBed is the scale bed as a drill.Bed, for primary-kill only:
// its router is Region's, and a kill takes the whole server down, with
// every shard database on it.
type failoverBed struct {
	m      *meter
	mu     sync.Mutex
	killed *mariadb.Server
	// slot is where the bed holds the killed server, for its restart.
	slot **mariadb.Server
	at   time.Time
}

var _ drill.Bed = (*failoverBed)(nil)

// Routers is Region's router: the replica regions have none.
func (fb *failoverBed) Routers(context.Context) ([]drill.Router, error) {
	return []drill.Router{{Region: Region, Addr: fb.m.b.Nodes[0].GRPC}}, nil
}

func (fb *failoverBed) killedAt() time.Time {
	fb.mu.Lock()
	defer fb.mu.Unlock()
	return fb.at
}

// primary is the stored map's primary of shard.
func (fb *failoverBed) primary(ctx context.Context, shard uint32) (string, error) {
	m, err := fb.m.storedMap(ctx)
	if err != nil {
		return "", err
	}
	s, ok := m.Shard(shard)
	if !ok {
		return "", fmt.Errorf("shard %d is not in the map", shard)
	}
	return s.Primary, nil
}

// slotOf is where the bed holds the server at addr, nil if none.
func (b *Bed) slotOf(addr string) **mariadb.Server {
	for _, list := range append([][]*mariadb.Server{b.servers}, b.replicas...) {
		for i, s := range list {
			if s != nil && s.Addr() == addr {
				return &list[i]
			}
		}
	}
	return nil
}

// Inject kills (SIGKILL) the mariadbd that is f.Shard's primary now.
func (fb *failoverBed) Inject(ctx context.Context, f drill.Fault) (drill.Injection, error) {
	if f.Scenario != "primary-kill" {
		return drill.Injection{}, fmt.Errorf("the scale bed injects primary-kill only, not %s", f.Scenario)
	}
	addr, err := fb.primary(ctx, f.Shard)
	if err != nil {
		return drill.Injection{}, err
	}
	slot := fb.m.b.slotOf(addr)
	if slot == nil {
		return drill.Injection{}, fmt.Errorf("shard %d's primary %s is no server of the bed", f.Shard, addr)
	}
	s := *slot
	fb.mu.Lock()
	fb.killed, fb.slot, fb.at = s, slot, time.Now()
	fb.mu.Unlock()
	if err := s.Kill(); err != nil {
		return drill.Injection{}, err
	}
	return drill.Injection{At: fb.killedAt(), Description: fmt.Sprintf("SIGKILL of mariadbd pid %d (%s), shard %d's primary and its server's other shards'",
		s.PID(), addr, f.Shard)}, nil
}

// Heal restarts the killed server: with replication.RejoinArgs when the
// shard failed over, so crash recovery drops what no replica acknowledged
// and the controller rejoins it as a replica; as the primary again, semi-
// sync on, when it did not.
func (fb *failoverBed) Heal(ctx context.Context, f drill.Fault) (string, error) {
	fb.mu.Lock()
	killed, slot := fb.killed, fb.slot
	fb.mu.Unlock()
	if killed == nil {
		return "", errors.New("no server was killed")
	}
	cur, err := fb.primary(ctx, f.Shard)
	if err != nil {
		return "", err
	}
	cfg := killed.Config()
	how := "as the primary"
	movedAway := cur != killed.Addr()
	if movedAway {
		cfg.ExtraArgs, how = append(cfg.ExtraArgs, replication.RejoinArgs()...), "to rejoin as a replica of "+cur
	}
	s, err := mariadb.Start(ctx, cfg)
	if err != nil {
		return "", err
	}
	*slot = s
	if !movedAway {
		a, err := replication.Open(s.DSN(""))
		if err != nil {
			return "", err
		}
		defer a.Close()
		if err := a.EnableSemiSync(ctx, true); err != nil {
			return "", err
		}
	}
	return fmt.Sprintf("killed mariadbd %s restarted %s (pid %d)", s.Addr(), how, s.PID()), nil
}

// Fate says what the killed server is now, giving the controller 15 s to
// rejoin it.
func (fb *failoverBed) Fate(ctx context.Context, _ drill.Fault) (string, error) {
	fb.mu.Lock()
	slot := fb.slot
	fb.mu.Unlock()
	if slot == nil {
		return "", errors.New("no server was killed")
	}
	a, err := replication.Open((*slot).DSN(""))
	if err != nil {
		return "", err
	}
	defer a.Close()
	var st replication.Status
	for deadline := time.Now().Add(15 * time.Second); ; {
		sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		st, err = a.Status(sctx)
		cancel()
		if err == nil && st.IOThreadRunning() || time.Now().After(deadline) || ctx.Err() != nil {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	switch {
	case err != nil:
		return "down: " + err.Error(), nil
	case st.IOThreadRunning():
		return fmt.Sprintf("rejoined as a read-only replica of %s (read_only=%v, at %s)", st.PrimaryAddr, st.ReadOnly, st.CurrentPos), nil
	case st.PrimaryAddr == "" && !st.ReadOnly:
		return "still a writable primary: no failover happened", nil
	}
	return fmt.Sprintf("not replicating (read_only=%v, primary %q, IO %s, last error %q)", st.ReadOnly, st.PrimaryAddr, st.IORunning, st.LastIOError), nil
}
