package policy

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/calico-cnm/calico-cnm/dataplane"
	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/ipam"
	"github.com/calico-cnm/calico-cnm/nft"
	"github.com/calico-cnm/calico-cnm/policy/api"
)

// Network options (docker network create -o KEY=VALUE), recorded by the
// driver in the network record's Options.
const (
	// OptIsolation "on" (default) or "off". On: the network's containers
	// exchange traffic only with containers of the same (logical) network,
	// their own host and destinations outside the pools. Off: with any
	// container whose network is also off.
	OptIsolation = "calico.isolation"
	// OptIngress says who outside the pools may open connections to the
	// network's containers: "cluster" (default: the cluster's hosts, i.e.
	// the IPv4 addresses of the node records), "host" (nobody but the
	// container's own host, which is never filtered) or "any".
	OptIngress = "calico.ingress"
	// OptNetwork names the logical network the Docker network belongs to
	// across hosts; default: the Docker network's name. See the package
	// documentation.
	OptNetwork = "calico.network"
)

// Ingress values.
const (
	IngressCluster = "cluster"
	IngressHost    = "host"
	IngressAny     = "any"
)

// Names of the fixed sets and chains.
const (
	setPools     = "pools"
	setNATPools  = "nat-pools"
	setHosts     = "hosts"
	setVTEPs     = "vteps"
	setWorkloads = "workloads"
	chainForward = "forward"
	chainNAT     = "postrouting"

	netSetPrefix     = "net-"
	ifSetPrefix      = "ifs-"
	ingressPrefix    = "in-"
	egressPrefix     = "out-"
	workloadIfPrefix = dataplane.HostIfPrefix
)

// Base chain priorities: nftables' "filter" and "srcnat".
const (
	priorityFilter int32 = 0
	prioritySrcNAT int32 = 100
)

// State is what the policy is computed from: the datastore's records as the
// syncer last saw them, and this host's node name.
type State struct {
	Node      string
	Pools     []ipam.Pool
	Networks  []datastore.Network
	Endpoints []datastore.Endpoint
	Nodes     []datastore.Node
	// Policies are the valid GlobalNetworkPolicy records.
	Policies []api.GlobalNetworkPolicy
	// HostEndpoints are the valid HostEndpoint records (every host's: rule
	// selectors match their expectedIPs); NetworkSets the valid
	// GlobalNetworkSet records.
	HostEndpoints []api.HostEndpoint
	NetworkSets   []api.GlobalNetworkSet
	// Failsafe are the ports host endpoint policy leaves open.
	Failsafe Failsafe
	// IPv6 includes the ip6 table; false where the kernel has no IPv6.
	IPv6 bool
}

// NetworkPolicy is a network's parsed options.
type NetworkPolicy struct {
	Isolated bool
	Ingress  string
}

// ParseOptions reads a network's policy options; unknown keys are not ours
// and are ignored. An invalid value is an error naming the option.
func ParseOptions(opts map[string]string) (NetworkPolicy, error) {
	p := NetworkPolicy{Isolated: true, Ingress: IngressCluster}
	if v, ok := opts[OptIsolation]; ok {
		switch strings.ToLower(strings.TrimSpace(v)) {
		case "on", "true", "yes", "1", "":
			p.Isolated = true
		case "off", "false", "no", "0":
			p.Isolated = false
		default:
			return NetworkPolicy{Isolated: true, Ingress: IngressCluster}, fmt.Errorf("network option %s=%q: use on or off", OptIsolation, v)
		}
	}
	if v, ok := opts[OptIngress]; ok {
		switch s := strings.ToLower(strings.TrimSpace(v)); s {
		case IngressCluster, IngressHost, IngressAny:
			p.Ingress = s
		case "":
		default:
			return NetworkPolicy{Isolated: true, Ingress: IngressCluster}, fmt.Errorf("network option %s=%q: use cluster, host or any", OptIngress, v)
		}
	}
	if v, ok := opts[OptNetwork]; ok {
		if err := validLogicalName(v); err != nil {
			return NetworkPolicy{Isolated: true, Ingress: IngressCluster}, err
		}
	}
	return p, nil
}

// ValidateOptions checks the policy options of a network; the driver can
// call it at CreateNetwork to refuse a typo instead of applying the default.
func ValidateOptions(opts map[string]string) error {
	_, err := ParseOptions(opts)
	return err
}

