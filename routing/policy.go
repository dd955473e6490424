package routing

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"

	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/internal/nlconv"
)

// PeerType says why a session exists; `node status` shows it.
type PeerType string

// Peer types.
const (
	PeerMesh      PeerType = "mesh"      // node-to-node mesh
	PeerReflector PeerType = "reflector" // we are a client of this route reflector
	PeerRRClient  PeerType = "rr-client" // we reflect, this node is our client
	PeerGlobal    PeerType = "global"    // explicit peer for every node
	PeerNode      PeerType = "node"      // explicit peer for this node only
)

// internal: sessions with other calico-cnm nodes (as opposed to routers).
func (t PeerType) internal() bool {
	return t == PeerMesh || t == PeerReflector || t == PeerRRClient
}

// PeerSpec is one session the speaker should have.
type PeerSpec struct {
	Address  netip.Addr
	ASN      uint32
	Type     PeerType
	Name     string // node name or BGP peer record name
	Password string // TCP MD5; never logged
	// PasswordSecret names the file (in Config.SecretsDir) that Password is
	// read from, when the peer record refers to one.
	PasswordSecret string
	// RRClient: we are a reflector and this peer is our client.
	RRClient  bool
	ClusterID string
	// Passive: wait for the peer to connect. Between two calico-cnm nodes
	// only the one with the higher address dials: when both dial, gobgp's
	// FSMs can stay in lockstep after a restart, each closing the other's
	// connection while in its 5 s idle hold, and never establish.
	Passive bool
	// LocalOnly: send this peer only the routes we originate.
	LocalOnly bool
	// Restarting sets the Restart State bit (and forwarding-preserved) in
	// our OPEN, so the peer keeps our stale routes until our End-of-RIB
	// instead of dropping them on the new OPEN (RFC 4724). The agent sets
	// it for sessions added while it is syncing after a start.
	Restarting bool
}

// Equal compares everything that needs the session re-created when it
// changes (Restarting only matters when the session is added).
func (p PeerSpec) Equal(o PeerSpec) bool {
	p.Restarting, o.Restarting = false, false
	return p == o
}

// String omits the password.
func (p PeerSpec) String() string {
	return fmt.Sprintf("%s(%s as%d %s)", p.Name, p.Address, p.ASN, p.Type)
}

// Self is this node as the policy needs it.
type Self struct {
	Name    string
	Address netip.Addr
	// Address6 is the next hop of our IPv6 prefixes (invalid: no IPv6).
	Address6       netip.Addr
	ASN            uint32
	RouteReflector bool
	ClusterID      string
}

// EffectiveASN is a node's own ASN, else the cluster default.
func EffectiveASN(n datastore.Node, cfg datastore.BGPConfig) uint32 {
	if n.ASN != 0 {
		return n.ASN
	}
	if cfg.ASN != 0 {
		return cfg.ASN
	}
	return DefaultASN
}

// DesiredPeers computes the sessions of self, Calico style:
//   - mesh on: every other node with an address;
//   - mesh off: a reflector peers with every other node (other reflectors as
//     plain iBGP peers, the rest as its clients); a non-reflector peers with
//     the reflectors only;
//   - explicit peers: global ones on every node, node ones on that node.
//
// A node never peers with its own address, and one address gets one session:
// an explicit peer record wins over a node-derived session.
func DesiredPeers(self Self, nodes []datastore.Node, peers []datastore.BGPPeer, cfg datastore.BGPConfig) []PeerSpec {
	byAddr := map[netip.Addr]PeerSpec{}
	for _, p := range peers {
		if p.Node != "" && p.Node != self.Name {
			continue
		}
		a, err := netip.ParseAddr(p.PeerIP)
		if err != nil || !a.Is4() || a == self.Address || p.ASN == 0 {
			continue
		}
		t := PeerGlobal
		if p.Node != "" {
			t = PeerNode
		}
		// A node-specific record beats a global one for the same address.
		if old, ok := byAddr[a]; ok && old.Type == PeerNode {
			continue
		}
		byAddr[a] = PeerSpec{Address: a, ASN: p.ASN, Type: t, Name: p.Name, Password: p.Password, PasswordSecret: p.PasswordSecret}
	}
	mesh := cfg.MeshEnabled()
	for _, n := range nodes {
		if n.Name == self.Name {
			continue
		}
		a, err := netip.ParseAddr(n.IPv4)
		if err != nil || !a.Is4() || a == self.Address {
			continue
		}
		if _, explicit := byAddr[a]; explicit {
			continue
		}
		spec := PeerSpec{Address: a, ASN: EffectiveASN(n, cfg), Name: n.Name, Passive: self.Address.Less(a)}
		switch {
		case mesh:
			spec.Type = PeerMesh
		case self.RouteReflector && n.RouteReflector:
			// Reflectors exchange only their own routes: every client
			// peers with every reflector anyway, and gobgp, when the new
			// best path may not be reflected to a peer, sends neither it
			// nor a withdrawal, so two reflectors passing client routes to
			// each other can keep a withdrawn route alive between them.
			spec.Type, spec.LocalOnly = PeerReflector, true
		case self.RouteReflector:
			spec.Type, spec.RRClient, spec.ClusterID = PeerRRClient, true, self.ClusterID
		case n.RouteReflector:
			spec.Type = PeerReflector
		default:
			continue
		}
		byAddr[a] = spec
	}
	out := make([]PeerSpec, 0, len(byAddr))
	for _, p := range byAddr {
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b PeerSpec) int { return a.Address.Compare(b.Address) })
	return out
}

