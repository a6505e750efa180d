package shardmap

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/triage-queue/triage/proto/triage/peer"
	"github.com/triage-queue/triage/schema"
)

// OpenBucket creates or opens the shard-map bucket with replicas copies
// (one per region in a multi-region cluster, so losing a region keeps it).
func OpenBucket(ctx context.Context, js jetstream.JetStream, replicas int) (jetstream.KeyValue, error) {
	kv, err := peer.EnsureKeyValue(ctx, js, jetstream.KeyValueConfig{
		Bucket:   Bucket,
		History:  16,
		Replicas: max(replicas, 1),
		Storage:  jetstream.FileStorage,
	})
	if err != nil {
		return nil, fmt.Errorf("open kv bucket %s: %w", Bucket, err)
	}
	return kv, nil
}

// Watch feeds every newer map stored in kv to h until ctx ends. It
// re-establishes the watch after NATS errors; meanwhile h keeps its last
// good snapshot. Alongside, probes prove every MaxStaleness/5 that h's map
// is still the stored one, and mark h fresh when that works: the watch
// alone cannot tell a quiet store from a lost one (see confirm).
//
// A watch restarted because it was slow (it did not go live, or probes
// did not come back through it) resumes after the last message the one
// before delivered: a fresh watch delivers every namespace's value again,
// 4.7 MB at 10,000 namespaces, which under load takes seconds, long
// enough for the probes to look stuck again, and each restart left the
// process unconfirmed, refusing writes, for as long. A resumed watch
// whose probes do not come back, or any other restart, starts fresh: a
// bucket made again numbers its messages from 1, and a resumed watch
// would skip them (see watchPos.restart).
func Watch(ctx context.Context, js jetstream.JetStream, kv jetstream.KeyValue, h *Holder, logger *slog.Logger) {
	p := &prober{h: h, log: logger, id: nuid.Next(), sent: map[string]time.Time{}, acked: map[string]time.Time{},
		reset: make(chan struct{}, 1)}
	go p.run(ctx, js)
	// liveWithin bounds how long a new watch may take to deliver its
	// initial values (see below); it doubles while watches keep missing it,
	// so a slow store is not restarted forever, and resets once one is live.
	liveWithin := watchLiveWithin
	var pos watchPos
	for ctx.Err() == nil {
		w, err := startWatch(ctx, kv, liveWithin, pos.after)
		if ctx.Err() != nil {
			if w != nil {
				_ = w.Stop()
			}
			break
		}
		if errors.Is(err, errWatchSlow) {
			logger.Warn("restarting the shard map watch: it did not start", "within", liveWithin, "resuming", pos.after > 0)
			liveWithin = min(2*liveWithin, maxWatchLiveWithin)
			pos.restart(watchNotLive)
			continue
		}
		if err != nil {
			logger.Warn("shard map watch failed; serving last good map", "err", err)
			pos.restart(watchEnded)
			schema.Sleep(ctx, time.Second)
			continue
		}
		// A restart asked for by the last watch's probes is done.
		select {
		case <-p.reset:
		default:
		}
		var why watchEnd
		liveWithin, why = p.follow(ctx, kv, w, logger, liveWithin, &pos)
		pos.restart(why)
		// Stopped in the background: nats.go stops a watch by deleting its
		// consumer, a JetStream API request that waits out the client's
		// timeout (5 s) when the consumer's server is cut off or dead, which
		// is when a watch is restarted; waiting for it would hold a
		// surviving node's next watch, and the new map, back as long. Its
		// deliveries end at once: the subscription goes before the delete
		// is asked for.
		go func(w jetstream.KeyWatcher) { _ = w.Stop() }(w)
		p.watchDown()
		schema.Sleep(ctx, 200*time.Millisecond)
	}
}

// watchPos is where Watch's next watch starts, and what the last one
// delivered that the next needs (see Watch).
type watchPos struct {
	// last is the revision of the last message the watch delivered, 0
	// before any; after is where the next watch resumes (last+1), 0 for
	// a fresh start.
	last, after uint64
	// resumed: the watch running resumes the one before.
	resumed bool
	// seen holds the namespace values delivered since the last head
	// (follow); a resumed watch does not deliver them again.
	seen map[string]stored
}

// watchEnd is why follow returned.
type watchEnd int

const (
	watchEnded   watchEnd = iota // ctx ended, the watch ended or failed
	watchNotLive                 // it did not start or go live in time
	watchStuck                   // committed probes did not come back
)

