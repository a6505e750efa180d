package wan

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/Shopify/toxiproxy/v2/toxics"
	"github.com/rs/zerolog"
)

// ErrClosed is returned by calls on a closed Net.
var ErrClosed = errors.New("wan: closed")

// Net is a set of cross-region links. Its methods are safe for concurrent
// use.
type Net struct {
	log *slog.Logger
	srv *toxiproxy.ApiServer

	mu     sync.Mutex // guards links, byName, closed, spikes; held while proxies start and stop
	links  []*link
	byName map[string]*link
	closed bool
	// spikes are the one-way latencies Spike adds, per region.
	spikes map[string]time.Duration
}

type link struct {
	name, from, to string
	proxy          *toxiproxy.Proxy
	base           time.Duration // one-way, as set by Link, SetLatency or SetLinkLatency; n.mu
	latency        atomic.Int64  // one-way in effect, nanoseconds (base and spikes); read by the link's toxics
}

// LinkInfo describes a link, as bed.json lists it.
type LinkInfo struct {
	// Name is unique within the Net, e.g. "eu-west>us-east/mysql-1".
	Name string `json:"name"`
	// From is the region that dials, To the region it reaches.
	From string `json:"from"`
	To   string `json:"to"`
	// Listen is where From's processes dial; Upstream the real server.
	Listen   string `json:"listen"`
	Upstream string `json:"upstream"`
	// LatencyMS is the one-way latency in milliseconds; a round trip costs
	// twice as much.
	LatencyMS float64 `json:"latency_ms"`
	// Enabled is false while the link is cut.
	Enabled bool `json:"enabled"`
}

// New returns an empty Net. logger (nil: slog.Default()) receives a line per
// cut, heal and latency change; toxiproxy's own logging is discarded.
func New(logger *slog.Logger) *Net {
	if logger == nil {
		logger = slog.Default()
	}
	return &Net{
		log: logger,
		// The ApiServer is only the container toxiproxy's proxies expect
		// (logger, metrics); its HTTP API is not served.
		srv:    toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop()),
		byName: map[string]*link{},
		spikes: map[string]time.Duration{},
	}
}

// Link starts a proxy on a free loopback port (below the ephemeral
// range, see start) in front of upstream (a
// host:port in region to) for processes of region from, delaying bytes by
// latency in each direction. It returns the address to dial instead of
// upstream.
func (n *Net) Link(name, from, to, upstream string, latency time.Duration) (listenAddr string, err error) {
	switch {
	case name == "" || from == "" || to == "":
		return "", fmt.Errorf("wan: link %q: name, from and to are required", name)
	case from == to:
		return "", fmt.Errorf("wan: link %q: from and to are both %q; links join two regions", name, from)
	case latency < 0:
		return "", fmt.Errorf("wan: link %q: latency %v: want 0 or more", name, latency)
	}
	if _, _, err := net.SplitHostPort(upstream); err != nil {
		return "", fmt.Errorf("wan: link %q: upstream %q: want host:port: %w", name, upstream, err)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return "", ErrClosed
	}
	if _, dup := n.byName[name]; dup {
		return "", fmt.Errorf("wan: link %q exists already", name)
	}
	l := &link{name: name, from: from, to: to, proxy: toxiproxy.NewProxy(n.srv, name, "127.0.0.1:0", upstream), base: latency}
	n.apply(l)
	for _, stream := range []string{"upstream", "downstream"} {
		spec, _ := json.Marshal(map[string]any{"name": "wan_" + stream, "type": "latency", "stream": stream, "toxicity": 1})
		w, err := l.proxy.Toxics.AddToxicJson(strings.NewReader(string(spec)))
		if err != nil {
			return "", fmt.Errorf("wan: link %q: add latency toxic: %w", name, err)
		}
		// Swapped in before the proxy accepts anything, so no connection
		// goroutine ever sees the stock toxic (see the package doc).
		w.Toxic = &latencyToxic{d: &l.latency}
	}
	if err := l.start(); err != nil {
		return "", fmt.Errorf("wan: link %q: %w", name, err)
	}
	n.links = append(n.links, l)
	n.byName[name] = l
	return l.listen(), nil
}

