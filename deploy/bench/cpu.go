package bench

import (
	"cmp"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// clockTicks is USER_HZ, the unit of /proc CPU times: 100 on every Linux
// architecture Go supports.
const clockTicks = 100

// cpuSnap is a point-in-time reading of where the box's CPU went, so a
// scenario can say what limited it: this process (the Triage node, NATS
// and the load generators), the bed's mariadbd processes, or other work
// on the box.
type cpuSnap struct {
	at               time.Time
	self             time.Duration
	mariadbd         time.Duration
	busy, iowait, tt uint64 // /proc/stat jiffies: busy, iowait, total
}

func takeCPU(pids []int) cpuSnap {
	s := cpuSnap{at: time.Now()}
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		s.self = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	for _, pid := range pids {
		s.mariadbd += procCPU(pid)
	}
	s.busy, s.iowait, s.tt = procStat()
	return s
}

// procCPU returns user+system time of pid from /proc/<pid>/stat.
func procCPU(pid int) time.Duration {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	// Fields after the command name, which is in parentheses and may hold
	// spaces; utime and stime are fields 14 and 15 of the whole line.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseUint(f[11], 10, 64)
	st, _ := strconv.ParseUint(f[12], 10, 64)
	return time.Duration(u+st) * time.Second / clockTicks
}

// procStat returns the box's busy, iowait and total jiffies.
func procStat() (busy, iowait, total uint64) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 8 || f[0] != "cpu" {
		return 0, 0, 0
	}
	var v []uint64
	for _, x := range f[1:] {
		n, _ := strconv.ParseUint(x, 10, 64)
		v = append(v, n)
	}
	for i, n := range v {
		total += n
		if i == 3 || i == 4 || i == 7 { // idle, iowait, steal (the hypervisor's)
			continue
		}
		if i >= 8 { // guest time is already counted in user
			total -= n
			continue
		}
		busy += n
	}
	return busy, v[4], total
}

// cpuUse is what a scenario used, in cores.
type cpuUse struct {
	self, mariadbd, other, iowait, box float64
	// server names the database processes counted in mariadbd, and
	// process what ran in this one; defaults: the bed's mariadbd, and the
	// Triage node, NATS and the load generators. River's rows set them.
	server, process string
}

func cpuSince(a, b cpuSnap, cores int) cpuUse {
	wall := b.at.Sub(a.at).Seconds()
	if wall <= 0 {
		return cpuUse{}
	}
	u := cpuUse{
		self:     (b.self - a.self).Seconds() / wall,
		mariadbd: (b.mariadbd - a.mariadbd).Seconds() / wall,
	}
	if dt := float64(b.tt - a.tt); dt > 0 {
		u.box = float64(b.busy-a.busy) / dt * float64(cores)
		u.iowait = float64(b.iowait-a.iowait) / dt * float64(cores)
		u.other = max(0, u.box-u.self-u.mariadbd)
	}
	return u
}

func (u cpuUse) note(cores int) string {
	return fmt.Sprintf("CPU in cores of %d: this process (%s) %.2f, %s %.2f, other processes %.2f, idle %.2f (iowait %.2f)",
		cores, cmp.Or(u.process, "Triage node, NATS, load generators"), u.self, cmp.Or(u.server, "mariadbd"), u.mariadbd,
		u.other, max(0, float64(cores)-u.box), u.iowait)
}

func (u cpuUse) metrics(m map[string]float64) {
	m["cpu_this_process_cores"] = u.self
	m["cpu_"+cmp.Or(u.server, "mariadbd")+"_cores"] = u.mariadbd
	m["cpu_other_processes_cores"] = u.other
	m["cpu_box_busy_cores"] = u.box
	m["cpu_iowait_cores"] = u.iowait
}
