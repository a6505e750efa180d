package wan

import (
	"bufio"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/triage-queue/triage/deploy/freeport"
)

// gateways starts the gateways of regions a (on 127.0.0.2) and b (on
// 127.0.0.3), on one host as the compose bed runs them in one container
// each, with an echo server of region b as the endpoint both listen for.
// It returns the endpoint's port and the two gateways.
func gateways(t *testing.T, latency time.Duration) (port int, a, b *Gateway) {
	t.Helper()
	echo := echoServer(t)
	port, err := freeport.Pick()
	require.NoError(t, err)
	d := Duration(latency)
	start := func(region, host string) *Gateway {
		g, err := StartGateway(GatewayConfig{Region: region, Latency: &d, Listen: host, Health: host + ":0",
			Gateways:  map[string]string{"a": "127.0.0.2", "b": "127.0.0.3"},
			Endpoints: []Endpoint{{Addr: echo, Region: "b", Port: port}}}, quiet())
		require.NoError(t, err)
		t.Cleanup(g.Close)
		return g
	}
	return port, start("a", "127.0.0.2"), start("b", "127.0.0.3")
}

func dialLine(t *testing.T, addr string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	require.NoError(t, c.SetDeadline(time.Now().Add(30*time.Second)))
	return c, bufio.NewReader(c)
}

// TestGatewayDelaysWhatLeavesTheRegion: through region a's gateway, a
// round trip to b's echo server costs at least two one-way latencies (the
// first one more: the handshake's round trip); b's own gateway relays
// without delay, as a region's ingress.
func TestGatewayDelaysWhatLeavesTheRegion(t *testing.T) {
	t.Parallel()
	const oneWay = 50 * time.Millisecond
	port, a, b := gateways(t, oneWay)
	c, r := dialLine(t, net.JoinHostPort("127.0.0.2", strconv.Itoa(port)))
	require.GreaterOrEqual(t, roundTrip(t, c, r), 4*oneWay, "first round trip: handshake plus request")
	for range 3 {
		rtt := roundTrip(t, c, r)
		require.GreaterOrEqual(t, rtt, 2*oneWay)
		require.Less(t, rtt, 4*oneWay, "one round trip, not two")
	}

	in, ir := dialLine(t, net.JoinHostPort("127.0.0.3", strconv.Itoa(port)))
	require.Less(t, roundTrip(t, in, ir), oneWay, "ingress adds no delay")

	links := a.Links()
	require.Len(t, links, 1)
	require.True(t, links[0].Egress)
	require.Equal(t, int64(1), links[0].Accepted)
	require.Equal(t, int64(1), links[0].Open)
	// The open connection and what crossed it: four pings and their
	// echoes (counted after each write returns, which may be after the
	// client read it).
	require.Eventually(t, func() bool {
		cs := a.Links()[0].Conns
		return len(cs) == 1 && cs[0].From == c.LocalAddr().String() && cs[0].Dialed && cs[0].ToServer == 4*5 && cs[0].ToClient == 4*5
	}, 5*time.Second, 10*time.Millisecond, "%+v", a.Links())
	// And on b's side, ingress: two connections, one from a's gateway.
	require.Eventually(t, func() bool {
		cs := b.Links()[0].Conns
		return len(cs) == 2 && cs[0].ToClient == 4*5 && cs[1].ToClient == 5
	}, 5*time.Second, 10*time.Millisecond, "%+v", b.Links())
}

// TestGatewaySpike: a spike slows open connections at once, on egress
// (on top of the latency) and on ingress (alone), and ends.
func TestGatewaySpike(t *testing.T) {
	t.Parallel()
	const oneWay = 10 * time.Millisecond
	port, a, b := gateways(t, oneWay)
	c, r := dialLine(t, net.JoinHostPort("127.0.0.2", strconv.Itoa(port)))
	in, ir := dialLine(t, net.JoinHostPort("127.0.0.3", strconv.Itoa(port)))
	roundTrip(t, c, r)
	roundTrip(t, in, ir)
	require.Equal(t, DefaultSpike, a.ConfiguredSpike())

	a.Spike(100 * time.Millisecond)
	require.GreaterOrEqual(t, roundTrip(t, c, r), 2*(oneWay+100*time.Millisecond), "egress: latency and spike")
	b.Spike(100 * time.Millisecond)
	require.GreaterOrEqual(t, roundTrip(t, in, ir), 200*time.Millisecond, "ingress: the spike alone")
	a.Spike(0)
	b.Spike(0)
	rtt := roundTrip(t, c, r)
	require.GreaterOrEqual(t, rtt, 2*oneWay)
	require.Less(t, rtt, 200*time.Millisecond, "the spike is over")
	require.Less(t, roundTrip(t, in, ir), 100*time.Millisecond)
}

// TestGatewayClosesWhatItCannotReach: a connection whose other side
// cannot be dialed (region b's gateway is gone) is closed at once and
// counted; one whose server goes away ends with EOF for the client.
func TestGatewayClosesWhatItCannotReach(t *testing.T) {
	t.Parallel()
	port, a, b := gateways(t, time.Millisecond)
	c, r := dialLine(t, net.JoinHostPort("127.0.0.2", strconv.Itoa(port)))
	roundTrip(t, c, r)

	b.Close() // region b's side of every connection closes
	_, err := r.ReadString('\n')
	require.ErrorIs(t, err, io.EOF)

	c2, r2 := dialLine(t, net.JoinHostPort("127.0.0.2", strconv.Itoa(port)))
	_, _ = c2.Write([]byte("lost\n"))
	_, err = r2.ReadString('\n')
	require.Error(t, err)
	require.NotContains(t, err.Error(), "timeout")
	require.Eventually(t, func() bool { return a.Links()[0].FailedDials == 1 }, 5*time.Second, 10*time.Millisecond)

	// The health endpoint answers and lists the links.
	for path, want := range map[string]string{"/healthz": "ok\n", "/links": `"failed_dials":1`} {
		resp, err := http.Get("http://" + a.HealthAddr() + path)
		require.NoError(t, err)
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		require.Contains(t, string(body), want)
	}
}

// TestGatewayConfig: a config that cannot work is refused with the reason.
func TestGatewayConfig(t *testing.T) {
	t.Parallel()
	neg := Duration(-time.Millisecond)
	for _, tc := range []struct {
		name string
		cfg  GatewayConfig
		want string
	}{
		{"no region", GatewayConfig{}, "region is required"},
		{"negative latency", GatewayConfig{Region: "a", Latency: &neg}, "want 0 or more"},
		{"bad address", GatewayConfig{Region: "a", Endpoints: []Endpoint{{Addr: "db", Region: "a", Port: 1}}}, "want host:port"},
		{"bad port", GatewayConfig{Region: "a", Endpoints: []Endpoint{{Addr: "db:1", Region: "a", Port: 70000}}}, "want 1-65535"},
		{"shared port", GatewayConfig{Region: "a", Endpoints: []Endpoint{{Addr: "db:1", Region: "a", Port: 5}, {Addr: "db:2", Region: "a", Port: 5}}}, "share port 5"},
		{"no gateway", GatewayConfig{Region: "a", Endpoints: []Endpoint{{Addr: "db:1", Region: "b", Port: 5}}}, `region "b", which has no gateway`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := StartGateway(tc.cfg, quiet())
			require.ErrorContains(t, err, tc.want)
		})
	}
	var c GatewayConfig
	require.NoError(t, json.Unmarshal([]byte(`{"region":"a","latency":"20ms"}`), &c))
	require.Equal(t, Duration(20*time.Millisecond), *c.Latency)
}
