package policy

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"sync"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"github.com/mdlayher/netlink"
	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"
)

// NFT reads and writes the project's tables in one network namespace over
// netlink (no nft binary needed, which the plugin's scratch rootfs lacks).
// It only ever lists, creates, changes and deletes tables named TableName.
type NFT struct {
	nsFd int // 0: the calling thread's namespace
	ns   *os.File
	log  logrus.FieldLogger

	// mu serialises Apply and guards known.
	mu sync.Mutex
	// known is the project's tables as this NFT last read or programmed
	// them, handles included (nil: unknown, read the kernel). Apply diffs
	// against it instead of reading every rule back from the kernel at
	// each change, which costs time in proportion to the endpoints of the
	// host (Felix keeps its dataplane state the same way). Resync drops
	// it: the periodic resync, and any failure, compare with the kernel
	// again, which repairs what somebody else changed.
	known *Ruleset
}

// NewNFT works on the namespace at nsPath ("" = the current one, the
// daemon's host namespace).
func NewNFT(nsPath string, log logrus.FieldLogger) (*NFT, error) {
	if log == nil {
		log = logrus.StandardLogger()
	}
	n := &NFT{log: log}
	if nsPath != "" {
		f, err := os.Open(nsPath)
		if err != nil {
			return nil, fmt.Errorf("opening network namespace %s: %w", nsPath, err)
		}
		n.ns, n.nsFd = f, int(f.Fd())
	}
	return n, nil
}

// Close releases the namespace handle.
func (n *NFT) Close() error {
	if n.ns != nil {
		return n.ns.Close()
	}
	return nil
}

// batchBuffer bounds the socket buffers of a batch. A batch gets one
// acknowledgement per message, and the kernel queues all of them before we
// read any: with the default buffer (~200 KB, a few hundred acks) a large
// rewrite would fail with ENOBUFS after the kernel had committed it.
func batchBuffer(ops int) int {
	return max(4<<20, ops*4096)
}

func (n *NFT) conn(bufBytes int) (*nftables.Conn, error) {
	opts := []nftables.ConnOption{}
	if n.nsFd != 0 {
		opts = append(opts, nftables.WithNetNSFd(n.nsFd))
	}
	if bufBytes > 0 {
		opts = append(opts, nftables.WithSockOptions(func(c *netlink.Conn) error { return forceBuffers(c, bufBytes) }))
	}
	c, err := nftables.New(opts...)
	if err != nil {
		return nil, fmt.Errorf("opening nftables netlink: %w", err)
	}
	return c, nil
}

// forceBuffers sizes c's send and receive buffers (see batchBuffer).
func forceBuffers(c *netlink.Conn, bufBytes int) error {
	raw, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := raw.Control(func(fd uintptr) {
		// FORCE: as root (CAP_NET_ADMIN) beyond net.core.*mem_max.
		if e := unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, bufBytes); e != nil {
			serr = e
			return
		}
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, bufBytes)
	}); err != nil {
		return err
	}
	return serr
}

func tableFamily(f Family) nftables.TableFamily {
	if f == IPv6 {
		return nftables.TableFamilyIPv6
	}
	return nftables.TableFamilyIPv4
}

func ourTable(f Family) *nftables.Table {
	return &nftables.Table{Name: TableName, Family: tableFamily(f)}
}

// Dump reads the project's tables of the given families back into the
// model: what Diff compares against. Rules it cannot decode (somebody
// else's, added by hand) come back with an empty verdict, so they never
// equal a desired rule and get deleted.
func (n *NFT) Dump(ctx context.Context, families ...Family) (Ruleset, error) {
	var rs Ruleset
	if err := ctx.Err(); err != nil {
		return rs, err
	}
	// Large buffers: a set of thousands of networks comes back in many
	// messages, and a receive buffer that overflows loses some silently.
	c, err := n.conn(batchBuffer(0))
	if err != nil {
		return rs, err
	}
	for _, f := range families {
		tables, err := c.ListTablesOfFamily(tableFamily(f))
		if err != nil {
			return rs, fmt.Errorf("listing %s tables: %w", f, err)
		}
		found := slices.ContainsFunc(tables, func(t *nftables.Table) bool { return t.Name == TableName })
		if !found {
			continue
		}
		t, err := n.dumpTable(c, f)
		if err != nil {
			return rs, fmt.Errorf("reading table %s %s: %w", f, TableName, err)
		}
		rs.Tables = append(rs.Tables, t)
	}
	return rs, nil
}

func (n *NFT) dumpTable(c *nftables.Conn, f Family) (Table, error) {
	t := Table{Family: f}
	nt := ourTable(f)
	sets, err := c.GetSets(nt)
	if err != nil {
		return t, fmt.Errorf("listing sets: %w", err)
	}
	for _, s := range sets {
		elems, err := c.GetSetElements(s)
		if err != nil {
			return t, fmt.Errorf("listing elements of set %s: %w", s.Name, err)
		}
		t.Sets = append(t.Sets, decodeSet(f, s, elems))
	}
	chains, err := c.ListChainsOfTableFamily(tableFamily(f))
	if err != nil {
		return t, fmt.Errorf("listing chains: %w", err)
	}
	for _, ch := range chains {
		if ch.Table == nil || ch.Table.Name != TableName {
			continue
		}
		dc := Chain{Name: ch.Name}
		if ch.Hooknum != nil {
			b := &BaseChain{Type: string(ch.Type), Hook: hookName(*ch.Hooknum)}
			if ch.Priority != nil {
				b.Priority = int32(*ch.Priority)
			}
			if ch.Policy != nil && *ch.Policy != nftables.ChainPolicyAccept {
				b.Hook += " (policy not accept)" // never equal to ours: replaced
			}
			dc.Base = b
		}
		rules, err := c.GetRules(nt, ch)
		if err != nil {
			return t, fmt.Errorf("listing rules of chain %s: %w", ch.Name, err)
		}
		for _, r := range rules {
			dc.Rules = append(dc.Rules, decodeRule(f, r))
		}
		t.Chains = append(t.Chains, dc)
	}
	return t, nil
}