// restart sets where the next watch starts after one that ended for
// why: after the last message delivered when it was slow, else from
// scratch. A resumed watch that went live but through which no probe of
// this process came back starts from scratch too: it may be reading a
// bucket made again past its end.
func (p *watchPos) restart(why watchEnd) {
	resume := p.last > 0 && (why == watchNotLive || why == watchStuck && !p.resumed)
	if resume {
		p.after, p.resumed = p.last+1, true
		return
	}
	p.last, p.after, p.resumed = 0, 0, false
	p.seen = map[string]stored{}
}

// follow offers h what the watch w delivers, and hands the probes' tokens
// on, until ctx ends, the watch ends, or it must be restarted: its
// initial values did not all come within liveWithin, or committed probes
// did not come back through it; why says which. It returns
// the next liveWithin: doubled after a watch that never went live (up to
// maxWatchLiveWithin), reset once one did. pos records what the watch
// delivered, for a resumed watch to go on from.
//
// Namespace values are kept as they come, and a head is built from
// them (decode), so a change costs a process the values it changed.
// A head that cannot be built restarts the watch: going on would skip
// that map, and the next head may not come for a long time.
func (p *prober) follow(ctx context.Context, kv jetstream.KeyValue, w jetstream.KeyWatcher, logger *slog.Logger, liveWithin time.Duration, pos *watchPos) (time.Duration, watchEnd) {
	// live turns true at the end of the initial values: from then on
	// the watch delivers every message on its keys in stream order.
	live := false
	if pos.seen == nil {
		pos.seen = map[string]stored{}
	}
	seen := pos.seen
	// A watch whose consumer was placed on a server that is cut off
	// never goes live, and until it does no probe counts as stuck
	// (checkStuck), so without this timer nothing would restart it
	// until the client's own heartbeat check, seconds later.
	notLive := time.NewTimer(liveWithin)
	defer notLive.Stop()
	for {
		var e jetstream.KeyValueEntry
		select {
		case <-ctx.Done():
			return liveWithin, watchEnded
		case <-notLive.C:
			if !live {
				logger.Warn("restarting the shard map watch: it delivered no initial values", "within", liveWithin, "resumed", pos.resumed)
				return min(2*liveWithin, maxWatchLiveWithin), watchNotLive
			}
		case <-p.reset:
			// The watch's consumer may sit on a server that went away;
			// the client notices only after missed heartbeats (seconds,
			// during which this process would stay unconfirmed).
			logger.Warn("restarting the shard map watch: committed probes did not come back through it", "resumed", pos.resumed)
			return liveWithin, watchStuck
		case got, ok := <-w.Updates():
			if !ok {
				return liveWithin, watchEnded
			}
			e = got
		}
		if e != nil {
			pos.last = e.Revision()
		}
		switch {
		case e == nil:
			live = true
			liveWithin = watchLiveWithin
			p.watchLive()
		case e.Operation() != jetstream.KeyValuePut:
		case e.Key() == ConfirmKey:
			// A probe of this process's back through a resumed watch shows
			// that it follows the stream being written: it counts as a
			// fresh one from then on.
			if live && p.seen(string(e.Value())) {
				pos.resumed = false
			}
		case strings.HasPrefix(e.Key(), namespacePrefix):
			seen[namespaceOf(e.Key())] = stored{e.Revision(), e.Value()}
		default:
			m, err := p.decode(ctx, kv, e, seen)
			// Every value the head names came before it, so what was
			// seen is used or superseded.
			clear(seen)
			if err != nil {
				logger.Error("restarting the shard map watch: cannot build the stored map", "revision", e.Revision(), "err", err)
				return liveWithin, watchEnded
			}
			if m != nil && p.h.Offer(m) {
				logger.Info("shard map updated", "version", m.Version)
			}
		}
	}
}

