package bed

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"sync"
	"syscall"
	"time"

	"github.com/triage-queue/triage/cmd/triage/node"
	"github.com/triage-queue/triage/deploy/wan"
)

// The nemesis's faults beyond the drills' (control.go dispatches to
// them):
//
//   - mariadb-pause: SIGSTOP of a shard's current primary mariadbd by its
//     PID. Its connections stay open and nothing answers on them, as with a
//     server stuck on its disk or a VM paused; the nemesis holds it past
//     the clients' 30 s read timeout, so the controller fails the shard
//     over while it is frozen. The heal sends SIGCONT and lets it run awake
//     for thawWindow with the sessions and transactions it had open (the
//     case this fault is for: a deposed primary waking up), then, if the
//     shard failed over, crashes it and restarts it with
//     replication.RejoinArgs, as a killed primary is restarted, so crash
//     recovery drops what no replica acknowledged and the controller
//     rejoins it.
//   - enqueuer-kill: the bed runs each region's enqueuer inside the
//     region's node, with its router and dequeuer, in this process, where
//     it cannot be killed alone. The fault starts a second enqueuer of the
//     region (a node with the enqueuer role only) whose NATS and MariaDB
//     connections go through links of their own, lets it pull and insert
//     for enqueuerWork, and crashes it: every one of its connections is
//     cut at once (the servers see them drop: its open transactions roll
//     back, what it pulled and did not ack waits out the ack wait), and
//     the node is stopped behind the cut, so nothing it does reaches a
//     server. The region's own enqueuer runs on throughout: this is one
//     of a region's two enqueuers crashing, not its only one (the compose
//     bed kills its only one).
//   - wan-spike: wan.Net.Spike adds wan.DefaultSpike of one-way latency
//     to every link from or to the region, open connections included; the
//     heal takes it off.

// thawWindow is how long a paused primary runs awake before the heal
// crashes it for its rejoin.
const thawWindow = 5 * time.Second

// enqueuerWork is how long the extra enqueuer of an enqueuer-kill works
// before it is crashed: long enough to have pulled batches and have
// transactions open.
const enqueuerWork = 3 * time.Second

// nemesisState is what the nemesis's faults keep between inject and heal.
type nemesisState struct {
	mu sync.Mutex
	// paused is, per shard, the mariadbd a mariadb-pause stopped.
	paused map[uint32]*dbServer
	// enqueuers is, per region, closed once the crashed extra enqueuer's
	// node has stopped.
	enqueuers map[string]chan struct{}
}

// pause stops shard's current primary with SIGSTOP.
func (b *Bed) pause(shard uint32) (string, error) {
	d := b.currentPrimary(shard)
	if d == nil {
		return "", fmt.Errorf("shard %d: no server of the bed is its primary in the shard map", shard)
	}
	select {
	case <-d.srv.Wait():
		return "", fmt.Errorf("shard %d's primary %s is not running", shard, d.srv.Addr())
	default:
	}
	b.nem.mu.Lock()
	defer b.nem.mu.Unlock()
	if b.nem.paused[shard] != nil {
		return "", fmt.Errorf("shard %d's primary is paused already", shard)
	}
	if err := syscall.Kill(d.srv.PID(), syscall.SIGSTOP); err != nil {
		return "", fmt.Errorf("SIGSTOP pid %d: %w", d.srv.PID(), err)
	}
	if b.nem.paused == nil {
		b.nem.paused = map[uint32]*dbServer{}
	}
	b.nem.paused[shard] = d
	return fmt.Sprintf("SIGSTOP of shard %d's primary mariadbd (pid %d, %s, region %s, started as %s): connections open, nothing answers",
		shard, d.srv.PID(), d.srv.Addr(), d.region, d.role), nil
}

