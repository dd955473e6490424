package dataplane

import (
	"context"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// moveToContainer does what Docker does with the container side: move it
// into the container's namespace, rename it eth0, give it the workload's
// addresses (IPv6 without DAD, as Docker does) and route everything via the
// virtual gateways.
func moveToContainer(t *testing.T, host, ctr *testNS, w Workload) {
	t.Helper()
	tmp, err := host.nl.LinkByName(TempIfName(w.EndpointID))
	if err != nil {
		t.Fatal(err)
	}
	if err := host.nl.LinkSetNsFd(tmp, int(ctr.ns)); err != nil {
		t.Fatalf("moving %s into %s: %v", tmp.Attrs().Name, ctr.name, err)
	}
	ip := func(args ...string) { run(t, append([]string{"ip", "-n", ctr.name}, args...)...) }
	ip("link", "set", TempIfName(w.EndpointID), "name", "eth0")
	ip("link", "set", "eth0", "up")
	if w.IPv4 != nil {
		ip("addr", "add", w.IPv4.String(), "dev", "eth0")
		ip("route", "add", GatewayIPv4, "dev", "eth0", "scope", "link")
		ip("route", "add", "default", "via", GatewayIPv4, "dev", "eth0")
	}
	if w.IPv6 != nil {
		ip("-6", "addr", "add", w.IPv6.String(), "dev", "eth0", "nodad")
		ip("-6", "route", "add", "default", "via", GatewayIPv6, "dev", "eth0")
	}
}

// pingCommand finds a ping: busybox (package busybox-static) or iputils.
func pingCommand(t *testing.T) []string {
	t.Helper()
	if _, err := os.Stat("/bin/busybox"); err == nil {
		return []string{"/bin/busybox", "ping"}
	}
	if p, err := exec.LookPath("ping"); err == nil {
		return []string{p}
	}
	t.Skip("!!!!!! SKIPPED: no ping here (neither /bin/busybox nor iputils ping): the L3 connectivity is NOT verified !!!!!!")
	return nil
}

// ping sends one echo request from inside ns to dst, retrying briefly: the
// first packets also wait for neighbour resolution on both hops.
func ping(t *testing.T, pingCmd []string, ns *testNS, dst net.IP) error {
	t.Helper()
	var (
		out []byte
		err error
	)
	for attempt := 0; attempt < 3; attempt++ {
		args := append([]string{"netns", "exec", ns.name}, pingCmd...)
		if dst.To4() == nil {
			args = append(args, "-6")
		}
		args = append(args, "-c1", "-W2", dst.String())
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		out, err = exec.CommandContext(ctx, "ip", args...).CombinedOutput()
		cancel()
		if err == nil {
			return nil
		}
	}
	t.Logf("ping %s from %s: %v\n%s", dst, ns.name, err, out)
	return err
}

// TestTwoWorkloadsPingThroughHost proves the pure L3 model end to end: two
// "containers" (namespaces), each with its veth moved in as eth0, a /32
// (/128) address and a default route via 169.254.1.1 (fe80::1), reach each
// other through the "host" namespace, which has no bridge, only proxy ARP,
// the host side's gateway address and the /32 and /128 routes.
func TestTwoWorkloadsPingThroughHost(t *testing.T) {
	requireRoot(t)
	pingCmd := pingCommand(t)
	l, host := newTestLinux(t)
	ctx := context.Background()

	ws, ctrs := twoWorkloadsThroughHost(t, l, host)
	pingAcross(t, pingCmd, ws, ctrs, "")

	// The gateway's MAC, as the container learnt it, is the host side's:
	// proof that it was the host that answered, by proxy ARP.
	eth0, err := ctrs[0].nl.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	neighs, err := ctrs[0].nl.NeighList(eth0.Attrs().Index, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	var gwMAC string
	for _, n := range neighs {
		if n.IP.Equal(net.ParseIP(GatewayIPv4)) {
			gwMAC = n.HardwareAddr.String()
		}
	}
	if gwMAC != eeMAC.String() {
		t.Errorf("container's neighbour entry for %s has MAC %q, want the host side's %s", GatewayIPv4, gwMAC, eeMAC)
	}

	// With the link now carrying, the host side still has only the fixed
	// gateway address (no kernel EUI-64 one), and the container's own
	// link-local address, EUI-64 of the same ee:ee MAC, did not collide.
	hostSide, err := host.nl.LinkByName(HostIfName(ws[0].EndpointID))
	if err != nil {
		t.Fatal(err)
	}
	if addrs, err := host.nl.AddrList(hostSide, netlink.FAMILY_V6); err != nil || len(addrs) != 1 || !addrs[0].IP.Equal(net.ParseIP(GatewayIPv6)) {
		t.Errorf("host side IPv6 addresses = %v (%v), want only %s", addrs, err, GatewayIPv6)
	}
	// DAD takes about a second (one probe, RetransTimer 1s): wait for its
	// verdict on the container's link-local address.
	var llState string
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		ctrAddrs, err := ctrs[0].nl.AddrList(eth0, netlink.FAMILY_V6)
		if err != nil {
			t.Fatal(err)
		}
		llState = "missing"
		for _, a := range ctrAddrs {
			if !a.IP.IsLinkLocalUnicast() {
				continue
			}
			switch {
			case a.Flags&unix.IFA_F_DADFAILED != 0:
				llState = "dadfailed"
			case a.Flags&unix.IFA_F_TENTATIVE != 0:
				llState = "tentative"
			default:
				llState = "ok"
			}
		}
		if llState != "tentative" {
			break
		}
	}
	if llState != "ok" {
		t.Errorf("container's IPv6 link-local address is %s, want it usable", llState)
	}

	// Removing workload 1 cuts it off: its eth0 disappears with the veth.
	if err := l.RemoveWorkload(ctx, ws[1].EndpointID, []net.IPNet{*ws[1].IPv4, *ws[1].IPv6}); err != nil {
		t.Fatal(err)
	}
	if got := ctrs[1].linkNames(t); !equalStrings(got, []string{"lo"}) {
		t.Errorf("container 1 links after RemoveWorkload = %v, want only lo", got)
	}
	args := append([]string{"netns", "exec", ctrs[0].name}, pingCmd...)
	args = append(args, "-c1", "-W1", ws[1].IPv4.IP.String())
	if out, err := exec.Command("ip", args...).CombinedOutput(); err == nil {
		t.Errorf("ping to a removed workload succeeded:\n%s", strings.TrimSpace(string(out)))
	}
}

// twoWorkloadsThroughHost adds two dual-stack workloads on host, each moved
// into a container namespace of its own, so that traffic between them is
// routed (forwarded) by host.
func twoWorkloadsThroughHost(t *testing.T, l *Linux, host *testNS) ([]Workload, []*testNS) {
	t.Helper()
	// A real host has an uplink and a default route. Proxy ARP needs the
	// latter: the host answers for 169.254.1.1 only because it has a route
	// to it through another interface. The uplink's address also gives the
	// host a source address for its ARP requests to the containers.
	hostIP := func(args ...string) { run(t, append([]string{"ip", "-n", host.name}, args...)...) }
	host.addUplink(t)
	hostIP("addr", "add", "192.0.2.1/24", "dev", "uplink0")
	hostIP("route", "add", "default", "via", "192.0.2.254", "dev", "uplink0")

	ws := []Workload{
		{EndpointID: newEndpointID(), IPv4: mustCIDR(t, "198.51.100.1/32"), IPv6: mustCIDR(t, "fd00:c0de::1/128")},
		{EndpointID: newEndpointID(), IPv4: mustCIDR(t, "198.51.100.2/32"), IPv6: mustCIDR(t, "fd00:c0de::2/128")},
	}
	ctrs := []*testNS{newTestNS(t), newTestNS(t)}
	for i, w := range ws {
		if err := l.AddWorkload(context.Background(), w); err != nil {
			t.Fatal(err)
		}
		moveToContainer(t, host, ctrs[i], w)
	}
	return ws, ctrs
}

// pingAcross pings each workload from the other, in both families.
func pingAcross(t *testing.T, pingCmd []string, ws []Workload, ctrs []*testNS, context string) {
	t.Helper()
	for _, tc := range []struct {
		from int
		to   net.IP
	}{
		{0, ws[1].IPv4.IP}, {1, ws[0].IPv4.IP},
		{0, ws[1].IPv6.IP}, {1, ws[0].IPv6.IP},
	} {
		if err := ping(t, pingCmd, ctrs[tc.from], tc.to); err != nil {
			t.Errorf("container %d cannot reach %s through the host%s: %v", tc.from, tc.to, context, err)
		}
	}
}
