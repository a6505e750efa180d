package wan

import (
	"syscall"
	"time"
)

// tcpUserTimeout is TCP_USER_TIMEOUT of linux/tcp.h, which package syscall
// lacks.
const tcpUserTimeout = 0x12

// setUserTimeoutFD sets TCP_USER_TIMEOUT: unacknowledged data older than d
// closes the connection, where the kernel would otherwise retransmit for
// about fifteen minutes.
func setUserTimeoutFD(fd uintptr, d time.Duration) error {
	return syscall.SetsockoptInt(int(fd), syscall.IPPROTO_TCP, tcpUserTimeout, int(d.Milliseconds()))
}
