// Package wireguard encrypts container traffic between hosts as Calico
// does: a wireguard.cali device per node (the kernel's where it has the
// module, wireguard-go over TUN otherwise), the node's public key in its
// node record, one peer per other node whose allowed IPs are that node's
// blocks and borrowed addresses, and routes to those destinations through
// the device in a table of their own, looked up by an ip rule before the
// main table (where BGP and VXLAN keep distributing reachability).
package wireguard

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/calico-cnm/calico-cnm/datastore"
)

// Calico's WireGuard choices (FelixConfiguration defaults).
const (
	Device      = "wireguard.cali"
	DefaultPort = 51820
	// Overhead is what WireGuard adds to an IPv4 packet: outer IPv4 (20),
	// UDP (8), WireGuard header (16) and authentication tag (16).
	Overhead = 60
	// RulePriority is the ip rule that sends traffic to RouteTable before
	// the main table is consulted (Calico's wireguardRoutingRulePriority).
	RulePriority = 99
	// RouteTable holds this package's routes, and only them.
	RouteTable = 99
	// FirewallMark marks the device's own UDP packets, which the rule lets
	// pass to the main table (Calico's wireguard mark).
	FirewallMark = 0x100000
)

// Modes of the cluster setting (datastore.ClusterConfig.WireGuardMode).
const (
	// ModeRequired: traffic to a node without a valid key is dropped
	// (unreachable), never sent in clear.
	ModeRequired = "required"
	// ModePreferred: traffic to such a node takes the main table's clear
	// route (mixed clusters, rollout).
	ModePreferred = "preferred"
)

// ParseMode checks a mode; "" is ModeRequired.
func ParseMode(s string) (string, error) {
	switch s {
	case "", ModeRequired:
		return ModeRequired, nil
	case ModePreferred:
		return ModePreferred, nil
	}
	return "", fmt.Errorf("WireGuard mode %q: use %s or %s", s, ModeRequired, ModePreferred)
}

// RouteType says what a route in RouteTable does.
type RouteType string

// Route types.
const (
	// RouteTunnel: dst dev wireguard.cali (encrypted to the peer that has
	// dst in its allowed IPs).
	RouteTunnel RouteType = "tunnel"
	// RouteUnreachable: dst belongs to a node without a valid key in
	// required mode; the sender gets an ICMP error, nothing leaves.
	RouteUnreachable RouteType = "unreachable"
	// RouteThrow: dst is a local workload inside another node's block
	// (borrowed here), or, in preferred mode, belongs to a node without a
	// valid key; the lookup goes on in the main table.
	RouteThrow RouteType = "throw"
)

// Route is one route of RouteTable.
type Route struct {
	Dst  netip.Prefix
	Type RouteType
}

// Peer is one other node as the device knows it.
type Peer struct {
	Node       string
	PublicKey  wgtypes.Key
	Endpoint   netip.AddrPort
	AllowedIPs []netip.Prefix // sorted
}

// Input is what the desired state is computed from.
type Input struct {
	Self      string
	SelfKey   wgtypes.Key // this node's public key
	Mode      string
	Nodes     []datastore.Node
	Owners    map[netip.Prefix]string // block -> host
	Pools     []netip.Prefix          // every IP pool's CIDR
	Endpoints []datastore.Endpoint    // every node's, Node set
}

// Desired is the peers and routes this node should have.
type Desired struct {
	Peers  []Peer // by node name
	Routes map[netip.Prefix]Route
	// Unencrypted names the remote nodes that have no peer, and why: in
	// required mode their destinations are unreachable, in preferred mode
	// reached in clear.
	Unencrypted map[string]string
}

// Compute derives peers and routes. A remote node is a peer when its
// record has a parseable public key (not this node's, not another node's)
// and an address; its allowed IPs are its blocks (IPv4 and IPv6) and the
// addresses its workloads borrowed from other nodes' blocks.
func Compute(in Input) Desired {
	d := Desired{Routes: map[netip.Prefix]Route{}, Unencrypted: map[string]string{}}
	dsts := destinations(in)
	peers := map[string]*Peer{}
	for node, reason := range peerCandidates(in, peers) {
		d.Unencrypted[node] = reason
	}
	for node, list := range dsts {
		if node == in.Self {
			for _, dst := range list {
				d.Routes[dst] = Route{Dst: dst, Type: RouteThrow}
			}
			continue
		}
		p, ok := peers[node]
		if !ok {
			if _, known := d.Unencrypted[node]; !known {
				d.Unencrypted[node] = "no node record"
			}
			// Preferred: throw, so that a /32 this node borrowed from an
			// encrypted node's block is not caught by that block's tunnel
			// route (the owner's peer would not accept it).
			typ := RouteThrow
			if in.Mode != ModePreferred {
				typ = RouteUnreachable
			}
			for _, dst := range list {
				d.Routes[dst] = Route{Dst: dst, Type: typ}
			}
			continue
		}
		p.AllowedIPs = append(p.AllowedIPs, list...)
		for _, dst := range list {
			d.Routes[dst] = Route{Dst: dst, Type: RouteTunnel}
		}
	}
	if in.Mode != ModePreferred {
		closePools(in, d.Routes)
	}
	for _, p := range peers {
		slices.SortFunc(p.AllowedIPs, comparePrefix)
		d.Peers = append(d.Peers, *p)
	}
	slices.SortFunc(d.Peers, func(a, b Peer) int { return strings.Compare(a.Node, b.Node) })
	return d
}

