package vxlan

import (
	"context"
	"net"
	"net/netip"
	"slices"
	"testing"

	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/datastore/etcdtest"
	"github.com/calico-cnm/calico-cnm/internal/follow/followtest"
	"github.com/calico-cnm/calico-cnm/ipam"
	"github.com/calico-cnm/calico-cnm/routing"
)

func TestVTEPMAC(t *testing.T) {
	// Expected values computed outside Go: printf NAME | sha1sum, first
	// five bytes, behind 0x66.
	for _, c := range []struct{ node, want string }{
		{"node1", "66:f9:37:c3:7e:94"},
		{"host-a", "66:b7:a0:7e:28:cc"},
	} {
		if got := VTEPMAC(c.node).String(); got != c.want {
			t.Errorf("VTEPMAC(%q) = %s, want %s", c.node, got, c.want)
		}
	}
}

func TestDesiredVXLAN(t *testing.T) {
	p := netip.MustParsePrefix
	a := netip.MustParseAddr
	nodes := []datastore.Node{
		{Name: "self", IPv4: "172.16.1.2", VXLANTunnelAddr: "10.0.0.1"},
		{Name: "near", IPv4: "172.16.1.3", VXLANTunnelAddr: "10.0.1.1"},
		{Name: "far", IPv4: "172.16.2.3", VXLANTunnelAddr: "10.0.2.1"},
		{Name: "novtep", IPv4: "172.16.2.4"},
	}
	owners := map[netip.Prefix]string{
		p("10.0.0.0/26"): "self", p("10.0.1.0/26"): "near", p("10.0.2.0/26"): "far", p("10.0.3.0/26"): "novtep",
		p("10.9.0.0/26"): "far", // in no pool
	}
	// Borrowed addresses get /32s to the node that uses them; an address
	// of the node's own block, or of this node, does not.
	endpoints := []datastore.Endpoint{
		{Node: "far", IPv4: "10.0.1.5/32"},  // borrowed from near
		{Node: "near", IPv4: "10.0.2.9/32"}, // borrowed from far
		{Node: "near", IPv4: "10.0.1.6/32"}, // its own
		{Node: "self", IPv4: "10.0.2.10/32"},
	}
	base := Input{Self: "self", SelfIP: a("172.16.1.2"), SelfSubnet: p("172.16.1.0/24"), Nodes: nodes, Owners: owners, Endpoints: endpoints}
	encap := func(via string) Route { return Route{Via: a(via), Encap: true} }
	cases := []struct {
		name   string
		mode   string
		bgp    bool
		needed bool
		routes map[string]Route
		kinds  map[string]routing.RouteKind
	}{
		{name: "never", mode: "Never"},
		{name: "always", mode: "Always", needed: true,
			routes: map[string]Route{"10.0.1.0/26": encap("10.0.1.1"), "10.0.2.0/26": encap("10.0.2.1"),
				"10.0.1.5/32": encap("10.0.2.1"), "10.0.2.9/32": encap("10.0.1.1")},
			kinds: map[string]routing.RouteKind{"near": routing.RouteVXLAN, "far": routing.RouteVXLAN, "novtep": routing.RouteNone}},
		{name: "always with BGP", mode: "Always", bgp: true, needed: true,
			routes: map[string]Route{"10.0.1.0/26": encap("10.0.1.1"), "10.0.2.0/26": encap("10.0.2.1"),
				"10.0.1.5/32": encap("10.0.2.1"), "10.0.2.9/32": encap("10.0.1.1")},
			kinds: map[string]routing.RouteKind{"near": routing.RouteVXLAN, "far": routing.RouteVXLAN, "novtep": routing.RouteNone}},
		{name: "cross subnet without BGP", mode: "CrossSubnet", needed: true,
			routes: map[string]Route{"10.0.1.0/26": {Via: a("172.16.1.3")}, "10.0.2.0/26": encap("10.0.2.1"),
				"10.0.1.5/32": encap("10.0.2.1"), "10.0.2.9/32": {Via: a("172.16.1.3")}},
			kinds: map[string]routing.RouteKind{"near": routing.RouteDirect, "far": routing.RouteVXLAN, "novtep": routing.RouteNone}},
		{name: "cross subnet with BGP", mode: "CrossSubnet", bgp: true, needed: true,
			routes: map[string]Route{"10.0.2.0/26": encap("10.0.2.1"), "10.0.1.5/32": encap("10.0.2.1")},
			kinds:  map[string]routing.RouteKind{"near": routing.RouteBGP, "far": routing.RouteVXLAN, "novtep": routing.RouteNone}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			in := base
			in.BGP = c.bgp
			in.Pools = []ipam.Pool{{CIDR: "10.0.0.0/16", VXLANMode: c.mode}, {CIDR: "fd00::/64"}}
			d := ComputeDesired(in)
			if d.Needed != c.needed {
				t.Fatalf("Needed = %v, want %v", d.Needed, c.needed)
			}
			if !c.needed {
				if len(d.Routes) != 0 || len(d.VTEPs) != 0 {
					t.Fatalf("no VXLAN pool but routes %v, VTEPs %v", d.Routes, d.VTEPs)
				}
				return
			}
			if len(d.Routes) != len(c.routes) {
				t.Fatalf("routes %v, want %v", d.Routes, c.routes)
			}
			for dst, w := range c.routes {
				w.Dst = p(dst)
				if got := d.Routes[p(dst)]; got != w {
					t.Errorf("route %s = %+v, want %+v", dst, got, w)
				}
				if !d.Owns(p(dst)) {
					t.Errorf("Owns(%s) = false", dst)
				}
			}
			if d.Owns(p("10.9.0.0/26")) || d.Owns(p("10.0.0.0/26")) {
				t.Error("owns a block outside the VXLAN pools, or its own")
			}
			for n, k := range c.kinds {
				if d.Kinds[n] != k {
					t.Errorf("kind of %s = %q, want %q", n, d.Kinds[n], k)
				}
			}
			var names []string
			for _, v := range d.VTEPs {
				names = append(names, v.Node)
				if v.MAC.String() != VTEPMAC(v.Node).String() {
					t.Errorf("VTEP %s MAC %s", v.Node, v.MAC)
				}
			}
			if !slices.Equal(names, []string{"far", "near"}) {
				t.Errorf("VTEPs of %v, want far and near (not self, not novtep)", names)
			}
		})
	}
}

