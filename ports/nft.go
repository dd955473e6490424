package ports

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"sort"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"golang.org/x/sys/unix"

	"github.com/calico-cnm/calico-cnm/dataplane"
	"github.com/calico-cnm/calico-cnm/datastore"
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

type nftRule struct {
	chain string
	exprs []expr.Any
	id    string // canonical text, stored as the rule's comment: its identity
}

func family(v6 bool) nftables.TableFamily {
	if v6 {
		return nftables.TableFamilyIPv6
	}
	return nftables.TableFamilyIPv4
}

func protoNum(p string) byte {
	if p == UDP {
		return unix.IPPROTO_UDP
	}
	return unix.IPPROTO_TCP
}

func port16(p int) []byte { return binaryutil.BigEndian.PutUint16(uint16(p)) }

// addrMatch compares the source or destination address.
func addrMatch(v6, src bool, a netip.Addr) []expr.Any {
	off, l := uint32(16), uint32(4)
	if src {
		off = 12
	}
	if v6 {
		off, l = 24, 16
		if src {
			off = 8
		}
	}
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: l},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: a.AsSlice()},
	}
}

func l4Match(proto string, dport int) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{protoNum(proto)}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: port16(dport)},
	}
}

// ipsDstNAT is the kernel's IPS_DST_NAT conntrack status bit (`ct status dnat`).
const ipsDstNAT = 1 << 5

var ctDNATMask = binaryutil.NativeEndian.PutUint32(ipsDstNAT)

func ctDNAT() []expr.Any {
	return []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATUS},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: ctDNATMask, Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: make([]byte, 4)},
	}
}

func workloadIf(in bool) []expr.Any {
	key := expr.MetaKeyOIFNAME
	if in {
		key = expr.MetaKeyIIFNAME
	}
	return []expr.Any{
		&expr.Meta{Key: key, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte("cali")}, // prefix match, like iptables' cali+
	}
}

// fibLocal is `fib daddr type local`.
func fibLocal() []expr.Any {
	return []expr.Any{
		&expr.Fib{Register: 1, FlagDADDR: true, ResultADDRTYPE: true},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(unix.RTN_LOCAL)},
	}
}

// desiredRules are the rules of one family's table for the bindings.
func desiredRules(v6 bool, entries []entry) []nftRule {
	var rs []nftRule
	add := func(chain, id string, ex ...[]expr.Any) {
		var all []expr.Any
		for _, e := range ex {
			all = append(all, e...)
		}
		rs = append(rs, nftRule{chain: chain, exprs: all, id: id})
	}
	jump := []expr.Any{&expr.Counter{}, &expr.Verdict{Kind: expr.VerdictJump, Chain: chainPublished}}
	add(chainPrerouting, "to a local address: published ports", fibLocal(), jump)
	add(chainOutput, "from the host to a local address: published ports", fibLocal(), jump)
	masq := []expr.Any{&expr.Counter{}, &expr.Masq{}}
	if !v6 {
		loop := netip.MustParsePrefix("127.0.0.0/8")
		lo := []expr.Any{
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: []byte{255, 0, 0, 0}, Xor: make([]byte, 4)},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: loop.Addr().AsSlice()},
		}
		add(chainPostrouting, "published port reached from 127.0.0.0/8: masquerade", ctDNAT(), workloadIf(false), lo, masq)
		dstLo := []expr.Any{
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: []byte{255, 0, 0, 0}, Xor: make([]byte, 4)},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: loop.Addr().AsSlice()},
		}
		add(chainRaw, "from a workload to 127.0.0.0/8 (route_localnet guard)", workloadIf(true), dstLo, []expr.Any{&expr.Counter{}, &expr.Verdict{Kind: expr.VerdictDrop}})
	}
	for _, e := range entries {
		cip := e.v4
		if v6 {
			cip = e.v6
		}
		if !cip.IsValid() {
			continue
		}
		var hostMatch []expr.Any
		if e.b.HostIP != "" {
			h, err := netip.ParseAddr(e.b.HostIP)
			if err != nil || h.Is4() == v6 {
				continue // the other family's binding
			}
			if !h.IsUnspecified() {
				hostMatch = addrMatch(v6, false, h)
			}
		}
		regPort := uint32(2)
		nat := []expr.Any{
			&expr.Counter{},
			&expr.Immediate{Register: 1, Data: cip.AsSlice()},
			&expr.Immediate{Register: regPort, Data: port16(e.b.Port)},
			&expr.NAT{Type: expr.NATTypeDestNAT, Family: uint32(family(v6)), RegAddrMin: 1, RegProtoMin: regPort, Specified: true},
		}
		add(chainPublished, fmt.Sprintf("%s -> %s:%d endpoint %s", String(e.b), cip, e.b.Port, dataplane.ShortID(e.endpoint)), hostMatch, l4Match(e.b.Proto, e.b.HostPort), nat)
		add(chainPostrouting, fmt.Sprintf("container to its own %s port %d: masquerade", e.b.Proto, e.b.Port),
			addrMatch(v6, true, cip), addrMatch(v6, false, cip), l4Match(e.b.Proto, e.b.Port), masq)
	}
	// Two bindings can make the same masquerade rule: keep one.
	seen := map[string]bool{}
	out := rs[:0]
	for _, r := range rs {
		if k := r.chain + "|" + r.id; !seen[k] {
			seen[k] = true
			out = append(out, r)
		}
	}
	return out
}

