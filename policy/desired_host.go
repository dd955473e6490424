package policy

import (
	"fmt"
	"github.com/calico-cnm/calico-cnm/nft"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/calico-cnm/calico-cnm/policy/api"
	"github.com/calico-cnm/calico-cnm/wireguard"
)

// Host endpoints (api.HostEndpoint) put the host's own interfaces under
// policy, as Calico does. Only this host's endpoints that name an
// interface get rules; while there is none the tables have no host
// chains at all. Per interface (a named one, or "*": every interface but
// the containers' cali* and lo, unless another endpoint names it):
//
//   - prerouting (before DNAT): the pre-DNAT policies selecting the
//     endpoint, for new connections arriving on it. A Deny drops; an
//     Allow marks the packet (markPreDNAT), which skips the normal host
//     endpoint policies below (the containers' own policies still
//     apply); no match goes on (pre-DNAT policy has no default deny).
//   - input (to the host's own processes): the normal policies (not
//     pre-DNAT) selecting it for ingress; none, or none allowing: drop.
//   - output (from the host's own processes): the same for egress. The
//     host's traffic to its own containers is never filtered here, as in
//     Calico.
//   - forward: the normal policies with applyOnForward selecting it, for
//     traffic forwarded in through it (ingress) or out through it
//     (egress): allowed, the packet goes on to the containers' own rules;
//     no policy for the direction: allowed; policies but none allowing:
//     drop.
//
// Failsafe ports (State.Failsafe) are accepted before any of it, so that a
// policy cannot cut a host off its cluster; replies of allowed
// connections pass (conntrack). The cluster's own data plane is accepted
// there too, whatever the failsafe lists say (as Felix does): VXLAN to and
// from the cluster's nodes, and this node's WireGuard port while its node
// record publishes a key. A failsafe list is the user's to shorten; the
// tunnels that carry every container's traffic between hosts are not; nor
// is IPv6 neighbor discovery, without which no IPv6 packet flows.

// markPreDNAT is set on a packet a pre-DNAT policy allowed.
const markPreDNAT uint32 = 0x00040000

// Chain and set names of the host endpoint program.
const (
	chainHostPre     = "host-prerouting"
	chainHostInput   = "host-input"
	chainHostOutput  = "host-output"
	setHostIfaces    = "host-ifaces" // interfaces named by a host endpoint
	hostDispatchPref = "hep-"        // per endpoint and kind: its policies
	loopbackIf       = "lo"

	// priorityMangle is nftables' "mangle" priority: before dstnat (-100),
	// so pre-DNAT policy sees the published port, not the container's.
	priorityMangle int32 = -150
)

// FailsafePort is a port that host endpoint policy never closes.
type FailsafePort struct {
	Proto uint8 // unix.IPPROTO_TCP or unix.IPPROTO_UDP
	Port  uint16
}

func (p FailsafePort) String() string {
	proto := "tcp"
	if p.Proto == unix.IPPROTO_UDP {
		proto = "udp"
	}
	return proto + ":" + strconv.Itoa(int(p.Port))
}

// Failsafe ports are the ports host endpoint policy leaves open, by
// direction.
type Failsafe struct {
	Inbound, Outbound []FailsafePort
}

// DefaultFailsafe is Calico's: SSH, DHCP, BGP, etcd, Typha, the Kubernetes
// API and etcd's older ports inbound, DNS, DHCP and the same services
// outbound; plus VXLAN both ways (the project's overlay).
func DefaultFailsafe() Failsafe {
	f := Failsafe{}
	f.Inbound, _ = ParseFailsafePorts("tcp:22,udp:68,tcp:179,tcp:2379,tcp:2380,tcp:5473,tcp:6443,tcp:6666,tcp:6667,udp:4789")
	f.Outbound, _ = ParseFailsafePorts("udp:53,udp:67,tcp:179,tcp:2379,tcp:2380,tcp:5473,tcp:6443,tcp:6666,tcp:6667,udp:4789")
	return f
}

// ParseFailsafePorts reads "tcp:22,udp:68,..." (a bare number is TCP);
// "" and "none" are no ports.
func ParseFailsafePorts(s string) ([]FailsafePort, error) {
	s = strings.TrimSpace(s)
	if s == "" || s == "none" {
		return nil, nil
	}
	var out []FailsafePort
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		proto, port, found := strings.Cut(item, ":")
		if !found {
			proto, port = "tcp", item
		}
		p := FailsafePort{Proto: unix.IPPROTO_TCP}
		switch strings.ToLower(proto) {
		case "tcp":
		case "udp":
			p.Proto = unix.IPPROTO_UDP
		default:
			return nil, fmt.Errorf("failsafe port %q: the protocol is tcp or udp", item)
		}
		n, err := strconv.Atoi(port)
		if err != nil || n < 1 || n > 65535 {
			return nil, fmt.Errorf("failsafe port %q: the port is 1-65535", item)
		}
		p.Port = uint16(n)
		out = append(out, p)
	}
	return out, nil
}