func hookName(h nftables.ChainHook) string {
	switch h {
	case *nftables.ChainHookForward:
		return "forward"
	case *nftables.ChainHookPostrouting:
		return "postrouting"
	case *nftables.ChainHookPrerouting:
		return "prerouting"
	case *nftables.ChainHookInput:
		return "input"
	case *nftables.ChainHookOutput:
		return "output"
	}
	return fmt.Sprintf("hook-%d", h)
}

func hookNum(name string) (*nftables.ChainHook, error) {
	switch name {
	case "forward":
		return nftables.ChainHookForward, nil
	case "postrouting":
		return nftables.ChainHookPostrouting, nil
	case "input":
		return nftables.ChainHookInput, nil
	case "prerouting":
		return nftables.ChainHookPrerouting, nil
	case "output":
		return nftables.ChainHookOutput, nil
	}
	return nil, fmt.Errorf("unsupported hook %q", name)
}

func decodeSet(f Family, s *nftables.Set, elems []nftables.SetElement) Set {
	out := Set{Name: s.Name, Interval: s.Interval}
	switch s.KeyType.Name {
	case nftables.TypeIPAddr.Name, nftables.TypeIP6Addr.Name:
		out.Type = SetAddr
	case nftables.TypeIFName.Name:
		out.Type = SetIfname
	default:
		out.Type = SetType("unsupported:" + s.KeyType.Name)
		return out
	}
	switch {
	case out.Type == SetIfname:
		var names []string
		for _, e := range elems {
			names = append(names, string(bytes.TrimRight(e.Key, "\x00")))
		}
		out.Elements = sortedUnique(names)
	case s.Interval:
		out.Elements = rangesElements(elementsToRanges(f, elems))
	default:
		var as []netip.Addr
		for _, e := range elems {
			if a, ok := netip.AddrFromSlice(e.Key); ok {
				as = append(as, a)
			}
		}
		out.Elements = addrElements(as)
	}
	return out
}

// elementsToRanges rebuilds ranges from interval elements: a start key
// opens a range, an interval-end key (one past its last address) closes it,
// a start without an end runs to the family's last address.
func elementsToRanges(f Family, elems []nftables.SetElement) []addrRange {
	type edge struct {
		a   netip.Addr
		end bool
	}
	var edges []edge
	for _, e := range elems {
		if a, ok := netip.AddrFromSlice(e.Key); ok {
			edges = append(edges, edge{a: a, end: e.IntervalEnd})
		}
	}
	slices.SortFunc(edges, func(x, y edge) int {
		if c := x.a.Compare(y.a); c != 0 {
			return c
		}
		// At the same key an end closes the previous range first.
		switch {
		case x.end && !y.end:
			return -1
		case !x.end && y.end:
			return 1
		}
		return 0
	})
	var out []addrRange
	var open *netip.Addr
	for _, e := range edges {
		if !e.end {
			if open == nil {
				a := e.a
				open = &a
			}
			continue
		}
		if open != nil {
			if last := e.a.Prev(); last.IsValid() && last.Compare(*open) >= 0 {
				out = append(out, addrRange{from: *open, to: last})
			}
			open = nil
		}
	}
	if open != nil {
		maxAddr := netip.AddrFrom4([4]byte{255, 255, 255, 255})
		if f == IPv6 {
			maxAddr = netip.AddrFrom16([16]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
		}
		out = append(out, addrRange{from: *open, to: maxAddr})
	}
	return mergeRanges(out)
}

// Address offsets in the network header.
func addrPayload(f Family, src bool) (offset, length uint32) {
	if f == IPv6 {
		if src {
			return 8, 16
		}
		return 24, 16
	}
	if src {
		return 12, 4
	}
	return 16, 4
}

func padIfname(s string) []byte {
	b := make([]byte, ifnameLen)
	copy(b, s)
	return b
}

var ctEstablishedMask = binaryutil.NativeEndian.PutUint32(expr.CtStateBitESTABLISHED | expr.CtStateBitRELATED)

// ctDNATMask is the kernel's IPS_DST_NAT conntrack status bit.
var ctDNATMask = binaryutil.NativeEndian.PutUint32(1 << 5)

// encodeRule turns a rule into nftables expressions; setIDs are the ids of
// sets created in the same batch (0 = an existing set, found by name).
func encodeRule(f Family, r Rule, setIDs map[string]uint32) ([]expr.Any, error) {
	var ex []expr.Any
	for _, m := range r.Matches {
		more, err := encodeMatch(f, m, setIDs)
		if err != nil {
			return nil, err
		}
		ex = append(ex, more...)
	}
	ex = append(ex, &expr.Counter{})
	if r.SetMark != 0 || r.ClearMark != 0 {
		ex = append(ex, encodeMarkStatement(r.SetMark, r.ClearMark)...)
	}
	if r.LogPrefix != "" {
		ex = append(ex, &expr.Log{Key: 1 << unix.NFTA_LOG_PREFIX, Data: []byte(r.LogPrefix)})
	}
	v, err := encodeVerdict(r)
	if err != nil {
		return nil, err
	}
	if v != nil {
		ex = append(ex, v)
	}
	return ex, nil
}

// encodeMatch turns one match into expressions; one helper per family of
// match kinds.
func encodeMatch(f Family, m Match, setIDs map[string]uint32) ([]expr.Any, error) {
	switch m.Kind {
	case MatchCtEstablished:
		return encodeCtMatch(expr.CtKeySTATE, ctEstablishedMask), nil
	case MatchCtDNAT:
		return encodeCtMatch(expr.CtKeySTATUS, ctDNATMask), nil
	case MatchIfname, MatchIfnameSet:
		return encodeIfnameMatch(m, setIDs)
	case MatchAddrSet:
		off, l := addrPayload(f, m.In)
		return []expr.Any{
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: l},
			&expr.Lookup{SourceRegister: 1, SetName: m.Value, SetID: setIDs[m.Value], Invert: m.Negate},
		}, nil
	case MatchMark:
		return encodeMarkMatch(m), nil
	case MatchL4Proto:
		return []expr.Any{&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1}, &expr.Cmp{Op: cmpOp(m.Negate), Register: 1, Data: []byte{m.Proto}}}, nil
	case MatchPort:
		return encodePortMatch(m), nil
	case MatchICMPType, MatchICMPCode:
		return encodeICMPMatch(m), nil
	default:
		return nil, fmt.Errorf("unsupported match kind %d", m.Kind)
	}
}