// fakeVXLANKernel records the device, neighbours, FDB and routes.
type fakeVXLANKernel struct {
	uplink Uplink
	dev    *DeviceSpec
	neigh  map[netip.Addr]string
	fdb    map[string]netip.Addr
	routes map[netip.Prefix]Route
}

func newFakeVXLANKernel() *fakeVXLANKernel {
	return &fakeVXLANKernel{
		uplink: Uplink{Index: 2, Name: "eth0", Subnet: netip.MustParsePrefix("172.16.1.0/24"), MTU: 1500},
		neigh:  map[netip.Addr]string{}, fdb: map[string]netip.Addr{}, routes: map[netip.Prefix]Route{},
	}
}

func (k *fakeVXLANKernel) Uplink(netip.Addr) (Uplink, error) { return k.uplink, nil }
func (k *fakeVXLANKernel) EnsureDevice(s DeviceSpec) error {
	k.dev = &s
	return nil
}
func (k *fakeVXLANKernel) RemoveDevice() error {
	k.dev = nil
	k.neigh, k.fdb = map[netip.Addr]string{}, map[string]netip.Addr{}
	for dst, r := range k.routes {
		if r.Encap {
			delete(k.routes, dst)
		}
	}
	return nil
}
func (k *fakeVXLANKernel) Neighbors() (map[netip.Addr]string, error) {
	out := map[netip.Addr]string{}
	for a, m := range k.neigh {
		out[a] = m
	}
	return out, nil
}
func (k *fakeVXLANKernel) SetNeighbor(ip netip.Addr, mac net.HardwareAddr) error {
	k.neigh[ip] = mac.String()
	return nil
}
func (k *fakeVXLANKernel) DelNeighbor(ip netip.Addr) error { delete(k.neigh, ip); return nil }
func (k *fakeVXLANKernel) FDB() (map[string]netip.Addr, error) {
	out := map[string]netip.Addr{}
	for m, a := range k.fdb {
		out[m] = a
	}
	return out, nil
}
func (k *fakeVXLANKernel) SetFDB(mac net.HardwareAddr, dst netip.Addr) error {
	k.fdb[mac.String()] = dst
	return nil
}
func (k *fakeVXLANKernel) DelFDB(mac net.HardwareAddr, _ netip.Addr) error {
	delete(k.fdb, mac.String())
	return nil
}
func (k *fakeVXLANKernel) Routes() ([]Route, error) {
	var out []Route
	for _, r := range k.routes {
		out = append(out, r)
	}
	return out, nil
}
func (k *fakeVXLANKernel) SetRoute(r Route) error { k.routes[r.Dst] = r; return nil }
func (k *fakeVXLANKernel) DelRoute(dst netip.Prefix) error {
	delete(k.routes, dst)
	return nil
}

