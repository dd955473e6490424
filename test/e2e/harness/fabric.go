package harness

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Fabric is an L2 segment for several hosts: a bridge in the root network
// namespace holding the subnet's first address (Gateway); every host added
// gets a veth on it, the next address on its eth0, and a default route via
// the gateway. Root-namespace services for the hosts (etcd, route
// reflectors) listen on Gateway.
type Fabric struct {
	Bridge  string     // cnme2ebrXXXXXX
	Subnet  *net.IPNet // e.g. 172.31.254.0/24
	Gateway net.IP     // first address of Subnet, on Bridge
	// Subnet6 and Gateway6 are set by EnableIPv6: hosts added afterwards
	// also get an address of Subnet6.
	Subnet6  *net.IPNet
	Gateway6 net.IP

	mu    sync.Mutex
	next  uint32 // offset of the next host address
	hosts []*Host
}

// Default subnets tried by NewFabric(t, ""): 172.31.254.0/24 downwards.
const (
	autoSubnetFirst = 254
	autoSubnetLast  = 200
)

// NewFabric creates the bridge with the first address of subnet (CIDR) and
// brings it up. subnet "" picks a free /24 in 172.31.200.0-172.31.254.0 (one
// not routed in the root namespace; a lock serialises concurrent test
// processes). A given subnet that overlaps an existing route fails the test.
//
// When br_netfilter is active and the root FORWARD chain is not a plain ACCEPT
// (e.g. a system dockerd set its policy to DROP), a rule accepting bridged
// traffic between the fabric's ports is inserted, and removed on cleanup.
func NewFabric(t testing.TB, subnet string) *Fabric {
	t.Helper()
	RequireRoot(t)
	lock := lockFile(t, filepath.Join(registryDir, "fabric.lock"))
	defer lock()

	var ipnet *net.IPNet
	if subnet == "" {
		for i := autoSubnetFirst; i >= autoSubnetLast && ipnet == nil; i-- {
			_, cand, _ := net.ParseCIDR(fmt.Sprintf("172.31.%d.0/24", i))
			if overlappingRoute(cand) == "" {
				ipnet = cand
			}
		}
		if ipnet == nil {
			t.Fatalf("harness: no free /24 in 172.31.%d.0-172.31.%d.0", autoSubnetLast, autoSubnetFirst)
		}
	} else {
		_, n, err := net.ParseCIDR(subnet)
		if err != nil || n.IP.To4() == nil {
			t.Fatalf("harness: NewFabric: %q is not an IPv4 CIDR", subnet)
		}
		ones, _ := n.Mask.Size()
		if ones > 29 {
			t.Fatalf("harness: NewFabric: %s is too small", subnet)
		}
		if r := overlappingRoute(n); r != "" {
			t.Fatalf("harness: NewFabric: %s overlaps the route %q of the root namespace (another test run? pass \"\" to pick a free subnet)", n, r)
		}
		ipnet = n
	}
	f := &Fabric{Bridge: NamePrefix + "br" + randHex(6), Subnet: ipnet, Gateway: addrAt(ipnet, 1), next: 2}

	// A fixed MAC: a bridge without one takes the lowest of its ports',
	// so removing a host's veth could change it, and every other host's
	// neighbour entry for the gateway (etcd, reflectors) would point at a
	// dead MAC until it expires (~30s of silence).
	if _, err := runCmd(nil, nil, "ip", "link", "add", f.Bridge, "address", "02:63:6e:"+randHex(2)+":"+randHex(2)+":"+randHex(2), "type", "bridge"); err != nil {
		t.Fatalf("harness: %v", err)
	}
	untrack := track(resource{Kind: "link", Name: f.Bridge})
	var untrackRule func()
	var rule []string
	t.Cleanup(func() {
		if rule != nil {
			if _, err := runCmd(nil, nil, append([]string{"iptables", "-w", "-D"}, rule...)...); err != nil {
				t.Errorf("harness: removing iptables rule: %v", err)
			}
			untrackRule()
		}
		if _, err := net.InterfaceByName(f.Bridge); err == nil {
			if _, err := runCmd(nil, nil, "ip", "link", "delete", f.Bridge); err != nil {
				t.Errorf("harness: deleting bridge: %v", err)
			}
		}
		untrack()
	})
	for _, argv := range [][]string{
		{"ip", "addr", "add", fmt.Sprintf("%s/%d", f.Gateway, prefixLen(ipnet)), "dev", f.Bridge},
		{"ip", "link", "set", f.Bridge, "up"},
	} {
		if _, err := runCmd(nil, nil, argv...); err != nil {
			t.Fatalf("harness: %v", err)
		}
	}
	if needForwardRule() {
		rule = []string{"FORWARD", "-i", f.Bridge, "-o", f.Bridge, "-j", "ACCEPT"}
		if _, err := runCmd(nil, nil, append([]string{"iptables", "-w", "-I"}, rule...)...); err != nil {
			rule = nil
			t.Logf("harness: could not insert the FORWARD rule for the bridge (hosts may not reach each other): %v", err)
		} else {
			untrackRule = track(resource{Kind: "iptables", Name: f.Bridge, Args: rule})
		}
	}
	t.Logf("harness: fabric %s on bridge %s, gateway %s", f.Subnet, f.Bridge, f.Gateway)
	return f
}

