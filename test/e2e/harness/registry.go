package harness

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// registryDir records, per test process, what the harness created, so that a
// later run can remove what a killed test process (go test -timeout panics do
// not run t.Cleanup) left behind. It lives on /run: gone after a reboot.
const registryDir = "/run/cnme2e-harness"

// resource is one thing the harness created.
type resource struct {
	Kind  string   `json:"kind"` // "pid", "netns", "link", "iptables", "dir", "procdir"
	Name  string   `json:"name"` // netns / link name, directory, description of a pid
	Pid   int      `json:"pid,omitempty"`
	Start uint64   `json:"start,omitempty"` // start time of Pid (pid reuse guard)
	Args  []string `json:"args,omitempty"`  // iptables rule spec (after the chain)
	file  string
}

func (r resource) String() string {
	switch r.Kind {
	case "pid":
		return fmt.Sprintf("pid %d (%s)", r.Pid, r.Name)
	case "iptables":
		return "iptables rule " + strings.Join(r.Args, " ")
	}
	return r.Kind + " " + r.Name
}

var reg struct {
	sync.Mutex
	dir     string
	seq     int
	history []resource
}

func ownerDir() string {
	if reg.dir == "" {
		reg.dir = filepath.Join(registryDir, fmt.Sprintf("%d.%d", os.Getpid(), procStartTime(os.Getpid())))
		_ = os.MkdirAll(reg.dir, 0o700)
	}
	return reg.dir
}

// track records r (in memory for Leftovers, on disk for SweepStale) and
// returns the function that forgets it on disk once it has been removed.
func track(r resource) (untrack func()) {
	reg.Lock()
	defer reg.Unlock()
	reg.seq++
	r.file = filepath.Join(ownerDir(), fmt.Sprintf("%06d-%s", reg.seq, r.Kind))
	if b, err := json.Marshal(r); err == nil {
		_ = os.WriteFile(r.file, b, 0o600)
	}
	reg.history = append(reg.history, r)
	return func() { _ = os.Remove(r.file) }
}

// resourceExists reports whether r is still present.
func resourceExists(r resource) bool {
	switch r.Kind {
	case "pid":
		return pidAlive(r.Pid, r.Start)
	case "netns":
		_, err := os.Stat(netnsPath(r.Name))
		return err == nil
	case "link":
		_, err := net.InterfaceByName(r.Name)
		return err == nil
	case "dir", "procdir":
		_, err := os.Stat(r.Name)
		return err == nil
	case "iptables":
		_, err := runCmd(nil, nil, append([]string{"iptables", "-w", "-C"}, r.Args...)...)
		return err == nil
	}
	return false
}

// Leftovers lists everything this test process created through the harness
// that still exists: network namespaces, interfaces, processes (dockerd,
// containerd, plugin, etcd, ...), iptables rules, temp dirs. After all
// cleanups have run it must be empty.
func Leftovers() []string {
	reg.Lock()
	hist := append([]resource(nil), reg.history...)
	reg.Unlock()
	var out []string
	var dirs []string
	for _, r := range hist {
		if r.Kind == "procdir" { // removed by Main at the very end
			continue
		}
		if resourceExists(r) {
			out = append(out, r.String())
		}
		if r.Kind == "dir" {
			dirs = append(dirs, r.Name)
		}
	}
	// Processes not started directly (containerd, shims) carry the host's
	// unique temp dir on their command line (-address DIR/exec/...).
	self := os.Getpid()
	for _, p := range allProcs() {
		if p.pid == self {
			continue
		}
		cmd := procCmdline(p.pid)
		for _, d := range dirs {
			if strings.Contains(cmd, d) {
				out = append(out, fmt.Sprintf("pid %d (%s)", p.pid, cmd))
				break
			}
		}
	}
	return out
}

// CreatedNetns returns the names of all network namespaces this process created.
func CreatedNetns() []string {
	return created("netns", func(r resource) string { return r.Name })
}

// CreatedPids returns the pids of all long-running processes (dockerd,
// plugin, etcd) this process started.
func CreatedPids() []int {
	return created("pid", func(r resource) int { return r.Pid })
}

// created returns field of every resource of kind this process created, in
// the order they were created.
func created[T any](kind string, field func(resource) T) []T {
	reg.Lock()
	defer reg.Unlock()
	var out []T
	for _, r := range reg.history {
		if r.Kind == kind {
			out = append(out, field(r))
		}
	}
	return out
}

// SweepStale removes what earlier, now dead, test processes recorded in
// /run/cnme2e-harness and did not clean up (processes killed by pid tree and
// by network namespace, then iptables rules, interfaces, namespaces, dirs).
// Records of live processes (e.g. a concurrent go test) are not touched.
func SweepStale(logf func(string, ...any)) {
	owners, err := os.ReadDir(registryDir)
	if err != nil {
		return
	}
	for _, o := range owners {
		pidS, startS, ok := strings.Cut(o.Name(), ".")
		if !ok {
			continue
		}
		pid, _ := strconv.Atoi(pidS)
		start, _ := strconv.ParseUint(startS, 10, 64)
		if pid == os.Getpid() || pidAlive(pid, start) {
			continue
		}
		dir := filepath.Join(registryDir, o.Name())
		files, _ := os.ReadDir(dir)
		var rs []resource
		for _, f := range files {
			b, err := os.ReadFile(filepath.Join(dir, f.Name()))
			if err != nil {
				continue
			}
			var r resource
			if json.Unmarshal(b, &r) == nil {
				rs = append(rs, r)
			}
		}
		if len(rs) > 0 {
			logf("sweeping %d resources left by dead test process %d", len(rs), pid)
		}
		order := map[string]int{"pid": 0, "netns": 1, "iptables": 2, "link": 3, "dir": 4, "procdir": 4}
		sort.SliceStable(rs, func(i, j int) bool { return order[rs[i].Kind] < order[rs[j].Kind] })
		for _, r := range rs {
			if !resourceExists(r) {
				continue
			}
			logf("  removing %s", r)
			switch r.Kind {
			case "pid":
				killTrees(5*time.Second, r.Pid)
			case "netns":
				if ino := fileInode(netnsPath(r.Name)); ino != 0 {
					if pids := procsInNamespaces(ino); len(pids) > 0 {
						killTrees(5*time.Second, pids...)
					}
				}
				_, _ = runCmd(nil, nil, "ip", "netns", "delete", r.Name)
			case "iptables":
				_, _ = runCmd(nil, nil, append([]string{"iptables", "-w", "-D"}, r.Args...)...)
			case "link":
				_, _ = runCmd(nil, nil, "ip", "link", "delete", r.Name)
			case "dir", "procdir":
				_ = os.RemoveAll(r.Name)
			}
		}
		_ = os.RemoveAll(dir)
	}
}

// forgetOwnerDir removes this process' on-disk records of resources that are
// gone (all of them, after a clean run).
func forgetOwnerDir() {
	reg.Lock()
	defer reg.Unlock()
	if reg.dir == "" {
		return
	}
	files, _ := os.ReadDir(reg.dir)
	left := 0
	for _, f := range files {
		path := filepath.Join(reg.dir, f.Name())
		b, err := os.ReadFile(path)
		var r resource
		if err != nil || json.Unmarshal(b, &r) != nil || !resourceExists(r) {
			_ = os.Remove(path)
			continue
		}
		left++
	}
	if left == 0 {
		_ = os.Remove(reg.dir)
		reg.dir = ""
	}
}
