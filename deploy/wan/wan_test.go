package wan

import (
	"bufio"
	"io"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// echoServer answers every line with the same line until the test ends.
func echoServer(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var wg sync.WaitGroup
	t.Cleanup(func() { l.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	return l.Addr().String()
}

func quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }

func setup(t *testing.T, latency time.Duration) (*Net, string) {
	t.Helper()
	n := New(quiet())
	t.Cleanup(n.Close)
	addr, err := n.Link("a>b/echo", "a", "b", echoServer(t), latency)
	require.NoError(t, err)
	return n, addr
}

// roundTrip sends one line on c and waits for its echo.
func roundTrip(t *testing.T, c net.Conn, r *bufio.Reader) time.Duration {
	t.Helper()
	start := time.Now()
	_, err := c.Write([]byte("ping\n"))
	require.NoError(t, err)
	line, err := r.ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "ping\n", line)
	return time.Since(start)
}

func TestLatencyBothWays(t *testing.T) {
	t.Parallel()
	const oneWay = 30 * time.Millisecond
	n, addr := setup(t, oneWay)
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer c.Close()
	r := bufio.NewReader(c)
	for range 3 {
		// Lower bound only: a loaded machine may be slower, never faster.
		require.GreaterOrEqual(t, roundTrip(t, c, r), 2*oneWay)
	}

	// A change applies to open connections.
	require.NoError(t, n.SetLatency(60*time.Millisecond))
	require.GreaterOrEqual(t, roundTrip(t, c, r), 120*time.Millisecond)

	links := n.Links()
	require.Len(t, links, 1)
	require.Equal(t, LinkInfo{Name: "a>b/echo", From: "a", To: "b", Listen: addr, Upstream: links[0].Upstream, LatencyMS: 60, Enabled: true}, links[0])
}

func TestCutAndHeal(t *testing.T) {
	t.Parallel()
	n, addr := setup(t, time.Millisecond)
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer c.Close()
	r := bufio.NewReader(c)
	roundTrip(t, c, r)

	require.NoError(t, n.Cut("b"))
	require.False(t, n.Links()[0].Enabled)
	// The open connection is closed...
	require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
	_, _ = c.Write([]byte("lost\n"))
	_, err = r.ReadString('\n')
	require.Error(t, err)
	require.NotContains(t, err.Error(), "timeout", "the cut closes the connection rather than blackholing it")
	// ...and new ones are refused.
	_, err = net.DialTimeout("tcp", addr, time.Second)
	require.Error(t, err)

	require.NoError(t, n.Heal("a"), "healing either end heals the link")
	require.True(t, n.Links()[0].Enabled)
	c2, err := net.Dial("tcp", addr)
	require.NoError(t, err, "same address after heal")
	defer c2.Close()
	roundTrip(t, c2, bufio.NewReader(c2))

	require.NoError(t, n.SetLinkEnabled("a>b/echo", false))
	_, err = net.DialTimeout("tcp", addr, time.Second)
	require.Error(t, err)
	require.NoError(t, n.SetLinkEnabled("a>b/echo", true))
	require.NoError(t, n.SetLinkEnabled("a>b/echo", true), "enabling an enabled link is a no-op")
}

func TestBadInput(t *testing.T) {
	t.Parallel()
	n := New(quiet())
	defer n.Close()
	up := echoServer(t)
	for _, tc := range []struct {
		name, link, from, to, upstream string
		latency                        time.Duration
		want                           string
	}{
		{"no name", "", "a", "b", up, 0, "required"},
		{"same region", "x", "a", "a", up, 0, "join two regions"},
		{"negative", "x", "a", "b", up, -time.Second, "want 0 or more"},
		{"bad upstream", "x", "a", "b", "nowhere", 0, "host:port"},
	} {
		_, err := n.Link(tc.link, tc.from, tc.to, tc.upstream, tc.latency)
		require.ErrorContains(t, err, tc.want, tc.name)
	}
	_, err := n.Link("x", "a", "b", up, 0)
	require.NoError(t, err)
	_, err = n.Link("x", "a", "c", up, 0)
	require.ErrorContains(t, err, "exists already")
	require.ErrorContains(t, n.Cut("mars"), `no link touches region "mars" (regions: a, b)`)
	require.ErrorContains(t, n.SetLinkEnabled("y", false), `no link "y"`)
	require.Error(t, n.SetLatency(-1))

	n.Close()
	n.Close()
	_, err = n.Link("z", "a", "b", up, 0)
	require.ErrorIs(t, err, ErrClosed)
	require.ErrorIs(t, n.Cut("a"), ErrClosed)
	require.True(t, strings.HasPrefix(n.Links()[0].Listen, "127.0.0.1:"))
}

// TestCutUnderTraffic cuts and heals while connections carry traffic and
// the latency changes: the race detector checks the proxies' bookkeeping.
func TestCutUnderTraffic(t *testing.T) {
	t.Parallel()
	n, addr := setup(t, time.Millisecond)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				c, err := net.DialTimeout("tcp", addr, time.Second)
				if err != nil {
					time.Sleep(time.Millisecond)
					continue
				}
				_ = c.SetDeadline(time.Now().Add(2 * time.Second))
				r := bufio.NewReader(c)
				for range 5 {
					if _, err := c.Write([]byte("x\n")); err != nil {
						break
					}
					if _, err := r.ReadString('\n'); err != nil {
						break
					}
				}
				c.Close()
			}
		}()
	}
	for i := range 10 {
		time.Sleep(20 * time.Millisecond)
		require.NoError(t, n.Cut("a"))
		require.NoError(t, n.SetLatency(time.Duration(i)*time.Millisecond))
		time.Sleep(5 * time.Millisecond)
		require.NoError(t, n.Heal("b"))
	}
	close(stop)
	wg.Wait()
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer c.Close()
	roundTrip(t, c, bufio.NewReader(c))
}