// encodeCtMatch tests that some of mask's bits are set in conntrack's key
// (state or status).
func encodeCtMatch(key expr.CtKey, mask []byte) []expr.Any {
	return []expr.Any{
		&expr.Ct{Register: 1, Key: key},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: make([]byte, 4)},
	}
}

// encodeIfnameMatch compares the input or output interface name with a
// name, a name prefix or a set of names.
func encodeIfnameMatch(m Match, setIDs map[string]uint32) ([]expr.Any, error) {
	key := expr.MetaKeyOIFNAME
	if m.In {
		key = expr.MetaKeyIIFNAME
	}
	load := &expr.Meta{Key: key, Register: 1}
	if m.Kind == MatchIfnameSet {
		return []expr.Any{load, &expr.Lookup{SourceRegister: 1, SetName: m.Value, SetID: setIDs[m.Value], Invert: m.Negate}}, nil
	}
	if m.Value == "" || len(m.Value) >= ifnameLen {
		return nil, fmt.Errorf("interface name %q is not 1 to 15 characters", m.Value)
	}
	data := padIfname(m.Value)
	if m.Prefix {
		data = []byte(m.Value) // iptables' -i cali+: compare the first bytes only
	}
	return []expr.Any{load, &expr.Cmp{Op: cmpOp(m.Negate), Register: 1, Data: data}}, nil
}

// encodeMarkMatch tests that some (Negate: none) of m.Mark's bits are set
// in the packet mark.
func encodeMarkMatch(m Match) []expr.Any {
	op := expr.CmpOpNeq
	if m.Negate {
		op = expr.CmpOpEq
	}
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyMARK, Register: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: binaryutil.NativeEndian.PutUint32(m.Mark), Xor: make([]byte, 4)},
		&expr.Cmp{Op: op, Register: 1, Data: make([]byte, 4)},
	}
}

// encodePortMatch compares the source or destination port with one port
// or a range.
func encodePortMatch(m Match) []expr.Any {
	off := uint32(2)
	if m.In {
		off = 0
	}
	load := &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: off, Len: 2}
	if m.Min == m.Max {
		return []expr.Any{load, &expr.Cmp{Op: cmpOp(m.Negate), Register: 1, Data: binaryutil.BigEndian.PutUint16(m.Min)}}
	}
	return []expr.Any{load, &expr.Range{Op: cmpOp(m.Negate), Register: 1, FromData: binaryutil.BigEndian.PutUint16(m.Min), ToData: binaryutil.BigEndian.PutUint16(m.Max)}}
}

// encodeICMPMatch compares the ICMP type or code (the first two bytes of
// the transport header) with m.Proto.
func encodeICMPMatch(m Match) []expr.Any {
	off := uint32(0)
	if m.Kind == MatchICMPCode {
		off = 1
	}
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: off, Len: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{m.Proto}},
	}
}

// encodeMarkStatement sets setBits and clears clearBits of the packet
// mark, in one read-modify-write.
func encodeMarkStatement(setBits, clearBits uint32) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyMARK, Register: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: binaryutil.NativeEndian.PutUint32(^(setBits | clearBits)), Xor: binaryutil.NativeEndian.PutUint32(setBits)},
		&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: 1},
	}
}

