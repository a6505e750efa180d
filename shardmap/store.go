package shardmap

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/maphash"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/triage-queue/triage/schema"
)

const (
	// Bucket is the NATS KV bucket that stores the map.
	Bucket = "triage_shardmap"
	// Key is the key of the map's head in Bucket: its version, regions,
	// shards and the revision of every namespace's key.
	Key = "current"
	// namespacePrefix starts the key of each namespace's config.
	namespacePrefix = "ns."
	// headFormat marks the split head; a value of Key without it is a
	// whole map (a store written before the split), still read.
	headFormat = 2
)

// NamespaceKey is the bucket key of namespace name's config. ValidName
// allows '.', which separates a key's tokens, so it is written as '=',
// which no valid name holds.
func NamespaceKey(name string) string { return namespacePrefix + strings.ReplaceAll(name, ".", "=") }

// namespaceOf is the namespace whose config key is key.
func namespaceOf(key string) string {
	return strings.ReplaceAll(strings.TrimPrefix(key, namespacePrefix), "=", ".")
}

// head is the value of Key: the map without its namespaces, which it
// names with the KV revision of each one's key. A change to one
// namespace writes that namespace's key and the head; every process then
// reads and parses those two values, not every namespace's. With 1,000
// shards and 10,000 namespaces (100,000 topic configs) the whole map is
// 4.3 MB and took each process 0.13-0.4 s to parse on every change; the
// head is about 0.3 MB. The head is written last, with compare-and-set,
// so it only ever names namespace values already stored.
type head struct {
	Format     int               `json:"format"`
	Version    uint64            `json:"version"`
	Regions    []string          `json:"regions"`
	Shards     []Shard           `json:"shards"`
	Retired    []uint32          `json:"retired,omitempty"`
	Namespaces map[string]uint64 `json:"namespace_revisions"`
}

// stamp is where a map's namespace came from: the revision of its key,
// and a checksum of the value, so Publish rewrites only namespaces that
// changed.
type stamp struct{ rev, sum uint64 }

var sumSeed = maphash.MakeSeed()

func checksum(data []byte) uint64 { return maphash.Bytes(sumSeed, data) }

// ErrConflict means the stored map moved on since the one a change was
// based on; reload and retry.
var ErrConflict = errors.New("shard map changed concurrently")

// ErrTooLarge means a change would make the map's head or a namespace's
// config larger than one NATS message carries (the server's max_payload):
// retrying cannot help, the change must shrink it.
var ErrTooLarge = errors.New("shard map too large")

// Bootstrap stores m unless a map is stored already, and returns the stored
// map. Restarting a process with its old config file therefore never rolls
// back a map that failovers have moved on. The head is created only after
// the namespaces' values are written, so of two processes bootstrapping at
// once one head wins and names only values that exist.
func Bootstrap(ctx context.Context, kv jetstream.KeyValue, m *Map) (*Map, error) {
	// A bucket just created may not answer direct gets for a moment (no
	// responders, while its stream's replicas start): look again then.
	for wait := 100 * time.Millisecond; ; wait = min(2*wait, time.Second) {
		_, err := kv.Get(ctx, Key)
		if err == nil {
			return Load(ctx, kv)
		}
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			break
		}
		if ctx.Err() != nil || !errors.Is(err, nats.ErrNoResponders) && !errors.Is(err, nats.ErrTimeout) && !errors.Is(err, context.DeadlineExceeded) {
			return nil, fmt.Errorf("bootstrap shard map: %w", err)
		}
		if !schema.Sleep(ctx, wait) {
			return nil, fmt.Errorf("bootstrap shard map: %w", ctx.Err())
		}
	}
	// Created, one at a time, each acknowledged (applied) before the
	// next: nats-server (2.15) sets up its tracking of writes that expect
	// a subject's sequence (Create, Update) at the first such write with
	// an unlocked check that races with the stream applying an earlier
	// write. A fresh bucket's first write is thus one of these, as the
	// head's Create was when the map was one value; plain puts in flight
	// before it had the race detector report the race in a three-region
	// bed.
	h, stamps, err := writeNamespaces(ctx, kv, &Map{}, m, true)
	if err != nil {
		return nil, fmt.Errorf("bootstrap shard map: %w", err)
	}
	data, err := json.Marshal(h)
	if err != nil {
		return nil, err
	}
	rev, err := kv.Create(ctx, Key, data)
	if errors.Is(err, jetstream.ErrKeyExists) {
		return Load(ctx, kv)
	}
	if err != nil {
		return nil, fmt.Errorf("bootstrap shard map: %w", tooLarge(err, len(data), "head"))
	}
	m.rev, m.stamps = rev, stamps
	return m, nil
}