func validLogicalName(v string) error {
	if strings.TrimSpace(v) == "" || len(v) > 255 {
		return fmt.Errorf("network option %s=%q: give a network name of 1 to 255 characters", OptNetwork, v)
	}
	return nil
}

// NetworkKey is the identity of the logical network a Docker network
// belongs to, the same on every host: "name:" + the calico.network option,
// else "name:" + the Docker network's name (Network.Name, recorded once it
// is known), else "id:" + the Docker network id, which only this host's
// network has.
func NetworkKey(n datastore.Network) string {
	if v := strings.TrimSpace(n.Options[OptNetwork]); v != "" {
		return "name:" + v
	}
	if n.Name != "" {
		return "name:" + n.Name
	}
	return "id:" + n.ID
}

// hashName is a short stable name part: nftables names are limited (32
// bytes on older kernels) and Docker network names may hold anything.
func hashName(s string) string {
	hashMu.Lock()
	defer hashMu.Unlock()
	if h, ok := hashMemo[s]; ok {
		return h
	}
	sum := sha256.Sum256([]byte(s))
	h := hex.EncodeToString(sum[:6])
	if len(hashMemo) >= maxHashMemo {
		clear(hashMemo)
	}
	hashMemo[s] = h
	return h
}

// hashMemo remembers hashName's answers: Desired names the chains and
// sets of every local endpoint's network at every change, which would
// hash the same few names thousands of times.
var (
	hashMu   sync.Mutex
	hashMemo = map[string]string{}
)

const maxHashMemo = 4096

// NetworkSetName is the address set of a logical network.
func NetworkSetName(key string) string { return netSetPrefix + hashName(key) }

// JumpSetName is the set of the workload interfaces whose traffic in a
// direction (from them: egress; to them: ingress) goes to the chain
// target: the forward chain jumps once per set, so that a Join adds an
// element to a set instead of a rule to the forward chain (adding a jump
// makes the kernel validate every jump of the table).
func JumpSetName(dir api.PolicyType, target string) string {
	return ifSetPrefix + hashName(string(dir)+"|"+target)
}

// IngressChainName is the chain checking traffic to the containers of a
// Docker network (by its id); EgressChainName the one checking theirs.
func IngressChainName(networkID string) string { return ingressPrefix + hashName(networkID) }

// EgressChainName: see IngressChainName.
func EgressChainName(networkID string) string { return egressPrefix + hashName(networkID) }

// validIfname accepts what the driver names workload interfaces: cali +
// up to 11 characters of [0-9a-zA-Z].
func validIfname(s string) bool {
	if !strings.HasPrefix(s, workloadIfPrefix) || len(s) >= nft.IfnameLen || len(s) <= len(workloadIfPrefix) {
		return false
	}
	for _, c := range s {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z') {
			return false
		}
	}
	return true
}

// localEndpoint is a joined endpoint of this host with what its rules need.
type localEndpoint struct {
	// ep is the record, not a copy: the Calculator's own copy or the
	// State's (a host's thousand locals would otherwise copy them all).
	ep      *datastore.Endpoint
	network datastore.Network // a stand-in with only ID when the record is missing
	policy  NetworkPolicy
	key     string
	// labels is labelsKey of ep.Labels: the policy plan groups the
	// endpoints by it at every change, and a kept localEndpoint (calc.go)
	// need not compute it again.
	labels string
}

// Desired computes the tables from the datastore state. It is pure: the
// same state gives the same ruleset. Problems with single records (a bad
// option value, an unparsable address) do not stop the rest; they are
// returned as warnings, and the record gets the safe default (isolated).
func Desired(st State) (Ruleset, []string) {
	networks := networksByID(st.Networks)
	members, locals, warnings := splitEndpoints(st, networks)
	rs, more := desiredFrom(st, locals, func(key string, f Family) []string { return nft.AddrElements(members[key][f]) }, nil, nil)
	return rs, append(warnings, more...)
}

// networksByID indexes the network records.
func networksByID(ns []datastore.Network) map[string]datastore.Network {
	networks := make(map[string]datastore.Network, len(ns))
	for _, n := range ns {
		networks[n.ID] = n
	}
	return networks
}