// encodeVerdict is the rule's last expression; nil for Continue (no
// verdict: the next rule).
func encodeVerdict(r Rule) (expr.Any, error) {
	switch r.Verdict {
	case Accept:
		return &expr.Verdict{Kind: expr.VerdictAccept}, nil
	case Drop:
		return &expr.Verdict{Kind: expr.VerdictDrop}, nil
	case Return:
		return &expr.Verdict{Kind: expr.VerdictReturn}, nil
	case Jump:
		if r.Target == "" {
			return nil, errors.New("jump without a target chain")
		}
		return &expr.Verdict{Kind: expr.VerdictJump, Chain: r.Target}, nil
	case Masquerade:
		return &expr.Masq{}, nil
	case Goto:
		if r.Target == "" {
			return nil, errors.New("goto without a target chain")
		}
		return &expr.Verdict{Kind: expr.VerdictGoto, Chain: r.Target}, nil
	case Continue:
		return nil, nil
	default:
		return nil, fmt.Errorf("unsupported verdict %d", r.Verdict)
	}
}

func cmpOp(negate bool) expr.CmpOp {
	if negate {
		return expr.CmpOpNeq
	}
	return expr.CmpOpEq
}

// decodeRule recognises exactly the expression sequences encodeRule
// writes. Anything else yields a rule with no verdict: unequal to every
// desired rule.
func decodeRule(f Family, nr *nftables.Rule) Rule {
	r := Rule{Handle: nr.Handle}
	if c, ok := userdata.GetString(nr.UserData, userdata.TypeComment); ok {
		r.Comment = c
	}
	for i := 0; i < len(nr.Exprs); {
		n, ok := decodeExprAt(f, nr.Exprs, i, &r)
		if !ok {
			return Rule{Handle: nr.Handle, Comment: "unrecognised: " + r.Comment}
		}
		i += n
	}
	if r.Verdict == 0 {
		r.Verdict = Continue
	}
	return r
}

// decodeExprAt reads the match, statement or verdict starting at ex[i]
// into r; n is the number of expressions it took.
func decodeExprAt(f Family, ex []expr.Any, i int, r *Rule) (n int, ok bool) {
	last := i == len(ex)-1
	switch e := ex[i].(type) {
	case *expr.Ct:
		m, ok := decodeCtMatch(e, ex[i+1:])
		return addMatch(r, m, ok, 3)
	case *expr.Meta:
		if e.Key == expr.MetaKeyMARK || e.Key == expr.MetaKeyL4PROTO {
			return decodeMeta(ex[i:], r)
		}
		m, ok := decodeIfnameMatch(e, ex[i+1:])
		return addMatch(r, m, ok, 2)
	case *expr.Payload:
		m, ok := decodePayloadMatch(f, e, ex[i+1:])
		return addMatch(r, m, ok, 2)
	case *expr.Counter:
		r.Packets, r.Bytes = e.Packets, e.Bytes
		return 1, true
	case *expr.Verdict:
		if !last {
			return 0, false
		}
		verdict, target, known := decodeVerdict(e)
		r.Verdict, r.Target = verdict, target
		return 1, known
	case *expr.Log:
		// The kernel reports its defaults (level, flags) too.
		if e.Key&(1<<unix.NFTA_LOG_PREFIX) == 0 || e.Key&(1<<unix.NFTA_LOG_GROUP) != 0 || r.LogPrefix != "" {
			return 0, false
		}
		r.LogPrefix = string(bytes.TrimRight(e.Data, "\x00"))
		return 1, true
	case *expr.Masq:
		if !last || e.Random || e.FullyRandom || e.Persistent || e.ToPorts {
			return 0, false
		}
		r.Verdict = Masquerade
		return 1, true
	}
	return 0, false
}

// addMatch appends m to r's matches when ok; n is the number of
// expressions it took.
func addMatch(r *Rule, m Match, ok bool, n int) (int, bool) {
	if !ok {
		return 0, false
	}
	r.Matches = append(r.Matches, m)
	return n, true
}

// decodeCtMatch reads a conntrack state or status test (encodeCtMatch);
// rest follows ct.
func decodeCtMatch(ct *expr.Ct, rest []expr.Any) (Match, bool) {
	if (ct.Key != expr.CtKeySTATE && ct.Key != expr.CtKeySTATUS) || len(rest) < 2 {
		return Match{}, false
	}
	kind, mask := MatchCtEstablished, ctEstablishedMask
	if ct.Key == expr.CtKeySTATUS {
		kind, mask = MatchCtDNAT, ctDNATMask
	}
	bw, ok1 := rest[0].(*expr.Bitwise)
	cmp, ok2 := rest[1].(*expr.Cmp)
	if !ok1 || !ok2 || !bytes.Equal(bw.Mask, mask) || cmp.Op != expr.CmpOpNeq || !bytes.Equal(cmp.Data, make([]byte, 4)) {
		return Match{}, false
	}
	return Match{Kind: kind}, true
}

// decodeIfnameMatch reads an interface name, prefix or set match
// (encodeIfnameMatch); rest follows the name's load.
func decodeIfnameMatch(load *expr.Meta, rest []expr.Any) (Match, bool) {
	if (load.Key != expr.MetaKeyIIFNAME && load.Key != expr.MetaKeyOIFNAME) || len(rest) < 1 {
		return Match{}, false
	}
	in := load.Key == expr.MetaKeyIIFNAME
	switch next := rest[0].(type) {
	case *expr.Lookup:
		return Match{Kind: MatchIfnameSet, In: in, Value: next.SetName, Negate: next.Invert}, true
	case *expr.Cmp:
		if next.Op != expr.CmpOpEq && next.Op != expr.CmpOpNeq {
			return Match{}, false
		}
		m := Match{Kind: MatchIfname, In: in, Negate: next.Op == expr.CmpOpNeq}
		if len(next.Data) == ifnameLen {
			m.Value = string(bytes.TrimRight(next.Data, "\x00"))
		} else {
			m.Value, m.Prefix = string(next.Data), true
		}
		return m, true
	}
	return Match{}, false
}