// TestVXLANManagerSync runs passes against a real datastore and IPAM with
// a fake kernel: a remote node appears, the pool changes mode, the node is
// deleted, VXLAN is switched off.
func TestVXLANManagerSync(t *testing.T) {
	store, eng, ctx, cancel, log := followtest.Fixture(t)
	defer cancel()
	k := newFakeVXLANKernel()
	m, err := NewManager(Deps{Store: store, Records: syncedRecords(t, store), Blocks: eng, Kernel: k, NodeName: "a", Log: log})
	if err != nil {
		t.Fatal(err)
	}
	m.addr, m.uplink, m.uplinkMTU = netip.MustParseAddr("172.16.1.2"), k.uplink, k.uplink.MTU
	mtu := func(ip string) int {
		t.Helper()
		n, err := m.WorkloadMTU(ctx, net.ParseIP(ip))
		if err != nil {
			t.Fatalf("WorkloadMTU(%s): %v", ip, err)
		}
		return n
	}
	sync := func() {
		t.Helper()
		if err := m.Sync(ctx); err != nil {
			t.Fatalf("Sync: %v", err)
		}
	}
	if _, err := eng.AddPool(ctx, ipam.Pool{CIDR: "10.0.0.0/16"}); err != nil {
		t.Fatal(err)
	}
	sync()
	if k.dev != nil || len(k.routes) != 0 {
		t.Fatalf("no VXLAN pool, yet device %+v routes %v", k.dev, k.routes)
	}
	if got := mtu("10.0.0.5"); got != 0 {
		t.Fatalf("MTU in a pool without VXLAN = %d, want the default (0)", got)
	}
	if _, err := eng.SetPoolVXLANMode(ctx, "10.0.0.0/16", "Always"); err != nil {
		t.Fatal(err)
	}
	if got, other := mtu("10.0.0.5"), mtu("10.200.0.5"); got != 1450 || other != 0 {
		t.Fatalf("MTU in a VXLAN pool = %d (want 1500-50), outside every pool = %d (want 0)", got, other)
	}
	// Node b: its record with VTEP, and a block of its own.
	bVTEP, err := eng.EnsureTunnelAddress(ctx, "b", []netip.Prefix{netip.MustParsePrefix("10.0.0.0/16")})
	if err != nil {
		t.Fatal(err)
	}
	putNode(t, ctx, store, datastore.Node{Name: "b", IPv4: "172.16.2.3", VXLANTunnelAddr: bVTEP.String(), VXLANTunnelMAC: VTEPMAC("b").String()})
	sync()
	if k.dev == nil || k.dev.MTU != 1450 || k.dev.MAC.String() != VTEPMAC("a").String() || k.dev.Parent != 2 || k.dev.Local != m.addr {
		t.Fatalf("device %+v", k.dev)
	}
	var self datastore.Node
	if _, err := store.GetJSON(ctx, datastore.NodeKey("a"), &self); err != nil || self.VXLANTunnelAddr != k.dev.Addr.String() || self.IPv4 != "172.16.1.2" || self.VXLANTunnelMAC != VTEPMAC("a").String() {
		t.Fatalf("node record %+v (%v), device address %s", self, err, k.dev.Addr)
	}
	bBlock := netip.PrefixFrom(bVTEP, 26).Masked()
	if r := k.routes[bBlock]; r.Via != bVTEP || !r.Encap {
		t.Fatalf("route to b's block %s = %+v", bBlock, r)
	}
	if k.neigh[bVTEP] != VTEPMAC("b").String() || k.fdb[VTEPMAC("b").String()] != netip.MustParseAddr("172.16.2.3") {
		t.Fatalf("neighbours %v, FDB %v", k.neigh, k.fdb)
	}
	st := m.Status()
	if st.Passes != 2 || len(st.Nodes) != 1 || st.Nodes[0].Routes != routing.RouteVXLAN || st.Nodes[0].VTEP != bVTEP.String() {
		t.Fatalf("status %+v", st)
	}
	if !m.Owns(bBlock) {
		t.Fatal("the manager does not own b's block: BGP would override it")
	}

	// b's record goes (node delete): its routes, neighbour and FDB go.
	if _, err := store.DeleteExisting(ctx, datastore.NodeKey("b")); err != nil {
		t.Fatal(err)
	}
	sync()
	if len(k.routes) != 0 || len(k.neigh) != 0 || len(k.fdb) != 0 {
		t.Fatalf("after b left: routes %v, neighbours %v, FDB %v", k.routes, k.neigh, k.fdb)
	}
	// A stale route of ours from an earlier run is removed.
	k.routes[netip.MustParsePrefix("10.0.99.0/26")] = Route{Dst: netip.MustParsePrefix("10.0.99.0/26"), Via: bVTEP, Encap: true}
	sync()
	if len(k.routes) != 0 {
		t.Fatalf("stale route kept: %v", k.routes)
	}

	// VXLAN off: device, VTEP address and record fields go.
	if _, err := eng.SetPoolVXLANMode(ctx, "10.0.0.0/16", "Never"); err != nil {
		t.Fatal(err)
	}
	sync()
	if k.dev != nil {
		t.Fatalf("device kept: %+v", k.dev)
	}
	if ips, err := eng.IPsByHandle(ctx, ipam.VXLANTunnelHandle("a")); err != nil || len(ips) != 0 {
		t.Fatalf("tunnel address kept: %v %v", ips, err)
	}
	self = datastore.Node{}
	if _, err := store.GetJSON(ctx, datastore.NodeKey("a"), &self); err != nil || self.VXLANTunnelAddr != "" || self.VXLANTunnelMAC != "" {
		t.Fatalf("node record %+v, %v", self, err)
	}
}

