package policy

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/ipam"
)

// trafficLab is a host namespace routing for "containers" (namespaces
// behind cali veths, plumbed like the dataplane does: /32 routes, proxy
// ARP, 169.254.1.1 gateway) and an "outside" namespace that has no route
// back to the pools.
type trafficLab struct {
	t       *testing.T
	host    string
	outside string
	ctrs    map[string]string // container name -> namespace
	nft     *NFT
}

const (
	labHostIP    = "10.99.0.1"
	labOutsideIP = "10.99.0.2"
)

func newTrafficLab(t *testing.T) *trafficLab {
	requireNetns(t)
	if _, err := os.Stat("/bin/busybox"); err != nil {
		t.Skip("!!!!!! SKIPPED: /bin/busybox (busybox-static) is needed for ping: the policy's effect on traffic is NOT verified !!!!!!")
	}
	l := &trafficLab{t: t, host: newNetns(t, "cnmpolh-"), outside: newNetns(t, "cnmpolo-"), ctrs: map[string]string{}}
	l.in(l.host, "sysctl", "-qw", "net.ipv4.ip_forward=1")
	mustRun(t, "ip", "-n", l.host, "link", "add", "ext0", "type", "veth", "peer", "name", "eth0", "netns", l.outside)
	mustRun(t, "ip", "-n", l.host, "addr", "add", labHostIP+"/24", "dev", "ext0")
	mustRun(t, "ip", "-n", l.host, "link", "set", "ext0", "up")
	mustRun(t, "ip", "-n", l.outside, "addr", "add", labOutsideIP+"/24", "dev", "eth0")
	mustRun(t, "ip", "-n", l.outside, "link", "set", "eth0", "up")
	// The host's uplink: its default route is what proxy ARP needs to
	// answer for 169.254.1.1.
	mustRun(t, "ip", "-n", l.host, "route", "add", "default", "via", labOutsideIP)
	var err error
	if l.nft, err = NewNFT("/var/run/netns/"+l.host, testLog(t)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.nft.Close() })
	return l
}

func (l *trafficLab) in(ns string, argv ...string) string {
	l.t.Helper()
	return mustRun(l.t, append([]string{"ip", "netns", "exec", ns}, argv...)...)
}

// container makes a namespace behind host interface ifname with ip.
func (l *trafficLab) container(name, ifname, ip string) {
	l.t.Helper()
	ns := newNetns(l.t, "cnmpolc-")
	l.ctrs[name] = ns
	h := func(args ...string) { mustRun(l.t, append([]string{"ip", "-n", l.host}, args...)...) }
	c := func(args ...string) { mustRun(l.t, append([]string{"ip", "-n", ns}, args...)...) }
	h("link", "add", ifname, "type", "veth", "peer", "name", "eth0", "netns", ns)
	h("link", "set", ifname, "up")
	l.in(l.host, "sysctl", "-qw", "net.ipv4.conf."+ifname+".proxy_arp=1", "net.ipv4.neigh."+ifname+".proxy_delay=0")
	h("route", "add", ip+"/32", "dev", ifname, "scope", "link")
	c("addr", "add", ip+"/32", "dev", "eth0")
	c("link", "set", "eth0", "up")
	c("route", "add", "169.254.1.1", "dev", "eth0", "scope", "link")
	c("route", "add", "default", "via", "169.254.1.1", "dev", "eth0")
}

// ping reports whether one echo from namespace ns to dst got an answer;
// a positive result is retried a little (neighbour resolution).
func (l *trafficLab) ping(ns, dst string, tries int) bool {
	for i := 0; i < tries; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := exec.CommandContext(ctx, "ip", "netns", "exec", ns, "/bin/busybox", "ping", "-c1", "-W1", dst).Run()
		cancel()
		if err == nil {
			return true
		}
	}
	return false
}

func (l *trafficLab) expect(from, fromNS, to, dst string, want bool) {
	l.t.Helper()
	tries := 1
	if want {
		tries = 3
	}
	if got := l.ping(fromNS, dst, tries); got != want {
		verb := map[bool]string{true: "reaches", false: "does not reach"}
		l.t.Errorf("%s %s %s (%s), want it %s", from, verb[got], to, dst, strings.TrimPrefix(verb[want], "does "))
	}
}

func (l *trafficLab) apply(st State) {
	l.t.Helper()
	rs, warnings := Desired(st)
	if len(warnings) > 0 {
		l.t.Fatalf("warnings: %v", warnings)
	}
	if _, err := l.nft.Apply(context.Background(), rs); err != nil {
		l.t.Fatal(err)
	}
}