// needForwardRule: bridged IPv4 traffic goes through the root FORWARD chain
// (br_netfilter) and that chain may drop it.
func needForwardRule() bool {
	b, err := os.ReadFile("/proc/sys/net/bridge/bridge-nf-call-iptables")
	if err != nil || strings.TrimSpace(string(b)) != "1" {
		return false
	}
	out, err := runCmd(nil, nil, "iptables", "-w", "-S", "FORWARD")
	if err != nil {
		return false // no iptables: nothing filters
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	return !(len(lines) == 1 && lines[0] == "-P FORWARD ACCEPT")
}

// EnableIPv6 gives the fabric a random ULA /64 (gateway ::1 on the bridge);
// every host added afterwards gets the address ::<n> on its eth0, n as in
// its IPv4 address, and a default IPv6 route via the gateway.
func (f *Fabric) EnableIPv6(t testing.TB) {
	t.Helper()
	_, n, err := net.ParseCIDR(fmt.Sprintf("fd63:6e6d:%s::/64", randHex(2)))
	if err != nil {
		t.Fatal(err)
	}
	gw := addrAt(n, 1)
	if err := os.WriteFile("/proc/sys/net/ipv6/conf/"+f.Bridge+"/disable_ipv6", []byte("0"), 0o644); err != nil {
		t.Fatalf("harness: enabling IPv6 on %s: %v", f.Bridge, err)
	}
	if _, err := runCmd(nil, nil, "ip", "-6", "addr", "add", gw.String()+"/64", "dev", f.Bridge, "nodad"); err != nil {
		t.Fatalf("harness: %v", err)
	}
	f.mu.Lock()
	f.Subnet6, f.Gateway6 = n, gw
	f.mu.Unlock()
	t.Logf("harness: fabric %s also has %s", f.Bridge, n)
}

// AddHost creates a host on the fabric: netns, veth (root end on the bridge,
// eth0 inside with the next free address), default route via the gateway,
// then dockerd unless opts.NoDockerd. name is the host's logical name (the
// plugin's --nodename).
func (f *Fabric) AddHost(t testing.TB, name string, opts HostOptions) *Host {
	t.Helper()
	ip, off := f.nextAddr(t)
	h := newHostNetns(t, name, opts)
	h.IP, h.Subnet, h.Gateway = ip, f.Subnet, f.Gateway
	f.mu.Lock()
	subnet6, gw6 := f.Subnet6, f.Gateway6
	f.mu.Unlock()
	h.RootVeth = NamePrefix + "v" + strings.TrimPrefix(h.Netns, NamePrefix+"-")
	if _, err := runCmd(nil, nil, "ip", "link", "add", h.RootVeth, "type", "veth", "peer", "name", "eth0", "netns", h.Netns); err != nil {
		t.Fatalf("harness: %v", err)
	}
	h.untracks = append(h.untracks, track(resource{Kind: "link", Name: h.RootVeth}))
	for _, argv := range [][]string{
		{"ip", "link", "set", h.RootVeth, "master", f.Bridge},
		{"ip", "link", "set", h.RootVeth, "up"},
		{"ip", "-n", h.Netns, "addr", "add", fmt.Sprintf("%s/%d", ip, prefixLen(f.Subnet)), "dev", "eth0"},
		{"ip", "-n", h.Netns, "link", "set", "eth0", "up"},
		{"ip", "-n", h.Netns, "route", "add", "default", "via", f.Gateway.String()},
	} {
		if _, err := runCmd(nil, nil, argv...); err != nil {
			t.Fatalf("harness: %v", err)
		}
	}
	if subnet6 != nil {
		h.IP6 = addrAt(subnet6, off)
		for _, argv := range [][]string{
			// /proc/sys/net shows the reader's network namespace.
			{"ip", "netns", "exec", h.Netns, "sh", "-c", "echo 0 > /proc/sys/net/ipv6/conf/eth0/disable_ipv6"},
			{"ip", "-n", h.Netns, "-6", "addr", "add", h.IP6.String() + "/64", "dev", "eth0", "nodad"},
			{"ip", "-n", h.Netns, "-6", "route", "add", "default", "via", gw6.String()},
		} {
			if _, err := runCmd(nil, nil, argv...); err != nil {
				t.Fatalf("harness: %v", err)
			}
		}
	}
	f.mu.Lock()
	f.hosts = append(f.hosts, h)
	f.mu.Unlock()
	h.finish(t)
	return h
}

// Hosts returns the hosts added so far.
func (f *Fabric) Hosts() []*Host {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*Host(nil), f.hosts...)
}