func putNode(t *testing.T, ctx context.Context, store *datastore.Store, n datastore.Node) {
	t.Helper()
	if err := store.Txn(ctx, datastore.Write(datastore.NodeKey(n.Name), datastore.MustJSON(n), 0)); err != nil {
		t.Fatal(err)
	}
}

// TestVXLANManagerIgnoresChurnWithoutVXLAN: while no pool uses VXLAN (the
// last pass cleaned up), block claims, endpoints and nodes anywhere in the
// cluster do not start a pass; a pool change does. With a VXLAN pool every
// change does. And a pass without a VXLAN pool reads only the pools.
func TestVXLANManagerIgnoresChurnWithoutVXLAN(t *testing.T) {
	for _, tc := range []struct {
		clean bool
		want  string
	}{{true, ipam.PoolsPrefix}, {false, ipam.AffinityWatchPrefix}} {
		m := &Manager{clean: tc.clean}
		dirty := make(chan string, 4)
		dirty <- ipam.AffinityWatchPrefix
		dirty <- datastore.EndpointsPrefix
		dirty <- datastore.NodesPrefix
		dirty <- ipam.PoolsPrefix
		cause, err := m.loop().Wait(context.Background(), dirty, nil, nil)
		if err != nil || cause != tc.want {
			t.Errorf("clean=%v: pass caused by %q (%v), want %q", tc.clean, cause, err, tc.want)
		}
		if len(dirty) != 0 {
			t.Errorf("clean=%v: %d changes left queued, want all drained into the one pass", tc.clean, len(dirty))
		}
	}
}

// ownersCounting counts the block-owner reads of a VXLAN manager.
type ownersCounting struct {
	datastore.Records
	reads int
}

func (o *ownersCounting) List(prefix string) ([]*datastore.Synced, int64) {
	if prefix == ipam.AffinityWatchPrefix {
		o.reads++
	}
	return o.Records.List(prefix)
}

// syncedRecords is the daemon's syncer over store, read-your-writes.
func syncedRecords(t *testing.T, store *datastore.Store) datastore.Records {
	return etcdtest.Records(t, store, append(datastore.Kinds(), ipam.Kinds()...)...)
}

// TestVXLANManagerPassWithoutVXLANReadsPools: without a VXLAN pool a pass
// reads the pools and nothing else (no block owners), and the first pass
// with one reads everything.
func TestVXLANManagerPassWithoutVXLANReadsPools(t *testing.T) {
	store, eng, ctx, cancel, log := followtest.Fixture(t)
	defer cancel()
	k := newFakeVXLANKernel()
	blocks := &ownersCounting{Records: syncedRecords(t, store)}
	m, err := NewManager(Deps{Store: store, Records: blocks, Blocks: eng, Kernel: k, NodeName: "a", Log: log})
	if err != nil {
		t.Fatal(err)
	}
	m.addr, m.uplink, m.uplinkMTU = netip.MustParseAddr("172.16.1.2"), k.uplink, k.uplink.MTU
	if _, err := eng.AddPool(ctx, ipam.Pool{CIDR: "10.0.0.0/16"}); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := m.Sync(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if blocks.reads != 0 || !m.clean {
		t.Fatalf("without a VXLAN pool: %d block-owner reads, clean %v; want 0 and clean", blocks.reads, m.clean)
	}
	if _, err := eng.SetPoolVXLANMode(ctx, "10.0.0.0/16", "Always"); err != nil {
		t.Fatal(err)
	}
	if err := m.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if blocks.reads != 1 || m.clean {
		t.Errorf("with a VXLAN pool: %d block-owner reads, clean %v; want 1 and not clean", blocks.reads, m.clean)
	}
}