// desiredFrom is Desired once the endpoint records are read: locals are
// this host's endpoints that get rules (sorted by interface name),
// memberElems gives a logical network's member set elements and memo
// (nil: none) keeps rules and the policy plan from one computation to the
// next. Only the
// policy plan reads st.Endpoints, for the joined ones' addresses that rule
// selectors pick; index (nil: none), the incremental calculation's
// (calc.go), answers the selectors instead, and the calculation hands it
// no endpoints.
func desiredFrom(st State, locals []localEndpoint, memberElems func(key string, f Family) []string, memo *passMemo, index *selectorIndex) (Ruleset, []string) {
	pools, natPools, warnings := poolPrefixes(st.Pools)
	hosts, hostWarnings := hostAddrs(st.Nodes)
	warnings = append(warnings, hostWarnings...)
	vteps, vtepWarnings := vtepAddrs(st.Nodes)
	warnings = append(warnings, vtepWarnings...)

	var pm *planMemo
	if memo != nil {
		pm = &memo.plan
	}
	plan, pw := planPolicies(st, locals, pm)
	plan.index = index
	warnings = append(warnings, pw...)
	heps, hw := localHostEndpoints(st)
	warnings = append(warnings, hw...)
	families := []Family{IPv4}
	if st.IPv6 {
		families = append(families, IPv6)
	}
	var rs Ruleset
	for _, f := range families {
		part := memo.partFor(f, plan, locals)
		t := desiredTable(f, locals, part, memo.chainMemo(f, plan), memberElems, pools[f], natPools[f], hosts[f], vteps[f], plan, heps, st.Failsafe, clusterOf(st))
		rs.Tables = append(rs.Tables, t)
	}
	memo.changesTaken()
	rs.Tables[0].Chains = append(rs.Tables[0].Chains, vxlanChains(st.Pools)...) // IPv4 only, as VXLAN
	return rs, warnings
}

// splitEndpoints reads the endpoint records: the members of each logical
// network, cluster-wide, by family, and this host's joined endpoints that
// get rules, sorted by interface name.
func splitEndpoints(st State, networks map[string]datastore.Network) (map[string]map[Family][]netip.Addr, []localEndpoint, []string) {
	var warnings []string
	members := map[string]map[Family][]netip.Addr{}
	var locals []localEndpoint
	seenIf := map[string]bool{}
	keys := map[string]string{} // network id -> its key, once per network
	for i := range st.Endpoints {
		ep := &st.Endpoints[i]
		key, done := keys[ep.Network]
		if !done {
			key = "id:" + ep.Network
			if n, ok := networks[ep.Network]; ok {
				key = NetworkKey(n)
			}
			keys[ep.Network] = key
		}
		if members[key] == nil {
			members[key] = map[Family][]netip.Addr{}
		}
		warnings = append(warnings, addMemberAddrs(members[key], *ep)...)
		if ep.Node != st.Node || !ep.Joined {
			continue
		}
		l, ok, warning := newLocalEndpoint(ep, key, networks, seenIf)
		if warning != "" {
			warnings = append(warnings, warning)
		}
		if ok {
			locals = append(locals, l)
		}
	}
	// Sorted by interface name; the records are large, so sort their
	// indexes and copy each once.
	order := make([]int, len(locals))
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(i, j int) bool { return locals[order[i]].ep.HostIfName < locals[order[j]].ep.HostIfName })
	sorted := make([]localEndpoint, len(locals))
	for i, k := range order {
		sorted[i] = locals[k]
	}
	return members, sorted, warnings
}

// addMemberAddrs adds the endpoint's addresses to its network's members.
func addMemberAddrs(members map[Family][]netip.Addr, ep datastore.Endpoint) []string {
	var warnings []string
	if a, ok := datastore.ParseEndpointAddr(ep.IPv4); ok && a.Is4() {
		members[IPv4] = append(members[IPv4], a)
	} else if ep.IPv4 != "" {
		warnings = append(warnings, fmt.Sprintf("endpoint %s: ignoring invalid IPv4 address %q", dataplane.ShortID(ep.ID), ep.IPv4))
	}
	if a, ok := datastore.ParseEndpointAddr(ep.IPv6); ok && a.Is6() {
		members[IPv6] = append(members[IPv6], a)
	} else if ep.IPv6 != "" {
		warnings = append(warnings, fmt.Sprintf("endpoint %s: ignoring invalid IPv6 address %q", dataplane.ShortID(ep.ID), ep.IPv6))
	}
	return warnings
}

