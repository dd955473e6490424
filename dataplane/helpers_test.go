package dataplane

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// testIDPrefix starts every endpoint id the tests make up, so that TestMain
// can prove afterwards that none of their interfaces ended up in the root
// namespace.
const testIDPrefix = "c0ffee"

func TestMain(m *testing.M) {
	code := m.Run()
	if os.Geteuid() == 0 {
		if leaked := rootNSTestLinks(); len(leaked) > 0 {
			fmt.Fprintf(os.Stderr, "FAIL: test interfaces leaked into the root network namespace: %v\n", leaked)
			code = 1
		}
	}
	os.Exit(code)
}

// rootNSTestLinks lists (read-only) the links of the test process's own
// namespace that carry a test endpoint id.
func rootNSTestLinks() []string {
	links, err := netlink.LinkList()
	if err != nil {
		return []string{"cannot list links: " + err.Error()}
	}
	var leaked []string
	for _, l := range links {
		name := l.Attrs().Name
		if strings.HasPrefix(name, HostIfPrefix+testIDPrefix) || strings.HasPrefix(name, tempIfPrefix+testIDPrefix) {
			leaked = append(leaked, name)
		}
	}
	return leaked
}

// requireRoot skips integration tests, loudly, where they cannot work.
func requireRoot(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("!!!!!! SKIPPED under -short (make unit): this dataplane integration test creates network namespaces and veths; " +
			"run `go test ./dataplane/` as root. The netlink dataplane is NOT verified by this run. !!!!!!")
	}
	if os.Geteuid() != 0 {
		t.Skip("!!!!!! SKIPPED: this dataplane integration test needs root (CAP_NET_ADMIN + CAP_SYS_ADMIN) " +
			"to create network namespaces and veths; run `go test ./dataplane/` as root. " +
			"The netlink dataplane is NOT verified by this run. !!!!!!")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("!!!!!! SKIPPED: iproute2 `ip` is needed to create throw-away network namespaces !!!!!!")
	}
}

func randHex(n int) string {
	b := make([]byte, (n+1)/2)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)[:n]
}

// newEndpointID makes up a Docker-like 64-hex endpoint id.
func newEndpointID() string {
	return testIDPrefix + randHex(64-len(testIDPrefix))
}

func run(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, args[0], args[1:]...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// testNS is a throw-away network namespace, deleted when the test ends,
// whatever its outcome.
type testNS struct {
	name string
	path string
	ns   netns.NsHandle  // for moving links into it
	nl   *netlink.Handle // for inspecting it from the test
}

func newTestNS(t *testing.T) *testNS {
	t.Helper()
	name := "cnmtest-" + randHex(8)
	run(t, "ip", "netns", "add", name)
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "delete", name).CombinedOutput(); err != nil {
			t.Errorf("deleting netns %s: %v: %s", name, err, out)
		}
	})
	run(t, "ip", "-n", name, "link", "set", "lo", "up")
	tn := &testNS{name: name, path: "/var/run/netns/" + name}
	var err error
	if tn.ns, err = netns.GetFromName(name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tn.ns.Close() }) // runs before the delete above
	if tn.nl, err = netlink.NewHandleAt(tn.ns, unix.NETLINK_ROUTE); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tn.nl.Close)
	return tn
}

// newTestLinux returns a Linux on a fresh throw-away namespace.
func newTestLinux(t *testing.T) (*Linux, *testNS) {
	t.Helper()
	tn := newTestNS(t)
	l, err := NewLinux(tn.path, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l, tn
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func testLogger(t *testing.T) logrus.FieldLogger {
	log := logrus.New()
	log.SetOutput(testWriter{t})
	log.SetLevel(logrus.DebugLevel)
	return log
}

// sysctlIn reads a /proc/sys key inside l's namespace.
func sysctlIn(t *testing.T, l *Linux, key string) string {
	t.Helper()
	var v string
	err := inNetNS(l.ns, l.log, func() error {
		var err error
		v, err = readSysctl(key)
		return err
	})
	if err != nil {
		t.Fatalf("reading sysctl %s: %v", key, err)
	}
	return v
}

// addUplink gives the namespace a stand-in for a host's uplink, "uplink0",
// up and with carrier. (A veth pair whose peer stays in the namespace: this
// kernel has no dummy driver.)
func (tn *testNS) addUplink(t *testing.T) {
	t.Helper()
	run(t, "ip", "-n", tn.name, "link", "add", "uplink0", "type", "veth", "peer", "name", "uplink0p")
	run(t, "ip", "-n", tn.name, "link", "set", "uplink0p", "up")
	run(t, "ip", "-n", tn.name, "link", "set", "uplink0", "up")
}

// linkNames lists the names of all links in the namespace, sorted.
func (tn *testNS) linkNames(t *testing.T) []string {
	t.Helper()
	links, err := tn.nl.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, l := range links {
		names = append(names, l.Attrs().Name)
	}
	sort.Strings(names)
	return names
}

// ourRoutes lists all routes in the namespace's main table with our protocol,
// as "dst dev scope type" strings.
func (tn *testNS) ourRoutes(t *testing.T) []string {
	t.Helper()
	routes, err := tn.nl.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Protocol: RouteProtocol}, netlink.RT_FILTER_PROTOCOL)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, r := range routes {
		out = append(out, tn.describeRoute(t, r))
	}
	return out
}

func (tn *testNS) describeRoute(t *testing.T, r netlink.Route) string {
	t.Helper()
	dev := "-"
	if r.LinkIndex > 0 {
		link, err := tn.nl.LinkByIndex(r.LinkIndex)
		if err != nil {
			t.Fatal(err)
		}
		dev = link.Attrs().Name
	}
	typ := "unicast"
	if r.Type == unix.RTN_BLACKHOLE {
		typ = "blackhole"
	}
	return fmt.Sprintf("%s dev %s scope %s %s", r.Dst, dev, r.Scope, typ)
}

// routesTo lists every route (any protocol) to ip in the main table.
func (tn *testNS) routesTo(t *testing.T, ip net.IP) []netlink.Route {
	t.Helper()
	dst, err := hostRouteDst(ip)
	if err != nil {
		t.Fatal(err)
	}
	routes, err := tn.nl.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Dst: dst}, netlink.RT_FILTER_DST)
	if err != nil {
		t.Fatal(err)
	}
	return routes
}

func mustCIDR(t *testing.T, s string) *net.IPNet {
	t.Helper()
	ip, n, err := net.ParseCIDR(s)
	if err != nil {
		t.Fatal(err)
	}
	n.IP = ip
	return n
}

// equalStrings compares as multisets: the order of links and routes in a dump
// means nothing.
func equalStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	a, b = append([]string(nil), a...), append([]string(nil), b...)
	sort.Strings(a)
	sort.Strings(b)
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