// Load reads the stored map.
func Load(ctx context.Context, kv jetstream.KeyValue) (*Map, error) {
	return LoadFrom(ctx, kv, nil)
}

// LoadFrom reads the stored map, taking from base every namespace whose
// key is at the revision base read it at, so only changed namespaces are
// read and parsed. base may be nil.
func LoadFrom(ctx context.Context, kv jetstream.KeyValue, base *Map) (*Map, error) {
	e, err := kv.Get(ctx, Key)
	if err != nil {
		return nil, fmt.Errorf("load shard map: %w", err)
	}
	return decode(ctx, kv, e, base, nil)
}

// LoadCurrent returns the stored map, proven the current one by a
// compare-and-set: it writes the same head back at the revision it read,
// which the bucket's leader commits only if no newer revision exists and
// only with a quorum. Load cannot prove that: its direct get is answered
// by any replica, also one that lags (a NATS server back from a partition
// catching up) or is cut off. A controller checks this before an
// irreversible step that no write of the bucket guards (rejoining a server
// as a replica of the primary it names), where a stale read could make it
// demote the real primary. The rewrite changes no map (watchers ignore a
// version they hold) and costs one commit, so it is for rare steps only.
// Namespaces are taken from base as in LoadFrom; base may be nil. A
// conflict is ErrConflict.
func LoadCurrent(ctx context.Context, kv jetstream.KeyValue, base *Map) (*Map, error) {
	e, err := kv.Get(ctx, Key)
	if err != nil {
		return nil, fmt.Errorf("load shard map: %w", err)
	}
	m, err := decode(ctx, kv, e, base, nil)
	if err != nil {
		return nil, err
	}
	rev, err := kv.Update(ctx, Key, e.Value(), e.Revision())
	if err != nil {
		return nil, fmt.Errorf("%w: revision %d (version %d) is not the stored one: %v", ErrConflict, e.Revision(), m.Version, err)
	}
	m.rev = rev
	return m, nil
}

// Publish stores next if the stored map is still at version prev (optimistic
// concurrency: two controllers cannot both publish over the same map).
// next.Version must be greater than prev. It writes the namespaces that
// differ from prev's stored ones, then the head with compare-and-set. A
// namespace written by a publish whose head then loses is named by no
// head, and the next publish writes it again. On success next knows its
// revisions, so a publish based on it needs no read.
func Publish(ctx context.Context, kv jetstream.KeyValue, prev *Map, next *Map) error {
	if next.Version <= prev.Version {
		return fmt.Errorf("publish shard map: version %d is not above %d", next.Version, prev.Version)
	}
	h, stamps, err := writeNamespaces(ctx, kv, prev, next, false)
	if err != nil {
		return fmt.Errorf("publish shard map: %w", err)
	}
	data, err := json.Marshal(h)
	if err != nil {
		return err
	}
	// prev was read from the bucket: compare-and-set on its revision. A
	// failure may only mean the same map was written back since
	// (LoadCurrent), so it falls back to comparing versions.
	if prev.rev != 0 {
		rev, err := kv.Update(ctx, Key, data, prev.rev)
		if err == nil {
			next.rev, next.stamps = rev, stamps
			return nil
		}
		if big := tooLarge(err, len(data), "head"); big != err {
			return big
		}
	}
	e, err := kv.Get(ctx, Key)
	if err != nil {
		return fmt.Errorf("publish shard map: %w", err)
	}
	var stored head
	if err := json.Unmarshal(e.Value(), &stored); err != nil {
		return fmt.Errorf("shard map: %w", err)
	}
	if stored.Version != prev.Version {
		return fmt.Errorf("%w: stored version %d moved past %d", ErrConflict, stored.Version, prev.Version)
	}
	rev, err := kv.Update(ctx, Key, data, e.Revision())
	if err != nil {
		if big := tooLarge(err, len(data), "head"); big != err {
			return big
		}
		return fmt.Errorf("%w: %v", ErrConflict, err)
	}
	next.rev, next.stamps = rev, stamps
	return nil
}

