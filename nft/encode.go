package nft

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"golang.org/x/sys/unix"
)

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
		out.Elements = SortedUnique(names)
	case s.Interval:
		out.Elements = RangesElements(elementsToRanges(f, elems))
	default:
		var as []netip.Addr
		for _, e := range elems {
			if a, ok := netip.AddrFromSlice(e.Key); ok {
				as = append(as, a)
			}
		}
		out.Elements = AddrElements(as)
	}
	return out
}

// elementsToRanges rebuilds ranges from interval elements: a start key
// opens a range, an interval-end key (one past its last address) closes it,
// a start without an end runs to the family's last address.
func elementsToRanges(f Family, elems []nftables.SetElement) []AddrRange {
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
	var out []AddrRange
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
				out = append(out, AddrRange{From: *open, To: last})
			}
			open = nil
		}
	}
	if open != nil {
		maxAddr := netip.AddrFrom4([4]byte{255, 255, 255, 255})
		if f == IPv6 {
			maxAddr = netip.AddrFrom16([16]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
		}
		out = append(out, AddrRange{From: *open, To: maxAddr})
	}
	return MergeRanges(out)
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
	b := make([]byte, IfnameLen)
	copy(b, s)
	return b
}

var ctEstablishedMask = binaryutil.NativeEndian.PutUint32(expr.CtStateBitESTABLISHED | expr.CtStateBitRELATED)

// ctDNATMask is the kernel's IPS_DST_NAT conntrack status bit.
var ctDNATMask = binaryutil.NativeEndian.PutUint32(1 << 5)

// EncodeRule turns a rule into nftables expressions; setIDs are the ids of
// sets created in the same batch (0 = an existing set, found by name).
func EncodeRule(f Family, r Rule, setIDs map[string]uint32) ([]expr.Any, error) {
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
	if r.Verdict == DNAT {
		dnat, err := encodeDNAT(f, r)
		if err != nil {
			return nil, err
		}
		return append(ex, dnat...), nil
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
	case MatchAddr:
		return encodeAddrMatch(f, m)
	case MatchFibLocal:
		return []expr.Any{
			&expr.Fib{Register: 1, FlagDADDR: true, ResultADDRTYPE: true},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(unix.RTN_LOCAL)},
		}, nil
	default:
		return nil, fmt.Errorf("unsupported match kind %d", m.Kind)
	}
}

// encodeAddrMatch compares the source or destination address with a
// prefix: the address alone for a single address, masked otherwise.
func encodeAddrMatch(f Family, m Match) ([]expr.Any, error) {
	p, err := netip.ParsePrefix(m.Value)
	if err != nil || FamilyOf(p.Addr()) != f {
		return nil, fmt.Errorf("%q is not an %s prefix", m.Value, f)
	}
	p = p.Masked()
	off, l := addrPayload(f, m.In)
	ex := []expr.Any{&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: l}}
	if !p.IsSingleIP() {
		mask := net.CIDRMask(p.Bits(), int(l)*8)
		ex = append(ex, &expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: l, Mask: mask, Xor: make([]byte, l)})
	}
	return append(ex, &expr.Cmp{Op: cmpOp(m.Negate), Register: 1, Data: p.Addr().AsSlice()}), nil
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
	if m.Value == "" || len(m.Value) >= IfnameLen {
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
	case DNAT:
		return nil, errors.New("dnat is encoded by encodeDNAT")
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

// encodeDNAT loads the address and the port into registers 1 and 2 and
// NATs to them.
func encodeDNAT(f Family, r Rule) ([]expr.Any, error) {
	if !r.NATAddr.IsValid() || FamilyOf(r.NATAddr) != f {
		return nil, fmt.Errorf("dnat to %v: not an %s address", r.NATAddr, f)
	}
	return []expr.Any{
		&expr.Immediate{Register: 1, Data: r.NATAddr.Unmap().AsSlice()},
		&expr.Immediate{Register: 2, Data: binaryutil.BigEndian.PutUint16(r.NATPort)},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: uint32(tableFamily(f)), RegAddrMin: 1, RegProtoMin: 2, Specified: true},
	}, nil
}

// decodeDNAT reads encodeDNAT's expressions at the start of ex, which
// must end the rule.
func decodeDNAT(ex []expr.Any, r *Rule) (n int, ok bool) {
	if len(ex) != 3 {
		return 0, false
	}
	addr, ok1 := ex[0].(*expr.Immediate)
	port, ok2 := ex[1].(*expr.Immediate)
	nat, ok3 := ex[2].(*expr.NAT)
	if !ok1 || !ok2 || !ok3 || nat.Type != expr.NATTypeDestNAT || !nat.Specified || addr.Register != 1 || port.Register != 2 ||
		nat.RegAddrMin != 1 || nat.RegProtoMin != 2 || len(port.Data) != 2 || nat.Random || nat.FullyRandom || nat.Persistent {
		return 0, false
	}
	a, ok := netip.AddrFromSlice(addr.Data)
	if !ok {
		return 0, false
	}
	r.Verdict, r.NATAddr, r.NATPort = DNAT, a, binaryutil.BigEndian.Uint16(port.Data)
	return 3, true
}

