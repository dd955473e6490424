// Package vxlan keeps vxlan.calico, its neighbours, FDB entries and the
// routes to other hosts' blocks equal to what the pools, node records and
// block affinities ask for, with or without BGP. The BGP agent (routing)
// asks it which destinations it owns (routing.VXLANRouter); its status is
// the VXLAN part of `node status` (routing.VXLANStatus).
package vxlan

import (
	"crypto/sha1"
	"net"
	"net/netip"
	"slices"
	"strings"

	"github.com/vishvananda/netlink"

	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/ipam"
	"github.com/calico-cnm/calico-cnm/routing"
)

// Calico's VXLAN choices, so that a node computes every other node's
// tunnel endpoint the same way Calico does.
const (
	Device = "vxlan.calico"
	VNI    = 4096
	Port   = 4789
	// Overhead is what the encapsulation adds to a packet: outer
	// IPv4 (20), UDP (8), VXLAN (8) and inner Ethernet (14) headers.
	Overhead = 50
)

// Protocol marks the routes the VXLAN manager installs ("proto 82"):
// neither dataplane.RouteProtocol (80: blackholes, workload routes) nor
// routing.LearnedProtocol (81: BGP), so that each owner's cleanup deletes
// only its own routes.
const Protocol netlink.RouteProtocol = 82

// VTEPMAC is the MAC of node's vxlan.calico device: 0x66 ('f') followed by
// the first five bytes of SHA-1 of the node name, as Calico computes it
// (felix/calc/vxlan_resolver.go), so that no node has to publish it for
// the others to program their FDB.
func VTEPMAC(node string) net.HardwareAddr {
	sum := sha1.Sum([]byte(node))
	return append(net.HardwareAddr{0x66}, sum[:5]...)
}

// VTEP is a remote node's tunnel endpoint.
type VTEP struct {
	Node   string
	NodeIP netip.Addr // underlay: where encapsulated packets go
	Addr   netip.Addr // the node's address on vxlan.calico
	MAC    net.HardwareAddr
}

// Route is one route of the VXLAN manager: via a VTEP on the device
// (Encap) or via a node address directly.
type Route struct {
	Dst   netip.Prefix
	Via   netip.Addr
	Encap bool
}

// Input is what the desired VXLAN state is computed from.
type Input struct {
	Self       string
	SelfIP     netip.Addr   // this node's underlay address
	SelfSubnet netip.Prefix // the subnet of SelfIP's interface (CrossSubnet)
	BGP        bool         // a BGP speaker installs direct routes
	Nodes      []datastore.Node
	Pools      []ipam.Pool
	Owners     map[netip.Prefix]string // block -> host
	// Endpoints are every node's workload endpoints: those holding an
	// address borrowed from another host's block are routed by /32.
	Endpoints []datastore.Endpoint
}

// Desired is the state the kernel should have.
type Desired struct {
	// Needed: some pool uses VXLAN, so this node has a device and a VTEP.
	Needed bool
	// Pools are the enabled and disabled pools with vxlanMode != Never:
	// the VTEP address comes from one of them.
	Pools  []netip.Prefix
	VTEPs  []VTEP // every remote node with a VTEP, by name
	Routes map[netip.Prefix]Route
	// Kinds is, per remote node, how its workloads are reached (the
	// strongest kind over its blocks: vxlan, then direct, then bgp).
	Kinds map[string]routing.RouteKind
}

// ComputeDesired computes device, VTEPs and routes from the datastore's view.
// A remote block in an Always pool is routed through the owner's VTEP; in a
// CrossSubnet pool likewise when the owner is outside SelfSubnet, and
// directly otherwise (left to BGP when BGP runs). Never pools are not
// touched (BGP's, or nobody's).
func ComputeDesired(in Input) Desired {
	d := Desired{Routes: map[netip.Prefix]Route{}, Kinds: map[string]routing.RouteKind{}}
	pools := vxlanPools(in.Pools)
	for _, p := range pools {
		d.Pools = append(d.Pools, p.pfx)
	}
	d.Needed = len(pools) > 0
	if !d.Needed {
		return d
	}
	r := vxlanRouter{in: in, d: &d, pools: pools, vteps: map[string]VTEP{}, nodeIPs: map[string]netip.Addr{}}
	r.readRemoteNodes()
	for name := range r.nodeIPs {
		d.Kinds[name] = routing.RouteNone
	}
	for block, owner := range in.Owners {
		if owner != in.Self && owner != "" {
			r.route(block, owner)
		}
	}
	r.routeBorrowedAddresses()
	return d
}

// vxlanPool is an IPv4 pool whose vxlanMode is not Never.
type vxlanPool struct {
	pfx  netip.Prefix
	mode string
}