// StartEtcd starts a single etcd member (Debian's etcd-server) in the root
// namespace, clients on http://Gateway:<free port>, and returns the endpoint
// URL (for ETCD_ENDPOINTS of the hosts' plugins). Skips loudly without etcd.
func (f *Fabric) StartEtcd(t testing.TB) string {
	t.Helper()
	return StartEtcd(t, f.Gateway.String()).Endpoint
}

// Etcd is an etcd member started by StartEtcd.
type Etcd struct {
	*Process
	Endpoint string // http://IP:PORT
	DataDir  string
}

// StartEtcd starts a single-member etcd (/usr/bin/etcd, etcd-server) in the
// root namespace, listening for clients on listenIP at a free port, and waits
// until /health answers. It is stopped and its data removed on cleanup.
func StartEtcd(t testing.TB, listenIP string) *Etcd {
	t.Helper()
	RequireRoot(t)
	RequireFile(t, EtcdPath, "package etcd-server")
	dir, err := os.MkdirTemp("", NamePrefix+"-etcd-")
	if err != nil {
		t.Fatalf("harness: %v", err)
	}
	untrackDir := track(resource{Kind: "dir", Name: dir})
	clientPort, peerPort := freePort(t, listenIP), freePort(t, "127.0.0.1")
	name := NamePrefix + "-etcd-" + randHex(4)
	client := fmt.Sprintf("http://%s", net.JoinHostPort(listenIP, fmt.Sprint(clientPort)))
	peer := fmt.Sprintf("http://127.0.0.1:%d", peerPort)
	e := &Etcd{Endpoint: client, DataDir: filepath.Join(dir, "data")}
	argv := []string{EtcdPath, "--name", name, "--data-dir", e.DataDir,
		"--listen-client-urls", client, "--advertise-client-urls", client,
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
		"--initial-cluster", name + "=" + peer, "--initial-cluster-state", "new",
		"--initial-cluster-token", name}
	e.Process = newProcess("etcd", filepath.Join(dir, "etcd.log"), argv, baseEnv(), func(ctx context.Context) error {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, client+"/health", nil)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		if res.StatusCode != http.StatusOK || !strings.Contains(string(b), "true") {
			return fmt.Errorf("etcd /health: %d %s", res.StatusCode, b)
		}
		return nil
	})
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("==== last 50 lines of %s ====\n%s", e.LogPath, e.LogTail(50))
		}
		if clean, _ := e.stop(StopTimeout); !clean {
			t.Logf("harness: etcd needed SIGKILL")
		}
		_ = os.RemoveAll(dir)
		untrackDir()
	})
	e.start(t, 30*time.Second)
	t.Logf("harness: etcd (pid %d) at %s", e.Pid(), client)
	return e
}

