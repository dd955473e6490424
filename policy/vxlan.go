package policy

import (
	"golang.org/x/sys/unix"

	"github.com/calico-cnm/calico-cnm/ipam"
)

// VXLANPort is the UDP port of VXLAN (vxlan.Port; policy does not
// import vxlan, so the value is repeated here and checked by a test).
const VXLANPort = 4789

// ChainVXLAN filters encapsulated traffic arriving at this host.
const ChainVXLAN = "vxlan-input"

// vxlanChains is the input filter for VXLAN, present while a pool uses
// VXLAN: encapsulated packets are taken only from the cluster's nodes (the
// hosts set: the node records' addresses); any other sender could inject
// packets with arbitrary pool source addresses. Dropped packets are
// counted by the rule's counter (`nft list chain ip calico-cnm vxlan-input`).
func vxlanChains(pools []ipam.Pool) []Chain {
	needed := false
	for _, p := range pools {
		needed = needed || p.Encapsulates()
	}
	if !needed {
		return nil
	}
	// The policy's own UDP and port matches, so that the rule reads back
	// from the kernel as exactly what was written.
	udp, port := Match{Kind: MatchL4Proto, Proto: unix.IPPROTO_UDP}, Match{Kind: MatchPort, Min: VXLANPort, Max: VXLANPort}
	return []Chain{{
		Name: ChainVXLAN,
		Base: &BaseChain{Type: "filter", Hook: "input", Priority: priorityFilter},
		Rules: []Rule{
			{Matches: []Match{udp, port, {Kind: MatchAddrSet, In: true, Value: setHosts}}, Verdict: Accept, Comment: "VXLAN from a cluster node"},
			{Matches: []Match{udp, port}, Verdict: Drop, Comment: "VXLAN from a non-node address"},
		},
	}}
}
