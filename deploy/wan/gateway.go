package wan

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// GatewayConfig is one region's WAN gateway: `triage-bed wan --config FILE`
// in the compose bed, where it is the only container of its region on the
// network between regions.
type GatewayConfig struct {
	// Region the gateway stands in. Required.
	Region string `json:"region"`
	// Latency is the one-way delay added to every byte of a connection
	// leaving the region, in both directions, so a round trip costs twice
	// as much; a new connection waits one round trip before it is dialed
	// (the TCP handshake). Default 20ms; "0s" for none.
	Latency *Duration `json:"latency,omitempty"`
	// Gateways names every region's gateway as the others reach it on the
	// network between regions (a host, without port). Required for every
	// region an endpoint is in.
	Gateways map[string]string `json:"gateways"`
	// Endpoints are the servers reachable across regions.
	Endpoints []Endpoint `json:"endpoints"`
	// Listen is the host the endpoints' listeners bind. Default: every
	// interface, so a gateway reconnected to the network between regions
	// after a cut serves at once on its new address.
	Listen string `json:"listen,omitempty"`
	// Health is where GET /healthz and GET /links are served. Default
	// 127.0.0.1:7070.
	Health string `json:"health,omitempty"`
	// Spike is the one-way latency a spike adds (Gateway.Spike; `triage-bed
	// wan` starts one on SIGUSR1 and ends it on SIGUSR2). Default
	// DefaultSpike.
	Spike *Duration `json:"spike,omitempty"`
}

// Endpoint is a server that processes of other regions reach through the
// gateways. Every gateway listens on Port: the one of Region forwards what
// arrives there to Addr (ingress), every other one delays it and forwards
// it to Region's gateway on the same port (egress). So a process of region
// A dials A's gateway on the endpoint's port, and only gateways cross the
// network between regions.
type Endpoint struct {
	// Addr is the server's host:port on its region's network, and the name
	// shard maps and configs give it.
	Addr string `json:"addr"`
	// Region the server runs in.
	Region string `json:"region"`
	// Port every gateway listens on for it.
	Port int `json:"port"`
}

// Duration is a time.Duration written as a Go duration string ("20ms").
type Duration time.Duration

// MarshalJSON writes d as a Go duration string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// UnmarshalJSON reads a Go duration string.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}

// DefaultLatency is the gateways' one-way latency unless configured.
const DefaultLatency = 20 * time.Millisecond

// DefaultSpike is the one-way latency a spike adds unless configured:
// with the default latency, a round trip between regions of about a
// second, well past what the clients and the controller see normally.
const DefaultSpike = 500 * time.Millisecond

// The gateway's TCP settings on connections between regions. A cut (the
// gateway's container disconnected from the network between regions)
// makes no noise: packets just stop arriving. Keepalives and
// TCP_USER_TIMEOUT turn that into a closed connection within about five
// seconds on both sides, and the gateway then closes the connection of
// the process it relays for, as a router or firewall that drops the flow
// would. Dials give up after dialTimeout.
const (
	dialTimeout     = 3 * time.Second
	wanUserTimeout  = 5 * time.Second
	wanKeepIdle     = 2 * time.Second
	wanKeepInterval = time.Second
	wanKeepCount    = 3
)

var wanKeepAlive = net.KeepAliveConfig{Enable: true, Idle: wanKeepIdle, Interval: wanKeepInterval, Count: wanKeepCount}