// decodePayloadMatch reads a port or ICMP match (a transport header load)
// or an address set match (a network header load); rest follows the load.
func decodePayloadMatch(f Family, load *expr.Payload, rest []expr.Any) (Match, bool) {
	if len(rest) < 1 {
		return Match{}, false
	}
	switch load.Base {
	case expr.PayloadBaseTransportHeader:
		return decodeTransport(load, rest[0])
	case expr.PayloadBaseNetworkHeader:
		return decodeAddrSetMatch(f, load, rest[0])
	}
	return Match{}, false
}

// decodeAddrSetMatch reads a source or destination address set lookup.
func decodeAddrSetMatch(f Family, load *expr.Payload, next expr.Any) (Match, bool) {
	lk, ok := next.(*expr.Lookup)
	if !ok {
		return Match{}, false
	}
	so, sl := addrPayload(f, true)
	do, dl := addrPayload(f, false)
	var src bool
	switch {
	case load.Offset == so && load.Len == sl:
		src = true
	case load.Offset == do && load.Len == dl:
	default:
		return Match{}, false
	}
	return Match{Kind: MatchAddrSet, In: src, Value: lk.SetName, Negate: lk.Invert}, true
}

// decodeVerdict reads the verdicts encodeVerdict writes.
func decodeVerdict(v *expr.Verdict) (VerdictKind, string, bool) {
	switch v.Kind {
	case expr.VerdictAccept:
		return Accept, "", true
	case expr.VerdictDrop:
		return Drop, "", true
	case expr.VerdictReturn:
		return Return, "", true
	case expr.VerdictJump:
		return Jump, v.Chain, true
	case expr.VerdictGoto:
		return Goto, v.Chain, true
	}
	return 0, "", false
}

// decodeMeta reads a mark match, a mark statement or an l4proto match at
// the start of ex; n is the number of expressions used.
func decodeMeta(ex []expr.Any, r *Rule) (n int, ok bool) {
	m := ex[0].(*expr.Meta)
	if m.SourceRegister || len(ex) < 2 {
		return 0, false
	}
	if m.Key == expr.MetaKeyL4PROTO {
		c, ok := ex[1].(*expr.Cmp)
		if !ok || len(c.Data) != 1 || (c.Op != expr.CmpOpEq && c.Op != expr.CmpOpNeq) {
			return 0, false
		}
		r.Matches = append(r.Matches, Match{Kind: MatchL4Proto, Proto: c.Data[0], Negate: c.Op == expr.CmpOpNeq})
		return 2, true
	}
	if len(ex) < 3 {
		return 0, false
	}
	bw, ok := ex[1].(*expr.Bitwise)
	if !ok || len(bw.Mask) != 4 || len(bw.Xor) != 4 {
		return 0, false
	}
	mask, xor := binaryutil.NativeEndian.Uint32(bw.Mask), binaryutil.NativeEndian.Uint32(bw.Xor)
	switch next := ex[2].(type) {
	case *expr.Cmp:
		if xor != 0 || !bytes.Equal(next.Data, make([]byte, 4)) || (next.Op != expr.CmpOpEq && next.Op != expr.CmpOpNeq) {
			return 0, false
		}
		r.Matches = append(r.Matches, Match{Kind: MatchMark, Mark: mask, Negate: next.Op == expr.CmpOpEq})
	case *expr.Meta:
		if !next.SourceRegister || next.Key != expr.MetaKeyMARK {
			return 0, false
		}
		r.SetMark, r.ClearMark = xor, ^mask&^xor
	default:
		return 0, false
	}
	return 3, true
}

// decodeTransport reads a port or ICMP match: a transport header load and
// its comparison.
func decodeTransport(p *expr.Payload, next expr.Any) (Match, bool) {
	switch {
	case p.Len == 2 && (p.Offset == 0 || p.Offset == 2):
		m := Match{Kind: MatchPort, In: p.Offset == 0}
		switch c := next.(type) {
		case *expr.Cmp:
			if len(c.Data) != 2 || (c.Op != expr.CmpOpEq && c.Op != expr.CmpOpNeq) {
				return Match{}, false
			}
			m.Min = binaryutil.BigEndian.Uint16(c.Data)
			m.Max, m.Negate = m.Min, c.Op == expr.CmpOpNeq
		case *expr.Range:
			if len(c.FromData) != 2 || len(c.ToData) != 2 {
				return Match{}, false
			}
			m.Min, m.Max = binaryutil.BigEndian.Uint16(c.FromData), binaryutil.BigEndian.Uint16(c.ToData)
			m.Negate = c.Op == expr.CmpOpNeq
		default:
			return Match{}, false
		}
		return m, true
	case p.Len == 1 && (p.Offset == 0 || p.Offset == 1):
		c, ok := next.(*expr.Cmp)
		if !ok || c.Op != expr.CmpOpEq || len(c.Data) != 1 {
			return Match{}, false
		}
		kind := MatchICMPType
		if p.Offset == 1 {
			kind = MatchICMPCode
		}
		return Match{Kind: kind, Proto: c.Data[0]}, true
	}
	return Match{}, false
}