// newLocalEndpoint prepares a joined endpoint of this host; ok is false
// when it gets no rules (its interface name is not a workload's, or
// seenIf shows another endpoint claimed it first). warning is "" or says
// why it gets no rules or the network's default policy.
func newLocalEndpoint(ep *datastore.Endpoint, key string, networks map[string]datastore.Network, seenIf map[string]bool) (l localEndpoint, ok bool, warning string) {
	if !validIfname(ep.HostIfName) {
		return localEndpoint{}, false, fmt.Sprintf("endpoint %s: host interface name %q is not a workload interface name; no rules for it", dataplane.ShortID(ep.ID), ep.HostIfName)
	}
	if seenIf[ep.HostIfName] {
		return localEndpoint{}, false, fmt.Sprintf("endpoint %s: interface %s is claimed by another endpoint record too; using the first", dataplane.ShortID(ep.ID), ep.HostIfName)
	}
	seenIf[ep.HostIfName] = true
	n, known := networks[ep.Network]
	if !known {
		n = datastore.Network{ID: ep.Network}
	}
	pol, err := ParseOptions(n.Options)
	if err != nil {
		warning = fmt.Sprintf("network %s: %v; applying the defaults (isolated, ingress from the cluster)", dataplane.ShortID(n.ID), err)
	}
	return localEndpoint{ep: ep, network: n, policy: pol, key: key, labels: labelsKey(ep.Labels)}, true, warning
}

// poolPrefixes are the pools' CIDRs by family: all of them, and those
// with natOutgoing.
func poolPrefixes(ps []ipam.Pool) (pools, natPools map[Family][]netip.Prefix, warnings []string) {
	pools, natPools = map[Family][]netip.Prefix{}, map[Family][]netip.Prefix{}
	for _, p := range ps {
		pfx, err := netip.ParsePrefix(p.CIDR)
		if err != nil {
			warnings = append(warnings, fmt.Sprintf("pool %q: invalid CIDR, ignored", p.CIDR))
			continue
		}
		f := nft.FamilyOf(pfx.Addr())
		// Disabled pools still hold addresses in use: they stay in both.
		pools[f] = append(pools[f], pfx)
		if p.NATOutgoing {
			natPools[f] = append(natPools[f], pfx)
		}
	}
	return pools, natPools, warnings
}

// hostAddrs are the cluster's hosts (the node records' IPv4 addresses).
func hostAddrs(nodes []datastore.Node) (map[Family][]netip.Addr, []string) {
	return nodeAddrs(nodes, "IPv4 address", func(n datastore.Node) string { return n.IPv4 })
}

// vtepAddrs are the nodes' VXLAN tunnel addresses: what a host sends
// through vxlan.calico leaves with its VTEP address as the source, which
// lies in a pool. They are a set of their own, apart from the hosts'
// underlay addresses that the vxlan-input filter trusts: a container may
// forge a pool address, so a VTEP address must never vouch for VXLAN.
// The nodes' WireGuard device addresses are in the set for the same
// reason: a host's own packets through wireguard.cali leave with that
// source.
func vtepAddrs(nodes []datastore.Node) (map[Family][]netip.Addr, []string) {
	out, warnings := nodeAddrs(nodes, "VXLAN tunnel address", func(n datastore.Node) string { return n.VXLANTunnelAddr })
	wg, wgWarnings := nodeAddrs(nodes, "WireGuard device address", func(n datastore.Node) string { return n.WireGuardInterfaceAddr })
	out[IPv4] = append(out[IPv4], wg[IPv4]...)
	return out, append(warnings, wgWarnings...)
}

// nodeAddrs are the IPv4 addresses field gives of the node records, with a
// warning for each invalid one (what names the field in it).
func nodeAddrs(nodes []datastore.Node, what string, field func(datastore.Node) string) (map[Family][]netip.Addr, []string) {
	var warnings []string
	out := map[Family][]netip.Addr{}
	for _, n := range nodes {
		v := field(n)
		if v == "" {
			continue
		}
		a, ok := datastore.ParseEndpointAddr(v)
		if !ok || !a.Is4() {
			warnings = append(warnings, fmt.Sprintf("node %s: ignoring invalid %s %q", n.Name, what, v))
			continue
		}
		out[IPv4] = append(out[IPv4], a)
	}
	return out, warnings
}