func (c *GatewayConfig) validate() error {
	if c.Region == "" {
		return errors.New("wan gateway config: region is required")
	}
	if c.Latency == nil {
		d := Duration(DefaultLatency)
		c.Latency = &d
	}
	if *c.Latency < 0 {
		return fmt.Errorf("wan gateway config: latency %v: want 0 or more", time.Duration(*c.Latency))
	}
	if c.Spike == nil {
		d := Duration(DefaultSpike)
		c.Spike = &d
	}
	if *c.Spike < 0 {
		return fmt.Errorf("wan gateway config: spike %v: want 0 or more", time.Duration(*c.Spike))
	}
	if c.Health == "" {
		c.Health = "127.0.0.1:7070"
	}
	ports := map[int]string{}
	for _, e := range c.Endpoints {
		if _, _, err := net.SplitHostPort(e.Addr); err != nil {
			return fmt.Errorf("wan gateway config: endpoint %q: want host:port: %w", e.Addr, err)
		}
		if e.Port < 1 || e.Port > 65535 {
			return fmt.Errorf("wan gateway config: endpoint %s: port %d: want 1-65535", e.Addr, e.Port)
		}
		if other, dup := ports[e.Port]; dup {
			return fmt.Errorf("wan gateway config: endpoints %s and %s share port %d", other, e.Addr, e.Port)
		}
		ports[e.Port] = e.Addr
		if e.Region != c.Region && c.Gateways[e.Region] == "" {
			return fmt.Errorf("wan gateway config: endpoint %s is in region %q, which has no gateway in gateways", e.Addr, e.Region)
		}
	}
	return nil
}

// Gateway is a running region gateway.
type Gateway struct {
	cfg        GatewayConfig
	log        *slog.Logger
	health     *http.Server
	healthAddr string

	mu        sync.Mutex // guards listeners, conns, closed
	listeners []net.Listener
	conns     map[net.Conn]struct{}
	closed    bool
	wg        sync.WaitGroup

	links []*gwLink
	// extra is the one-way latency a spike adds (Spike), nanoseconds.
	extra atomic.Int64
}

// gwLink is one endpoint's listener, its counters and its open
// connections.
type gwLink struct {
	Endpoint
	Egress           bool
	accepted, failed atomic.Int64

	mu    sync.Mutex // guards conns
	conns map[*gwConn]struct{}
}

// gwConn is one relayed connection. Its byte counts tell, for a client
// that waits, which hop holds the bytes: a MariaDB handshake stalled with
// nothing sent back from the server is told apart from one whose greeting
// the gateway did not pass on.
type gwConn struct {
	from               string
	since              time.Time
	dialed             atomic.Bool
	toServer, toClient atomic.Int64
}

// StartGateway listens on every endpoint's port and on cfg.Health, and
// relays until Close.
func StartGateway(cfg GatewayConfig, log *slog.Logger) (*Gateway, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.Default()
	}
	g := &Gateway{cfg: cfg, log: log, conns: map[net.Conn]struct{}{}}
	lc := net.ListenConfig{KeepAliveConfig: wanKeepAlive}
	for _, e := range cfg.Endpoints {
		k := &gwLink{Endpoint: e, Egress: e.Region != cfg.Region, conns: map[*gwConn]struct{}{}}
		l, err := lc.Listen(context.Background(), "tcp", net.JoinHostPort(cfg.Listen, strconv.Itoa(e.Port)))
		if err != nil {
			g.Close()
			return nil, fmt.Errorf("wan gateway: endpoint %s: %w", e.Addr, err)
		}
		g.listeners = append(g.listeners, l)
		g.links = append(g.links, k)
		g.wg.Go(func() { g.serve(l, k) })
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("GET /links", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(g.Links())
	})
	hl, err := net.Listen("tcp", cfg.Health)
	if err != nil {
		g.Close()
		return nil, fmt.Errorf("wan gateway: health listener: %w", err)
	}
	g.healthAddr = hl.Addr().String()
	g.health = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = g.health.Serve(hl) }()
	log.Info("wan gateway up", "region", cfg.Region, "endpoints", len(cfg.Endpoints), "one_way", time.Duration(*cfg.Latency))
	return g, nil
}

// Spike adds extra one-way latency to every connection the gateway
// relays, both ways and at once, open ones included, until Spike sets it
// again (0 ends it): on top of the configured latency on egress, alone on
// ingress. So every connection of the region with another region is
// slowed by about extra each way, whichever side dialed it, and spikes
// of two regions add up between them.
func (g *Gateway) Spike(extra time.Duration) {
	g.extra.Store(int64(max(extra, 0)))
	g.log.Info("wan gateway: latency spike", "region", g.cfg.Region, "extra_one_way", extra)
}