// setElements encodes canonical elements for the kernel.
func setElements(f Family, s Set) ([]nftables.SetElement, error) {
	var out []nftables.SetElement
	switch {
	case s.Type == SetIfname:
		for _, e := range s.Elements {
			if e == "" || len(e) >= ifnameLen {
				return nil, fmt.Errorf("set %s: interface name %q is not 1 to 15 characters", s.Name, e)
			}
			out = append(out, nftables.SetElement{Key: padIfname(e)})
		}
	case s.Interval:
		rs, err := parseIntervalElements(s.Elements)
		if err != nil {
			return nil, fmt.Errorf("set %s: %w", s.Name, err)
		}
		for _, r := range rs {
			if familyOf(r.from) != f {
				return nil, fmt.Errorf("set %s: %s is not an %s address", s.Name, r.from, f)
			}
			out = append(out, nftables.SetElement{Key: r.from.AsSlice()})
			// The end element is one past the range; a range up to the
			// last address has none (it runs to the end).
			if next := r.to.Next(); next.IsValid() {
				out = append(out, nftables.SetElement{Key: next.AsSlice(), IntervalEnd: true})
			}
		}
	default:
		for _, e := range s.Elements {
			a, err := netip.ParseAddr(e)
			if err != nil || familyOf(a) != f {
				return nil, fmt.Errorf("set %s: %q is not an %s address", s.Name, e, f)
			}
			out = append(out, nftables.SetElement{Key: a.Unmap().AsSlice()})
		}
	}
	return out, nil
}

func (n *NFT) nftSet(f Family, s Set) *nftables.Set {
	ns := &nftables.Set{Table: ourTable(f), Name: s.Name, Interval: s.Interval, Comment: clipComment(s.Comment)}
	switch s.Type {
	case SetIfname:
		ns.KeyType = nftables.TypeIFName
		ns.KeyByteOrder = binaryutil.NativeEndian
	default:
		ns.KeyType = nftables.TypeIPAddr
		if f == IPv6 {
			ns.KeyType = nftables.TypeIP6Addr
		}
		ns.KeyByteOrder = binaryutil.BigEndian
	}
	return ns
}

// Execute applies ops as one netlink batch: all of them or none. The next
// Apply reads the tables from the kernel.
func (n *NFT) Execute(ctx context.Context, ops []Op) error {
	n.Resync()
	_, err := n.execute(ctx, ops)
	return err
}

// execute is Execute that also returns the kernel's handles of the rules
// the OpAddRule ops created, by index in ops (from the kernel's echo of
// each new rule; a handle it did not echo is missing).
func (n *NFT) execute(ctx context.Context, ops []Op) (map[int]uint64, error) {
	if len(ops) == 0 {
		return nil, nil
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	c, echo, err := n.echoConn(batchBuffer(len(ops)))
	if err != nil {
		return nil, err
	}
	defer echo.close()
	b := &nftBatch{n: n, c: c, setIDs: map[string]uint32{}}
	var ruleOps []int // the index in ops of each rule added, in batch order
	for i, op := range ops {
		if err := b.add(op); err != nil {
			return nil, err
		}
		if op.Kind == OpAddRule {
			ruleOps = append(ruleOps, i)
		}
	}
	if err := c.Flush(); err != nil {
		return nil, fmt.Errorf("nftables batch of %d changes failed (nothing was changed): %w", len(ops), err)
	}
	return echo.handles(ops, ruleOps), nil
}

// newRuleType is the netlink message type of a new rule, and of the
// kernel's echo of it.
const newRuleType = netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_NEWRULE)

// ruleEcho relays a batch between an nftables.Conn and a netlink socket
// of its own, noting the sequence number of each new rule sent and the
// handle the kernel's echo gives it back (nftables.Conn asks for the
// echo, but drops it).
type ruleEcho struct {
	conn    *netlink.Conn
	sent    []uint32          // sequence numbers of the new rules, in order
	echoed  map[uint32]uint64 // sequence number -> handle
	chainOf map[uint32]string // sequence number -> chain echoed
}

// echoConn is an nftables connection whose replies pass through a
// ruleEcho; bufBytes sizes the socket's buffers.
func (n *NFT) echoConn(bufBytes int) (*nftables.Conn, *ruleEcho, error) {
	nc, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: n.nsFd})
	if err != nil {
		return nil, nil, fmt.Errorf("opening nftables netlink: %w", err)
	}
	if err := forceBuffers(nc, bufBytes); err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("sizing the nftables netlink buffers: %w", err)
	}
	e := &ruleEcho{conn: nc, echoed: map[uint32]uint64{}, chainOf: map[uint32]string{}}
	c, err := nftables.New(nftables.WithTestDial(e.relay))
	if err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("opening nftables netlink: %w", err)
	}
	return c, e, nil
}

func (e *ruleEcho) close() { e.conn.Close() }

// relay is the nltest.Func of the connection: requests (non-nil) are sent
// on the socket, a nil request receives.
func (e *ruleEcho) relay(req []netlink.Message) ([]netlink.Message, error) {
	if req != nil {
		for i := range req {
			req[i].Header.PID = 0 // the socket's own port id
			if req[i].Header.Type == newRuleType {
				e.sent = append(e.sent, req[i].Header.Sequence)
			}
		}
		_, err := e.conn.SendMessages(req)
		return nil, err
	}
	msgs, err := e.conn.Receive()
	for _, m := range msgs {
		if m.Header.Type == newRuleType {
			e.note(m)
		}
	}
	return msgs, err
}

