package ports

import (
	"fmt"
	"net/netip"

	"golang.org/x/sys/unix"

	"github.com/calico-cnm/calico-cnm/dataplane"
	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/nft"
)

// TableName is the name of this package's tables (one per family). The
// policy's tables ("calico-cnm") are another package's; nothing else is
// touched.
const TableName = "calico-cnm-ports"

// Chains of the tables.
const (
	chainPrerouting  = "prerouting"  // nat, dstnat: traffic arriving for a local address
	chainOutput      = "output"      // nat, dstnat: the host's own traffic (127.0.0.1 too)
	chainPublished   = "published"   // one DNAT rule per binding
	chainPostrouting = "postrouting" // nat, srcnat: masquerade where replies need it
	chainRaw         = "raw"         // filter before conntrack: guard for route_localnet
	chainInternal    = "internal"    // filter, forward: --internal networks reach only the pools
)

// How the host reaches its own published ports, and why the kernel alone
// does it. Docker's bridge DNATs published ports in iptables and, by
// default, leaves 127.0.0.1 (and hairpin on its bridge) to docker-proxy, a
// userland copy loop per binding; with --userland-proxy=false it does
// both in the kernel: route_localnet on the bridge so that a packet from
// 127.0.0.1 may leave through it, and masquerade for sources of the host
// and of the container itself (moby drivers/bridge: setupLoopbackAddressesRouting,
// port_mapping.go). Here each container has its own routed veth, so the
// kernel way needs no bridge hairpin at all: a container reaching another
// one's published port through the host's address crosses the host's
// stack both ways and conntrack undoes the DNAT on the reply. Only two
// cases need masquerade: sources in 127.0.0.0/8 (the container could not
// answer them) and a container reaching its own published port (it would
// drop a packet from its own address). So: no proxy process, the
// container sees the real client address from other hosts, and the
// throughput is the kernel's. route_localnet is set only on the veths of
// endpoints with published ports, and the raw chain drops what it would
// otherwise open: packets from a container to 127.0.0.0/8 (the host's
// loopback services), as kube-proxy does since CVE-2020-8558. IPv6 has no
// route_localnet: [::1] is not forwarded (publish on the host's addresses).

// entry is one active binding with the endpoint's addresses.
type entry struct {
	b        datastore.PortBinding
	endpoint string
	v4, v6   netip.Addr
}

func family(v6 bool) nft.Family {
	if v6 {
		return nft.IPv6
	}
	return nft.IPv4
}

func protoNum(p string) uint8 {
	if p == UDP {
		return unix.IPPROTO_UDP
	}
	return unix.IPPROTO_TCP
}

// addrMatch compares the source or destination address with one address.
func addrMatch(src bool, a netip.Addr) nft.Match {
	return nft.Match{Kind: nft.MatchAddr, In: src, Value: netip.PrefixFrom(a, a.BitLen()).String()}
}

// l4Match is the protocol and its destination port.
func l4Match(proto string, dport int) []nft.Match {
	return []nft.Match{{Kind: nft.MatchL4Proto, Proto: protoNum(proto)}, {Kind: nft.MatchPort, Min: uint16(dport), Max: uint16(dport)}}
}

// workloadIf matches the input (in) or output interface: a workload's
// veth, by prefix like iptables' cali+.
func workloadIf(in bool) nft.Match {
	return nft.Match{Kind: nft.MatchIfname, In: in, Value: dataplane.HostIfPrefix, Prefix: true}
}

// loopback is 127.0.0.0/8, matched as the source (src) or destination.
func loopback(src bool) nft.Match {
	return nft.Match{Kind: nft.MatchAddr, In: src, Value: "127.0.0.0/8"}
}

// baseChains are the table's chains, with the hooks of the base ones.
func baseChains() map[string]*nft.BaseChain {
	return map[string]*nft.BaseChain{
		chainRaw:         {Type: "filter", Hook: "prerouting", Priority: -300},
		chainPrerouting:  {Type: "nat", Hook: "prerouting", Priority: -100}, // dstnat
		chainOutput:      {Type: "nat", Hook: "output", Priority: -100},     // dstnat
		chainPostrouting: {Type: "nat", Hook: "postrouting", Priority: 100}, // srcnat
		chainInternal:    {Type: "filter", Hook: "forward", Priority: 0},
		chainPublished:   nil,
	}
}