// start starts the proxy on a free loopback port below the kernel's
// ephemeral range. A heal listens on the same port again; a port the
// kernel chose (":0") is in the ephemeral range, where, while the link was
// cut, any outgoing connection on the machine could be given it as its
// local port, and the heal failed with "address already in use". Ports
// below the range are only ever taken by explicit binds.
func (l *link) start() error {
	low, _ := ephemeralRange()
	const first = 10000
	if low <= first {
		l.proxy.Listen = "127.0.0.1:0"
		return l.proxy.Start()
	}
	span := low - first
	off := rand.IntN(span)
	var err error
	for i := range min(span, 500) {
		l.proxy.Listen = "127.0.0.1:" + strconv.Itoa(first+(off+i)%span)
		if err = l.proxy.Start(); !errors.Is(err, syscall.EADDRINUSE) {
			return err
		}
	}
	return err
}

func (l *link) listen() string {
	l.proxy.Lock()
	defer l.proxy.Unlock()
	return l.proxy.Listen
}

// Cut disables every link from or to region: their proxies stop listening
// and close the connections they carry. It reports an error for a region
// no link touches, so a typo does not pass for a partition.
func (n *Net) Cut(region string) error { return n.setRegion(region, false) }

// Heal enables again every link from or to region, whatever cut it, on the
// ports they had.
func (n *Net) Heal(region string) error { return n.setRegion(region, true) }

func (n *Net) setRegion(region string, on bool) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return ErrClosed
	}
	var errs []error
	found := 0
	for _, l := range n.links {
		if l.from == region || l.to == region {
			found++
			errs = append(errs, l.setEnabled(on))
		}
	}
	if found == 0 {
		return fmt.Errorf("wan: no link touches region %q (regions: %s)", region, strings.Join(n.regions(), ", "))
	}
	n.log.Info(map[bool]string{true: "wan: healed region", false: "wan: cut region"}[on], "region", region, "links", found)
	return errors.Join(errs...)
}

// SetLinkEnabled cuts (false) or heals (true) one link, for partial
// partitions such as a single direction between two regions.
func (n *Net) SetLinkEnabled(name string, on bool) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return ErrClosed
	}
	l, ok := n.byName[name]
	if !ok {
		return fmt.Errorf("wan: no link %q", name)
	}
	return l.setEnabled(on)
}

func (l *link) setEnabled(on bool) error {
	if !on {
		l.proxy.Stop()
		return nil
	}
	err := l.proxy.Start()
	if errors.Is(err, toxiproxy.ErrProxyAlreadyStarted) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("wan: heal link %q: %w", l.name, err)
	}
	return nil
}