// note reads the handle and chain of an echoed rule.
func (e *ruleEcho) note(m netlink.Message) {
	if len(m.Data) < 4 {
		return
	}
	ad, err := netlink.NewAttributeDecoder(m.Data[4:])
	if err != nil {
		return
	}
	ad.ByteOrder = binary.BigEndian
	for ad.Next() {
		switch ad.Type() {
		case unix.NFTA_RULE_HANDLE:
			e.echoed[m.Header.Sequence] = ad.Uint64()
		case unix.NFTA_RULE_CHAIN:
			e.chainOf[m.Header.Sequence] = ad.String()
		}
	}
}

// handles maps the echoed handles to the ops (ruleOps: the index of each
// new rule's op, in the order they were sent). A rule whose echo is
// missing or names another chain gets none.
func (e *ruleEcho) handles(ops []Op, ruleOps []int) map[int]uint64 {
	out := map[int]uint64{}
	if len(e.sent) != len(ruleOps) {
		return out
	}
	for k, seq := range e.sent {
		i := ruleOps[k]
		if h, ok := e.echoed[seq]; ok && e.chainOf[seq] == ops[i].Chain {
			out[i] = h
		}
	}
	return out
}

// nftBatch queues one Execute's operations on its connection.
type nftBatch struct {
	n      *NFT
	c      *nftables.Conn
	setIDs map[string]uint32 // family/name -> id, sets created in this batch
}

// idsOf are the ids of the sets of family f created in this batch, by name.
func (b *nftBatch) idsOf(f Family) map[string]uint32 {
	m := map[string]uint32{}
	for k, v := range b.setIDs {
		if fam, name, ok := cutFamily(k); ok && fam == f {
			m[name] = v
		}
	}
	return m
}

// add queues op.
func (b *nftBatch) add(op Op) error {
	t := ourTable(op.Family)
	switch op.Kind {
	case OpAddTable:
		b.c.AddTable(t)
	case OpDelTable:
		b.c.DelTable(t)
		for k := range b.setIDs {
			if fam, _, _ := cutFamily(k); fam == op.Family {
				delete(b.setIDs, k)
			}
		}
	case OpAddSet:
		return b.addSet(op)
	case OpDelSet:
		b.c.DelSet(&nftables.Set{Table: t, Name: op.Set.Name})
	case OpFlushSet:
		b.c.FlushSet(&nftables.Set{Table: t, Name: op.Set.Name})
	case OpAddElements, OpDelElements:
		return b.changeElements(op)
	case OpAddChain:
		return b.addChain(op)
	case OpDelChain:
		b.c.DelChain(&nftables.Chain{Name: op.Chain, Table: t})
	case OpFlushChain:
		b.c.FlushChain(&nftables.Chain{Name: op.Chain, Table: t})
	case OpAddRule:
		return b.addRule(op)
	case OpDelRule:
		if err := b.c.DelRule(&nftables.Rule{Table: t, Chain: &nftables.Chain{Name: op.Chain, Table: t}, Handle: op.Rule.Handle}); err != nil {
			return fmt.Errorf("deleting rule %d of chain %s: %w", op.Rule.Handle, op.Chain, err)
		}
	default:
		return fmt.Errorf("unsupported operation %d", op.Kind)
	}
	return nil
}

// addSet creates a set with its elements; later operations of the batch
// refer to it by its id.
func (b *nftBatch) addSet(op Op) error {
	ns := b.n.nftSet(op.Family, op.Set)
	elems, err := setElements(op.Family, op.Set)
	if err != nil {
		return err
	}
	chunks := elementChunks(elems)
	if err := b.c.AddSet(ns, chunks[0]); err != nil {
		return fmt.Errorf("adding set %s: %w", op.Set.Name, err)
	}
	for _, more := range chunks[1:] {
		if err := b.c.SetAddElements(ns, more); err != nil {
			return fmt.Errorf("adding elements to set %s: %w", op.Set.Name, err)
		}
	}
	b.setIDs[string(op.Family)+"/"+op.Set.Name] = ns.ID
	return nil
}

// maxElementsPerMessage keeps a set element message's element list under
// netlink's 64 KiB attribute length (an IPv6 interval element with its
// attributes takes about 40 bytes); a longer list would be cut short by
// the length wrapping around, and the kernel take part of it.
const maxElementsPerMessage = 1024

// elementChunks splits elements into lists a message can carry, never
// between a range's start and its end. There is always a first chunk.
func elementChunks(elems []nftables.SetElement) [][]nftables.SetElement {
	var out [][]nftables.SetElement
	for len(elems) > maxElementsPerMessage {
		cut := maxElementsPerMessage
		for cut < len(elems) && elems[cut].IntervalEnd {
			cut++
		}
		out = append(out, elems[:cut])
		elems = elems[cut:]
	}
	return append(out, elems)
}