// ConfiguredSpike is GatewayConfig.Spike, what a spike asked for by
// signal adds.
func (g *Gateway) ConfiguredSpike() time.Duration { return time.Duration(*g.cfg.Spike) }

// HealthAddr is where GET /healthz and GET /links are served.
func (g *Gateway) HealthAddr() string { return g.healthAddr }

// GatewayLink describes one endpoint of a gateway, as GET /links lists it.
type GatewayLink struct {
	Endpoint
	// Egress is true for an endpoint in another region (delayed), false
	// for one of the gateway's own region (relayed as is).
	Egress bool `json:"egress"`
	// Open connections now, Accepted in all, and FailedDials: connections
	// closed at once because the other side could not be reached.
	Open        int64 `json:"open"`
	Accepted    int64 `json:"accepted"`
	FailedDials int64 `json:"failed_dials"`
	// Conns are the open connections, oldest first.
	Conns []GatewayConn `json:"conns,omitempty"`
}

// GatewayConn is one open connection of a link.
type GatewayConn struct {
	// From is the client's address (for an ingress link, the other
	// region's gateway).
	From string `json:"from"`
	// Age is how long ago the gateway accepted it.
	Age Duration `json:"age"`
	// Dialed is true once the onward connection is made (after the
	// handshake's round trip on an egress link).
	Dialed bool `json:"dialed"`
	// ToServer and ToClient are the bytes written onward each way.
	ToServer int64 `json:"to_server"`
	ToClient int64 `json:"to_client"`
}

// Links describes every endpoint's listener, in config order.
func (g *Gateway) Links() []GatewayLink {
	var out []GatewayLink
	now := time.Now()
	for _, k := range g.links {
		l := GatewayLink{Endpoint: k.Endpoint, Egress: k.Egress, Accepted: k.accepted.Load(), FailedDials: k.failed.Load()}
		k.mu.Lock()
		l.Open = int64(len(k.conns))
		for c := range k.conns {
			l.Conns = append(l.Conns, GatewayConn{From: c.from, Age: Duration(now.Sub(c.since)), Dialed: c.dialed.Load(),
				ToServer: c.toServer.Load(), ToClient: c.toClient.Load()})
		}
		k.mu.Unlock()
		slices.SortFunc(l.Conns, func(a, b GatewayConn) int { return cmp.Compare(b.Age, a.Age) })
		out = append(out, l)
	}
	return out
}

// Close stops listening and closes every relayed connection.
func (g *Gateway) Close() {
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return
	}
	g.closed = true
	for _, l := range g.listeners {
		_ = l.Close()
	}
	for c := range g.conns {
		_ = c.Close()
	}
	g.mu.Unlock()
	if g.health != nil {
		_ = g.health.Close()
	}
	g.wg.Wait()
}

// track registers c so Close closes it; false when the gateway is closed.
func (g *Gateway) track(c net.Conn) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return false
	}
	g.conns[c] = struct{}{}
	return true
}

func (g *Gateway) untrack(c net.Conn) {
	g.mu.Lock()
	delete(g.conns, c)
	g.mu.Unlock()
	_ = c.Close()
}

func (g *Gateway) serve(l net.Listener, k *gwLink) {
	for {
		c, err := l.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			g.log.Warn("wan gateway: accept", "endpoint", k.Addr, "err", err)
			time.Sleep(100 * time.Millisecond)
			continue
		}
		if !g.track(c) {
			_ = c.Close()
			return
		}
		k.accepted.Add(1)
		g.wg.Go(func() {
			defer g.untrack(c)
			gc := &gwConn{from: c.RemoteAddr().String(), since: time.Now()}
			k.mu.Lock()
			k.conns[gc] = struct{}{}
			k.mu.Unlock()
			defer func() {
				k.mu.Lock()
				delete(k.conns, gc)
				k.mu.Unlock()
			}()
			g.relay(c, k, gc)
		})
	}
}