// DesiredExports is what this host originates: every block it owns and a
// host route (/32, /128) for each local workload address outside those
// blocks (an address borrowed from another host's block: the owner
// advertises the block, so the host route must win by being more
// specific). IPv6 prefixes only when ipv6: they need this node's IPv6 next
// hop.
func DesiredExports(blocks []netip.Prefix, workloadIPs []netip.Addr, ipv6 bool) []netip.Prefix {
	set := map[netip.Prefix]bool{}
	var own []netip.Prefix
	for _, b := range blocks {
		if b.Addr().Is4() || ipv6 {
			b = b.Masked()
			set[b] = true
			own = append(own, b)
		}
	}
	for _, ip := range workloadIPs {
		ip = ip.Unmap()
		if ip.Is6() && !ipv6 {
			continue
		}
		inBlock := false
		for _, b := range own {
			if b.Contains(ip) {
				inBlock = true
				break
			}
		}
		if !inBlock {
			set[netip.PrefixFrom(ip, ip.BitLen())] = true
		}
	}
	out := make([]netip.Prefix, 0, len(set))
	for p := range set {
		out = append(out, p)
	}
	slices.SortFunc(out, nlconv.ComparePrefix)
	return out
}

// LearnedPath is one path in the speaker's RIB that came from a peer.
type LearnedPath struct {
	Prefix    netip.Prefix
	NextHop   netip.Addr
	Peer      netip.Addr // the neighbor it was received from
	ASPath    []uint32
	LocalPref uint32 // 0 = not set (treated as 100)
	Stale     bool   // kept by graceful restart while the peer restarts
}

// ImportPolicy decides which learned paths reach the kernel.
type ImportPolicy struct {
	Self  Self
	Pools []netip.Prefix
	// Nodes maps every node's BGP address, and its IPv6 next hop, to its
	// name.
	Nodes map[netip.Addr]string
	// NodeIPv6 maps a node's name to its IPv6 next hop.
	NodeIPv6 map[string]netip.Addr
	// Peers are the current sessions, by address.
	Peers map[netip.Addr]PeerSpec
	// Exports are our own prefixes: a path for one of them is ignored (our
	// blackhole or workload routes serve it).
	Exports map[netip.Prefix]bool
}

// Reject reasons, counted in `node status`.
const (
	RejectNotInPool    = "prefix outside the IP pools"
	RejectOwnPrefix    = "prefix originated by this node"
	RejectUnknownPeer  = "from an unknown peer"
	RejectBadNextHop   = "next hop is not the peer's node address"
	RejectSelfNextHop  = "next hop is this node"
	RejectASLoop       = "AS path contains this node's AS"
	RejectFamily       = "next hop of another address family"
	RejectNoIPv6       = "IPv6 prefix, and this node routes no IPv6"
	RejectInvalidRoute = "invalid prefix or next hop"
)