// outsideCounters counts, in the outside namespace, echo requests by
// source: what the receiving side saw.
func (l *trafficLab) watchOutside() {
	l.t.Helper()
	cmd := exec.Command("ip", "netns", "exec", l.outside, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(`table ip probe {
	chain in { type filter hook input priority 0; policy accept;
		icmp type echo-request ip saddr ` + labHostIP + ` counter comment "from-host"
		icmp type echo-request ip saddr 192.168.0.0/16 counter comment "from-pool"
		icmp type echo-request ip saddr 10.66.0.0/16 counter comment "from-nonat-pool"
	}
}`)
	if out, err := cmd.CombinedOutput(); err != nil {
		l.t.Fatalf("probe table: %v\n%s", err, out)
	}
}

func (l *trafficLab) outsideCount(comment string) int {
	l.t.Helper()
	out := l.in(l.outside, "nft", "list", "chain", "ip", "probe", "in")
	m := regexp.MustCompile(`counter packets (\d+) bytes \d+ comment "` + comment + `"`).FindStringSubmatch(out)
	if m == nil {
		l.t.Fatalf("no counter %s in\n%s", comment, out)
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// TestPolicyTraffic checks what the rules do to real packets.
func TestPolicyTraffic(t *testing.T) {
	l := newTrafficLab(t)
	net3 := datastore.Network{ID: net3ID, Name: "net3", Options: map[string]string{OptIsolation: "off"}}
	net4 := datastore.Network{ID: net4ID, Name: "net4", Options: map[string]string{OptIsolation: "off", OptIngress: "any"}}
	const net5ID = "5555555555555555555555555555555555555555555555555555555555555555"
	eps := []struct {
		name, network, ip string
	}{
		{"a", net1ID, "192.168.0.1"}, {"b", net1ID, "192.168.0.2"},
		{"c", net2ID, "192.168.0.3"},
		{"d", net3ID, "192.168.0.4"}, {"e", net4ID, "192.168.0.5"},
		{"f", net5ID, "10.66.0.1"},
	}
	st := State{
		Node:  "h1",
		Pools: []ipam.Pool{{CIDR: "192.168.0.0/16", NATOutgoing: true}, {CIDR: "10.66.0.0/16"}},
		Networks: []datastore.Network{
			{ID: net1ID, Name: "net1"}, {ID: net2ID, Name: "net2"}, net3, net4, {ID: net5ID, Name: "net5"},
		},
	}
	ifnames, ips := map[string]string{}, map[string]string{}
	for i, e := range eps {
		id := fmt.Sprintf("%011x", 0xabc0000+i) + strings.Repeat("0", 53)
		ifnames[e.name], ips[e.name] = "cali"+id[:11], e.ip
		st.Endpoints = append(st.Endpoints, localEP(id, e.network, e.ip))
		l.container(e.name, ifnames[e.name], e.ip)
	}
	// A workload interface the datastore does not know.
	l.container("u", "cali0badbadbad0", "192.168.0.9")
	l.apply(st)
	l.watchOutside()
	c := l.ctrs

	// Between two containers, both ways.
	for _, tc := range []struct {
		name, a, b string
		reach      bool
	}{
		{"same network", "a", "b", true},
		{"different isolated networks", "a", "c", false},
		{"isolation off on both", "d", "e", true},
		{"isolation off on one side only", "a", "d", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l.t = t
			l.expect(tc.a, c[tc.a], tc.b, ips[tc.b], tc.reach)
			l.expect(tc.b, c[tc.b], tc.a, ips[tc.a], tc.reach)
		})
	}
	t.Run("own host", func(t *testing.T) {
		l.t = t
		l.expect("a", c["a"], "the host", labHostIP, true)
		l.expect("the host", l.host, "a", "192.168.0.1", true)
	})
	t.Run("nat outgoing", func(t *testing.T) {
		l.t = t
		l.expect("a", c["a"], "outside", labOutsideIP, true)
		if n := l.outsideCount("from-host"); n == 0 {
			t.Errorf("outside saw no echo request from the host's address: not masqueraded")
		}
		if n := l.outsideCount("from-pool"); n != 0 {
			t.Errorf("outside saw %d echo requests from pool addresses: not masqueraded", n)
		}
		// A pool without natOutgoing: its packets arrive with their own
		// source, and the outside, with no route back, cannot answer.
		l.expect("f", c["f"], "outside", labOutsideIP, false)
		if n := l.outsideCount("from-nonat-pool"); n == 0 {
			t.Errorf("the packet from the natOutgoing=false pool did not arrive with its own source")
		}
	})
	t.Run("ingress from outside the pools", func(t *testing.T) {
		l.t = t
		mustRun(t, "ip", "-n", l.outside, "route", "add", "192.168.0.0/16", "via", labHostIP)
		defer mustRun(t, "ip", "-n", l.outside, "route", "del", "192.168.0.0/16", "via", labHostIP)
		l.expect("outside (not a cluster host)", l.outside, "a", "192.168.0.1", false)
		l.expect("outside", l.outside, "e (ingress any)", "192.168.0.5", true)
		withHost := st
		withHost.Nodes = []datastore.Node{{Name: "h2", IPv4: labOutsideIP}}
		l.apply(withHost)
		l.expect("outside (now a cluster host)", l.outside, "a", "192.168.0.1", true)
		l.apply(st)
	})
	t.Run("unknown workload interface", func(t *testing.T) {
		l.t = t
		l.expect("u", c["u"], "b", "192.168.0.2", false)
		l.expect("u", c["u"], "outside", labOutsideIP, false)
		l.expect("the host", l.host, "u", "192.168.0.9", true) // the host is never filtered
	})
	t.Run("after leave", func(t *testing.T) {
		l.t = t
		left := st
		left.Endpoints = st.Endpoints[1:] // a leaves; its veth is still there
		l.apply(left)
		l.expect("b", c["b"], "a", "192.168.0.1", false)
		l.expect("a", c["a"], "b", "192.168.0.2", false)
		rs, err := l.nft.Dump(context.Background(), IPv4, IPv6)
		if err != nil {
			t.Fatal(err)
		}
		if txt := rs.Render(); strings.Contains(txt, ifnames["a"]) || strings.Contains(txt, "192.168.0.1") {
			t.Errorf("after a's leave the tables still mention it:\n%s", txt)
		}
		l.apply(st)
		l.expect("b", c["b"], "a", "192.168.0.1", true)
	})
}
