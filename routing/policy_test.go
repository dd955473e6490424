package routing

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/calico-cnm/calico-cnm/datastore"
)

var (
	pfx  = netip.MustParsePrefix
	addr = netip.MustParseAddr
)

func boolp(b bool) *bool { return &b }

func TestDesiredPeers(t *testing.T) {
	nodes := []datastore.Node{
		{Name: "a", IPv4: "10.0.0.1"},
		{Name: "b", IPv4: "10.0.0.2", ASN: 65002},
		{Name: "c", IPv4: "10.0.0.3"},
		{Name: "rr1", IPv4: "10.0.0.11", RouteReflector: true, ClusterID: "1.1.1.1"},
		{Name: "rr2", IPv4: "10.0.0.12", RouteReflector: true, ClusterID: "1.1.1.1"},
		{Name: "noaddr"},
	}
	meshOff := datastore.BGPConfig{NodeToNodeMesh: boolp(false)}
	tor := datastore.BGPPeer{Name: "tor", PeerIP: "10.0.0.254", ASN: 65000, Password: "s3cret"}
	torForB := datastore.BGPPeer{Name: "tor-b", PeerIP: "10.0.0.253", ASN: 65001, Node: "b"}
	type want struct {
		addr string
		typ  PeerType
		asn  uint32
		rr   bool
	}
	tests := []struct {
		name  string
		self  Self
		peers []datastore.BGPPeer
		cfg   datastore.BGPConfig
		want  []want
	}{
		{
			name: "mesh: every other node with an address, their own ASN or the default",
			self: Self{Name: "a", Address: addr("10.0.0.1"), ASN: 64512},
			want: []want{
				{"10.0.0.2", PeerMesh, 65002, false}, {"10.0.0.3", PeerMesh, 64512, false},
				{"10.0.0.11", PeerMesh, 64512, false}, {"10.0.0.12", PeerMesh, 64512, false},
			},
		},
		{
			name: "mesh uses the cluster default ASN",
			self: Self{Name: "b", Address: addr("10.0.0.2")},
			cfg:  datastore.BGPConfig{ASN: 65100},
			want: []want{
				{"10.0.0.1", PeerMesh, 65100, false}, {"10.0.0.3", PeerMesh, 65100, false},
				{"10.0.0.11", PeerMesh, 65100, false}, {"10.0.0.12", PeerMesh, 65100, false},
			},
		},
		{
			name: "mesh off, plain node: only the reflectors",
			self: Self{Name: "a", Address: addr("10.0.0.1")},
			cfg:  meshOff,
			want: []want{{"10.0.0.11", PeerReflector, 64512, false}, {"10.0.0.12", PeerReflector, 64512, false}},
		},
		{
			name: "mesh off, reflector: clients, and the other reflector as a plain peer",
			self: Self{Name: "rr1", Address: addr("10.0.0.11"), RouteReflector: true, ClusterID: "1.1.1.1"},
			cfg:  meshOff,
			want: []want{
				{"10.0.0.1", PeerRRClient, 64512, true}, {"10.0.0.2", PeerRRClient, 65002, true},
				{"10.0.0.3", PeerRRClient, 64512, true}, {"10.0.0.12", PeerReflector, 64512, false},
			},
		},
		{
			name:  "mesh off and no reflector: nothing but explicit peers",
			self:  Self{Name: "a", Address: addr("10.0.0.1")},
			cfg:   meshOff,
			peers: []datastore.BGPPeer{tor, torForB},
			want:  []want{{"10.0.0.11", PeerReflector, 64512, false}, {"10.0.0.12", PeerReflector, 64512, false}, {"10.0.0.254", PeerGlobal, 65000, false}},
		},
		{
			name:  "global peers on every node, node peers only on theirs",
			self:  Self{Name: "b", Address: addr("10.0.0.2")},
			cfg:   meshOff,
			peers: []datastore.BGPPeer{tor, torForB},
			want:  []want{{"10.0.0.11", PeerReflector, 64512, false}, {"10.0.0.12", PeerReflector, 64512, false}, {"10.0.0.253", PeerNode, 65001, false}, {"10.0.0.254", PeerGlobal, 65000, false}},
		},
		{
			name: "an explicit peer at a node's address replaces the mesh session; own address and bad records are skipped",
			self: Self{Name: "a", Address: addr("10.0.0.1")},
			peers: []datastore.BGPPeer{
				{Name: "c-as-peer", PeerIP: "10.0.0.3", ASN: 65003},
				{Name: "self", PeerIP: "10.0.0.1", ASN: 65000},
				{Name: "bad-ip", PeerIP: "nope", ASN: 65000},
				{Name: "no-asn", PeerIP: "10.9.9.9"},
				{Name: "v6", PeerIP: "fd00::1", ASN: 65000},
			},
			want: []want{
				{"10.0.0.2", PeerMesh, 65002, false}, {"10.0.0.3", PeerGlobal, 65003, false},
				{"10.0.0.11", PeerMesh, 64512, false}, {"10.0.0.12", PeerMesh, 64512, false},
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := DesiredPeers(tc.self, nodes, tc.peers, tc.cfg)
			var gotW []want
			for _, p := range got {
				gotW = append(gotW, want{p.Address.String(), p.Type, p.ASN, p.RRClient})
			}
			if !slices.Equal(gotW, tc.want) {
				t.Errorf("peers:\n got %v\nwant %v", gotW, tc.want)
			}
		})
	}
	t.Run("password and cluster id are carried", func(t *testing.T) {
		got := DesiredPeers(Self{Name: "rr1", Address: addr("10.0.0.11"), RouteReflector: true, ClusterID: "1.1.1.1"}, nodes, []datastore.BGPPeer{tor}, meshOff)
		for _, p := range got {
			if p.Address == addr("10.0.0.254") && p.Password != "s3cret" {
				t.Errorf("ToR session lost its password")
			}
			if (p.Type == PeerReflector) != p.LocalOnly {
				t.Errorf("%s: reflector-to-reflector sessions must carry only own routes (LocalOnly=%v)", p.Address, p.LocalOnly)
			}
			if p.Type == PeerRRClient && p.ClusterID != "1.1.1.1" {
				t.Errorf("client %s has cluster id %q", p.Address, p.ClusterID)
			}
			if strings.Contains(p.String(), "s3cret") {
				t.Errorf("String() leaks the password")
			}
		}
	})
}