// Ports freePort picks from: below the kernel's default ephemeral range
// (32768-60999), so that the outgoing connection of another process on
// the shared machine cannot take a port between freePort and the bind of
// the process it is for (etcd's peer port on 127.0.0.1 was lost so).
const (
	freePortMin  = 20000
	freePortSpan = 12000
)

// freePort returns a TCP port that is free on ip right now.
func freePort(t testing.TB, ip string) int {
	t.Helper()
	for range 50 {
		p := freePortMin + rand.IntN(freePortSpan)
		if l, err := net.Listen("tcp", net.JoinHostPort(ip, strconv.Itoa(p))); err == nil {
			l.Close()
			return p
		}
	}
	l, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		t.Fatalf("harness: free port on %s: %v", ip, err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// ---------------------------------------------------------------- address helpers

func prefixLen(n *net.IPNet) int {
	if n == nil {
		return 0
	}
	ones, _ := n.Mask.Size()
	return ones
}

// addrAt returns the address at offset off in n.
func addrAt(n *net.IPNet, off uint32) net.IP {
	if n.IP.To4() == nil {
		ip := make(net.IP, 16)
		copy(ip, n.IP.To16())
		binary.BigEndian.PutUint32(ip[12:], binary.BigEndian.Uint32(ip[12:])+off)
		return ip
	}
	base := binary.BigEndian.Uint32(n.IP.To4())
	ip := make(net.IP, 4)
	binary.BigEndian.PutUint32(ip, base+off)
	return ip
}

func broadcast(n *net.IPNet) net.IP {
	ip := make(net.IP, 4)
	b := n.IP.To4()
	for i := range ip {
		ip[i] = b[i] | ^n.Mask[i]
	}
	return ip
}

// overlappingRoute returns the first IPv4 route (any table) of the root
// namespace whose destination overlaps n, "" if none. Default routes are
// ignored.
func overlappingRoute(n *net.IPNet) string {
	out, err := runCmd(nil, nil, "ip", "-4", "-o", "route", "show", "table", "all")
	if err != nil {
		return ""
	}
	types := map[string]bool{"unicast": true, "local": true, "broadcast": true, "multicast": true,
		"throw": true, "unreachable": true, "prohibit": true, "blackhole": true, "nat": true, "anycast": true}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		dst := f[0]
		if types[dst] && len(f) > 1 {
			dst = f[1]
		}
		if dst == "default" {
			continue
		}
		if !strings.Contains(dst, "/") {
			dst += "/32"
		}
		_, rn, err := net.ParseCIDR(dst)
		if err != nil {
			continue
		}
		if rn.Contains(n.IP) || n.Contains(rn.IP) {
			return strings.TrimSpace(line)
		}
	}
	return ""
}

// lockFile takes an exclusive flock on path (created if needed) and returns
// the unlock function.
func lockFile(t testing.TB, path string) func() {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatalf("harness: %v", err)
	}
	fh, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatalf("harness: %v", err)
	}
	if err := syscall.Flock(int(fh.Fd()), syscall.LOCK_EX); err != nil {
		fh.Close()
		t.Fatalf("harness: flock %s: %v", path, err)
	}
	return func() {
		_ = syscall.Flock(int(fh.Fd()), syscall.LOCK_UN)
		fh.Close()
	}
}

// StartingCrowd is held by a test while it starts a crowd of containers at
// once (100 docker runs): two such bursts side by side on a two-core
// machine make Docker's own per-container setup (each container's DNS
// rules wait for the one xtables lock) outlast the docker run timeout,
// whatever the driver does. It returns the release, which t's cleanup
// also calls (releasing twice is harmless).
func StartingCrowd(t testing.TB) (release func()) {
	t.Helper()
	unlock := lockFile(t, filepath.Join(registryDir, "crowd.lock"))
	var once sync.Once
	release = func() { once.Do(unlock) }
	t.Cleanup(release)
	return release
}
