package harness

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
)

// The kernel's IPv4 neighbour (ARP) table is one table for the whole
// machine: its limits (net.ipv4.neigh.default.gc_thresh1..3, visible only in
// the root namespace) count the entries of every network namespace
// together. A fabric of N hosts that all talk to each other needs about
// N*(N+1) entries (each host resolves every other and the gateway), so from
// about 32 hosts the default gc_thresh3 of 1024 is exceeded: new entries are
// refused ("table_fulls" in /proc/net/stat/arp_cache), and packets that
// need one, such as the ACK of a received segment, are silently dropped.
// TCP then backs off for tens of seconds. Real hosts each have their own
// table, so this is a property of the one-machine test bed.
const neighSysctlDir = "/proc/sys/net/ipv4/neigh/default/"

// RaiseNeighbourLimits makes room for entries more neighbour entries than
// the table holds now (and at least gc_thresh3 as it was), restoring the
// previous limits on cleanup. Limits are only ever raised.
func RaiseNeighbourLimits(t testing.TB, entries int) {
	t.Helper()
	RequireRoot(t)
	used, _ := NeighbourStats()
	want := used.Entries + entries
	var restore []func()
	for _, k := range []struct {
		name string
		min  int
	}{{"gc_thresh3", want}, {"gc_thresh2", want * 3 / 4}} {
		path := neighSysctlDir + k.name
		cur, err := readIntFile(path)
		if err != nil {
			t.Fatalf("harness: %v", err)
		}
		if cur >= k.min {
			continue
		}
		if err := os.WriteFile(path, []byte(strconv.Itoa(k.min)), 0o644); err != nil {
			t.Fatalf("harness: raising %s to %d: %v", path, k.min, err)
		}
		t.Logf("harness: %s %d -> %d (the neighbour table is shared by all namespaces)", k.name, cur, k.min)
		restore = append(restore, func() { _ = os.WriteFile(path, []byte(strconv.Itoa(cur)), 0o644) })
	}
	t.Cleanup(func() {
		for i := len(restore) - 1; i >= 0; i-- {
			restore[i]()
		}
	})
}

// NeighbourCounters are machine-wide IPv4 neighbour table counters.
type NeighbourCounters struct {
	Entries    int // entries now
	TableFulls int // entries refused because the table was full (cumulative)
}

// NeighbourStats reads /proc/net/stat/arp_cache (one row per CPU; entries
// is the same in each row, the counters are summed).
func NeighbourStats() (NeighbourCounters, error) {
	data, err := os.ReadFile("/proc/net/stat/arp_cache")
	if err != nil {
		return NeighbourCounters{}, err
	}
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	if len(lines) < 2 {
		return NeighbourCounters{}, fmt.Errorf("unexpected /proc/net/stat/arp_cache: %q", data)
	}
	col := map[string]int{}
	for i, name := range strings.Fields(lines[0]) {
		col[name] = i
	}
	var c NeighbourCounters
	for _, line := range lines[1:] {
		f := strings.Fields(line)
		get := func(name string) int {
			i, ok := col[name]
			if !ok || i >= len(f) {
				return 0
			}
			v, _ := strconv.ParseInt(f[i], 16, 64)
			return int(v)
		}
		c.Entries = get("entries")
		c.TableFulls += get("table_fulls")
	}
	return c, nil
}

func readIntFile(path string) (int, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	v, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		return 0, fmt.Errorf("%s: %w", path, err)
	}
	return v, nil
}
