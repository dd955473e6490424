package wireguard

import (
	"net/netip"
	"slices"
	"testing"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/calico-cnm/calico-cnm/datastore"
)

func mustKey(t *testing.T) wgtypes.Key {
	t.Helper()
	k, err := wgtypes.GeneratePrivateKey()
	if err != nil {
		t.Fatal(err)
	}
	return k.PublicKey()
}

func TestCompute(t *testing.T) {
	p := netip.MustParsePrefix
	self, kb, kc := mustKey(t), mustKey(t), mustKey(t)
	node := func(name string, key wgtypes.Key, addr string) datastore.Node {
		return datastore.Node{Name: name, WireGuardPublicKey: key.String(), WireGuardAddr: addr, WireGuardPort: 51821}
	}
	withDeviceAddr := func(n datastore.Node, a string) datastore.Node { n.WireGuardInterfaceAddr = a; return n }
	owners := map[netip.Prefix]string{
		p("10.0.0.0/26"): "self", p("10.0.1.0/26"): "b", p("10.0.2.0/26"): "c", p("10.0.3.0/26"): "nokey",
		p("fd00::/122"):   "b", // IPv6 blocks go through the tunnel too
		p("fd00::40/122"): "nokey",
		p("10.0.9.0/26"):  "", // no host
	}
	endpoints := []datastore.Endpoint{
		{Node: "c", IPv4: "10.0.1.5/32"},     // borrowed from b: /32 to c
		{Node: "b", IPv4: "10.0.1.6/32"},     // b's own block
		{Node: "self", IPv4: "10.0.2.7/32"},  // borrowed here from c: throw
		{Node: "self", IPv4: "10.0.0.8/32"},  // this node's own block
		{Node: "b", IPv4: "10.0.9.1/32"},     // in a block without a host: /32 to b
		{Node: "c", IPv6: "fd00::5/128"},     // borrowed from b's IPv6 block: /128 to c
		{Node: "nokey", IPv4: "10.0.1.9/32"}, // borrowed from b by a node without a peer
		{Node: "self", IPv4: "10.0.9.2/32"},  // local, in a block without a host: throw
	}
	pools := []netip.Prefix{p("10.0.0.0/16"), p("fd00::/64")}
	tunnel := func(s string) Route { return Route{Dst: p(s), Type: RouteTunnel} }
	unreachable := func(s string) Route { return Route{Dst: p(s), Type: RouteUnreachable} }
	throwTo := func(s string) Route { return Route{Dst: p(s), Type: RouteThrow} }
	throw := throwTo("10.0.2.7/32")
	// Required mode closes the pools: what no other route covers (a block
	// the manager has not seen yet) is dropped; this node's own block is
	// thrown to the main table.
	closed := []Route{unreachable("10.0.0.0/16"), unreachable("fd00::/64"), throwTo("10.0.0.0/26"), throwTo("10.0.9.2/32")}
	// nokey's destinations: its blocks and the address it borrowed from b.
	nokeyDrop := []Route{unreachable("10.0.3.0/26"), unreachable("fd00::40/122"), unreachable("10.0.1.9/32")}
	nokeyClear := []Route{throwTo("10.0.3.0/26"), throwTo("fd00::40/122"), throwTo("10.0.1.9/32")}
	toBC := []Route{tunnel("10.0.1.0/26"), tunnel("10.0.9.1/32"), tunnel("fd00::/122"), tunnel("10.0.1.5/32"), tunnel("10.0.2.0/26"), tunnel("fd00::5/128"), throw}
	peerB := Peer{Node: "b", PublicKey: kb, Endpoint: netip.MustParseAddrPort("172.16.0.2:51821"), AllowedIPs: []netip.Prefix{p("10.0.1.0/26"), p("10.0.9.1/32"), p("fd00::/122")}}
	peerC := Peer{Node: "c", PublicKey: kc, Endpoint: netip.MustParseAddrPort("172.16.1.3:51821"), AllowedIPs: []netip.Prefix{p("10.0.1.5/32"), p("10.0.2.0/26"), p("fd00::5/128")}}
	cases := []struct {
		name        string
		mode        string
		nodes       []datastore.Node
		peers       []Peer
		routes      []Route
		unencrypted map[string]string
	}{
		{
			name:   "every node with a key",
			mode:   ModeRequired,
			nodes:  []datastore.Node{node("self", self, "172.16.0.1"), node("b", kb, "172.16.0.2"), node("c", kc, "172.16.1.3"), node("nokey", kb, "")},
			peers:  []Peer{peerB, peerC},
			routes: slices.Concat(toBC, nokeyDrop, closed),
			// nokey publishes b's key with no address: refused as
			// addressless before the key is compared.
			unencrypted: map[string]string{"nokey": "publishes no WireGuard address"},
		},
		{
			name:        "a device address borrowed from another node's block is routed by /32",
			mode:        ModeRequired,
			nodes:       []datastore.Node{withDeviceAddr(node("b", kb, "172.16.0.2"), "10.0.1.1"), withDeviceAddr(node("c", kc, "172.16.1.3"), "10.0.1.2")},
			peers:       []Peer{peerB, {Node: "c", PublicKey: kc, Endpoint: peerC.Endpoint, AllowedIPs: []netip.Prefix{p("10.0.1.2/32"), p("10.0.1.5/32"), p("10.0.2.0/26"), p("fd00::5/128")}}},
			routes:      slices.Concat(toBC, []Route{tunnel("10.0.1.2/32")}, nokeyDrop, closed),
			unencrypted: map[string]string{"nokey": "no node record"},
		},
		{
			name:        "required: a node without a key is unreachable",
			mode:        ModeRequired,
			nodes:       []datastore.Node{node("b", kb, "172.16.0.2"), node("c", kc, "172.16.1.3"), {Name: "nokey"}},
			peers:       []Peer{peerB, peerC},
			routes:      slices.Concat(toBC, nokeyDrop, closed),
			unencrypted: map[string]string{"nokey": "publishes no WireGuard key"},
		},
		{
			// The /32 nokey borrowed from b is thrown too: b's block's
			// tunnel route would carry it to b, which does not hold it.
			name:        "preferred: a node without a key is left to the main table",
			mode:        ModePreferred,
			nodes:       []datastore.Node{node("b", kb, "172.16.0.2"), node("c", kc, "172.16.1.3"), {Name: "nokey"}},
			peers:       []Peer{peerB, peerC},
			routes:      slices.Concat(toBC, nokeyClear, []Route{throwTo("10.0.9.2/32")}),
			unencrypted: map[string]string{"nokey": "publishes no WireGuard key"},
		},
		{
			name:  "a shared key belongs to neither node",
			mode:  ModeRequired,
			nodes: []datastore.Node{node("b", kb, "172.16.0.2"), node("c", kb, "172.16.1.3")},
			routes: slices.Concat([]Route{unreachable("10.0.1.0/26"), unreachable("10.0.9.1/32"), unreachable("fd00::/122"), unreachable("10.0.1.5/32"),
				unreachable("10.0.2.0/26"), unreachable("fd00::5/128"), throw}, nokeyDrop, closed),
			unencrypted: map[string]string{"b": "shares its WireGuard key with c", "c": "shares its WireGuard key with b", "nokey": "no node record"},
		},
		{
			name:  "this node's own key or a bad key",
			mode:  ModePreferred,
			nodes: []datastore.Node{{Name: "b", WireGuardPublicKey: "not-a-key", WireGuardAddr: "172.16.0.2"}, node("c", self, "172.16.1.3")},
			routes: slices.Concat([]Route{throwTo("10.0.1.0/26"), throwTo("10.0.9.1/32"), throwTo("fd00::/122"), throwTo("10.0.1.5/32"),
				throwTo("10.0.2.0/26"), throwTo("fd00::5/128"), throw, throwTo("10.0.9.2/32")}, nokeyClear),
			unencrypted: map[string]string{"b": "publishes an invalid WireGuard key", "c": "publishes this node's own WireGuard key",
				"nokey": "no node record"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := Compute(Input{Self: "self", SelfKey: self, Mode: tc.mode, Nodes: tc.nodes, Owners: owners, Endpoints: endpoints, Pools: pools})
			if !slices.EqualFunc(d.Peers, tc.peers, func(a, b Peer) bool {
				return a.Node == b.Node && a.PublicKey == b.PublicKey && a.Endpoint == b.Endpoint && slices.Equal(a.AllowedIPs, b.AllowedIPs)
			}) {
				t.Errorf("peers:\n got %+v\nwant %+v", d.Peers, tc.peers)
			}
			want := map[netip.Prefix]Route{}
			for _, r := range tc.routes {
				want[r.Dst] = r
			}
			if len(d.Routes) != len(want) {
				t.Errorf("routes:\n got %v\nwant %v", d.Routes, want)
			}
			for dst, r := range want {
				if d.Routes[dst] != r {
					t.Errorf("route %s = %+v, want %+v", dst, d.Routes[dst], r)
				}
			}
			if len(d.Unencrypted) != len(tc.unencrypted) {
				t.Errorf("unencrypted %v, want %v", d.Unencrypted, tc.unencrypted)
			}
			for n, why := range tc.unencrypted {
				if d.Unencrypted[n] != why {
					t.Errorf("unencrypted[%s] = %q, want %q", n, d.Unencrypted[n], why)
				}
			}
		})
	}
}

func TestParseMode(t *testing.T) {
	for in, want := range map[string]string{"": ModeRequired, "required": ModeRequired, "preferred": ModePreferred} {
		if got, err := ParseMode(in); err != nil || got != want {
			t.Errorf("ParseMode(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := ParseMode("sometimes"); err == nil {
		t.Error("ParseMode(sometimes) accepted")
	}
}