// decode builds the map of head e, or returns nil when h holds it
// already (this process wrote it, or read it at start).
func (p *prober) decode(ctx context.Context, kv jetstream.KeyValue, e jetstream.KeyValueEntry, seen map[string]stored) (*Map, error) {
	cur := p.h.Current()
	if cur != nil && cur.rev == e.Revision() {
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(ctx, decodeWithin)
	defer cancel()
	return decode(ctx, kv, e, cur, seen)
}

// errWatchSlow: startWatch gave up waiting for the watch to start.
var errWatchSlow = errors.New("shard map watch did not start in time")

// startWatch starts a watch of the map and probe keys, or gives up after
// within. Starting one makes its consumer with a JetStream API request,
// which waits out the client's timeout (5 s) when the server that should
// answer is cut off or electing, and while it waits no timer of Watch
// runs, so the node would go without new maps as long. The start given
// up on goes on in the background, and its watch, should it come, is
// stopped.
//
// With after above 0 the watch delivers the messages from that revision
// on, history included, rather than every key's last value.
func startWatch(ctx context.Context, kv jetstream.KeyValue, within time.Duration, after uint64) (jetstream.KeyWatcher, error) {
	type started struct {
		w   jetstream.KeyWatcher
		err error
	}
	var opts []jetstream.WatchOpt
	if after > 0 {
		opts = append(opts, jetstream.ResumeFromRevision(after))
	}
	done := make(chan started, 1)
	go func() {
		w, err := kv.WatchFiltered(ctx, []string{Key, ConfirmKey, namespacePrefix + ">"}, opts...)
		done <- started{w, err}
	}()
	t := time.NewTimer(within)
	defer t.Stop()
	select {
	case r := <-done:
		return r.w, r.err
	case <-t.C:
	case <-ctx.Done():
	}
	go func() {
		if r := <-done; r.w != nil {
			_ = r.w.Stop()
		}
	}()
	return nil, errWatchSlow
}

// decodeWithin bounds the reads that building one stored map may need
// (namespace values the watch did not deliver as named).
const decodeWithin = 10 * time.Second

// watchLiveWithin is how long a new watch may take to deliver the map
// before it is restarted; after each miss it doubles, up to
// maxWatchLiveWithin.
const (
	watchLiveWithin    = MaxStaleness / 2
	maxWatchLiveWithin = 8 * time.Second
)

// ConfirmKey is the key the probes are written to: one shared key, so the
// bucket's history bound (16 per key) bounds what they keep.
const ConfirmKey = "confirm"

// prober keeps h fresh only while the shard-map bucket's stream can still
// commit, as seen from this process, and h holds the map stored last.
//
// Reads cannot show that. A direct get (what KeyValue.Get and
// Stream.GetLastMsgForSubject use on a KV stream, which has AllowDirect) is
// answered by any replica, also one cut off from the others, from its
// stale copy. $JS.API.STREAM.MSG.GET is answered by the stream leader, but
// a leader cut off into a minority keeps believing it leads, and answering,
// until it notices the lost quorum (after 10 s by default, 5 s with the
// embedded servers' timing, natsserver/raft.go), while the majority has
// elected another leader and a failover has published a new map there.
//
// So every round publishes a probe, a unique token, to ConfirmKey, and
// Watch's ordered consumer, which also carries the map's key, reports
// when the probe comes back. A stream stores a message only once a quorum
// committed it, and the ordered consumer delivers the two keys' messages
// in stream order without gaps (it restarts after the last one it
// delivered when it misses one). So when the probe sent at t comes back,
// h has been offered every map stored before the probe, which was
// committed after t: h's map was the stored one at t, and h is fresh as of
// t. A process in a minority cannot commit its probes, so it goes stale
// MaxStaleness after its last committed probe.
//
// The probe is a plain publish, not one conditional on the map key's
// last sequence (Nats-Expected-Last-Subject-Sequence-Subject): on a
// replicated stream the leader refuses such a write while another
// conditional write on the same key is in flight, which would serialise
// every process's probes through one commit at a time, and under load
// with WAN latency leave nodes unconfirmed for many seconds
// (TestConfirmUnderContention). Plain publishes pipeline.
type prober struct {
	h   *Holder
	log *slog.Logger
	id  string // this process's prefix of the probe tokens

	mu    sync.Mutex
	sent  map[string]time.Time // token -> when it was sent
	acked map[string]time.Time // token committed but not seen yet -> when its PubAck came
	n     uint64
	// live: the current watch delivers live updates, since liveAt.
	live   bool
	liveAt time.Time

	reset chan struct{} // asks Watch to restart its watch
}

// run sends a probe every MaxStaleness/5 (the first at once) until ctx
// ends.
func (p *prober) run(ctx context.Context, js jetstream.JetStream) {
	t := time.NewTicker(MaxStaleness / 5)
	defer t.Stop()
	// failing is the reason the process is not confirmed ("" when it is):
	// a change is logged, so a process that stays unconfirmed (and
	// refuses every write) says why, once.
	failing := ""
	report := func(why string) {
		if why != failing {
			if why == "" {
				p.log.Info("shard map confirmed again")
			} else {
				p.log.Warn("shard map not confirmed", "why", why)
			}
			failing = why
		}
	}
	for first := true; ; first = false {
		if !first {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
		token := p.next()
		rctx, cancel := context.WithTimeout(ctx, MaxStaleness/2)
		_, err := js.Publish(rctx, "$KV."+Bucket+"."+ConfirmKey, []byte(token))
		cancel()
		if err == nil {
			p.committed(token)
		}
		p.checkStuck()
		switch {
		case err != nil:
			report("probe: " + err.Error())
		case p.h.Age() > MaxStaleness:
			report("probes are committed but do not come back through the watch")
		default:
			report("")
		}
	}
}

// next returns a new token, remembered with its send time, and forgets
// tokens too old to matter.
func (p *prober) next() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.h.now()
	for tok, at := range p.sent {
		if now.Sub(at) > 2*MaxStaleness {
			delete(p.sent, tok)
			delete(p.acked, tok)
		}
	}
	p.n++
	tok := p.id + "." + strconv.FormatUint(p.n, 10)
	p.sent[tok] = now
	return tok
}

// watchLive notes that a new watch delivers live updates from now on.
// Probes sent before cannot come back through it (it skips them as
// initial values), so they no longer count as stuck.
func (p *prober) watchLive() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.live, p.liveAt = true, p.h.now()
	clear(p.acked)
}

