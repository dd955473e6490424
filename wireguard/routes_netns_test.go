package wireguard

import (
	"maps"
	"net"
	"net/netip"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/internal/netnstest"
)

// netnsKernel is Netlink in a throw-away network namespace holding a
// stand-in wireguard.cali (one end of a veth: routes through it need a
// device, not WireGuard).
func netnsKernel(t *testing.T) *Netlink {
	t.Helper()
	h := netnstest.New(t, "wgtest", "table 99 and its rules")
	la := netlink.NewLinkAttrs()
	la.Name = Device
	if err := h.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: "wgtestpeer"}); err != nil {
		t.Fatal(err)
	}
	l, err := h.LinkByName(Device)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.LinkSetUp(l); err != nil {
		t.Fatal(err)
	}
	return &Netlink{h: h}
}

// ourRules counts the rules to RouteTable per family.
func ourRules(t *testing.T, k *Netlink) map[int]int {
	t.Helper()
	out := map[int]int{}
	for _, family := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		rules, err := k.h.RuleList(family)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rules {
			if r.Table == RouteTable && r.Priority == RulePriority && r.Invert && r.Mark == FirewallMark {
				out[family]++
			}
		}
	}
	return out
}

// TestNetlinkBothFamilies: IPv6 destinations get the same treatment as
// IPv4 ones (a rule per family, tunnel and unreachable routes in table
// 99): IPv6 blocks are routed between the hosts too, and without these
// they would leave in clear in required mode.
func TestNetlinkBothFamilies(t *testing.T) {
	k := netnsKernel(t)
	for range 2 { // idempotent
		if err := k.EnsureRule(); err != nil {
			t.Fatal(err)
		}
	}
	if got := ourRules(t, k); got[netlink.FAMILY_V4] != 1 || got[netlink.FAMILY_V6] != 1 {
		t.Fatalf("rules to table %d per family: %v, want one IPv4 and one IPv6", RouteTable, got)
	}
	p := netip.MustParsePrefix
	want := map[netip.Prefix]Route{}
	for _, r := range []Route{
		{Dst: p("10.0.1.0/26"), Type: RouteTunnel},
		{Dst: p("10.0.3.0/26"), Type: RouteUnreachable},
		{Dst: p("fd00::/122"), Type: RouteTunnel},
		{Dst: p("fd00::40/122"), Type: RouteUnreachable},
		{Dst: p("fd00::85/128"), Type: RouteThrow},
	} {
		if err := k.SetRoute(r); err != nil {
			t.Fatalf("SetRoute(%+v): %v", r, err)
		}
		want[r.Dst] = r
	}
	got, err := k.Routes()
	if err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(got, want) {
		t.Fatalf("table %d:\n got %v\nwant %v", RouteTable, got, want)
	}
	if err := k.DelRoute(p("fd00::/122")); err != nil {
		t.Fatal(err)
	}
	delete(want, p("fd00::/122"))
	if got, err = k.Routes(); err != nil || !maps.Equal(got, want) {
		t.Fatalf("after deleting fd00::/122: %v, %v; want %v", got, err, want)
	}
	if err := k.RemoveRule(); err != nil {
		t.Fatal(err)
	}
	if got := ourRules(t, k); len(got) != 0 {
		t.Fatalf("rules left after RemoveRule: %v", got)
	}
}

// TestClosedPoolLookups asks the kernel itself where packets go with the
// routes of required mode: a block BGP routes in the main table before
// the manager has seen it is unreachable (not sent in clear), this node's
// own block is looked up in the main table, and a block with a tunnel
// route goes through wireguard.cali.
func TestClosedPoolLookups(t *testing.T) {
	k := netnsKernel(t)
	up, err := k.h.LinkByName("wgtestpeer")
	if err != nil {
		t.Fatal(err)
	}
	if err := k.h.LinkSetUp(up); err != nil {
		t.Fatal(err)
	}
	p := netip.MustParsePrefix
	// The main table as BGP and the dataplane leave it: every block
	// through the uplink stand-in.
	for _, block := range []string{"10.0.0.0/26", "10.0.5.0/26", "10.0.6.0/26"} {
		dst := p(block)
		r := &netlink.Route{LinkIndex: up.Attrs().Index, Dst: &net.IPNet{IP: dst.Addr().AsSlice(), Mask: net.CIDRMask(dst.Bits(), 32)}}
		if err := k.h.RouteAdd(r); err != nil {
			t.Fatal(err)
		}
	}
	want := Compute(Input{
		Self: "self", Mode: ModeRequired, Pools: []netip.Prefix{p("10.0.0.0/16")},
		Owners: map[netip.Prefix]string{p("10.0.0.0/26"): "self", p("10.0.6.0/26"): "b"},
		Nodes:  []datastore.Node{{Name: "b", WireGuardPublicKey: mustKey(t).String(), WireGuardAddr: "172.16.0.2"}},
	})
	if err := k.EnsureRule(); err != nil {
		t.Fatal(err)
	}
	for _, r := range want.Routes {
		if err := k.SetRoute(r); err != nil {
			t.Fatalf("SetRoute(%+v): %v", r, err)
		}
	}
	dev, err := k.h.LinkByName(Device)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		dst  string
		via  int // link index; 0: unreachable
		what string
	}{
		{"10.0.5.1", 0, "a block no node record names yet (BGP routes it)"},
		{"10.0.0.5", up.Attrs().Index, "this node's own block"},
		{"10.0.6.7", dev.Attrs().Index, "a block of an encrypted node"},
	} {
		rs, err := k.h.RouteGet(net.ParseIP(tc.dst))
		switch {
		case tc.via == 0 && err == nil:
			t.Errorf("%s (%s) is routed, via link %d: it would leave in clear", tc.dst, tc.what, rs[0].LinkIndex)
		case tc.via != 0 && err != nil:
			t.Errorf("%s (%s): %v, want via link %d", tc.dst, tc.what, err, tc.via)
		case tc.via != 0 && rs[0].LinkIndex != tc.via:
			t.Errorf("%s (%s) goes via link %d, want %d", tc.dst, tc.what, rs[0].LinkIndex, tc.via)
		}
	}
}