// Decide returns "" to accept path, else the reason to reject it.
//
// The next-hop rule keeps a peer from steering our traffic anywhere: a mesh
// peer may only announce itself; a path via a route reflector (which keeps
// the originator's next hop) must point at a known node; an explicit peer
// (a router) may point at itself or at a node.
func (pol ImportPolicy) Decide(p LearnedPath) string {
	if !p.Prefix.IsValid() || !p.NextHop.IsValid() {
		return RejectInvalidRoute
	}
	v6 := p.Prefix.Addr().Is6()
	if v6 != p.NextHop.Is6() {
		return RejectFamily
	}
	if v6 && !pol.Self.Address6.IsValid() {
		return RejectNoIPv6
	}
	if !inPools(p.Prefix, pol.Pools) {
		return RejectNotInPool
	}
	if pol.Exports[p.Prefix.Masked()] {
		return RejectOwnPrefix
	}
	peer, ok := pol.Peers[p.Peer]
	if !ok {
		return RejectUnknownPeer
	}
	if p.NextHop == pol.Self.Address || (pol.Self.Address6.IsValid() && p.NextHop == pol.Self.Address6) {
		return RejectSelfNextHop
	}
	if !peer.Type.internal() && slices.Contains(p.ASPath, pol.Self.ASN) {
		return RejectASLoop
	}
	_, isNode := pol.Nodes[p.NextHop]
	// The peer's own next hop: its session address, or for IPv6 the IPv6
	// next hop its node record gives (a router has none: its IPv6 paths
	// must point at a node).
	own := peer.Address
	if v6 {
		own = pol.NodeIPv6[pol.Nodes[peer.Address]]
	}
	switch peer.Type {
	case PeerMesh:
		if !own.IsValid() || p.NextHop != own {
			return RejectBadNextHop
		}
	case PeerReflector, PeerRRClient:
		if !isNode {
			return RejectBadNextHop
		}
	default:
		if (!own.IsValid() || p.NextHop != own) && !isNode {
			return RejectBadNextHop
		}
	}
	return ""
}

func inPools(p netip.Prefix, pools []netip.Prefix) bool {
	for _, pool := range pools {
		if pool.Bits() <= p.Bits() && pool.Contains(p.Addr()) {
			return true
		}
	}
	return false
}

// PeerCounts are per-session prefix counters.
type PeerCounts struct {
	Received int `json:"received"`
	Accepted int `json:"accepted"`
}

// Selection is the result of running the import policy over the RIB.
type Selection struct {
	// Routes: prefix -> next hops (sorted; more than one = ECMP).
	Routes   map[netip.Prefix][]netip.Addr
	PerPeer  map[netip.Addr]PeerCounts
	Rejected map[string]int // reason -> paths
}

// Select applies the policy to every learned path and picks, per prefix, the
// next hops of the best accepted paths: highest local preference, then
// shortest AS path; all paths that tie there are used together (ECMP), one
// next hop once.
func Select(paths []LearnedPath, pol ImportPolicy) Selection {
	sel := Selection{
		Routes:   map[netip.Prefix][]netip.Addr{},
		PerPeer:  map[netip.Addr]PeerCounts{},
		Rejected: map[string]int{},
	}
	best := map[netip.Prefix][]LearnedPath{}
	for _, p := range paths {
		c := sel.PerPeer[p.Peer]
		c.Received++
		if why := pol.Decide(p); why != "" {
			sel.Rejected[why]++
			sel.PerPeer[p.Peer] = c
			continue
		}
		c.Accepted++
		sel.PerPeer[p.Peer] = c
		pfx := p.Prefix.Masked()
		cur := best[pfx]
		if len(cur) == 0 {
			best[pfx] = []LearnedPath{p}
			continue
		}
		switch comparePreference(p, cur[0]) {
		case 1:
			best[pfx] = []LearnedPath{p}
		case 0:
			best[pfx] = append(cur, p)
		}
	}
	for pfx, ps := range best {
		var hops []netip.Addr
		for _, p := range ps {
			if !slices.Contains(hops, p.NextHop) {
				hops = append(hops, p.NextHop)
			}
		}
		slices.SortFunc(hops, netip.Addr.Compare)
		sel.Routes[pfx] = hops
	}
	return sel
}

// comparePreference: 1 if a is preferred to b, -1 if b is, 0 on a tie.
func comparePreference(a, b LearnedPath) int {
	lp := func(p LearnedPath) uint32 {
		if p.LocalPref == 0 {
			return 100
		}
		return p.LocalPref
	}
	if c := cmp.Compare(lp(a), lp(b)); c != 0 {
		return c
	}
	return cmp.Compare(len(b.ASPath), len(a.ASPath))
}
