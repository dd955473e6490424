package harness

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// procInfo is the little we need to know about a process from /proc.
type procInfo struct {
	pid       int
	ppid      int
	startTime uint64 // clock ticks since boot (field 22 of /proc/PID/stat)
}

// readProc parses /proc/PID/stat. ok is false when the process is gone.
func readProc(pid int) (procInfo, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return procInfo{}, false
	}
	s := string(b)
	// comm (field 2) may contain spaces and parentheses: split after the last ')'.
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return procInfo{}, false
	}
	f := strings.Fields(s[i+1:])
	// f[0] is field 3 (state); ppid is field 4, starttime field 22.
	if len(f) < 20 {
		return procInfo{}, false
	}
	if f[0] == "Z" || f[0] == "X" {
		// A zombie has finished running; it only waits to be reaped.
		return procInfo{}, false
	}
	ppid, _ := strconv.Atoi(f[1])
	st, _ := strconv.ParseUint(f[19], 10, 64)
	return procInfo{pid: pid, ppid: ppid, startTime: st}, true
}

// procStartTime returns the start time of pid, 0 if it is gone.
func procStartTime(pid int) uint64 {
	p, ok := readProc(pid)
	if !ok {
		return 0
	}
	return p.startTime
}

// pidAlive reports whether pid runs and (when startTime != 0) is still the
// same process (guards against pid reuse).
func pidAlive(pid int, startTime uint64) bool {
	if pid <= 0 {
		return false
	}
	p, ok := readProc(pid)
	if !ok {
		return false
	}
	return startTime == 0 || p.startTime == startTime
}

// allProcs lists every process currently visible in /proc.
func allProcs() []procInfo {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []procInfo
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if p, ok := readProc(pid); ok {
			out = append(out, p)
		}
	}
	return out
}

// nsInode returns the inode of namespace kind ("net", "mnt") of pid, 0 if unknown.
func nsInode(pid int, kind string) uint64 {
	var st syscall.Stat_t
	if err := syscall.Stat(fmt.Sprintf("/proc/%d/ns/%s", pid, kind), &st); err != nil {
		return 0
	}
	return st.Ino
}

// fileInode returns the inode of a namespace file such as /var/run/netns/NAME.
func fileInode(path string) uint64 {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return 0
	}
	return st.Ino
}

// procsInNamespaces returns the pids of all processes whose network namespace
// is netIno or whose mount namespace is one of mntInos (0 values are ignored).
func procsInNamespaces(netIno uint64, mntInos ...uint64) []int {
	self := os.Getpid()
	var out []int
	for _, p := range allProcs() {
		if p.pid == self || p.pid == 1 {
			continue
		}
		if netIno != 0 && nsInode(p.pid, "net") == netIno {
			out = append(out, p.pid)
			continue
		}
		for _, m := range mntInos {
			if m != 0 && nsInode(p.pid, "mnt") == m {
				out = append(out, p.pid)
				break
			}
		}
	}
	return out
}

// descendants returns roots plus all their (transitive) children, roots first.
func descendants(roots ...int) []int {
	children := map[int][]int{}
	for _, p := range allProcs() {
		children[p.ppid] = append(children[p.ppid], p.pid)
	}
	seen := map[int]bool{}
	var out []int
	var walk func(int)
	walk = func(pid int) {
		if seen[pid] {
			return
		}
		seen[pid] = true
		out = append(out, pid)
		for _, c := range children[pid] {
			walk(c)
		}
	}
	for _, r := range roots {
		walk(r)
	}
	return out
}

// killTrees SIGKILLs the given processes and all their descendants (the whole
// tree is collected before the first signal, so that re-parented children are
// not missed) and waits up to timeout for them to disappear. It returns the
// pids still alive afterwards. pid 1 and the test process are never signalled.
func killTrees(timeout time.Duration, roots ...int) []int {
	self := os.Getpid()
	var pids []int
	for _, p := range descendants(roots...) {
		if p > 1 && p != self {
			pids = append(pids, p)
		}
	}
	starts := map[int]uint64{}
	for _, p := range pids {
		starts[p] = procStartTime(p)
		_ = syscall.Kill(p, syscall.SIGKILL)
	}
	deadline := time.Now().Add(timeout)
	for {
		var alive []int
		for _, p := range pids {
			if starts[p] != 0 && pidAlive(p, starts[p]) {
				alive = append(alive, p)
			}
		}
		if len(alive) == 0 || time.Now().After(deadline) {
			return alive
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// procCmdline returns a printable command line of pid (for diagnostics).
func procCmdline(pid int) string {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
	if err != nil {
		return "?"
	}
	return strings.TrimSpace(strings.ReplaceAll(string(b), "\x00", " "))
}