// thaw wakes the mariadbd pause stopped (SIGCONT), lets it run awake for
// thawWindow and says what it did, then, if the shard failed over from
// it, crashes it and restarts it to rejoin as a replica.
func (b *Bed) thaw(ctx context.Context, shard uint32) (string, error) {
	b.nem.mu.Lock()
	d := b.nem.paused[shard]
	delete(b.nem.paused, shard)
	b.nem.mu.Unlock()
	if d == nil {
		return "", fmt.Errorf("shard %d: no paused primary to wake", shard)
	}
	if err := syscall.Kill(d.srv.PID(), syscall.SIGCONT); err != nil && !errors.Is(err, syscall.ESRCH) {
		return "", fmt.Errorf("SIGCONT pid %d: %w", d.srv.PID(), err)
	}
	woke := fmt.Sprintf("SIGCONT of pid %d (%s)", d.srv.PID(), d.srv.Addr())
	select {
	case <-ctx.Done():
		return woke, ctx.Err()
	case <-time.After(thawWindow):
	}
	awake := awakeState(ctx, d)
	if b.currentPrimary(shard) == d {
		return fmt.Sprintf("%s; still shard %d's primary, no failover: %s", woke, shard, awake), nil
	}
	// Crashed, not stopped: a clean shutdown would complete the commits
	// waiting for a semi-sync acknowledgement, which no replica has.
	if err := d.srv.Kill(); err != nil {
		return woke, err
	}
	desc, err := b.restartKilled(ctx, d)
	return fmt.Sprintf("%s; deposed, %s awake: %s; crashed, %s", woke, thawWindow, awake, desc), err
}

// awakeState describes a woken mariadbd: its fence, the sessions still
// waiting for a semi-sync acknowledgement and the statements running.
func awakeState(ctx context.Context, d *dbServer) string {
	db, err := sql.Open("mysql", d.srv.DSN(""))
	if err != nil {
		return "unreadable: " + err.Error()
	}
	defer db.Close()
	qctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	var readOnly, running int
	var waiting sql.NullString
	err = db.QueryRowContext(qctx, `SELECT @@global.read_only,
		(SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS WHERE VARIABLE_NAME = 'RPL_SEMI_SYNC_MASTER_WAIT_SESSIONS'),
		(SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE COMMAND = 'Query' AND ID <> CONNECTION_ID())`).Scan(&readOnly, &waiting, &running)
	if err != nil {
		return "unreadable: " + err.Error()
	}
	return fmt.Sprintf("read_only=%d, %s sessions waiting for a semi-sync ack, %d statements running", readOnly, waiting.String, running)
}

// crashEnqueuer starts an extra enqueuer of r behind links of its own,
// lets it work and crashes it (see the top of this file).
func (b *Bed) crashEnqueuer(ctx context.Context, r *region) (string, error) {
	b.mu.Lock()
	dead := r.dead || r.node == nil || r.nats == nil
	b.mu.Unlock()
	if dead {
		return "", fmt.Errorf("region %s is down", r.name)
	}
	stopped, err := b.reserveEnqueuerCrash(r)
	if err != nil {
		return "", err
	}
	links, n, startedIn, err := b.startExtraEnqueuer(ctx, r)
	if err != nil {
		b.nem.mu.Lock()
		delete(b.nem.enqueuers, r.name)
		b.nem.mu.Unlock()
		return "", err
	}
	select {
	case <-ctx.Done():
	case <-time.After(enqueuerWork):
	}
	links.Close() // the crash: every connection it has drops at once
	b.bg.Add(1)
	go func() {
		defer b.bg.Done()
		defer close(stopped)
		n.Stop() // behind the cut: it reaches nothing
	}()
	return fmt.Sprintf("a second enqueuer of %s (started in %s) crashed after %s of work: its NATS and MariaDB connections cut at once, nothing handed back; the node's own enqueuer runs on",
		r.name, startedIn.Round(time.Millisecond), enqueuerWork), ctx.Err()
}

// reserveEnqueuerCrash records that r has a crashed extra enqueuer, one at
// a time per region, and returns the channel to close once its node has
// stopped, which the heal waits on.
func (b *Bed) reserveEnqueuerCrash(r *region) (chan struct{}, error) {
	b.nem.mu.Lock()
	defer b.nem.mu.Unlock()
	if b.nem.enqueuers[r.name] != nil {
		return nil, fmt.Errorf("an enqueuer of %s is crashed already", r.name)
	}
	stopped := make(chan struct{})
	if b.nem.enqueuers == nil {
		b.nem.enqueuers = map[string]chan struct{}{}
	}
	b.nem.enqueuers[r.name] = stopped
	return stopped, nil
}