// relay carries one connection: from a process of this region to another
// region's gateway (egress: delayed both ways, after one round trip for
// the handshake), or from another region's gateway to a server of this
// one (ingress: as is). The side that crosses regions gets keepalives and
// TCP_USER_TIMEOUT.
func (g *Gateway) relay(client net.Conn, k *gwLink, gc *gwConn) {
	base := time.Duration(*g.cfg.Latency)
	target := k.Addr
	d := net.Dialer{Timeout: dialTimeout}
	if k.Egress {
		target = net.JoinHostPort(g.cfg.Gateways[k.Region], strconv.Itoa(k.Port))
		d.KeepAliveConfig, d.Control = wanKeepAlive, setUserTimeout
		time.Sleep(2 * (base + time.Duration(g.extra.Load())))
	} else {
		base = 0
		_ = userTimeout(client)
	}
	delay := func() time.Duration { return base + time.Duration(g.extra.Load()) }
	up, err := d.Dial("tcp", target)
	if err != nil {
		k.failed.Add(1)
		g.log.Debug("wan gateway: dial", "endpoint", k.Addr, "via", target, "err", err)
		return
	}
	if !g.track(up) {
		_ = up.Close()
		return
	}
	defer g.untrack(up)
	gc.dialed.Store(true)
	var wg sync.WaitGroup
	wg.Go(func() { pipe(up, client, delay, &gc.toServer) })
	wg.Go(func() { pipe(client, up, delay, &gc.toClient) })
	wg.Wait()
}

// chunk is a piece of a stream and when the gateway read it.
type chunk struct {
	data []byte
	at   time.Time
}

// pipe copies src to dst, each chunk delay() after it was read from src
// (delay is read per chunk, so a spike reaches open connections), and
// half-closes dst when src ends; written counts the bytes written to dst.
// An error on either side closes both, so the other direction ends too.
func pipe(dst, src net.Conn, delay func() time.Duration, written *atomic.Int64) {
	fail := func() { _ = src.Close(); _ = dst.Close() }
	// Up to 256 chunks wait at once: a burst queues behind the delay
	// instead of stalling the reader (latency, not a bandwidth cap).
	queue := make(chan chunk, 256)
	go func() {
		defer close(queue)
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 {
				queue <- chunk{slices.Clone(buf[:n]), time.Now()}
			}
			if err != nil {
				if !errors.Is(err, io.EOF) {
					queue <- chunk{} // nil data: the stream broke
				}
				return
			}
		}
	}()
	broken := false
	for c := range queue {
		if broken {
			continue // drain until the reader sees the close
		}
		if c.data == nil {
			fail()
			broken = true
			continue
		}
		if wait := time.Until(c.at.Add(delay())); wait > 0 {
			time.Sleep(wait)
		}
		n, err := dst.Write(c.data)
		written.Add(int64(n))
		if err != nil {
			fail()
			broken = true
		}
	}
	if !broken {
		closeWrite(dst)
	}
}

// closeWrite half-closes c (a TCP connection), or closes it.
func closeWrite(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.CloseWrite()
		return
	}
	_ = c.Close()
}

// userTimeout sets TCP_USER_TIMEOUT on an accepted connection.
func userTimeout(c net.Conn) error {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return nil
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return err
	}
	return setUserTimeout("", "", raw)
}

// setUserTimeout sets TCP_USER_TIMEOUT (where the system has it) on a
// socket; it is also a net.Dialer's Control.
func setUserTimeout(_, _ string, c syscall.RawConn) error {
	var serr error
	if err := c.Control(func(fd uintptr) { serr = setUserTimeoutFD(fd, wanUserTimeout) }); err != nil {
		return err
	}
	return serr
}