func desiredTable(f Family, locals []localEndpoint, part *localsPart, chains *chainMemo, memberElems func(key string, f Family) []string, pools, natPools []netip.Prefix, hosts, vteps []netip.Addr, plan policyPlan, heps []api.HostEndpoint, fs Failsafe, cl clusterTraffic) Table {
	pt := newPolicyTable(f, plan, chains)
	t := Table{Family: f, Sets: fixedSets(locals, pools, natPools, hosts, vteps), Chains: []Chain{natChain()}}
	forward := forwardChain()
	part.emit(pt, &t, &forward, memberElems, len(vteps) > 0)
	pt.hostChains(&t, &forward, heps, fs, cl)
	t.Chains = append(t.Chains, forward)
	pt.finish(&t)
	return t
}

// fixedSets are the sets every table has.
func fixedSets(locals []localEndpoint, pools, natPools []netip.Prefix, hosts, vteps []netip.Addr) []Set {
	ifnames := make([]string, len(locals))
	for i, l := range locals {
		ifnames[i] = l.ep.HostIfName
	}
	// The locals come sorted by interface name, each name once: sorting
	// again would cost a Join in proportion to the host's endpoints.
	if !strictlyIncreasing(ifnames) {
		ifnames = nft.SortedUnique(ifnames)
	}
	return []Set{
		{Name: setPools, Type: SetAddr, Interval: true, Elements: nft.IntervalElements(pools), Comment: "every calico pool"},
		{Name: setNATPools, Type: SetAddr, Interval: true, Elements: nft.IntervalElements(natPools), Comment: "pools with natOutgoing"},
		{Name: setHosts, Type: SetAddr, Elements: nft.AddrElements(hosts), Comment: "the cluster's hosts (node records)"},
		{Name: setVTEPs, Type: SetAddr, Elements: nft.AddrElements(vteps), Comment: "the cluster's hosts' VXLAN tunnel addresses"},
		{Name: setWorkloads, Type: SetIfname, Elements: ifnames, Comment: "this host's joined workload interfaces"},
	}
}

func strictlyIncreasing(s []string) bool {
	for i := 1; i < len(s); i++ {
		if s[i-1] >= s[i] {
			return false
		}
	}
	return true
}

// natChain masquerades what leaves a natOutgoing pool for outside the
// pools.
func natChain() Chain {
	return Chain{
		Name: chainNAT,
		Base: &BaseChain{Type: "nat", Hook: "postrouting", Priority: prioritySrcNAT},
		Rules: []Rule{{
			Matches: []Match{
				{Kind: MatchAddrSet, In: true, Value: setNATPools},
				{Kind: MatchAddrSet, Value: setPools, Negate: true},
			},
			Verdict: Masquerade,
			Comment: "natOutgoing: pool to outside the pools",
		}},
	}
}

// forwardChain is the filter base chain before the endpoints' jumps.
func forwardChain() Chain {
	return Chain{
		Name: chainForward,
		Base: &BaseChain{Type: "filter", Hook: "forward", Priority: priorityFilter},
		Rules: []Rule{
			{Matches: []Match{{Kind: MatchCtEstablished}}, Verdict: Accept, Comment: "replies of allowed connections"},
			// Fail closed: a workload interface whose endpoint this host
			// has not (yet) programmed gets no traffic rather than all.
			{Matches: []Match{{Kind: MatchIfname, In: true, Value: workloadIfPrefix, Prefix: true}, {Kind: MatchIfnameSet, In: true, Value: setWorkloads, Negate: true}},
				Verdict: Drop, Comment: "from a workload interface without rules"},
			{Matches: []Match{{Kind: MatchIfname, Value: workloadIfPrefix, Prefix: true}, {Kind: MatchIfnameSet, Value: setWorkloads, Negate: true}},
				Verdict: Drop, Comment: "to a workload interface without rules"},
		},
	}
}

// endpointJump is where a local endpoint's traffic in one direction
// goes from the forward chain: its network's chain or, when policies
// select it, their dispatch chain.
type endpointJump struct {
	dir    api.PolicyType
	target string
	via    jumpKind
}

type jumpKind int

const (
	viaNetwork    jumpKind = iota // the network's chain
	viaPolicies                   // the dispatch chain of the policies selecting it
	viaFailClosed                 // its labels are unknown while policies exist
)

// jumpGroups are the interfaces of the endpoints by jump, in the order
// the jumps were first seen (localsPart.emit).
type jumpGroups struct {
	groups []jumpGroup
}