// tooLarge turns a refusal for size into ErrTooLarge, naming what was
// too large; other errors are returned as they are.
func tooLarge(err error, size int, what string) error {
	if errors.Is(err, nats.ErrMaxPayload) {
		return fmt.Errorf("%w: the %s would be %d bytes, more than one NATS message carries: remove namespaces or topic configs, or raise the NATS servers' max_payload",
			ErrTooLarge, what, size)
	}
	return err
}

// putsInFlight bounds the namespace values a publish writes at once.
const putsInFlight = 32

// writeNamespaces writes every namespace of next whose value differs
// from the one prev read or wrote, and returns next's head and stamps.
// fresh (Bootstrap) creates them one at a time; else they are put
// putsInFlight at a time.
func writeNamespaces(ctx context.Context, kv jetstream.KeyValue, prev, next *Map, fresh bool) (*head, map[string]stamp, error) {
	inFlight := putsInFlight
	if fresh {
		inFlight = 1
	}
	h := &head{Format: headFormat, Version: next.Version, Regions: next.Regions, Shards: next.Shards, Retired: next.Retired,
		Namespaces: make(map[string]uint64, len(next.Namespaces))}
	stamps := make(map[string]stamp, len(next.Namespaces))
	type put struct {
		name string
		data []byte
		sum  uint64
	}
	var puts []put
	for i := range next.Namespaces {
		ns := &next.Namespaces[i]
		data, err := json.Marshal(ns)
		if err != nil {
			return nil, nil, err
		}
		sum := checksum(data)
		if st, ok := prev.stamps[ns.Name]; ok && st.sum == sum {
			stamps[ns.Name], h.Namespaces[ns.Name] = st, st.rev
			continue
		}
		puts = append(puts, put{ns.Name, data, sum})
	}
	var mu sync.Mutex
	err := eachAtOnce(len(puts), inFlight, func(i int) error {
		p := puts[i]
		key := NamespaceKey(p.name)
		var rev uint64
		var err error
		if fresh {
			// Bootstrap: see there.
			if rev, err = kv.Create(ctx, key, p.data); errors.Is(err, jetstream.ErrKeyExists) {
				rev, err = kv.Put(ctx, key, p.data)
			}
		} else {
			rev, err = kv.Put(ctx, key, p.data)
		}
		if err != nil {
			return fmt.Errorf("namespace %q: %w", p.name, tooLarge(err, len(p.data), "namespace's config"))
		}
		mu.Lock()
		defer mu.Unlock()
		stamps[p.name], h.Namespaces[p.name] = stamp{rev, p.sum}, rev
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	return h, stamps, nil
}

// stored is a namespace value read from the bucket.
type stored struct {
	rev  uint64
	data []byte
}

// decode builds the map the head e names. Each namespace comes from base
// when base read it at the named revision, else from seen (values a
// watch delivered, by namespace) when that holds the named revision,
// else from the bucket.
func decode(ctx context.Context, kv jetstream.KeyValue, e jetstream.KeyValueEntry, base *Map, seen map[string]stored) (*Map, error) {
	var h head
	if err := json.Unmarshal(e.Value(), &h); err != nil {
		return nil, fmt.Errorf("shard map: %w", err)
	}
	if h.Format != headFormat {
		// A whole map, as stored before the split and as a bootstrap
		// file holds it.
		m, err := Parse(e.Value())
		if err != nil {
			return nil, err
		}
		m.rev = e.Revision()
		return m, nil
	}
	m := Map{Version: h.Version, Regions: h.Regions, Shards: h.Shards, Retired: h.Retired, Namespaces: make([]Namespace, 0, len(h.Namespaces))}
	stamps := make(map[string]stamp, len(h.Namespaces))
	values := map[string]stored{}
	var missing []string
	for name, rev := range h.Namespaces {
		if st, ok := base.stampOf(name); ok && st.rev == rev {
			ns, _ := base.Namespace(name)
			m.Namespaces = append(m.Namespaces, *ns)
			stamps[name] = st
			continue
		}
		if v, ok := seen[name]; ok && v.rev == rev {
			values[name] = v
			continue
		}
		missing = append(missing, name)
	}
	if err := fetch(ctx, kv, h.Namespaces, missing, values); err != nil {
		return nil, err
	}
	for name, v := range values {
		var ns Namespace
		if err := json.Unmarshal(v.data, &ns); err != nil {
			return nil, fmt.Errorf("shard map: namespace %q at revision %d: %w", name, v.rev, err)
		}
		if ns.Name != name {
			return nil, fmt.Errorf("shard map: the value of %s names namespace %q", NamespaceKey(name), ns.Name)
		}
		m.Namespaces = append(m.Namespaces, ns)
		stamps[name] = stamp{v.rev, checksum(v.data)}
	}
	out, err := New(m)
	if err != nil {
		return nil, err
	}
	out.rev, out.stamps = e.Revision(), stamps
	return out, nil
}

// bulkFetch is the number of missing namespaces past which fetch reads
// every namespace's latest value with one watch rather than a get each.
const bulkFetch = 64

// fetch reads the named revisions (want) of the missing namespaces into
// values. Many are read with one watch of every namespace key's latest
// value (a process starting, or one that lost its watch); the few whose
// latest value is not the named one, and all when few are missing, with
// a get of the named revision each (the bucket keeps 16 per key).
func fetch(ctx context.Context, kv jetstream.KeyValue, want map[string]uint64, missing []string, values map[string]stored) error {
	if len(missing) > bulkFetch {
		w, err := kv.WatchFiltered(ctx, []string{namespacePrefix + ">"}, jetstream.IgnoreDeletes())
		if err != nil {
			return fmt.Errorf("load shard map namespaces: %w", err)
		}
		for e := range w.Updates() {
			if e == nil {
				break
			}
			name := namespaceOf(e.Key())
			if rev, ok := want[name]; ok && rev == e.Revision() {
				values[name] = stored{e.Revision(), e.Value()}
			}
		}
		_ = w.Stop()
		if ctx.Err() != nil {
			return fmt.Errorf("load shard map namespaces: %w", ctx.Err())
		}
		missing = slicesDeleteFound(missing, values)
	}
	var mu sync.Mutex
	return eachAtOnce(len(missing), putsInFlight, func(i int) error {
		name := missing[i]
		e, err := kv.GetRevision(ctx, NamespaceKey(name), want[name])
		if err != nil {
			return fmt.Errorf("load shard map: namespace %q at revision %d: %w", name, want[name], err)
		}
		mu.Lock()
		defer mu.Unlock()
		values[name] = stored{e.Revision(), e.Value()}
		return nil
	})
}

// eachAtOnce calls fn(0) … fn(n-1), up to limit at a time, and returns
// the first error (after every call has returned).
func eachAtOnce(n, limit int, fn func(i int) error) error {
	var (
		mu       sync.Mutex
		firstErr error
		wg       sync.WaitGroup
		sem      = make(chan struct{}, limit)
	)
	for i := range n {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if err := fn(i); err != nil {
				mu.Lock()
				firstErr = cmp.Or(firstErr, err)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return firstErr
}

// slicesDeleteFound drops the names values holds.
func slicesDeleteFound(names []string, values map[string]stored) []string {
	out := names[:0]
	for _, n := range names {
		if _, ok := values[n]; !ok {
			out = append(out, n)
		}
	}
	return out
}

// stampOf is the stamp of m's namespace name, if m was read from or
// written to the bucket. m may be nil.
func (m *Map) stampOf(name string) (stamp, bool) {
	if m == nil {
		return stamp{}, false
	}
	st, ok := m.stamps[name]
	return st, ok
}