// TestLinkPortOutsideEphemeralRange: a link listened on a kernel-chosen
// port, which is in the ephemeral range; while the link was cut, an
// outgoing connection of any process could be given that port as its
// local port, and the heal failed with "bind: address already in use".
// Links now listen below the ephemeral range, where the kernel never
// hands out ports on its own.
func TestLinkPortOutsideEphemeralRange(t *testing.T) {
	t.Parallel()
	n, addr := setup(t, 0)
	_, port, err := net.SplitHostPort(addr)
	require.NoError(t, err)
	p, err := strconv.Atoi(port)
	require.NoError(t, err)
	low, _ := ephemeralRange()
	require.Less(t, p, low, "link port %d is in the ephemeral range (from %d)", p, low)
	require.NoError(t, n.Cut("b"))
	require.NoError(t, n.Heal("b"))
}

// TestSpike: a spike of a region adds to the links that touch it, on open
// connections too, spikes of both ends add up, and ending it restores
// the base latency (a SetLatency during the spike included).
func TestSpike(t *testing.T) {
	t.Parallel()
	const oneWay = 10 * time.Millisecond
	n, addr := setup(t, oneWay)
	_, err := n.Link("c>d/echo", "c", "d", echoServer(t), oneWay)
	require.NoError(t, err)
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer c.Close()
	r := bufio.NewReader(c)
	roundTrip(t, c, r)

	require.NoError(t, n.Spike("b", 100*time.Millisecond))
	require.GreaterOrEqual(t, roundTrip(t, c, r), 220*time.Millisecond, "an open connection is slowed")
	require.NoError(t, n.Spike("a", 50*time.Millisecond))
	latency := func() map[string]float64 {
		out := map[string]float64{}
		for _, l := range n.Links() {
			out[l.Name] = l.LatencyMS
		}
		return out
	}
	require.Equal(t, map[string]float64{"a>b/echo": 160, "c>d/echo": 10}, latency(), "both ends' spikes, and none on the other link")
	require.NoError(t, n.SetLatency(20*time.Millisecond))
	require.Equal(t, map[string]float64{"a>b/echo": 170, "c>d/echo": 20}, latency())
	require.NoError(t, n.Spike("b", 0))
	require.NoError(t, n.Spike("a", 0))
	require.Equal(t, map[string]float64{"a>b/echo": 20, "c>d/echo": 20}, latency())
	rtt := roundTrip(t, c, r)
	require.GreaterOrEqual(t, rtt, 40*time.Millisecond)
	require.Less(t, rtt, 200*time.Millisecond, "the spike is over")
	require.Error(t, n.Spike("nowhere", time.Second), "a region no link touches")
	require.Error(t, n.Spike("a", -time.Second))
}
