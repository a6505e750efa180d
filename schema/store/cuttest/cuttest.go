package cuttest

import (
	"encoding/binary"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Proxy forwards TCP connections to a MariaDB server and cuts one when
// armed (Arm).
type Proxy struct {
	t      testing.TB
	ln     net.Listener
	target string

	mu      sync.Mutex
	match   func(query string) bool // nil: disarmed
	deliver bool                    // forward the query before cutting
	cuts    chan struct{}           // one value per cut

	refuse atomic.Bool
	wg     sync.WaitGroup
	conns  sync.Map // net.Conn → struct{}
}

// Start listens on a loopback port and forwards to target (host:port);
// everything stops when t ends.
func Start(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("cuttest: %v", err)
	}
	p := &Proxy{t: t, ln: ln, target: target, cuts: make(chan struct{}, 16)}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(func() {
		ln.Close()
		p.conns.Range(func(c, _ any) bool { c.(net.Conn).Close(); return true })
		p.wg.Wait()
	})
	return p
}

// Addr is the address clients dial instead of the server's.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Refuse makes the proxy close new connections at once (true), as a
// server that cannot be reached, or accept them again (false).
func (p *Proxy) Refuse(on bool) { p.refuse.Store(on) }

// Arm makes the next query for which match is true cut its connection,
// once: after the server answered all of it when deliver, else before
// the query is sent.
func (p *Proxy) Arm(deliver bool, match func(query string) bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.match, p.deliver = match, deliver
}

// Cut waits for the armed cut to have happened.
func (p *Proxy) Cut() {
	p.t.Helper()
	select {
	case <-p.cuts:
	case <-time.After(10 * time.Second):
		p.t.Fatal("cuttest: the armed query never came")
	}
}

// IsCommit matches a COMMIT statement sent alone (database/sql's
// Tx.Commit).
func IsCommit(q string) bool { return strings.TrimSpace(q) == "COMMIT" }

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if p.refuse.Load() {
			c.Close()
			continue
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.conns.Store(c, struct{}{})
		p.conns.Store(s, struct{}{})
		p.wg.Add(2)
		var cut atomic.Bool
		replied := make(chan struct{})
		go p.toClient(c, s, &cut, replied)
		go p.toServer(c, s, &cut, replied)
	}
}

// toClient copies the server's bytes to the client until a cut began;
// then it drains the server's answer until it is quiet for 300 ms (a
// multi-statement query is answered in several writes, and every
// statement of it must have run) and closes replied.
func (p *Proxy) toClient(c, s net.Conn, cut *atomic.Bool, replied chan struct{}) {
	defer p.wg.Done()
	defer c.Close()
	buf := make([]byte, 64<<10)
	for {
		n, err := s.Read(buf)
		if n > 0 && cut.Load() {
			for err == nil {
				_ = s.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
				_, err = s.Read(buf)
			}
			close(replied)
			return
		}
		if n > 0 {
			if _, werr := c.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// toServer copies the client's packets to the server, looking at each
// command packet (sequence 0) that is a COM_QUERY for the armed match.
func (p *Proxy) toServer(c, s net.Conn, cut *atomic.Bool, replied chan struct{}) {
	defer p.wg.Done()
	defer s.Close()
	defer c.Close()
	for {
		var hdr [4]byte
		if _, err := io.ReadFull(c, hdr[:]); err != nil {
			return
		}
		n := int(binary.LittleEndian.Uint32([]byte{hdr[0], hdr[1], hdr[2], 0}))
		pkt := make([]byte, 4+n)
		copy(pkt, hdr[:])
		if _, err := io.ReadFull(c, pkt[4:]); err != nil {
			return
		}
		if hdr[3] == 0 && n > 0 && pkt[4] == 0x03 && p.hit(string(pkt[5:])) {
			p.mu.Lock()
			deliver := p.deliver
			p.mu.Unlock()
			if deliver {
				cut.Store(true)
				if _, err := s.Write(pkt); err == nil {
					select {
					case <-replied:
					case <-time.After(10 * time.Second):
					}
				}
			}
			p.cuts <- struct{}{}
			return
		}
		if _, err := s.Write(pkt); err != nil {
			return
		}
	}
}

// hit reports whether query matches the armed cut, and disarms it if so.
func (p *Proxy) hit(query string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.match == nil || !p.match(query) {
		return false
	}
	p.match = nil
	return true
}
