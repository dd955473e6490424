package dataplane

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

var eeMAC = net.HardwareAddr{0xee, 0xee, 0xee, 0xee, 0xee, 0xee}

func TestInterfaceNames(t *testing.T) {
	id := "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	if got, want := HostIfName(id), "cali0123456789a"; got != want {
		t.Errorf("HostIfName = %q, want %q", got, want)
	}
	if got, want := TempIfName(id), "tmp0123456789a"; got != want {
		t.Errorf("TempIfName = %q, want %q", got, want)
	}
	if n := len(HostIfName(id)); n > unix.IFNAMSIZ-1 {
		t.Errorf("HostIfName is %d chars, the kernel allows %d", n, unix.IFNAMSIZ-1)
	}
}

// TestWorkloadValidation proves AddWorkload's input checks (pure, no root).
func TestWorkloadValidation(t *testing.T) {
	id := newEndpointID()
	v4 := func(s string) *net.IPNet { return mustCIDR(t, s) }
	tests := []struct {
		name    string
		w       Workload
		wantErr string // "" = valid
	}{
		{"v4 ok", Workload{EndpointID: id, IPv4: v4("10.0.0.1/32")}, ""},
		{"v6 ok", Workload{EndpointID: id, IPv6: v4("fd00::1/128")}, ""},
		{"dual ok, names given", Workload{EndpointID: id, HostIfName: HostIfName(id), TempIfName: TempIfName(id), IPv4: v4("10.0.0.1/32"), IPv6: v4("fd00::1/128")}, ""},
		{"empty id", Workload{IPv4: v4("10.0.0.1/32")}, "empty endpoint id"},
		{"short id", Workload{EndpointID: "abc", IPv4: v4("10.0.0.1/32")}, "shorter than 11"},
		{"id with slash", Workload{EndpointID: "abc/def0123456", IPv4: v4("10.0.0.1/32")}, "not allowed"},
		{"no IP", Workload{EndpointID: id}, "no IP address"},
		{"v4 not /32", Workload{EndpointID: id, IPv4: v4("10.0.0.1/24")}, "not a /32"},
		{"v4 is v6", Workload{EndpointID: id, IPv4: v4("fd00::1/128")}, "not an IPv4"},
		{"v4 link-local", Workload{EndpointID: id, IPv4: v4("169.254.1.1/32")}, "not a unicast"},
		{"v6 not /128", Workload{EndpointID: id, IPv6: v4("fd00::1/64")}, "not a /128"},
		{"v6 is v4", Workload{EndpointID: id, IPv6: v4("10.0.0.1/32")}, "not an IPv6"},
		{"wrong host name", Workload{EndpointID: id, HostIfName: "eth0", IPv4: v4("10.0.0.1/32")}, "does not match"},
		{"wrong temp name", Workload{EndpointID: id, TempIfName: "eth0", IPv4: v4("10.0.0.1/32")}, "does not match"},
		{"multicast MAC", Workload{EndpointID: id, MAC: net.HardwareAddr{1, 0, 0x5e, 0, 0, 1}, IPv4: v4("10.0.0.1/32")}, "multicast"},
		{"short MAC", Workload{EndpointID: id, MAC: net.HardwareAddr{1, 2}, IPv4: v4("10.0.0.1/32")}, "48-bit"},
		{"MTU too small", Workload{EndpointID: id, MTU: 60, IPv4: v4("10.0.0.1/32")}, "MTU"},
		{"MTU too small for v6", Workload{EndpointID: id, MTU: 1200, IPv6: v4("fd00::1/128")}, "MTU"},
		{"v6 gateway not link-local", Workload{EndpointID: id, IPv6: v4("fd00::1/128"), GatewayIPv6: net.ParseIP("fd00::2")}, "not an IPv6 link-local"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.w.normalize()
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				if got.HostIfName != HostIfName(id) || got.TempIfName != TempIfName(id) || got.MTU != 1500 || got.MAC.String() != eeMAC.String() {
					t.Errorf("defaults not filled in: %+v", got)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("error = %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
}

// TestAddWorkload proves AddWorkload creates exactly the veth pair, sysctls,
// addresses and routes of the L3 model, for IPv4, IPv6 and dual stack.
func TestAddWorkload(t *testing.T) {
	requireRoot(t)
	tests := []struct {
		name    string
		ipv4    string
		ipv6    string
		mtu     int
		mac     net.HardwareAddr
		wantMTU int
		wantMAC net.HardwareAddr
		gw6     string // Workload.GatewayIPv6; "" = the default
	}{
		{name: "ipv4", ipv4: "10.65.0.1/32", wantMTU: 1500, wantMAC: eeMAC},
		{name: "ipv6", ipv6: "fd00:65::1/128", wantMTU: 1500, wantMAC: eeMAC},
		{name: "dual stack, jumbo MTU, own MAC", ipv4: "10.65.0.2/32", ipv6: "fd00:65::2/128", mtu: 9000,
			mac: net.HardwareAddr{0x02, 0x42, 0xac, 0x11, 0x00, 0x02}, wantMTU: 9000, wantMAC: net.HardwareAddr{0x02, 0x42, 0xac, 0x11, 0x00, 0x02}},
		{name: "second interface of a container: its own IPv6 gateway", ipv4: "10.65.0.3/32", ipv6: "fd00:65::3/128", wantMTU: 1500, wantMAC: eeMAC, gw6: "fe80::2"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l, tn := newTestLinux(t)
			ctx := context.Background()
			id := newEndpointID()
			w := Workload{EndpointID: id, MAC: tc.mac, MTU: tc.mtu}
			wantGW := GatewayIPv6
			if tc.gw6 != "" {
				w.GatewayIPv6, wantGW = net.ParseIP(tc.gw6), tc.gw6
			}
			if tc.ipv4 != "" {
				w.IPv4 = mustCIDR(t, tc.ipv4)
			}
			if tc.ipv6 != "" {
				w.IPv6 = mustCIDR(t, tc.ipv6)
			}
			if err := l.AddWorkload(ctx, w); err != nil {
				t.Fatalf("AddWorkload: %v", err)
			}
			hostName, tmpName := HostIfName(id), TempIfName(id)

			// Exactly the pair, nothing else.
			if got, want := tn.linkNames(t), []string{"lo", hostName, tmpName}; !equalStrings(got, want) {
				t.Errorf("links = %v, want %v", got, want)
			}
			host, err := tn.nl.LinkByName(hostName)
			if err != nil {
				t.Fatal(err)
			}
			tmp, err := tn.nl.LinkByName(tmpName)
			if err != nil {
				t.Fatal(err)
			}
			if host.Type() != "veth" || tmp.Type() != "veth" {
				t.Errorf("types = %s/%s, want veth/veth", host.Type(), tmp.Type())
			}
			if tmp.Attrs().ParentIndex != host.Attrs().Index {
				t.Errorf("%s's peer is ifindex %d, want %s (%d)", tmpName, tmp.Attrs().ParentIndex, hostName, host.Attrs().Index)
			}
			if host.Attrs().Flags&net.FlagUp == 0 {
				t.Errorf("host side %s is not up", hostName)
			}
			if tmp.Attrs().Flags&net.FlagUp != 0 {
				t.Errorf("container side %s is up; Docker must find it down", tmpName)
			}
			if got := tmp.Attrs().HardwareAddr.String(); got != tc.wantMAC.String() {
				t.Errorf("container side MAC = %s, want %s", got, tc.wantMAC)
			}
			if got := host.Attrs().HardwareAddr.String(); got != eeMAC.String() {
				t.Errorf("host side MAC = %s, want %s", got, eeMAC)
			}
			if host.Attrs().MTU != tc.wantMTU || tmp.Attrs().MTU != tc.wantMTU {
				t.Errorf("MTU = %d/%d, want %d", host.Attrs().MTU, tmp.Attrs().MTU, tc.wantMTU)
			}
			// Each address has a permanent neighbour entry with the
			// container side's MAC: reachable without ARP/NDP.
			for _, ip := range []*net.IPNet{w.IPv4, w.IPv6} {
				if ip == nil {
					continue
				}
				fam := netlink.FAMILY_V4
				if ip.IP.To4() == nil {
					fam = netlink.FAMILY_V6
				}
				neighs, err := tn.nl.NeighList(host.Attrs().Index, fam)
				if err != nil {
					t.Fatal(err)
				}
				found := false
				for _, n := range neighs {
					if n.IP.Equal(ip.IP) && n.State == netlink.NUD_PERMANENT && n.HardwareAddr.String() == tc.wantMAC.String() {
						found = true
					}
				}
				if !found {
					t.Errorf("no permanent neighbour %s lladdr %s on %s: %+v", ip.IP, tc.wantMAC, hostName, neighs)
				}
			}

			// Sysctls, read back inside the namespace.
			want := map[string]string{}
			if w.IPv4 != nil {
				want["net/ipv4/ip_forward"] = "1"
				want["net/ipv4/conf/"+hostName+"/forwarding"] = "1"
				want["net/ipv4/conf/"+hostName+"/proxy_arp"] = "1"
				want["net/ipv4/neigh/"+hostName+"/proxy_delay"] = "0"
			}
			if w.IPv6 != nil {
				want["net/ipv6/conf/all/forwarding"] = "1"
				want["net/ipv6/conf/"+hostName+"/forwarding"] = "1"
				want["net/ipv6/conf/"+hostName+"/proxy_ndp"] = "1"
				want["net/ipv6/conf/"+hostName+"/accept_ra"] = "0"
				want["net/ipv6/conf/"+hostName+"/addr_gen_mode"] = "1"
			}
			for key, v := range want {
				if got := sysctlIn(t, l, key); got != v {
					t.Errorf("sysctl %s = %s, want %s", key, got, v)
				}
			}

			// Routes: exactly one host route per IP, with our protocol.
			var wantRoutes []string
			if w.IPv4 != nil {
				wantRoutes = append(wantRoutes, tc.ipv4+" dev "+hostName+" scope link unicast")
			}
			if w.IPv6 != nil {
				wantRoutes = append(wantRoutes, tc.ipv6+" dev "+hostName+" scope universe unicast")
			}
			if got := tn.ourRoutes(t); !equalStrings(got, wantRoutes) {
				t.Errorf("routes with proto %d = %v, want %v", RouteProtocol, got, wantRoutes)
			}

			// IPv6: the host side's link-local gateway, usable at once.
			addrs, err := tn.nl.AddrList(host, netlink.FAMILY_V6)
			if err != nil {
				t.Fatal(err)
			}
			if w.IPv6 == nil {
				if len(addrs) != 0 {
					t.Errorf("IPv4-only host side has IPv6 addresses %v", addrs)
				}
				// No link-local address ever comes: HostLinkLocalIPv6 gives
				// up at the deadline instead of hanging.
				short, cancel := context.WithTimeout(ctx, 150*time.Millisecond)
				defer cancel()
				if ip, err := l.HostLinkLocalIPv6(short, hostName); err == nil || !errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("HostLinkLocalIPv6 on an IPv4-only veth = %v, %v; want a deadline error", ip, err)
				}
				return
			}
			if len(addrs) != 1 || addrs[0].IPNet.String() != wantGW+"/64" {
				t.Fatalf("host side IPv6 addresses = %v, want only %s/64", addrs, wantGW)
			}
			gw, err := l.HostLinkLocalIPv6(ctx, hostName)
			if err != nil {
				t.Fatalf("HostLinkLocalIPv6: %v", err)
			}
			if !gw.Equal(net.ParseIP(wantGW)) {
				t.Errorf("HostLinkLocalIPv6 = %s, want %s", gw, wantGW)
			}
		})
	}
}

// TestRemoveWorkload proves RemoveWorkload deletes both veth ends and the
// routes, is idempotent, and spares routes to the same IPs through other
// interfaces.
func TestRemoveWorkload(t *testing.T) {
	requireRoot(t)
	l, tn := newTestLinux(t)
	ctx := context.Background()
	ip4, ip6 := mustCIDR(t, "10.65.1.1/32"), mustCIDR(t, "fd00:65:1::1/128")
	w1 := Workload{EndpointID: newEndpointID(), IPv4: ip4, IPv6: ip6}
	w2 := Workload{EndpointID: newEndpointID(), IPv4: mustCIDR(t, "10.65.1.2/32")}
	for _, w := range []Workload{w1, w2} {
		if err := l.AddWorkload(ctx, w); err != nil {
			t.Fatal(err)
		}
	}
	ips := []net.IPNet{*ip4, *ip6}
	for i := 0; i < 2; i++ {
		if err := l.RemoveWorkload(ctx, w1.EndpointID, ips); err != nil {
			t.Fatalf("RemoveWorkload #%d: %v", i+1, err)
		}
	}
	// w2 untouched; w1 gone entirely.
	if got, want := tn.linkNames(t), []string{"lo", HostIfName(w2.EndpointID), TempIfName(w2.EndpointID)}; !equalStrings(got, want) {
		t.Errorf("links = %v, want %v", got, want)
	}
	if got, want := tn.ourRoutes(t), []string{"10.65.1.2/32 dev " + HostIfName(w2.EndpointID) + " scope link unicast"}; !equalStrings(got, want) {
		t.Errorf("routes = %v, want %v", got, want)
	}
	for _, ip := range ips {
		if r := tn.routesTo(t, ip.IP); len(r) != 0 {
			t.Errorf("routes to %s remain: %v", ip.IP, r)
		}
	}

	// Removing w2 with the IP of w1 (say, reused by w2 meanwhile... or just a
	// caller's mistake) must not touch a route to it through another link.
	if err := l.RemoveWorkload(ctx, w2.EndpointID, []net.IPNet{*ip4}); err != nil {
		t.Fatal(err)
	}
	if got := tn.linkNames(t); !equalStrings(got, []string{"lo"}) {
		t.Errorf("links = %v, want only lo", got)
	}
	if got := tn.ourRoutes(t); len(got) != 0 {
		t.Errorf("routes left: %v", got)
	}

	// Never-added endpoint: fine. Invalid id: refused.
	if err := l.RemoveWorkload(ctx, newEndpointID(), ips); err != nil {
		t.Errorf("RemoveWorkload of unknown endpoint: %v", err)
	}
	if err := l.RemoveWorkload(ctx, "", nil); err == nil {
		t.Error("RemoveWorkload with empty id succeeded")
	}
}

// TestRemoveWorkloadSparesForeignRoute: a route to the workload's IP through
// another interface is not the workload's and must survive its removal.
func TestRemoveWorkloadSparesForeignRoute(t *testing.T) {
	requireRoot(t)
	l, tn := newTestLinux(t)
	ctx := context.Background()
	tn.addUplink(t)
	w := Workload{EndpointID: newEndpointID(), IPv4: mustCIDR(t, "10.65.2.1/32")}
	if err := l.AddWorkload(ctx, w); err != nil {
		t.Fatal(err)
	}
	other := mustCIDR(t, "10.65.2.2/32")
	run(t, "ip", "-n", tn.name, "route", "add", other.String(), "dev", "uplink0", "proto", "80")
	if err := l.RemoveWorkload(ctx, w.EndpointID, []net.IPNet{*w.IPv4, *other}); err != nil {
		t.Fatal(err)
	}
	if got, want := tn.ourRoutes(t), []string{"10.65.2.2/32 dev uplink0 scope link unicast"}; !equalStrings(got, want) {
		t.Errorf("routes = %v, want %v", got, want)
	}
}

// TestRemoveWorkloadAfterMove: once Docker has moved the container side into
// the container, RemoveWorkload still deletes both ends.
func TestRemoveWorkloadAfterMove(t *testing.T) {
	requireRoot(t)
	l, tn := newTestLinux(t)
	cn := newTestNS(t)
	ctx := context.Background()
	w := Workload{EndpointID: newEndpointID(), IPv4: mustCIDR(t, "10.65.3.1/32")}
	if err := l.AddWorkload(ctx, w); err != nil {
		t.Fatal(err)
	}
	moveToContainer(t, tn, cn, w)
	if err := l.RemoveWorkload(ctx, w.EndpointID, []net.IPNet{*w.IPv4}); err != nil {
		t.Fatal(err)
	}
	if got := tn.linkNames(t); !equalStrings(got, []string{"lo"}) {
		t.Errorf("host links = %v, want only lo", got)
	}
	if got := cn.linkNames(t); !equalStrings(got, []string{"lo"}) {
		t.Errorf("container links = %v, want only lo", got)
	}
}

// TestAddWorkloadReplacesLeftover: a veth left by an earlier attempt for the
// same endpoint is replaced; a non-veth holding the name is refused, and
// left alone.
func TestAddWorkloadReplacesLeftover(t *testing.T) {
	requireRoot(t)
	l, tn := newTestLinux(t)
	ctx := context.Background()
	w := Workload{EndpointID: newEndpointID(), IPv4: mustCIDR(t, "10.65.4.1/32")}
	if err := l.AddWorkload(ctx, w); err != nil {
		t.Fatal(err)
	}
	first, err := tn.nl.LinkByName(HostIfName(w.EndpointID))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.AddWorkload(ctx, w); err != nil {
		t.Fatalf("AddWorkload over leftover: %v", err)
	}
	second, err := tn.nl.LinkByName(HostIfName(w.EndpointID))
	if err != nil {
		t.Fatal(err)
	}
	if first.Attrs().Index == second.Attrs().Index {
		t.Error("leftover veth was not re-created")
	}
	if got, want := tn.linkNames(t), []string{"lo", HostIfName(w.EndpointID), TempIfName(w.EndpointID)}; !equalStrings(got, want) {
		t.Errorf("links = %v, want %v", got, want)
	}
	if got, want := tn.ourRoutes(t), []string{"10.65.4.1/32 dev " + HostIfName(w.EndpointID) + " scope link unicast"}; !equalStrings(got, want) {
		t.Errorf("routes = %v, want %v", got, want)
	}

	w2 := Workload{EndpointID: newEndpointID(), IPv4: mustCIDR(t, "10.65.4.2/32")}
	run(t, "ip", "-n", tn.name, "link", "add", HostIfName(w2.EndpointID), "type", "bridge")
	err = l.AddWorkload(ctx, w2)
	if err == nil || !strings.Contains(err.Error(), "not a veth") {
		t.Fatalf("AddWorkload over a bridge = %v, want a 'not a veth' error", err)
	}
	if link, err := tn.nl.LinkByName(HostIfName(w2.EndpointID)); err != nil || link.Type() != "bridge" {
		t.Errorf("the foreign bridge was touched: %v %v", link, err)
	}
}

var errInjected = errors.New("injected failure")

// TestAddWorkloadRollback proves that a failure at any point of AddWorkload
// leaves no veth, address or route behind.
func TestAddWorkloadRollback(t *testing.T) {
	requireRoot(t)
	tests := []struct {
		name      string
		failAt    string // failpoint step; "" = none
		cancelAt  string // cancel the context at this step instead
		tempTaken bool   // a bridge holds TempIfName: a genuine kernel failure
		wantErr   string
		wantLinks []string
	}{
		{name: "after veth", failAt: stepVethCreated, wantErr: stepVethCreated},
		{name: "after sysctls", failAt: stepSysctls, wantErr: stepSysctls},
		{name: "after IPv6 address", failAt: stepIPv6Addr, wantErr: stepIPv6Addr},
		{name: "after link up", failAt: stepLinkUp, wantErr: stepLinkUp},
		{name: "after routes", failAt: stepRoutes, wantErr: stepRoutes},
		{name: "context cancelled half way", cancelAt: stepLinkUp, wantErr: "interrupted after " + stepLinkUp},
		{name: "temp name taken", tempTaken: true, wantErr: "already used by a bridge link"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l, tn := newTestLinux(t)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			w := Workload{EndpointID: newEndpointID(), IPv4: mustCIDR(t, "10.65.5.1/32"), IPv6: mustCIDR(t, "fd00:65:5::1/128")}
			wantLinks := []string{"lo"}
			if tc.tempTaken {
				run(t, "ip", "-n", tn.name, "link", "add", TempIfName(w.EndpointID), "type", "bridge")
				wantLinks = append(wantLinks, TempIfName(w.EndpointID))
			}
			var reached []string
			l.failpoint = func(step string) error {
				reached = append(reached, step)
				if step == tc.cancelAt {
					cancel()
				}
				if step == tc.failAt {
					return errInjected
				}
				return nil
			}
			err := l.AddWorkload(ctx, w)
			if err == nil {
				t.Fatalf("AddWorkload succeeded (steps reached %v)", reached)
			}
			if !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("error = %v, want it to mention %q", err, tc.wantErr)
			}
			if tc.failAt != "" && !errors.Is(err, errInjected) {
				t.Errorf("error %v does not wrap the cause", err)
			}
			if tc.cancelAt != "" && !errors.Is(err, context.Canceled) {
				t.Errorf("error %v does not wrap context.Canceled", err)
			}
			if got := tn.linkNames(t); !equalStrings(got, wantLinks) {
				t.Errorf("links after failure = %v, want %v", got, wantLinks)
			}
			if got := tn.ourRoutes(t); len(got) != 0 {
				t.Errorf("routes after failure: %v", got)
			}
			for _, ip := range []*net.IPNet{w.IPv4, w.IPv6} {
				if r := tn.routesTo(t, ip.IP); len(r) != 0 {
					t.Errorf("routes to %s after failure: %v", ip.IP, r)
				}
			}
		})
	}
}

