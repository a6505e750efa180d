package freeport

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
)

// lowest is the bottom of the range Pick chooses from. It stays clear of
// the ports the local bed serves on by default (808x, 909x, 4222, 3306).
const lowest = 20000

var picked struct {
	sync.Mutex
	ports map[int]bool
}

// Pick returns a free loopback port that this process has not been given
// before. Where the ephemeral range leaves no room below it, it falls
// back to asking the kernel.
func Pick() (int, error) {
	picked.Lock()
	defer picked.Unlock()
	if picked.ports == nil {
		picked.ports = map[int]bool{}
	}
	hi := ephemeralLow()
	for range 200 {
		var port int
		if hi-lowest >= 1000 {
			port = lowest + rand.IntN(hi-lowest)
			if picked.ports[port] {
				continue
			}
			l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
			if err != nil {
				continue // taken
			}
			l.Close()
		} else {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				return 0, fmt.Errorf("freeport: %w", err)
			}
			port = l.Addr().(*net.TCPAddr).Port
			l.Close()
			if picked.ports[port] {
				continue
			}
		}
		picked.ports[port] = true
		return port, nil
	}
	return 0, errors.New("freeport: no free port after 200 tries")
}

// Addr is Pick as host:port on 127.0.0.1.
func Addr() (string, error) {
	p, err := Pick()
	if err != nil {
		return "", err
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(p)), nil
}

// ephemeralLow is the first port of the kernel's ephemeral range, or
// lowest (no room: fall back to the kernel) when it cannot be read.
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return lowest
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return lowest
	}
	n, err := strconv.Atoi(f[0])
	if err != nil {
		return lowest
	}
	return n
}