// vxlanPools picks the IPv4 pools that use VXLAN, in their order.
func vxlanPools(all []ipam.Pool) []vxlanPool {
	var pools []vxlanPool
	for _, p := range all {
		pfx, err := netip.ParsePrefix(p.CIDR)
		if err != nil || !pfx.Addr().Is4() || !p.Encapsulates() {
			continue
		}
		pools = append(pools, vxlanPool{pfx.Masked(), p.VXLAN()})
	}
	return pools
}

// routeKindRank orders the kinds by strength: a node's kind is the
// strongest over its blocks.
var routeKindRank = map[routing.RouteKind]int{routing.RouteNone: 0, routing.RouteBGP: 1, routing.RouteDirect: 2, routing.RouteVXLAN: 3}

// vxlanRouter fills d's VTEPs, routes and kinds from in, once the VXLAN
// pools are known.
type vxlanRouter struct {
	in      Input
	d       *Desired
	pools   []vxlanPool
	vteps   map[string]VTEP       // remote node -> its VTEP
	nodeIPs map[string]netip.Addr // remote node -> its underlay address
}

// readRemoteNodes collects every other node's underlay address and, where
// it has one, its VTEP (listed in d.VTEPs by name).
func (r *vxlanRouter) readRemoteNodes() {
	for _, n := range r.in.Nodes {
		if n.Name == r.in.Self || n.Name == "" {
			continue
		}
		ip, err := netip.ParseAddr(n.IPv4)
		if err != nil || !ip.Is4() {
			continue
		}
		r.nodeIPs[n.Name] = ip
		vtep, err := netip.ParseAddr(n.VXLANTunnelAddr)
		if err != nil || !vtep.Is4() {
			continue
		}
		mac := VTEPMAC(n.Name)
		if m, err := net.ParseMAC(n.VXLANTunnelMAC); err == nil && len(m) == 6 {
			mac = m
		}
		v := VTEP{Node: n.Name, NodeIP: ip, Addr: vtep, MAC: mac}
		r.vteps[n.Name] = v
		r.d.VTEPs = append(r.d.VTEPs, v)
	}
	slices.SortFunc(r.d.VTEPs, func(a, b VTEP) int { return strings.Compare(a.Node, b.Node) })
}

// note raises node's kind to k unless it already has a stronger one.
func (r *vxlanRouter) note(node string, k routing.RouteKind) {
	if routeKindRank[k] > routeKindRank[r.d.Kinds[node]] {
		r.d.Kinds[node] = k
	}
}

// poolOf is the first VXLAN pool that contains dst.
func (r *vxlanRouter) poolOf(dst netip.Prefix) (vxlanPool, bool) {
	idx := slices.IndexFunc(r.pools, func(p vxlanPool) bool { return p.pfx.Overlaps(dst) && p.pfx.Bits() <= dst.Bits() })
	if idx < 0 {
		return vxlanPool{}, false
	}
	return r.pools[idx], true
}

// route routes dst, a block or a borrowed address, to node's workloads.
func (r *vxlanRouter) route(dst netip.Prefix, node string) {
	pool, ok := r.poolOf(dst)
	nodeIP, known := r.nodeIPs[node]
	if !ok || !known {
		return
	}
	sameSubnet := r.in.SelfSubnet.IsValid() && r.in.SelfSubnet.Contains(nodeIP)
	switch {
	case pool.mode == ipam.EncapCrossSubnet && sameSubnet && r.in.BGP:
		r.note(node, routing.RouteBGP)
	case pool.mode == ipam.EncapCrossSubnet && sameSubnet:
		r.d.Routes[dst] = Route{Dst: dst, Via: nodeIP}
		r.note(node, routing.RouteDirect)
	default:
		v, ok := r.vteps[node]
		if !ok {
			return // no VTEP yet: the node's manager has not started
		}
		r.d.Routes[dst] = Route{Dst: dst, Via: v.Addr, Encap: true}
		r.note(node, routing.RouteVXLAN)
	}
}

// routeBorrowedAddresses gives a workload whose address is borrowed from
// another host's block (or from a block without a host) a /32 to its own
// node, more specific than the block's route.
func (r *vxlanRouter) routeBorrowedAddresses() {
	for _, ep := range r.in.Endpoints {
		a, _ := ep.Addrs()
		if !a.IsValid() || ep.Node == r.in.Self || ep.Node == "" {
			continue
		}
		owner := ""
		for block, host := range r.in.Owners {
			if block.Contains(a) {
				owner = host
				break
			}
		}
		if owner != ep.Node {
			r.route(netip.PrefixFrom(a, 32), ep.Node)
		}
	}
}

// Owns says whether the VXLAN manager routes dst; BGP must then leave it
// alone (VXLAN takes precedence over BGP-learned routes for its pools).
func (d Desired) Owns(dst netip.Prefix) bool {
	_, ok := d.Routes[dst.Masked()]
	return ok
}