// TestBlackholes proves EnsureBlackhole/RemoveBlackhole/ListBlackholes are
// idempotent, see only our routes, and leave everybody else's alone.
func TestBlackholes(t *testing.T) {
	requireRoot(t)
	l, tn := newTestLinux(t)
	ctx := context.Background()
	tn.addUplink(t)
	// Not ours: another protocol's blackhole and a static route.
	run(t, "ip", "-n", tn.name, "route", "add", "blackhole", "10.70.9.0/26", "proto", "static")
	run(t, "ip", "-n", tn.name, "route", "add", "10.70.8.0/26", "dev", "uplink0", "proto", "static")
	// A block route learnt from a peer (our protocol, unicast): claiming the
	// block locally replaces it.
	run(t, "ip", "-n", tn.name, "route", "add", "10.70.7.0/26", "dev", "uplink0", "proto", "80")

	blocks := []*net.IPNet{mustCIDR(t, "10.70.0.0/26"), mustCIDR(t, "fd00:70::/122"), mustCIDR(t, "10.70.7.0/26")}
	for i := 0; i < 2; i++ { // twice: idempotent
		for _, b := range blocks {
			if err := l.EnsureBlackhole(ctx, *b); err != nil {
				t.Fatalf("EnsureBlackhole(%s) #%d: %v", b, i+1, err)
			}
		}
	}
	list := func() []string {
		got, err := l.ListBlackholes(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var s []string
		for _, b := range got {
			s = append(s, b.String())
		}
		sort.Strings(s)
		return s
	}
	if got, want := list(), []string{"10.70.0.0/26", "10.70.7.0/26", "fd00:70::/122"}; !equalStrings(got, want) {
		t.Errorf("ListBlackholes = %v, want %v", got, want)
	}
	// The kernel's view: blackholes with our protocol, the peer's route gone.
	if got, want := tn.ourRoutes(t), []string{"10.70.0.0/26 dev - scope universe blackhole", "10.70.7.0/26 dev - scope universe blackhole",
		"fd00:70::/122 dev lo scope universe blackhole"}; !equalStrings(got, want) {
		t.Errorf("kernel routes = %v, want %v", got, want)
	}

	for i := 0; i < 2; i++ {
		for _, b := range blocks {
			if err := l.RemoveBlackhole(ctx, *b); err != nil {
				t.Fatalf("RemoveBlackhole(%s) #%d: %v", b, i+1, err)
			}
		}
	}
	if got := list(); len(got) != 0 {
		t.Errorf("ListBlackholes after removal = %v", got)
	}
	// Removing "ours" for blocks that only have foreign routes is a no-op.
	for _, b := range []string{"10.70.9.0/26", "10.70.8.0/26"} {
		if err := l.RemoveBlackhole(ctx, *mustCIDR(t, b)); err != nil {
			t.Fatal(err)
		}
		routes, err := tn.nl.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Dst: mustCIDR(t, b)}, netlink.RT_FILTER_DST)
		if err != nil {
			t.Fatal(err)
		}
		if len(routes) != 1 || routes[0].Protocol != unix.RTPROT_STATIC {
			t.Errorf("foreign route to %s was touched: %v", b, routes)
		}
	}

	for _, bad := range []string{"10.70.0.1/26", "fd00:70::1/122"} {
		_, n, _ := net.ParseCIDR(bad)
		n.IP = mustCIDR(t, bad).IP
		if err := l.EnsureBlackhole(ctx, *n); err == nil || !strings.Contains(err.Error(), "host bits") {
			t.Errorf("EnsureBlackhole(%s) = %v, want a host bits error", bad, err)
		}
	}
}