// desiredTable is one family's table for the bindings and the internal
// networks. Rules whose order cannot matter (each binding's, each matching
// its own port) are unordered, so that a binding added or removed changes
// only its own rules.
func desiredTable(v6 bool, entries []entry, in internalState) nft.Table {
	chains := map[string]*nft.Chain{}
	for name, base := range baseChains() {
		chains[name] = &nft.Chain{Name: name, Base: base}
	}
	fibLocal := nft.Match{Kind: nft.MatchFibLocal}
	jump := func(comment string) nft.Rule {
		return nft.Rule{Matches: []nft.Match{fibLocal}, Verdict: nft.Jump, Target: chainPublished, Comment: comment}
	}
	chains[chainPrerouting].Rules = []nft.Rule{jump("to a local address: published ports")}
	chains[chainOutput].Rules = []nft.Rule{jump("from the host to a local address: published ports")}
	if !v6 {
		chains[chainPostrouting].Rules = []nft.Rule{{Matches: []nft.Match{{Kind: nft.MatchCtDNAT}, workloadIf(false), loopback(true)},
			Verdict: nft.Masquerade, Comment: "published port reached from 127.0.0.0/8: masquerade"}}
		chains[chainRaw].Rules = []nft.Rule{{Matches: []nft.Match{workloadIf(true), loopback(false)},
			Verdict: nft.Drop, Comment: "from a workload to 127.0.0.0/8 (route_localnet guard)"}}
	}
	// Two bindings can make the same masquerade rule: keep one.
	seen := map[string]bool{}
	for _, e := range entries {
		cip := e.v4
		if v6 {
			cip = e.v6
		}
		if !cip.IsValid() {
			continue
		}
		var matches []nft.Match
		if e.b.HostIP != "" {
			h, err := netip.ParseAddr(e.b.HostIP)
			if err != nil || h.Is4() == v6 {
				continue // the other family's binding
			}
			if !h.IsUnspecified() {
				matches = append(matches, addrMatch(false, h))
			}
		}
		pub := &chains[chainPublished].Unordered
		*pub = append(*pub, nft.Rule{Matches: append(matches, l4Match(e.b.Proto, e.b.HostPort)...), Verdict: nft.DNAT, NATAddr: cip, NATPort: uint16(e.b.Port),
			Comment: fmt.Sprintf("%s -> %s:%d endpoint %s", String(e.b), cip, e.b.Port, dataplane.ShortID(e.endpoint))})
		comment := fmt.Sprintf("container to its own %s port %d: masquerade", e.b.Proto, e.b.Port)
		if seen[comment] {
			continue
		}
		seen[comment] = true
		post := &chains[chainPostrouting].Unordered
		*post = append(*post, nft.Rule{Matches: append([]nft.Match{addrMatch(true, cip), addrMatch(false, cip)}, l4Match(e.b.Proto, e.b.Port)...),
			Verdict: nft.Masquerade, Comment: comment})
	}
	chains[chainInternal].Rules = internalRules(v6, in)
	t := nft.Table{Family: family(v6)}
	for _, c := range chains {
		t.Chains = append(t.Chains, *c)
	}
	return t
}

// internalRules keep the containers of --internal networks inside the
// pools, whatever routes they have (Join gives them no default route; one
// with NET_ADMIN could add its own): per such interface an accept per pool
// of the family (an accept ends only this chain: the policy still filters)
// and a drop for anything else.
func internalRules(v6 bool, in internalState) []nft.Rule {
	var rs []nft.Rule
	for _, ifc := range in.ifaces {
		name := nft.Match{Kind: nft.MatchIfname, In: true, Value: ifc}
		for _, p := range in.pools {
			if p.Addr().Is4() == v6 {
				continue
			}
			rs = append(rs, nft.Rule{Matches: []nft.Match{name, {Kind: nft.MatchAddr, Value: p.Masked().String()}}, Verdict: nft.Accept,
				Comment: fmt.Sprintf("internal network: %s to pool %s", ifc, p)})
		}
		rs = append(rs, nft.Rule{Matches: []nft.Match{name}, Verdict: nft.Drop, Comment: fmt.Sprintf("internal network: %s outside the pools", ifc)})
	}
	return rs
}

// desired is the tables of the families served (ip6 with ipv6).
func desired(ipv6 bool, entries []entry, in internalState) nft.Ruleset {
	rs := nft.Ruleset{Tables: []nft.Table{desiredTable(false, entries, in)}}
	if ipv6 {
		rs.Tables = append(rs.Tables, desiredTable(true, entries, in))
	}
	return rs
}