// hostKind is one place host endpoint policy applies.
type hostKind struct {
	name    string // in chain names and comments
	dir     api.PolicyType
	in      bool // the endpoint is the input interface
	applies func(p compiledPolicy) bool
	// noPolicyDrop: with no selecting policy, drop (input and output);
	// otherwise such traffic goes on.
	noPolicyDrop bool
	// allowed is the verdict for what a policy allowed (Return: on to
	// the containers' rules); undecided is for what no policy allowed.
	allowed, undecided VerdictKind
	// skipPreDNAT: packets a pre-DNAT policy allowed skip these policies.
	skipPreDNAT bool
}

func normal(p compiledPolicy) bool    { return !p.Spec.PreDNAT }
func onForward(p compiledPolicy) bool { return !p.Spec.PreDNAT && p.Spec.ApplyOnForward }

var hostKinds = struct{ preDNAT, in, out, fwdIn, fwdOut hostKind }{
	preDNAT: hostKind{name: "prednat", dir: api.Ingress, in: true, applies: func(p compiledPolicy) bool { return p.Spec.PreDNAT }, allowed: Accept, undecided: Return},
	in:      hostKind{name: "in", dir: api.Ingress, in: true, applies: normal, noPolicyDrop: true, allowed: Accept, undecided: Drop},
	out:     hostKind{name: "out", dir: api.Egress, applies: normal, noPolicyDrop: true, allowed: Accept, undecided: Drop},
	fwdIn:   hostKind{name: "fwd-in", dir: api.Ingress, in: true, applies: onForward, allowed: Return, undecided: Drop, skipPreDNAT: true},
	fwdOut:  hostKind{name: "fwd-out", dir: api.Egress, applies: onForward, allowed: Return, undecided: Drop},
}

// localHostEndpoints are this host's endpoints that name an interface,
// named interfaces first (they take precedence over "*"), at most one "*"
// and one endpoint per interface (the first by name).
func localHostEndpoints(st State) ([]api.HostEndpoint, []string) {
	var out []api.HostEndpoint
	var warnings []string
	seen := map[string]string{}
	heps := slices.Clone(st.HostEndpoints)
	slices.SortFunc(heps, func(a, b api.HostEndpoint) int {
		if (a.Spec.InterfaceName == api.AllInterfaces) != (b.Spec.InterfaceName == api.AllInterfaces) {
			if a.Spec.InterfaceName == api.AllInterfaces {
				return 1
			}
			return -1
		}
		return strings.Compare(a.Metadata.Name, b.Metadata.Name)
	})
	for _, h := range heps {
		ifc := h.Spec.InterfaceName
		if h.Spec.Node != st.Node {
			continue
		}
		if ifc == "" {
			// Calico would find the interface holding an expected IP;
			// here such an endpoint only lends its addresses to rule
			// selectors, and says so.
			warnings = append(warnings, fmt.Sprintf("host endpoint %s names no interfaceName: no traffic of this host is under its policy (its expectedIPs only match rule selectors)", h.Metadata.Name))
			continue
		}
		if prev, dup := seen[ifc]; dup {
			warnings = append(warnings, fmt.Sprintf("host endpoint %s: interface %s is host endpoint %s's already; ignored", h.Metadata.Name, ifc, prev))
			continue
		}
		if strings.HasPrefix(ifc, workloadIfPrefix) || ifc == loopbackIf {
			warnings = append(warnings, fmt.Sprintf("host endpoint %s: interface %s is a container's or the loopback; ignored", h.Metadata.Name, ifc))
			continue
		}
		seen[ifc] = h.Metadata.Name
		out = append(out, h)
	}
	return out, warnings
}