// TestListWorkloadInterfaces: only cali* veths, sorted.
func TestListWorkloadInterfaces(t *testing.T) {
	requireRoot(t)
	l, tn := newTestLinux(t)
	ctx := context.Background()
	var want []string
	for i, ip := range []string{"10.65.6.1/32", "10.65.6.2/32"} {
		w := Workload{EndpointID: newEndpointID(), IPv4: mustCIDR(t, ip)}
		if err := l.AddWorkload(ctx, w); err != nil {
			t.Fatal(i, err)
		}
		want = append(want, HostIfName(w.EndpointID))
	}
	sort.Strings(want)
	run(t, "ip", "-n", tn.name, "link", "add", "calidummy0", "type", "bridge")
	got, err := l.ListWorkloadInterfaces(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !equalStrings(got, want) {
		t.Errorf("ListWorkloadInterfaces = %v, want %v", got, want)
	}
}

// TestEnsureWorkloadRoutes: missing routes come back (also after the link
// went down, which flushes them), present ones are left, a missing link is
// an error.
func TestEnsureWorkloadRoutes(t *testing.T) {
	requireRoot(t)
	l, tn := newTestLinux(t)
	ctx := context.Background()
	w := Workload{EndpointID: newEndpointID(), IPv4: mustCIDR(t, "10.65.7.1/32"), IPv6: mustCIDR(t, "fd00:65:7::1/128")}
	if err := l.AddWorkload(ctx, w); err != nil {
		t.Fatal(err)
	}
	name := HostIfName(w.EndpointID)
	ips := []net.IPNet{*w.IPv4, *w.IPv6}
	want := tn.ourRoutes(t)
	if len(want) != 2 {
		t.Fatalf("routes after AddWorkload = %v", want)
	}

	run(t, "ip", "-n", tn.name, "route", "del", "10.65.7.1/32")
	if err := l.EnsureWorkloadRoutes(ctx, name, ips); err != nil {
		t.Fatal(err)
	}
	if got := tn.ourRoutes(t); !equalStrings(got, want) {
		t.Errorf("routes after restoring one = %v, want %v", got, want)
	}
	if err := l.EnsureWorkloadRoutes(ctx, name, ips); err != nil { // no-op
		t.Fatal(err)
	}
	if got := tn.ourRoutes(t); !equalStrings(got, want) {
		t.Errorf("routes after a no-op = %v, want %v", got, want)
	}

	run(t, "ip", "-n", tn.name, "link", "set", name, "down")
	if got := tn.ourRoutes(t); len(got) >= 2 {
		t.Logf("note: kernel kept %v on a down link", got)
	}
	if err := l.EnsureWorkloadRoutes(ctx, name, ips); err != nil {
		t.Fatal(err)
	}
	if got := tn.ourRoutes(t); !equalStrings(got, want) {
		t.Errorf("routes after link down/ensure = %v, want %v", got, want)
	}

	if err := l.EnsureWorkloadRoutes(ctx, HostIfName(newEndpointID()), ips); err == nil {
		t.Error("EnsureWorkloadRoutes on a missing interface succeeded")
	}
}

// TestNewLinuxErrors: a path that is not a network namespace is refused.
func TestNewLinuxErrors(t *testing.T) {
	requireRoot(t)
	f, err := os.CreateTemp(t.TempDir(), "notns")
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	for _, p := range []string{"/nonexistent/netns", f.Name()} {
		if l, err := NewLinux(p, testLogger(t)); err == nil {
			l.Close()
			t.Errorf("NewLinux(%q) succeeded", p)
		}
	}
}

// TestInNetNS: fn really runs inside the target namespace, and the caller's
// thread never leaves its own.
func TestInNetNS(t *testing.T) {
	requireRoot(t)
	l, _ := newTestLinux(t)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	before, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer before.Close()
	for i := 0; i < 20; i++ {
		err := inNetNS(l.ns, l.log, func() error {
			cur, err := netns.Get()
			if err != nil {
				return err
			}
			defer cur.Close()
			if !cur.Equal(l.ns) {
				return errors.New("fn is not running in the target namespace")
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	after, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer after.Close()
	if !after.Equal(before) {
		t.Fatal("the calling thread changed namespace")
	}
}

// TestConcurrentWorkloads: one Linux serves concurrent calls for different
// endpoints (the driver serialises per endpoint only).
func TestConcurrentWorkloads(t *testing.T) {
	requireRoot(t)
	l, tn := newTestLinux(t)
	ctx := context.Background()
	const n = 16
	ws := make([]Workload, n)
	for i := range ws {
		ws[i] = Workload{
			EndpointID: newEndpointID(),
			IPv4:       &net.IPNet{IP: net.IPv4(10, 66, 0, byte(i+1)), Mask: net.CIDRMask(32, 32)},
			IPv6:       &net.IPNet{IP: net.ParseIP(fmt.Sprintf("fd00:66::%x", i+1)), Mask: net.CIDRMask(128, 128)},
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for _, w := range ws {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- l.AddWorkload(ctx, w)
		}()
	}
	wg.Wait()
	for range n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	names, err := l.ListWorkloadInterfaces(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(names) != n || len(tn.ourRoutes(t)) != 2*n {
		t.Fatalf("%d interfaces and %d routes, want %d and %d", len(names), len(tn.ourRoutes(t)), n, 2*n)
	}
	for _, w := range ws {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- l.RemoveWorkload(ctx, w.EndpointID, []net.IPNet{*w.IPv4, *w.IPv6})
		}()
	}
	wg.Wait()
	for range n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if got := tn.linkNames(t); !equalStrings(got, []string{"lo"}) {
		t.Errorf("links = %v, want only lo", got)
	}
	if got := tn.ourRoutes(t); len(got) != 0 {
		t.Errorf("routes left: %v", got)
	}
}

func TestGateways(t *testing.T) {
	tests := []struct {
		index      int
		want4      string
		want6      string
		wantErrSub string
	}{
		{index: 1, want4: GatewayIPv4, want6: GatewayIPv6},
		{index: 2, want4: "169.254.1.2", want6: "fe80::2"},
		{index: 254, want4: "169.254.1.254", want6: "fe80::fe"},
		{index: 0, wantErrSub: "outside"},
		{index: 255, wantErrSub: "outside"},
	}
	for _, tc := range tests {
		v4, v6, err := Gateways(tc.index)
		if tc.wantErrSub != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErrSub) {
				t.Errorf("Gateways(%d) error = %v, want %q", tc.index, err, tc.wantErrSub)
			}
			continue
		}
		if err != nil || v4.String() != tc.want4 || v6.String() != tc.want6 {
			t.Errorf("Gateways(%d) = %s, %s, %v; want %s, %s", tc.index, v4, v6, err, tc.want4, tc.want6)
		}
	}
}