// SetLatency sets the one-way latency of every link, effective at once,
// also for bytes already in flight that have not waited that long.
func (n *Net) SetLatency(d time.Duration) error {
	if d < 0 {
		return fmt.Errorf("wan: latency %v: want 0 or more", d)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, l := range n.links {
		l.base = d
		n.apply(l)
	}
	n.log.Info("wan: latency set", "one_way", d, "links", len(n.links))
	return nil
}

// SetLinkLatency sets one link's one-way latency.
func (n *Net) SetLinkLatency(name string, d time.Duration) error {
	if d < 0 {
		return fmt.Errorf("wan: latency %v: want 0 or more", d)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	l, ok := n.byName[name]
	if !ok {
		return fmt.Errorf("wan: no link %q", name)
	}
	l.base = d
	n.apply(l)
	return nil
}

// Spike adds extra one-way latency to every link from or to region,
// effective at once on open connections too, until Spike sets it again
// (0 ends the spike). Spikes of two regions add up on the links between
// them, as the compose bed's gateways do (see Gateway.Spike). It reports
// an error for a region no link touches.
func (n *Net) Spike(region string, extra time.Duration) error {
	if extra < 0 {
		return fmt.Errorf("wan: spike %v: want 0 or more", extra)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return ErrClosed
	}
	found := 0
	if extra == 0 {
		delete(n.spikes, region)
	} else {
		n.spikes[region] = extra
	}
	for _, l := range n.links {
		if l.from == region || l.to == region {
			found++
			n.apply(l)
		}
	}
	if found == 0 {
		delete(n.spikes, region)
		return fmt.Errorf("wan: no link touches region %q (regions: %s)", region, strings.Join(n.regions(), ", "))
	}
	n.log.Info("wan: latency spike", "region", region, "extra_one_way", extra, "links", found)
	return nil
}

// apply puts l's base latency plus the spikes of its two regions in
// effect; n.mu held.
func (n *Net) apply(l *link) {
	l.latency.Store(int64(l.base + n.spikes[l.from] + n.spikes[l.to]))
}

// Links describes every link, in creation order.
func (n *Net) Links() []LinkInfo {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := make([]LinkInfo, 0, len(n.links))
	for _, l := range n.links {
		l.proxy.Lock()
		out = append(out, LinkInfo{
			Name: l.name, From: l.from, To: l.to,
			Listen: l.proxy.Listen, Upstream: l.proxy.Upstream,
			LatencyMS: float64(l.latency.Load()) / float64(time.Millisecond),
			Enabled:   l.proxy.Enabled,
		})
		l.proxy.Unlock()
	}
	return out
}

// Close stops every link; Link, Cut, Heal and SetLinkEnabled return
// ErrClosed afterwards. Closing twice is harmless.
func (n *Net) Close() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return
	}
	n.closed = true
	for _, l := range n.links {
		l.proxy.Stop()
	}
}

// regions lists the regions links touch; n.mu held.
func (n *Net) regions() []string {
	var out []string
	for _, l := range n.links {
		for _, r := range []string{l.from, l.to} {
			if !slices.Contains(out, r) {
				out = append(out, r)
			}
		}
	}
	slices.Sort(out)
	return out
}

// latencyToxic delays each chunk until d after the proxy read it, like
// toxiproxy's latency toxic, but reads d atomically so it can change under
// live connections.
type latencyToxic struct{ d *atomic.Int64 }

var _ toxics.BufferedToxic = (*latencyToxic)(nil)

// GetBufferSize lets a burst queue up behind the delay instead of stalling
// the reader: latency, not a bandwidth cap.
func (t *latencyToxic) GetBufferSize() int { return 1024 }

// Pipe implements toxics.Toxic.
func (t *latencyToxic) Pipe(stub *toxics.ToxicStub) {
	timer := time.NewTimer(0)
	<-timer.C
	defer timer.Stop()
	for {
		select {
		case <-stub.Interrupt:
			return
		case c := <-stub.Input:
			if c == nil {
				stub.Close()
				return
			}
			if wait := time.Duration(t.d.Load()) - time.Since(c.Timestamp); wait > 0 {
				timer.Reset(wait)
				select {
				case <-timer.C:
				case <-stub.Interrupt:
					timer.Stop()
					stub.Output <- c // never drop data on the floor
					return
				}
			}
			stub.Output <- c
		}
	}
}

// ephemeralRange is the kernel's range of ports for outgoing connections
// (Linux ip_local_port_range; the Linux default when it cannot be read).
func ephemeralRange() (low, high int) {
	low, high = 32768, 60999
	data, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return low, high
	}
	f := strings.Fields(string(data))
	if len(f) == 2 {
		l, err1 := strconv.Atoi(f[0])
		h, err2 := strconv.Atoi(f[1])
		if err1 == nil && err2 == nil && l > 1024 {
			return l, h
		}
	}
	return low, high
}