func TestDesiredExports(t *testing.T) {
	tests := []struct {
		name   string
		blocks []netip.Prefix
		ips    []netip.Addr
		ipv6   bool
		want   []netip.Prefix
	}{
		{"nothing", nil, nil, false, []netip.Prefix{}},
		{
			name:   "blocks only; addresses inside them add nothing",
			blocks: []netip.Prefix{pfx("192.168.1.64/26"), pfx("192.168.1.0/26")},
			ips:    []netip.Addr{addr("192.168.1.1"), addr("192.168.1.70")},
			want:   []netip.Prefix{pfx("192.168.1.0/26"), pfx("192.168.1.64/26")},
		},
		{
			name:   "borrowed addresses get a /32, duplicates once",
			blocks: []netip.Prefix{pfx("192.168.1.0/26")},
			ips:    []netip.Addr{addr("192.168.7.5"), addr("192.168.1.2"), addr("192.168.7.5")},
			want:   []netip.Prefix{pfx("192.168.1.0/26"), pfx("192.168.7.5/32")},
		},
		{
			name: "no blocks at all: every workload is borrowed",
			ips:  []netip.Addr{addr("10.1.0.9")},
			want: []netip.Prefix{pfx("10.1.0.9/32")},
		},
		{
			name:   "IPv6 is not exported without an IPv6 next hop",
			blocks: []netip.Prefix{pfx("fd00::/122"), pfx("10.0.0.0/26")},
			ips:    []netip.Addr{addr("fd00:1::5")},
			want:   []netip.Prefix{pfx("10.0.0.0/26")},
		},
		{
			name:   "IPv6 blocks, and /128 for borrowed IPv6 addresses",
			blocks: []netip.Prefix{pfx("fd00::/122"), pfx("10.0.0.0/26")},
			ips:    []netip.Addr{addr("fd00::5"), addr("fd00:1::5"), addr("10.0.0.7")},
			ipv6:   true,
			want:   []netip.Prefix{pfx("10.0.0.0/26"), pfx("fd00::/122"), pfx("fd00:1::5/128")},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := DesiredExports(tc.blocks, tc.ips, tc.ipv6); !slices.Equal(got, tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

func testPolicy() ImportPolicy {
	peers := map[netip.Addr]PeerSpec{}
	for _, p := range []PeerSpec{
		{Address: addr("10.0.0.2"), Type: PeerMesh, Name: "b"},
		{Address: addr("10.0.0.3"), Type: PeerMesh, Name: "c"},
		{Address: addr("10.0.0.11"), Type: PeerReflector, Name: "rr1"},
		{Address: addr("10.0.0.254"), Type: PeerGlobal, Name: "tor", ASN: 65000},
	} {
		peers[p.Address] = p
	}
	return ImportPolicy{
		Self:  Self{Name: "a", Address: addr("10.0.0.1"), Address6: addr("fd00:f::1"), ASN: 64512},
		Pools: []netip.Prefix{pfx("192.168.0.0/16"), pfx("10.244.0.0/16"), pfx("fd00:10::/64")},
		Nodes: map[netip.Addr]string{addr("10.0.0.2"): "b", addr("10.0.0.3"): "c", addr("10.0.0.4"): "d", addr("10.0.0.11"): "rr1",
			addr("fd00:f::2"): "b", addr("fd00:f::4"): "d"},
		NodeIPv6: map[string]netip.Addr{"b": addr("fd00:f::2"), "d": addr("fd00:f::4")},
		Peers:    peers,
		Exports:  map[netip.Prefix]bool{pfx("192.168.0.0/26"): true},
	}
}

func TestImportDecide(t *testing.T) {
	pol := testPolicy()
	tests := []struct {
		name string
		path LearnedPath
		want string
	}{
		{"mesh peer announcing its own block", LearnedPath{Prefix: pfx("192.168.1.0/26"), NextHop: addr("10.0.0.2"), Peer: addr("10.0.0.2")}, ""},
		{"borrowed /32 inside a pool", LearnedPath{Prefix: pfx("192.168.0.5/32"), NextHop: addr("10.0.0.3"), Peer: addr("10.0.0.3")}, ""},
		{"prefix outside every pool", LearnedPath{Prefix: pfx("10.99.0.0/24"), NextHop: addr("10.0.0.2"), Peer: addr("10.0.0.2")}, RejectNotInPool},
		{"supernet of a pool is not inside it", LearnedPath{Prefix: pfx("192.168.0.0/15"), NextHop: addr("10.0.0.2"), Peer: addr("10.0.0.2")}, RejectNotInPool},
		{"default route", LearnedPath{Prefix: pfx("0.0.0.0/0"), NextHop: addr("10.0.0.254"), Peer: addr("10.0.0.254")}, RejectNotInPool},
		{"our own block", LearnedPath{Prefix: pfx("192.168.0.0/26"), NextHop: addr("10.0.0.2"), Peer: addr("10.0.0.2")}, RejectOwnPrefix},
		{"mesh peer pointing at another node", LearnedPath{Prefix: pfx("192.168.1.0/26"), NextHop: addr("10.0.0.3"), Peer: addr("10.0.0.2")}, RejectBadNextHop},
		{"mesh peer pointing at a stranger", LearnedPath{Prefix: pfx("192.168.1.0/26"), NextHop: addr("10.0.0.99"), Peer: addr("10.0.0.2")}, RejectBadNextHop},
		{"reflector passing on a node's block", LearnedPath{Prefix: pfx("192.168.2.0/26"), NextHop: addr("10.0.0.4"), Peer: addr("10.0.0.11")}, ""},
		{"reflector pointing at a stranger", LearnedPath{Prefix: pfx("192.168.2.0/26"), NextHop: addr("10.0.0.99"), Peer: addr("10.0.0.11")}, RejectBadNextHop},
		{"reflected back to us", LearnedPath{Prefix: pfx("192.168.3.0/26"), NextHop: addr("10.0.0.1"), Peer: addr("10.0.0.11")}, RejectSelfNextHop},
		{"router pointing at itself", LearnedPath{Prefix: pfx("10.244.5.0/24"), NextHop: addr("10.0.0.254"), Peer: addr("10.0.0.254"), ASPath: []uint32{65000}}, ""},
		{"router pointing at a node", LearnedPath{Prefix: pfx("10.244.5.0/24"), NextHop: addr("10.0.0.3"), Peer: addr("10.0.0.254"), ASPath: []uint32{65000}}, ""},
		{"router pointing elsewhere", LearnedPath{Prefix: pfx("10.244.5.0/24"), NextHop: addr("10.0.0.77"), Peer: addr("10.0.0.254")}, RejectBadNextHop},
		{"router echoing our AS", LearnedPath{Prefix: pfx("192.168.1.0/26"), NextHop: addr("10.0.0.254"), Peer: addr("10.0.0.254"), ASPath: []uint32{65000, 64512}}, RejectASLoop},
		{"unknown peer", LearnedPath{Prefix: pfx("192.168.1.0/26"), NextHop: addr("10.0.0.5"), Peer: addr("10.0.0.5")}, RejectUnknownPeer},
		{"IPv6 prefix with an IPv4 next hop", LearnedPath{Prefix: pfx("fd00:10::/122"), NextHop: addr("10.0.0.2"), Peer: addr("10.0.0.2")}, RejectFamily},
		{"IPv4 prefix with an IPv6 next hop", LearnedPath{Prefix: pfx("192.168.1.0/26"), NextHop: addr("fd00:f::2"), Peer: addr("10.0.0.2")}, RejectFamily},
		{"mesh peer announcing its IPv6 block via its IPv6 next hop", LearnedPath{Prefix: pfx("fd00:10::40/122"), NextHop: addr("fd00:f::2"), Peer: addr("10.0.0.2")}, ""},
		{"IPv6 prefix outside every pool", LearnedPath{Prefix: pfx("fd00:99::/64"), NextHop: addr("fd00:f::2"), Peer: addr("10.0.0.2")}, RejectNotInPool},
		{"mesh peer pointing its IPv6 block at another node", LearnedPath{Prefix: pfx("fd00:10::40/122"), NextHop: addr("fd00:f::4"), Peer: addr("10.0.0.2")}, RejectBadNextHop},
		{"mesh peer without an IPv6 next hop", LearnedPath{Prefix: pfx("fd00:10::80/122"), NextHop: addr("fd00:f::3"), Peer: addr("10.0.0.3")}, RejectBadNextHop},
		{"reflector passing on a node's IPv6 block", LearnedPath{Prefix: pfx("fd00:10::c0/122"), NextHop: addr("fd00:f::4"), Peer: addr("10.0.0.11")}, ""},
		{"IPv6 reflected back to us", LearnedPath{Prefix: pfx("fd00:10::c0/122"), NextHop: addr("fd00:f::1"), Peer: addr("10.0.0.11")}, RejectSelfNextHop},
		{"router pointing an IPv6 prefix at a node", LearnedPath{Prefix: pfx("fd00:10::100/122"), NextHop: addr("fd00:f::2"), Peer: addr("10.0.0.254"), ASPath: []uint32{65000}}, ""},
		{"router pointing an IPv6 prefix elsewhere", LearnedPath{Prefix: pfx("fd00:10::100/122"), NextHop: addr("fd00:f::77"), Peer: addr("10.0.0.254"), ASPath: []uint32{65000}}, RejectBadNextHop},
		{"no next hop", LearnedPath{Prefix: pfx("192.168.1.0/26"), Peer: addr("10.0.0.2")}, RejectInvalidRoute},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := pol.Decide(tc.path); got != tc.want {
				t.Errorf("Decide = %q, want %q", got, tc.want)
			}
		})
	}
}

// TestImportDecideWithoutIPv6: a node with no IPv6 next hop installs no
// IPv6 routes (it could not reach their next hops anyway).
func TestImportDecideWithoutIPv6(t *testing.T) {
	pol := testPolicy()
	pol.Self.Address6 = netip.Addr{}
	p := LearnedPath{Prefix: pfx("fd00:10::40/122"), NextHop: addr("fd00:f::2"), Peer: addr("10.0.0.2")}
	if got := pol.Decide(p); got != RejectNoIPv6 {
		t.Errorf("Decide = %q, want %q", got, RejectNoIPv6)
	}
}

func TestSelect(t *testing.T) {
	pol := testPolicy()
	paths := []LearnedPath{
		// b's block from b, and the same again reflected (same next hop).
		{Prefix: pfx("192.168.1.0/26"), NextHop: addr("10.0.0.2"), Peer: addr("10.0.0.2")},
		{Prefix: pfx("192.168.1.0/26"), NextHop: addr("10.0.0.2"), Peer: addr("10.0.0.11")},
		// an anycast prefix from b and c: ECMP.
		{Prefix: pfx("192.168.9.0/26"), NextHop: addr("10.0.0.3"), Peer: addr("10.0.0.3")},
		{Prefix: pfx("192.168.9.0/26"), NextHop: addr("10.0.0.2"), Peer: addr("10.0.0.2")},
		// the router offers a longer AS path for c's block: not used.
		{Prefix: pfx("192.168.2.0/26"), NextHop: addr("10.0.0.3"), Peer: addr("10.0.0.3")},
		{Prefix: pfx("192.168.2.0/26"), NextHop: addr("10.0.0.254"), Peer: addr("10.0.0.254"), ASPath: []uint32{65000}},
		// a higher local preference wins over a shorter AS path.
		{Prefix: pfx("10.244.1.0/24"), NextHop: addr("10.0.0.254"), Peer: addr("10.0.0.254"), ASPath: []uint32{65000}, LocalPref: 200},
		{Prefix: pfx("10.244.1.0/24"), NextHop: addr("10.0.0.4"), Peer: addr("10.0.0.11")},
		// stale paths (graceful restart) still count.
		{Prefix: pfx("192.168.4.0/26"), NextHop: addr("10.0.0.3"), Peer: addr("10.0.0.3"), Stale: true},
		// rejected ones.
		{Prefix: pfx("10.99.0.0/24"), NextHop: addr("10.0.0.254"), Peer: addr("10.0.0.254"), ASPath: []uint32{65000}},
		{Prefix: pfx("172.16.0.0/12"), NextHop: addr("10.0.0.254"), Peer: addr("10.0.0.254"), ASPath: []uint32{65000}},
		{Prefix: pfx("192.168.0.0/26"), NextHop: addr("10.0.0.2"), Peer: addr("10.0.0.2")},
	}
	sel := Select(paths, pol)
	want := map[netip.Prefix][]netip.Addr{
		pfx("192.168.1.0/26"): {addr("10.0.0.2")},
		pfx("192.168.9.0/26"): {addr("10.0.0.2"), addr("10.0.0.3")},
		pfx("192.168.2.0/26"): {addr("10.0.0.3")},
		pfx("10.244.1.0/24"):  {addr("10.0.0.254")},
		pfx("192.168.4.0/26"): {addr("10.0.0.3")},
	}
	if len(sel.Routes) != len(want) {
		t.Errorf("routes = %v, want %v", sel.Routes, want)
	}
	for p, hops := range want {
		if !slices.Equal(sel.Routes[p], hops) {
			t.Errorf("%s via %v, want %v", p, sel.Routes[p], hops)
		}
	}
	if sel.Rejected[RejectNotInPool] != 2 || sel.Rejected[RejectOwnPrefix] != 1 {
		t.Errorf("rejected = %v, want 2 outside the pools and 1 own prefix", sel.Rejected)
	}
	tor := sel.PerPeer[addr("10.0.0.254")]
	if tor.Received != 4 || tor.Accepted != 2 {
		t.Errorf("ToR counters = %+v, want received 4 accepted 2", tor)
	}
	b := sel.PerPeer[addr("10.0.0.2")]
	if b.Received != 3 || b.Accepted != 2 {
		t.Errorf("b counters = %+v, want received 3 accepted 2", b)
	}
}

func TestDesiredPeersOnlyHigherAddressDials(t *testing.T) {
	nodes := []datastore.Node{{Name: "a", IPv4: "10.0.0.1"}, {Name: "b", IPv4: "10.0.0.2"}, {Name: "c", IPv4: "10.0.0.3"}}
	tor := []datastore.BGPPeer{{Name: "tor", PeerIP: "10.0.0.254", ASN: 65000}}
	got := DesiredPeers(Self{Name: "b", Address: addr("10.0.0.2")}, nodes, tor, datastore.BGPConfig{})
	want := map[string]bool{"10.0.0.1": false, "10.0.0.3": true, "10.0.0.254": false}
	if len(got) != len(want) {
		t.Fatalf("peers = %v", got)
	}
	for _, p := range got {
		if p.Passive != want[p.Address.String()] {
			t.Errorf("%s passive = %v, want %v (nodes: the lower address waits; routers: always dial)", p.Address, p.Passive, want[p.Address.String()])
		}
	}
	// Restarting does not make a session "changed".
	x := got[0]
	y := x
	y.Restarting = true
	if !x.Equal(y) {
		t.Errorf("Restarting alone must not re-create a session")
	}
	y.Password = "new"
	if x.Equal(y) {
		t.Errorf("a new password must re-create the session")
	}
}

func TestConfigFinish(t *testing.T) {
	tests := []struct {
		name    string
		cfg     Config
		wantErr string
	}{
		{"defaults", Config{}, ""},
		{"node ip", Config{NodeIP: "10.0.0.1"}, ""},
		{"ipv6 node ip", Config{NodeIP: "fd00::1"}, "not an IPv4 address"},
		{"bad port", Config{Port: 70000}, "use 1-65535"},
		{"long restart", Config{RestartTime: 2 * time.Hour}, "at most 4095s"},
		{"interface regexp", Config{AutodetectMethod: "interface=eth.*"}, ""},
		{"bad regexp", Config{AutodetectMethod: "interface=eth("}, "bad interface regexp"},
		{"can-reach", Config{AutodetectMethod: "can-reach=10.0.0.254"}, ""},
		{"can-reach name", Config{AutodetectMethod: "can-reach=router"}, "needs an IPv4 address"},
		{"unknown method", Config{AutodetectMethod: "skip"}, "use first-found"},
		{"listen", Config{ListenAddress: "nope"}, "not an IP address"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Finish()
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("Finish: %v", err)
				}
				if tc.cfg.Port != DefaultPort || tc.cfg.RestartTime != DefaultRestartTime || tc.cfg.SyncTimeout != DefaultSyncTimeout {
					t.Errorf("defaults not applied: %+v", tc.cfg)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("Finish = %v, want an error containing %q", err, tc.wantErr)
			}
		})
	}
}