// changeElements adds or deletes elements of a set.
func (b *nftBatch) changeElements(op Op) error {
	ns := b.n.nftSet(op.Family, op.Set)
	ns.ID = b.setIDs[string(op.Family)+"/"+op.Set.Name]
	elems, err := setElements(op.Family, op.Set)
	if err != nil {
		return err
	}
	for _, chunk := range elementChunks(elems) {
		if op.Kind == OpAddElements {
			err = b.c.SetAddElements(ns, chunk)
		} else {
			err = b.c.SetDeleteElements(ns, chunk)
		}
		if err != nil {
			return fmt.Errorf("changing elements of set %s: %w", op.Set.Name, err)
		}
	}
	return nil
}

// addChain creates a regular chain, or a base chain on its hook.
func (b *nftBatch) addChain(op Op) error {
	ch := &nftables.Chain{Name: op.ChainDef.Name, Table: ourTable(op.Family)}
	if base := op.ChainDef.Base; base != nil {
		hook, err := hookNum(base.Hook)
		if err != nil {
			return err
		}
		prio := nftables.ChainPriority(base.Priority)
		policy := nftables.ChainPolicyAccept
		ch.Type, ch.Hooknum, ch.Priority, ch.Policy = nftables.ChainType(base.Type), hook, &prio, &policy
	}
	b.c.AddChain(ch)
	return nil
}

// addRule appends a rule to its chain, its comment as user data.
func (b *nftBatch) addRule(op Op) error {
	ex, err := encodeRule(op.Family, op.Rule, b.idsOf(op.Family))
	if err != nil {
		return fmt.Errorf("rule %q: %w", op.Rule.Render(op.Family), err)
	}
	var ud []byte
	if cm := clipComment(op.Rule.Comment); cm != "" {
		ud = userdata.AppendString(nil, userdata.TypeComment, cm)
	}
	t := ourTable(op.Family)
	b.c.AddRule(&nftables.Rule{Table: t, Chain: &nftables.Chain{Name: op.Chain, Table: t}, Exprs: ex, UserData: ud})
	return nil
}

func cutFamily(k string) (Family, string, bool) {
	for i := 0; i < len(k); i++ {
		if k[i] == '/' {
			return Family(k[:i]), k[i+1:], true
		}
	}
	return "", "", false
}

// Apply makes the project's tables equal to want, changing only what
// differs, in one batch. What differs is judged against the tables as
// Apply last left them (see known), or read from the kernel after Resync
// or a failure. If the batch fails (the kernel refused some change, or
// the remembered tables were not the kernel's any more), it compares with
// the kernel's tables and, failing again, rewrites them whole, also in one
// batch. It returns the number of changes made.
func (n *NFT) Apply(ctx context.Context, want Ruleset) (int, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.known != nil {
		cur := *n.known
		ops := Diff(cur, want)
		if len(ops) == 0 {
			return 0, nil
		}
		handles, err := n.execute(ctx, ops)
		if err == nil {
			n.remember(cur, ops, handles)
			return len(ops), nil
		}
		n.known = nil
		if ctx.Err() != nil {
			return 0, err
		}
		n.log.WithError(err).Warn("updating the nftables tables from what was last programmed failed; reading them from the kernel")
	}
	return n.applyFromKernel(ctx, want)
}

// Resync makes the next Apply read the kernel's tables instead of
// trusting what it last programmed.
func (n *NFT) Resync() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.known = nil
}

// remember records the tables after ops were applied to cur; when that
// cannot be told exactly, the next Apply reads the kernel.
func (n *NFT) remember(cur Ruleset, ops []Op, handles map[int]uint64) {
	next, ok := afterOps(cur, ops, handles)
	if !ok {
		n.log.Debug("cannot tell the nftables tables after a change; the next change reads them from the kernel")
		n.known = nil
		return
	}
	n.known = &next
}

// applyFromKernel is Apply against the kernel's tables as read now.
func (n *NFT) applyFromKernel(ctx context.Context, want Ruleset) (int, error) {
	families := []Family{IPv4, IPv6}
	cur, err := n.Dump(ctx, families...)
	if err != nil {
		return 0, err
	}
	ops := Diff(cur, want)
	if len(ops) == 0 {
		n.known = &cur
		return 0, nil
	}
	handles, err := n.execute(ctx, ops)
	if err == nil {
		n.remember(cur, ops, handles)
		return len(ops), nil
	}
	n.log.WithError(err).Warn("updating the nftables tables in place failed; rewriting them")
	var full []Op
	for _, t := range want.sortedTables() {
		_, exists := cur.Table(t.Family)
		full = append(full, ReplaceTable(t, exists)...)
	}
	for _, t := range cur.sortedTables() {
		if _, ok := want.Table(t.Family); !ok {
			full = append(full, Op{Kind: OpDelTable, Family: t.Family})
		}
	}
	handles, err2 := n.execute(ctx, full)
	if err2 != nil {
		return 0, fmt.Errorf("rewriting the nftables tables: %w (in-place update: %v)", err2, err)
	}
	n.remember(cur, full, handles)
	return len(full), nil
}

// Delete removes the project's tables (both families); absent ones are
// fine. The daemon never calls it on shutdown: the rules must keep
// protecting running containers while it restarts.
func (n *NFT) Delete(ctx context.Context) error {
	n.Resync()
	cur, err := n.Dump(ctx, IPv4, IPv6)
	if err != nil {
		return err
	}
	var ops []Op
	for _, t := range cur.sortedTables() {
		ops = append(ops, Op{Kind: OpDelTable, Family: t.Family})
	}
	return n.Execute(ctx, ops)
}