// NFT programs the tables in one network namespace.
type NFT struct {
	ns *os.File // nil: the calling thread's
}

// NewNFT works on the namespace at nsPath ("" = the current one).
func NewNFT(nsPath string) (*NFT, error) {
	if nsPath == "" {
		return &NFT{}, nil
	}
	f, err := os.Open(nsPath)
	if err != nil {
		return nil, fmt.Errorf("opening network namespace %s: %w", nsPath, err)
	}
	return &NFT{ns: f}, nil
}

// Close releases the namespace.
func (n *NFT) Close() error {
	if n.ns != nil {
		return n.ns.Close()
	}
	return nil
}

func (n *NFT) conn() (*nftables.Conn, error) {
	var opts []nftables.ConnOption
	if n.ns != nil {
		opts = append(opts, nftables.WithNetNSFd(int(n.ns.Fd())))
	}
	return nftables.New(opts...)
}

type chainDef struct {
	name string
	typ  nftables.ChainType
	hook *nftables.ChainHook
	prio nftables.ChainPriority
}

var chainDefs = []chainDef{
	{chainRaw, nftables.ChainTypeFilter, nftables.ChainHookPrerouting, nftables.ChainPriority(-300)},
	{chainPrerouting, nftables.ChainTypeNAT, nftables.ChainHookPrerouting, *nftables.ChainPriorityNATDest},
	{chainOutput, nftables.ChainTypeNAT, nftables.ChainHookOutput, *nftables.ChainPriorityNATDest},
	{chainPostrouting, nftables.ChainTypeNAT, nftables.ChainHookPostrouting, *nftables.ChainPriorityNATSource},
	{chainInternal, nftables.ChainTypeFilter, nftables.ChainHookForward, *nftables.ChainPriorityFilter},
	{chainPublished, "", nil, 0},
}