// watchDown notes that the watch stopped: until the next one is live, no
// probe can come back, and none counts as stuck (else a watch slow to
// start would be restarted before it ever delivered).
func (p *prober) watchDown() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.live = false
	clear(p.acked)
}

// committed notes that token's probe was committed (its PubAck came).
func (p *prober) committed(token string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if at, ok := p.sent[token]; ok && p.live && at.After(p.liveAt) {
		p.acked[token] = p.h.now()
	}
}

// checkStuck asks Watch to restart its watch when a committed probe has
// not come back through it within MaxStaleness/2: the watch is stuck.
func (p *prober) checkStuck() {
	p.mu.Lock()
	stuck := false
	now := p.h.now()
	for tok, at := range p.acked {
		if now.Sub(at) > MaxStaleness/2 {
			stuck = true
			delete(p.acked, tok)
		}
	}
	p.mu.Unlock()
	if stuck {
		select {
		case p.reset <- struct{}{}:
		default:
		}
	}
}

// seen handles a probe delivered by the watch: when it is one of this
// process's, h is fresh as of its send time, and seen returns true.
func (p *prober) seen(token string) bool {
	p.mu.Lock()
	at, ok := p.sent[token]
	delete(p.sent, token)
	delete(p.acked, token)
	p.mu.Unlock()
	if ok {
		p.h.confirm(at)
	}
	return ok
}

// LeaderLastMsg reads the last message on subject of stream from the
// stream's leader ($JS.API.STREAM.MSG.GET), never by direct get, which any
// replica answers from what it has, also one cut off from the leader.
func LeaderLastMsg(ctx context.Context, js jetstream.JetStream, stream, subject string) (*jetstream.RawStreamMsg, error) {
	prefix := cmp.Or(js.Options().APIPrefix, jetstream.DefaultAPIPrefix)
	if !strings.HasSuffix(prefix, ".") {
		prefix += "."
	}
	req, err := json.Marshal(map[string]string{"last_by_subj": subject})
	if err != nil {
		return nil, err
	}
	reply, err := js.Conn().RequestWithContext(ctx, prefix+"STREAM.MSG.GET."+stream, req)
	if err != nil {
		return nil, fmt.Errorf("get %s from the leader of %s: %w", subject, stream, err)
	}
	var resp struct {
		Message *struct {
			Subject  string    `json:"subject"`
			Sequence uint64    `json:"seq"`
			Data     []byte    `json:"data"`
			Time     time.Time `json:"time"`
		} `json:"message"`
		Error *jetstream.APIError `json:"error"`
	}
	if err := json.Unmarshal(reply.Data, &resp); err != nil {
		return nil, fmt.Errorf("get %s from the leader of %s: %w", subject, stream, err)
	}
	switch {
	case resp.Error != nil && resp.Error.ErrorCode == jetstream.JSErrCodeMessageNotFound:
		return nil, jetstream.ErrMsgNotFound
	case resp.Error != nil:
		return nil, fmt.Errorf("get %s from the leader of %s: %w", subject, stream, resp.Error)
	case resp.Message == nil:
		return nil, fmt.Errorf("get %s from the leader of %s: %w", subject, stream, jetstream.ErrInvalidJetStreamResponse)
	}
	m := resp.Message
	return &jetstream.RawStreamMsg{Subject: m.Subject, Sequence: m.Sequence, Data: m.Data, Time: m.Time}, nil
}