// startExtraEnqueuer starts a node of r with the enqueuer role only, its
// NATS and MariaDB connections through links of their own, and returns
// the links (closing them is the crash), the node and how long it took to
// start. On error it has closed the links.
func (b *Bed) startExtraEnqueuer(ctx context.Context, r *region) (*wan.Net, *node.Node, time.Duration, error) {
	links, natsURL, via, err := b.extraEnqueuerLinks(r)
	if err != nil {
		return nil, nil, 0, err
	}
	password, err := b.writeAppPassword()
	if err != nil {
		links.Close()
		return nil, nil, 0, err
	}
	cred := b.appMySQL(r.name, password)
	cred.DialVia = via
	replicas := min(len(b.regions), 3)
	started := time.Now()
	n, err := node.Start(ctx, node.Config{
		Roles:          []string{node.RoleEnqueuer},
		Region:         r.name,
		NATS:           natsURL,
		GRPC:           "127.0.0.1:0",
		HTTP:           "127.0.0.1:0",
		MySQL:          cred,
		ShardMapFile:   b.Layout.ShardMap,
		OwnerTTL:       shardmapDuration(b.cfg.OwnerTTL),
		KVReplicas:     replicas,
		StreamReplicas: replicas,
		KeysFile:       b.Layout.KeysFile,
		NATSAuth:       b.Layout.NATSAuth,
		NATSTLS:        b.Layout.NATSTLS,
	}, b.log.With("extra_enqueuer", r.name))
	if err != nil {
		links.Close()
		return nil, nil, 0, fmt.Errorf("start a second enqueuer in %s: %w", r.name, err)
	}
	return links, n, time.Since(started), nil
}

// extraEnqueuerLinks opens the extra enqueuer's own links, with no
// latency of their own: one to every server of the bed (to a server of
// another region through the region's WAN link, so a partition still
// cuts it) and one to r's NATS server. It returns them, the NATS URL
// through its link and, per server address, the link to dial instead. On
// error it has closed them.
func (b *Bed) extraEnqueuerLinks(r *region) (links *wan.Net, natsURL string, via map[string]string, err error) {
	links = wan.New(b.log)
	via = map[string]string{}
	for _, d := range b.serverList() {
		addr := d.srv.Addr()
		l, err := links.Link(r.name+"-enqueuer>"+addr, r.name+"/enqueuer", d.region, b.Via(r.name, addr), 0)
		if err != nil {
			links.Close()
			return nil, "", nil, err
		}
		via[addr] = l
	}
	u, err := url.Parse(r.nats.ClientURL())
	if err != nil {
		links.Close()
		return nil, "", nil, err
	}
	if u.Host, err = links.Link(r.name+"-enqueuer>nats", r.name+"/enqueuer", r.name, u.Host, 0); err != nil {
		links.Close()
		return nil, "", nil, err
	}
	return links, u.String(), via, nil
}

// healEnqueuer waits until the crashed extra enqueuer of r has stopped.
func (b *Bed) healEnqueuer(ctx context.Context, r *region) (string, error) {
	b.nem.mu.Lock()
	stopped := b.nem.enqueuers[r.name]
	delete(b.nem.enqueuers, r.name)
	b.nem.mu.Unlock()
	if stopped == nil {
		return "", fmt.Errorf("no crashed enqueuer of %s", r.name)
	}
	select {
	case <-stopped:
	case <-ctx.Done():
		return "", ctx.Err()
	}
	return fmt.Sprintf("the crashed enqueuer of %s is gone; %s's node's enqueuer served throughout", r.name, r.name), nil
}

// spike adds wan.DefaultSpike (on) or nothing (off) to r's links.
func (b *Bed) spike(r *region, on bool) (string, error) {
	if b.net == nil {
		return "", errors.New("one region, no WAN")
	}
	extra := map[bool]time.Duration{true: wan.DefaultSpike}[on]
	if err := errors.Join(b.net.Spike(r.name, extra), b.rewriteLayout()); err != nil {
		return "", err
	}
	if !on {
		return fmt.Sprintf("every link from or to %s back to %s one way", r.name, b.cfg.WANLatency), nil
	}
	return fmt.Sprintf("%s one way added to every link from or to %s (open connections too)", extra, r.name), nil
}
