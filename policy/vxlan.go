package policy

import (
	"fmt"
	"strconv"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"golang.org/x/sys/unix"

	"github.com/calico-cnm/calico-cnm/ipam"
)

// MatchUDPDport: the packet is UDP to port Value (decimal). Numbered far
// from the other kinds so that new kinds elsewhere never collide with it.
const MatchUDPDport MatchKind = 100

// VXLANPort is the UDP port of VXLAN (routing.VXLANPort; policy does not
// import routing, so the value is repeated here and checked by a test).
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
	udp := Match{Kind: MatchUDPDport, Value: strconv.Itoa(VXLANPort)}
	return []Chain{{
		Name: ChainVXLAN,
		Base: &BaseChain{Type: "filter", Hook: "input", Priority: priorityFilter},
		Rules: []Rule{
			{Matches: []Match{udp, {Kind: MatchAddrSet, In: true, Value: setHosts}}, Verdict: Accept, Comment: "VXLAN from a cluster node"},
			{Matches: []Match{udp}, Verdict: Drop, Comment: "VXLAN from a non-node address"},
		},
	}}
}

func renderExtraMatch(m Match) string {
	if m.Kind == MatchUDPDport {
		return "udp dport " + m.Value
	}
	return fmt.Sprintf("<unknown match %d>", m.Kind)
}

func encodeExtraMatch(m Match) ([]expr.Any, error) {
	if m.Kind != MatchUDPDport {
		return nil, fmt.Errorf("unsupported match kind %d", m.Kind)
	}
	port, err := strconv.ParseUint(m.Value, 10, 16)
	if err != nil {
		return nil, fmt.Errorf("UDP port %q: %w", m.Value, err)
	}
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_UDP}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(uint16(port))},
	}, nil
}

// decodeExtraMatch recognises what encodeExtraMatch writes at the start of
// ex, returning the match and how many expressions it took.
func decodeExtraMatch(ex []expr.Any) (Match, int, bool) {
	if len(ex) < 4 {
		return Match{}, 0, false
	}
	meta, ok1 := ex[0].(*expr.Meta)
	proto, ok2 := ex[1].(*expr.Cmp)
	pl, ok3 := ex[2].(*expr.Payload)
	port, ok4 := ex[3].(*expr.Cmp)
	if !ok1 || !ok2 || !ok3 || !ok4 || meta.Key != expr.MetaKeyL4PROTO ||
		proto.Op != expr.CmpOpEq || len(proto.Data) != 1 || proto.Data[0] != unix.IPPROTO_UDP ||
		pl.Base != expr.PayloadBaseTransportHeader || pl.Offset != 2 || pl.Len != 2 ||
		port.Op != expr.CmpOpEq || len(port.Data) != 2 {
		return Match{}, 0, false
	}
	return Match{Kind: MatchUDPDport, Value: strconv.Itoa(int(binaryutil.BigEndian.Uint16(port.Data)))}, 4, true
}

// RuleCounters reads the packet counters of a chain of the project's table,
// by rule comment: what the VXLAN filter dropped, for example.
func (n *NFT) RuleCounters(f Family, chain string) (map[string]uint64, error) {
	c, err := n.conn(0)
	if err != nil {
		return nil, err
	}
	rules, err := c.GetRules(ourTable(f), &nftables.Chain{Name: chain, Table: ourTable(f)})
	if err != nil {
		return nil, fmt.Errorf("reading chain %s: %w", chain, err)
	}
	out := map[string]uint64{}
	for _, r := range rules {
		comment, _ := userdata.GetString(r.UserData, userdata.TypeComment)
		for _, e := range r.Exprs {
			if ctr, ok := e.(*expr.Counter); ok {
				out[comment] += ctr.Packets
			}
		}
	}
	return out, nil
}
