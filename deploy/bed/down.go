package bed

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
	"time"
)

func alive(pid int) bool {
	return syscall.Kill(pid, 0) == nil
}

// ours checks /proc that pid still runs the program bed.json says, so a
// stale file never gets an unrelated process that reused the PID signalled.
func ours(p Process) bool {
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p.PID))
	if err != nil {
		return false
	}
	want := "triage"
	if strings.HasPrefix(p.Role, "mysql") {
		want = "mariadbd"
	}
	return strings.Contains(string(cmdline), want)
}

// Down stops the bed described by dir's bed.json from another process: it
// sends SIGTERM to the bed's own process (which stops its children
// cleanly), waits, then stops any listed process still alive, by PID only.
func Down(dir string, timeout time.Duration) error {
	l, err := ReadLayout(dir)
	if errors.Is(err, os.ErrNotExist) {
		return errNotRunning
	}
	if err != nil {
		return err
	}
	self := os.Getpid()
	owners := map[int]bool{}
	for _, p := range l.Processes {
		if !ours(p) {
			continue
		}
		if p.Role == "triage" || p.Role == "nats" {
			owners[p.PID] = true
		}
	}
	signalAll := func(pids map[int]bool, sig syscall.Signal) {
		for pid := range pids {
			if pid != self && alive(pid) {
				_ = syscall.Kill(pid, sig)
			}
		}
	}
	waitGone := func(pids map[int]bool, d time.Duration) bool {
		deadline := time.Now().Add(d)
		for time.Now().Before(deadline) {
			left := false
			for pid := range pids {
				if alive(pid) {
					left = true
				}
			}
			if !left {
				return true
			}
			time.Sleep(100 * time.Millisecond)
		}
		return false
	}
	signalAll(owners, syscall.SIGTERM)
	waitGone(owners, timeout)
	rest := map[int]bool{}
	for _, p := range l.Processes {
		if p.PID != self && alive(p.PID) && ours(p) {
			rest[p.PID] = true
		}
	}
	if len(rest) > 0 {
		signalAll(rest, syscall.SIGTERM)
		if !waitGone(rest, timeout) {
			signalAll(rest, syscall.SIGKILL)
			waitGone(rest, 5*time.Second)
		}
	}
	_ = os.Remove(LayoutPath(dir))
	for pid := range rest {
		if alive(pid) {
			return fmt.Errorf("pid %d did not stop", pid)
		}
	}
	return nil
}

// ErrNotRunning reports whether err means no bed was found.
func ErrNotRunning(err error) bool { return errors.Is(err, errNotRunning) }