// hostChains adds the host endpoint program to t (see above) and the
// forward rules to forward.
func (pt *policyTable) hostChains(t *Table, forward *Chain, heps []api.HostEndpoint, fs Failsafe, cl clusterTraffic) {
	if len(heps) == 0 {
		return
	}
	clIn, clOut := cl.rules(pt.f)
	var named []string
	for _, h := range heps {
		if h.Spec.InterfaceName != api.AllInterfaces {
			named = append(named, h.Spec.InterfaceName)
		}
	}
	t.Sets = append(t.Sets, Set{Name: setHostIfaces, Type: SetIfname, Elements: nft.SortedUnique(named), Comment: "interfaces named by host endpoints"})
	established := Rule{Matches: []Match{{Kind: MatchCtEstablished}}, Verdict: Accept, Comment: "replies of allowed connections"}
	fromWorkload := Rule{Matches: []Match{{Kind: MatchIfname, In: true, Value: workloadIfPrefix, Prefix: true}}, Verdict: Accept, Comment: "from containers: their own policy"}
	pre := Chain{Name: chainHostPre, Base: &BaseChain{Type: "filter", Hook: "prerouting", Priority: priorityMangle},
		Rules: append(append([]Rule{established, fromWorkload}, clIn...), failsafeRules(fs.Inbound, false)...)}
	in := Chain{Name: chainHostInput, Base: &BaseChain{Type: "filter", Hook: "input", Priority: priorityFilter},
		Rules: []Rule{established, fromWorkload,
			{Matches: []Match{{Kind: MatchIfname, In: true, Value: loopbackIf}}, Verdict: Accept, Comment: "the host to itself"},
			{Matches: []Match{{Kind: MatchMark, Mark: markPreDNAT}}, Verdict: Accept, Comment: "allowed by a pre-DNAT policy"}}}
	in.Rules = append(append(in.Rules, clIn...), failsafeRules(fs.Inbound, false)...)
	out := Chain{Name: chainHostOutput, Base: &BaseChain{Type: "filter", Hook: "output", Priority: priorityFilter},
		Rules: []Rule{established,
			{Matches: []Match{{Kind: MatchIfname, Value: workloadIfPrefix, Prefix: true}}, Verdict: Accept, Comment: "the host to its containers (not filtered, as in Calico)"},
			{Matches: []Match{{Kind: MatchIfname, Value: loopbackIf}}, Verdict: Accept, Comment: "the host to itself"}}}
	out.Rules = append(append(out.Rules, clOut...), failsafeRules(fs.Outbound, true)...)
	for _, h := range heps {
		pre.Rules = append(pre.Rules, pt.hostRules(h, hostKinds.preDNAT)...)
		in.Rules = append(in.Rules, pt.hostRules(h, hostKinds.in)...)
		out.Rules = append(out.Rules, pt.hostRules(h, hostKinds.out)...)
		forward.Rules = append(forward.Rules, pt.hostRules(h, hostKinds.fwdIn)...)
		forward.Rules = append(forward.Rules, pt.hostRules(h, hostKinds.fwdOut)...)
	}
	t.Chains = append(t.Chains, pre, in, out)
}

// clusterTraffic is what the cluster's own tunnels need of this host.
type clusterTraffic struct {
	// wireGuardPort is this node's WireGuard listen port; 0 while its
	// node record publishes no key.
	wireGuardPort uint16
}

// clusterOf reads this node's WireGuard port from its node record (0 in
// the record is the device's default port).
func clusterOf(st State) clusterTraffic {
	for _, n := range st.Nodes {
		if n.Name != st.Node || n.WireGuardPublicKey == "" {
			continue
		}
		port := n.WireGuardPort
		if port <= 0 || port > 65535 {
			port = wireguard.DefaultPort
		}
		return clusterTraffic{wireGuardPort: uint16(port)}
	}
	return clusterTraffic{}
}

// ndpTypes are ICMPv6 router solicitation and advertisement, neighbor
// solicitation and advertisement: without them the host's neighbors
// cannot be resolved, and no IPv6 packet (failsafe or allowed) flows.
var ndpTypes = []uint8{133, 134, 135, 136}

// rules accept the tunnels' packets: VXLAN from (inbound) and to
// (outbound) the cluster's nodes, WireGuard to this node's port and from
// it (the device sends from its listen port); in the ip6 table, neighbor
// discovery both ways.
func (cl clusterTraffic) rules(f Family) (in, out []Rule) {
	udp := Match{Kind: MatchL4Proto, Proto: unix.IPPROTO_UDP}
	vxlan := Match{Kind: MatchPort, Min: VXLANPort, Max: VXLANPort}
	in = []Rule{{Matches: []Match{udp, vxlan, {Kind: MatchAddrSet, In: true, Value: setHosts}}, Verdict: Accept, Comment: "cluster: VXLAN from a node"}}
	out = []Rule{{Matches: []Match{udp, vxlan, {Kind: MatchAddrSet, Value: setHosts}}, Verdict: Accept, Comment: "cluster: VXLAN to a node"}}
	if p := cl.wireGuardPort; p != 0 {
		in = append(in, Rule{Matches: []Match{udp, {Kind: MatchPort, Min: p, Max: p}}, Verdict: Accept, Comment: "cluster: WireGuard to this node"})
		out = append(out, Rule{Matches: []Match{udp, {Kind: MatchPort, In: true, Min: p, Max: p}}, Verdict: Accept, Comment: "cluster: WireGuard from this node"})
	}
	if f == IPv6 {
		for _, typ := range ndpTypes {
			r := Rule{Matches: []Match{{Kind: MatchL4Proto, Proto: unix.IPPROTO_ICMPV6}, {Kind: MatchICMPType, Proto: typ}},
				Verdict: Accept, Comment: "IPv6 neighbor discovery, type " + strconv.Itoa(int(typ))}
			in, out = append(in, r), append(out, r)
		}
	}
	return in, out
}