// internalRules keep the containers of --internal networks inside the
// pools, whatever routes they have (Join gives them no default route; one
// with NET_ADMIN could add its own): per such interface an accept per pool
// of the family (an accept ends only this chain: the policy still filters)
// and a drop for anything else.
func internalRules(v6 bool, in internalState) []nftRule {
	var rs []nftRule
	for _, ifc := range in.ifaces {
		name := []expr.Any{
			&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: padIfname(ifc)},
		}
		for _, p := range in.pools {
			if p.Addr().Is4() == v6 {
				continue
			}
			off, l := uint32(16), uint32(4)
			if v6 {
				off, l = 24, 16
			}
			mask := net.CIDRMask(p.Bits(), int(l)*8)
			rs = append(rs, nftRule{chain: chainInternal, id: fmt.Sprintf("internal network: %s to pool %s", ifc, p), exprs: append(append([]expr.Any{}, name...),
				&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: l},
				&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: l, Mask: mask, Xor: make([]byte, l)},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: p.Addr().AsSlice()},
				&expr.Counter{}, &expr.Verdict{Kind: expr.VerdictAccept})})
		}
		rs = append(rs, nftRule{chain: chainInternal, id: fmt.Sprintf("internal network: %s outside the pools", ifc), exprs: append(append([]expr.Any{}, name...),
			&expr.Counter{}, &expr.Verdict{Kind: expr.VerdictDrop})})
	}
	return rs
}

func padIfname(s string) []byte {
	b := make([]byte, 16)
	copy(b, s)
	return b
}

// current reads the identities ("chain|comment") of the table's rules;
// exists false when there is no table.
func current(c *nftables.Conn, t *nftables.Table) (ids []string, exists bool, err error) {
	tables, err := c.ListTablesOfFamily(t.Family)
	if err != nil {
		return nil, false, fmt.Errorf("listing tables: %w", err)
	}
	if !slices.ContainsFunc(tables, func(x *nftables.Table) bool { return x.Name == t.Name }) {
		return nil, false, nil
	}
	chains, err := c.ListChainsOfTableFamily(t.Family)
	if err != nil {
		return nil, true, fmt.Errorf("listing chains: %w", err)
	}
	for _, ch := range chains {
		if ch.Table == nil || ch.Table.Name != t.Name {
			continue
		}
		ids = append(ids, "chain:"+ch.Name)
		rules, err := c.GetRules(t, ch)
		if err != nil {
			return nil, true, fmt.Errorf("listing rules of %s: %w", ch.Name, err)
		}
		for _, r := range rules {
			cm, _ := userdata.GetString(r.UserData, userdata.TypeComment)
			ids = append(ids, ch.Name+"|"+cm)
		}
	}
	sort.Strings(ids)
	return ids, true, nil
}

// Apply makes the family's table hold exactly the rules of entries. The
// kernel's rules are read back and compared by identity; when they differ
// the table is replaced in one batch (the old rules keep working until the
// new ones are in). It reports whether it changed anything.
func (n *NFT) Apply(ctx context.Context, v6 bool, entries []entry, in internalState) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	c, err := n.conn()
	if err != nil {
		return false, fmt.Errorf("opening nftables: %w", err)
	}
	t := &nftables.Table{Name: TableName, Family: family(v6)}
	want := append(desiredRules(v6, entries), internalRules(v6, in)...)
	var wantIDs []string
	for _, d := range chainDefs {
		wantIDs = append(wantIDs, "chain:"+d.name)
	}
	for _, r := range want {
		wantIDs = append(wantIDs, r.chain+"|"+r.id)
	}
	sort.Strings(wantIDs)
	have, exists, err := current(c, t)
	if err != nil {
		return false, err
	}
	if exists && slices.Equal(have, wantIDs) {
		return false, nil
	}
	if exists {
		c.DelTable(t)
	}
	c.AddTable(t)
	chains := map[string]*nftables.Chain{}
	for _, d := range chainDefs {
		ch := &nftables.Chain{Name: d.name, Table: t}
		if d.hook != nil {
			prio, policy := d.prio, nftables.ChainPolicyAccept
			ch.Type, ch.Hooknum, ch.Priority, ch.Policy = d.typ, d.hook, &prio, &policy
		}
		chains[d.name] = c.AddChain(ch)
	}
	for _, r := range want {
		c.AddRule(&nftables.Rule{Table: t, Chain: chains[r.chain], Exprs: r.exprs,
			UserData: userdata.AppendString(nil, userdata.TypeComment, r.id)})
	}
	if err := c.Flush(); err != nil {
		return false, fmt.Errorf("programming table %s (%d rules): %w", TableName, len(want), err)
	}
	return true, nil
}