// decodeFibLocal reads `fib daddr type local`; rest follows the fib.
func decodeFibLocal(fib *expr.Fib, rest []expr.Any) (Match, bool) {
	if len(rest) < 1 || !fib.FlagDADDR || !fib.ResultADDRTYPE || fib.FlagSADDR || fib.FlagMARK || fib.FlagIIF || fib.FlagOIF || fib.FlagPRESENT ||
		fib.ResultOIF || fib.ResultOIFNAME {
		return Match{}, false
	}
	c, ok := rest[0].(*expr.Cmp)
	if !ok || c.Op != expr.CmpOpEq || !bytes.Equal(c.Data, binaryutil.NativeEndian.PutUint32(unix.RTN_LOCAL)) {
		return Match{}, false
	}
	return Match{Kind: MatchFibLocal}, true
}

// decodeAddrMatch reads encodeAddrMatch's comparison (rest follows the
// load): n is the number of expressions after the load it took.
func decodeAddrMatch(f Family, src bool, rest []expr.Any) (m Match, n int, ok bool) {
	bits := 32
	if f == IPv6 {
		bits = 128
	}
	if bw, isBW := rest[0].(*expr.Bitwise); isBW {
		ones, size := net.IPMask(bw.Mask).Size()
		if size != bits || !bytes.Equal(bw.Xor, make([]byte, len(bw.Xor))) || len(rest) < 2 {
			return Match{}, 0, false
		}
		bits, rest, n = ones, rest[1:], 1
	}
	c, isCmp := rest[0].(*expr.Cmp)
	if !isCmp || (c.Op != expr.CmpOpEq && c.Op != expr.CmpOpNeq) {
		return Match{}, 0, false
	}
	a, isAddr := netip.AddrFromSlice(c.Data)
	if !isAddr || FamilyOf(a) != f {
		return Match{}, 0, false
	}
	return Match{Kind: MatchAddr, In: src, Value: netip.PrefixFrom(a, bits).String(), Negate: c.Op == expr.CmpOpNeq}, n + 1, true
}

func cmpOp(negate bool) expr.CmpOp {
	if negate {
		return expr.CmpOpNeq
	}
	return expr.CmpOpEq
}

// DecodeRule recognises exactly the expression sequences EncodeRule
// writes. Anything else yields a rule with no verdict: unequal to every
// desired rule.
func DecodeRule(f Family, nr *nftables.Rule) Rule {
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
		if e.Base == expr.PayloadBaseNetworkHeader && i+1 < len(ex) {
			if _, lookup := ex[i+1].(*expr.Lookup); !lookup {
				src, ok := addrLoad(f, e)
				if !ok {
					return 0, false
				}
				m, n, ok := decodeAddrMatch(f, src, ex[i+1:])
				return addMatch(r, m, ok, 1+n)
			}
		}
		m, ok := decodePayloadMatch(f, e, ex[i+1:])
		return addMatch(r, m, ok, 2)
	case *expr.Fib:
		m, ok := decodeFibLocal(e, ex[i+1:])
		return addMatch(r, m, ok, 2)
	case *expr.Immediate:
		return decodeDNAT(ex[i:], r)
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
		if len(next.Data) == IfnameLen {
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
	src, ok := addrLoad(f, load)
	if !ok {
		return Match{}, false
	}
	return Match{Kind: MatchAddrSet, In: src, Value: lk.SetName, Negate: lk.Invert}, true
}

// addrLoad tells a load of the source address (src) from one of the
// destination; ok is false for any other load.
func addrLoad(f Family, load *expr.Payload) (src, ok bool) {
	so, sl := addrPayload(f, true)
	do, dl := addrPayload(f, false)
	switch {
	case load.Offset == so && load.Len == sl:
		return true, true
	case load.Offset == do && load.Len == dl:
		return false, true
	}
	return false, false
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
			if e == "" || len(e) >= IfnameLen {
				return nil, fmt.Errorf("set %s: interface name %q is not 1 to 15 characters", s.Name, e)
			}
			out = append(out, nftables.SetElement{Key: padIfname(e)})
		}
	case s.Interval:
		rs, err := ParseIntervalElements(s.Elements)
		if err != nil {
			return nil, fmt.Errorf("set %s: %w", s.Name, err)
		}
		for _, r := range rs {
			if FamilyOf(r.From) != f {
				return nil, fmt.Errorf("set %s: %s is not an %s address", s.Name, r.From, f)
			}
			out = append(out, nftables.SetElement{Key: r.From.AsSlice()})
			// The end element is one past the range; a range up to the
			// last address has none (it runs to the end).
			if next := r.To.Next(); next.IsValid() {
				out = append(out, nftables.SetElement{Key: next.AsSlice(), IntervalEnd: true})
			}
		}
	default:
		for _, e := range s.Elements {
			a, err := netip.ParseAddr(e)
			if err != nil || FamilyOf(a) != f {
				return nil, fmt.Errorf("set %s: %q is not an %s address", s.Name, e, f)
			}
			out = append(out, nftables.SetElement{Key: a.Unmap().AsSlice()})
		}
	}
	return out, nil
}

func nftSet(table string, f Family, s Set) *nftables.Set {
	ns := &nftables.Set{Table: ourTable(table, f), Name: s.Name, Interval: s.Interval, Comment: ClipComment(s.Comment)}
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