// failsafeRules accept the failsafe ports: inbound by destination port,
// outbound (the host as client) by destination port too.
func failsafeRules(ports []FailsafePort, outbound bool) []Rule {
	what := "failsafe inbound "
	if outbound {
		what = "failsafe outbound "
	}
	var rs []Rule
	for _, p := range ports {
		rs = append(rs, Rule{Matches: []Match{{Kind: MatchL4Proto, Proto: p.Proto}, {Kind: MatchPort, Min: p.Port, Max: p.Port}},
			Verdict: Accept, Comment: what + p.String()})
	}
	return rs
}

// hostMatches match the endpoint's interface in the direction of k.
func hostMatches(h api.HostEndpoint, k hostKind) []Match {
	if h.Spec.InterfaceName != api.AllInterfaces {
		return []Match{{Kind: MatchIfname, In: k.in, Value: h.Spec.InterfaceName}}
	}
	return []Match{
		{Kind: MatchIfname, In: k.in, Value: workloadIfPrefix, Prefix: true, Negate: true},
		{Kind: MatchIfname, In: k.in, Value: loopbackIf, Negate: true},
		{Kind: MatchIfnameSet, In: k.in, Value: setHostIfaces, Negate: true},
	}
}

// hostRules are the rules of one endpoint in the base chain of k: a jump
// to the chain of its selecting policies, or for input and output with
// no policy, a drop (Calico's default deny for host endpoints).
func (pt *policyTable) hostRules(h api.HostEndpoint, k hostKind) []Rule {
	var idx []int
	for i, p := range pt.plan.policies {
		if k.applies(p) && p.AppliesTo(k.dir) && p.sel.Evaluate(h.Metadata.Labels) {
			idx = append(idx, i)
		}
	}
	ms := hostMatches(h, k)
	what := fmt.Sprintf("host endpoint %s %s", h.Metadata.Name, k.name)
	if len(idx) == 0 {
		if !k.noPolicyDrop {
			return nil
		}
		return []Rule{{Matches: ms, Verdict: Drop, Comment: what + ": no policy (default deny)"}}
	}
	if k.skipPreDNAT {
		ms = append(ms, Match{Kind: MatchMark, Mark: markPreDNAT, Negate: true})
	}
	name := hostDispatchPref + hashName(h.Metadata.Name+"|"+k.name)
	c := Chain{Name: name, Rules: []Rule{{ClearMark: markBits, Verdict: Continue, Comment: nft.ClipComment(what)}}}
	for n, i := range idx {
		p := pt.plan.policies[i]
		r := Rule{Verdict: Jump, Target: pt.policyChain(p, k.dir), Comment: "policy " + p.Metadata.Name}
		if n > 0 {
			r.Matches = []Match{{Kind: MatchMark, Mark: markBits, Negate: true}}
		}
		c.Rules = append(c.Rules, r)
	}
	allowed := Rule{Matches: []Match{{Kind: MatchMark, Mark: markAccept}}, ClearMark: markBits, Verdict: k.allowed, Comment: "allowed by a policy"}
	if k.allowed == Accept && k.dir == api.Ingress && !k.noPolicyDrop {
		allowed.SetMark = markPreDNAT // skips the normal policies
	}
	undecided := Rule{Verdict: k.undecided, Comment: "no policy allowed it (default deny)"}
	if k.undecided == Return {
		undecided.ClearMark, undecided.Comment = markBits, "no pre-DNAT policy decided: go on"
		c.Rules = append(c.Rules, allowed, Rule{Matches: []Match{{Kind: MatchMark, Mark: markDeny}}, Verdict: Drop, Comment: "denied by a pre-DNAT policy"})
	} else {
		c.Rules = append(c.Rules, allowed)
	}
	c.Rules = append(c.Rules, undecided)
	pt.chains[name] = c
	return []Rule{{Matches: ms, Verdict: Jump, Target: name, Comment: what + ": policies"}}
}