// closePools makes, in required mode, every pool address that routes
// has no more specific route for unreachable, and throws this node's own
// blocks to the main table: a block another node has just claimed, which
// BGP may route before this node's datastore watch has told the manager,
// is dropped until its tunnel route is in, never sent in clear.
func closePools(in Input, routes map[netip.Prefix]Route) {
	for _, pool := range in.Pools {
		pool = pool.Masked()
		if _, ok := routes[pool]; !ok {
			routes[pool] = Route{Dst: pool, Type: RouteUnreachable}
		}
	}
	for block, owner := range in.Owners {
		if owner == in.Self {
			routes[block.Masked()] = Route{Dst: block.Masked(), Type: RouteThrow}
		}
	}
}

// peerCandidates fills peers with the remote nodes that can be peers and
// returns the others with the reason they cannot.
func peerCandidates(in Input, peers map[string]*Peer) map[string]string {
	bad := map[string]string{}
	byKey := map[wgtypes.Key][]string{}
	for _, n := range in.Nodes {
		if n.Name == in.Self || n.Name == "" {
			continue
		}
		if n.WireGuardPublicKey == "" {
			bad[n.Name] = "publishes no WireGuard key"
			continue
		}
		key, err := wgtypes.ParseKey(n.WireGuardPublicKey)
		if err != nil {
			bad[n.Name] = "publishes an invalid WireGuard key"
			continue
		}
		if key == in.SelfKey {
			bad[n.Name] = "publishes this node's own WireGuard key"
			continue
		}
		addr, err := netip.ParseAddr(n.WireGuardAddr)
		if err != nil || !addr.Is4() {
			bad[n.Name] = "publishes no WireGuard address"
			continue
		}
		port := n.WireGuardPort
		if port <= 0 || port > 65535 {
			port = DefaultPort
		}
		peers[n.Name] = &Peer{Node: n.Name, PublicKey: key, Endpoint: netip.AddrPortFrom(addr, uint16(port))}
		byKey[key] = append(byKey[key], n.Name)
	}
	// One key, one peer: a key two nodes publish belongs to neither.
	for _, names := range byKey {
		if len(names) < 2 {
			continue
		}
		slices.Sort(names)
		for _, name := range names {
			delete(peers, name)
			bad[name] = "shares its WireGuard key with " + strings.Join(slices.DeleteFunc(slices.Clone(names), func(s string) bool { return s == name }), ", ")
		}
	}
	return bad
}

// destinations maps each node to the destinations its workloads live
// in: its blocks and, more specific, the addresses its workloads borrowed
// from a block of another node (or of none). This node's entry holds only
// such borrowed addresses (throw routes: they are local, and must not
// fall under a pool's unreachable route). IPv6 is among
// them: the tunnel between IPv4 node addresses carries both families, and
// BGP routes IPv6 blocks between the hosts as it does IPv4 ones, so
// leaving them out would send IPv6 in clear in required mode.
func destinations(in Input) map[string][]netip.Prefix {
	out := map[string][]netip.Prefix{}
	for block, owner := range in.Owners {
		if owner == "" || owner == in.Self {
			continue
		}
		out[owner] = append(out[owner], block.Masked())
	}
	// A node's device address is routed like a workload's.
	eps := slices.Clone(in.Endpoints)
	for _, n := range in.Nodes {
		if n.WireGuardInterfaceAddr != "" {
			eps = append(eps, datastore.Endpoint{Node: n.Name, IPv4: n.WireGuardInterfaceAddr + "/32"})
		}
	}
	for _, ep := range eps {
		if ep.Node == "" {
			continue
		}
		for _, cidr := range []string{ep.IPv4, ep.IPv6} {
			p, err := netip.ParsePrefix(cidr)
			if err != nil {
				continue
			}
			a := p.Addr().Unmap()
			owner := ""
			for block, host := range in.Owners {
				if block.Contains(a) {
					owner = host
					break
				}
			}
			if owner == ep.Node {
				continue
			}
			out[ep.Node] = append(out[ep.Node], netip.PrefixFrom(a, a.BitLen()))
		}
	}
	return out
}

func comparePrefix(a, b netip.Prefix) int {
	if c := a.Addr().Compare(b.Addr()); c != 0 {
		return c
	}
	return a.Bits() - b.Bits()
}