type jumpGroup struct {
	endpointJump
	network string // the first endpoint's network, for viaNetwork's comment
	ifnames []string
}

// addTo adds each group's interface set to t and its jump to forward.
func (g *jumpGroups) addTo(f Family, t *Table, forward *Chain) {
	for _, j := range g.groups {
		set := JumpSetName(j.dir, j.target)
		what := "to"
		if j.dir == api.Egress {
			what = "from"
		}
		comment := what + " the endpoints of network " + j.network
		switch j.via {
		case viaPolicies:
			comment = what + " the endpoints policies select"
		case viaFailClosed:
			comment = what + " the endpoints whose labels are unknown: fail closed"
		}
		t.Sets = append(t.Sets, Set{Name: set, Type: SetIfname, Elements: j.ifnames, Comment: nft.ClipComment("interfaces whose traffic " + what + " them goes to " + j.target)})
		forward.Unordered = append(forward.Unordered, Rule{
			Matches: []Match{{Kind: MatchIfnameSet, In: j.dir == api.Egress, Value: set}},
			Verdict: Jump, Target: j.target, Comment: comment,
		}.WithText(f))
	}
}

// networkDisplayName is how comments name a network: its name, or its
// short id when it has none.
func networkDisplayName(n datastore.Network) string {
	if n.Name != "" {
		return n.Name
	}
	return dataplane.ShortID(n.ID)
}

// publishedPortRule opens a published port (docker run -p) to whoever
// reaches the host's port, whatever the network's isolation and ingress
// options say, as Docker's bridge does: only package ports DNATs to
// workloads. It lives in the network's chains, the endpoint's profile, so
// that a GlobalNetworkPolicy selecting the endpoint still decides, as
// Calico's policy applies after DNAT.
var publishedPortRule = Rule{Matches: []Match{{Kind: MatchCtDNAT}}, Verdict: Return, Comment: "published ports"}

// ingressChain checks traffic to a network's local containers: it drops
// what the network does not allow and returns otherwise, so that the
// sender's egress chain (for a local sender) is consulted too.
func ingressChain(name, netSet, network string, p NetworkPolicy, vxlan bool) Chain {
	c := Chain{Name: name, Rules: []Rule{publishedPortRule}}
	if vxlan && p.Ingress != IngressHost {
		// A host's connection through VXLAN comes from its VTEP address,
		// inside the pools: let it in before isolation drops the pools.
		c.Rules = append(c.Rules, Rule{Matches: []Match{{Kind: MatchAddrSet, In: true, Value: setVTEPs}}, Verdict: Return, Comment: "from the cluster's hosts over VXLAN"})
	}
	if p.Isolated {
		c.Rules = append(c.Rules,
			Rule{Matches: []Match{{Kind: MatchAddrSet, In: true, Value: netSet}}, Verdict: Return, Comment: "from network " + network},
			Rule{Matches: []Match{{Kind: MatchAddrSet, In: true, Value: setPools}}, Verdict: Drop, Comment: "from other calico networks"},
		)
	} else {
		c.Rules = append(c.Rules,
			Rule{Matches: []Match{{Kind: MatchAddrSet, In: true, Value: setPools}}, Verdict: Return, Comment: "from any calico network (isolation off)"},
		)
	}
	switch p.Ingress {
	case IngressAny:
		// Everything else is allowed: fall off the end (return).
	case IngressHost:
		c.Rules = append(c.Rules, Rule{Verdict: Drop, Comment: "from outside the pools (ingress host)"})
	default:
		c.Rules = append(c.Rules,
			Rule{Matches: []Match{{Kind: MatchAddrSet, In: true, Value: setHosts}}, Verdict: Return, Comment: "from the cluster's hosts"},
			Rule{Verdict: Drop, Comment: "from outside the pools (ingress cluster)"},
		)
	}
	return c
}

// egressChain checks traffic from an isolated network's local containers:
// to its own network and outside the pools it returns, to other calico
// networks it drops.
func egressChain(name, netSet, network string) Chain {
	return Chain{Name: name, Rules: []Rule{
		publishedPortRule,
		{Matches: []Match{{Kind: MatchAddrSet, Value: netSet}}, Verdict: Return, Comment: "to network " + network},
		{Matches: []Match{{Kind: MatchAddrSet, Value: setPools}}, Verdict: Drop, Comment: "to other calico networks"},
	}}
}

// sortedKeys is for deterministic iteration in callers and tests.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
