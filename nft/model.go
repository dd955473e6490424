package nft

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Family is an nftables table family the project uses.
type Family string

// The two families: one table each.
const (
	IPv4 Family = "ip"
	IPv6 Family = "ip6"
)

// FamilyOf is the table family of a's address family.
func FamilyOf(a netip.Addr) Family {
	if a.Unmap().Is4() {
		return IPv4
	}
	return IPv6
}

// SetType is the key type of a named set.
type SetType string

// Set key types.
const (
	SetAddr   SetType = "addr"   // ipv4_addr or ipv6_addr, by the table's family
	SetIfname SetType = "ifname" // interface names
)

// Ruleset is the whole desired (or dumped) content of the tables of one
// name, one table per family: the pure description an owner of tables
// computes (policy.Desired, the published ports), Diff compares and Conn
// writes and reads back.
type Ruleset struct {
	Tables []Table
}

// Table is one family's table.
type Table struct {
	Family Family
	Sets   []Set
	Chains []Chain
}

// Set is a named set. Elements are canonical strings: for address sets
// addresses ("192.168.0.5") or, in interval sets, the minimal list of
// prefixes covering the merged ranges ("192.168.0.0/16"); for ifname sets
// the names. Sorted, without duplicates (see canonicalElements).
type Set struct {
	Name     string
	Type     SetType
	Interval bool
	Elements []string
	// Comment is for humans (nft list); it is not compared.
	Comment string
}

// BaseChain is the hook of a base chain. Policy is always accept: the
// project only ever drops what it decided to drop.
type BaseChain struct {
	Type     string // "filter" or "nat"
	Hook     string // "forward" or "postrouting"
	Priority int32
}

// Chain is a chain with its rules. Rules are evaluated in order; the
// Unordered rules come after them in any order (per-endpoint rules, each
// matching a different interface, so their order cannot matter). Keeping
// them apart lets an endpoint's rules be appended and deleted one by one.
type Chain struct {
	Name      string
	Base      *BaseChain // nil: a regular chain, reached by jump
	Rules     []Rule
	Unordered []Rule
}

// MatchKind is what a match tests.
type MatchKind int

// Match kinds.
const (
	// MatchCtEstablished: conntrack state established or related.
	MatchCtEstablished MatchKind = iota + 1
	// MatchIfname: the input (In) or output interface name is Value, or
	// starts with Value when Prefix.
	MatchIfname
	// MatchIfnameSet: the interface name is (Negate: is not) in set Value.
	MatchIfnameSet
	// MatchAddrSet: the source (In) or destination address is (Negate: is
	// not) in set Value.
	MatchAddrSet
	// MatchMark: the packet mark has (Negate: has none of) the bits Mark.
	MatchMark
	// MatchL4Proto: the transport protocol is (Negate: is not) Proto.
	MatchL4Proto
	// MatchPort: the source (In) or destination port is (Negate: is not)
	// in Min..Max. Only after a MatchL4Proto of a protocol with ports.
	MatchPort
	// MatchICMPType, MatchICMPCode: the ICMP (ICMPv6 in the ip6 table)
	// type or code is Proto. Only after a MatchL4Proto of ICMP.
	MatchICMPType
	MatchICMPCode
	// MatchCtDNAT: the connection was destination-NATed (`ct status
	// dnat`): a published port (package ports).
	MatchCtDNAT
	// MatchAddr: the source (In) or destination address is (Negate: is
	// not) in the prefix Value ("127.0.0.0/8", "10.0.0.5/32").
	MatchAddr
	// MatchFibLocal: the destination address is one of this host's (`fib
	// daddr type local`).
	MatchFibLocal
)

// Match is one condition of a rule.
type Match struct {
	Kind   MatchKind
	In     bool // input interface / source address; otherwise output / destination
	Value  string
	Prefix bool
	Negate bool
	Mark   uint32 // MatchMark
	Proto  uint8  // MatchL4Proto; the value of MatchICMPType/Code
	Min    uint16 // MatchPort
	Max    uint16
}

// VerdictKind is what a rule does when all its matches hold.
type VerdictKind int

// Verdicts.
const (
	Accept VerdictKind = iota + 1
	Drop
	Return
	Jump
	Masquerade
	Goto     // to Target; its return goes where this chain's would
	Continue // no verdict: the next rule (a Log rule)
	DNAT     // to NATAddr port NATPort (a nat chain)
)

// Rule is matches and a verdict. Every rule counts its packets.
type Rule struct {
	Matches []Match
	Verdict VerdictKind
	Target  string // chain of a Jump or Goto
	// NATAddr and NATPort are where a DNAT sends the packet.
	NATAddr netip.Addr
	NATPort uint16
	// SetMark bits are set and ClearMark bits cleared in the packet mark
	// (one statement, after the counter).
	SetMark, ClearMark uint32
	// LogPrefix, when set, logs the packet (kernel log) with this prefix.
	LogPrefix string
	Comment   string
	// Handle is the kernel's handle of a dumped rule (0 in desired rules);
	// it is not compared.
	Handle uint64
	// Packets and Bytes are a dumped rule's counter (not compared).
	Packets, Bytes uint64

	// rendered is Render(renderedFor), remembered by WithText: rules
	// Conn remembers and the rules an owner memoises (the policy's
	// endpoint jumps) are compared at every change without rendering
	// them again.
	rendered    string
	renderedFor Family
}

// Text is Render(f), remembered when WithText did it for f.
func (r Rule) Text(f Family) string {
	if r.rendered != "" && r.renderedFor == f {
		return r.rendered
	}
	return r.Render(f)
}

// WithoutText is r without a remembered rendering: two rules that differ
// only in it are the same rule (tests compare them so).
func (r Rule) WithoutText() Rule {
	r.rendered, r.renderedFor = "", ""
	return r
}

// WithText is r remembering its rendering for f (r must not change
// afterwards).
func (r Rule) WithText(f Family) Rule {
	r.rendered, r.renderedFor = r.Render(f), f
	return r
}

// IfnameLen is IFNAMSIZ: nftables compares interface names as 16 bytes.
const IfnameLen = 16

func (m Match) render(f Family) string {
	return string(m.appendRender(nil, f))
}

// appendRender appends the match in nft syntax to b. Rendering runs for
// every rule at every change (rules are compared by it), so it builds the
// text without fmt.
func (m Match) appendRender(b []byte, f Family) []byte {
	dir := func(in bool, a, b string) string {
		if in {
			return a
		}
		return b
	}
	neg := ""
	if m.Negate {
		neg = "!= "
	}
	switch m.Kind {
	case MatchCtEstablished:
		return append(b, "ct state established,related"...)
	case MatchCtDNAT:
		return append(b, "ct status dnat"...)
	case MatchFibLocal:
		return append(b, "fib daddr type local"...)
	case MatchAddr:
		b = append(append(append(append(append(b, f...), ' '), dir(m.In, "saddr", "daddr")...), ' '), neg...)
		if p, err := netip.ParsePrefix(m.Value); err == nil && p.IsSingleIP() {
			return p.Addr().AppendTo(b)
		}
		return append(b, m.Value...)
	case MatchIfname:
		v := m.Value
		if m.Prefix {
			v += "*"
		}
		b = append(append(append(b, dir(m.In, "iifname", "oifname")...), ' '), neg...)
		return appendQuote(b, v)
	case MatchIfnameSet:
		b = append(append(append(b, dir(m.In, "iifname", "oifname")...), ' '), neg...)
		return append(append(b, '@'), m.Value...)
	case MatchAddrSet:
		b = append(append(append(append(append(b, f...), ' '), dir(m.In, "saddr", "daddr")...), ' '), neg...)
		return append(append(b, '@'), m.Value...)
	case MatchMark:
		op := " != 0"
		if m.Negate {
			op = " == 0"
		}
		return append(appendHex8(append(b, "meta mark & "...), m.Mark), op...)
	case MatchL4Proto:
		return strconv.AppendUint(append(append(b, "meta l4proto "...), neg...), uint64(m.Proto), 10)
	case MatchPort:
		b = append(append(append(append(b, "th "...), dir(m.In, "sport", "dport")...), ' '), neg...)
		b = strconv.AppendUint(b, uint64(m.Min), 10)
		if m.Max != m.Min {
			b = strconv.AppendUint(append(b, '-'), uint64(m.Max), 10)
		}
		return b
	case MatchICMPType, MatchICMPCode:
		proto := "icmp"
		if f == IPv6 {
			proto = "icmpv6"
		}
		field := " type "
		if m.Kind == MatchICMPCode {
			field = " code "
		}
		return strconv.AppendUint(append(append(b, proto...), field...), uint64(m.Proto), 10)
	}
	return append(b, fmt.Sprintf("<unknown match %d>", m.Kind)...)
}

// appendQuote is strconv.AppendQuote, quicker for the plain ASCII that
// interface names, log prefixes and comments almost always are.
func appendQuote(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' {
			return strconv.AppendQuote(b, s)
		}
	}
	return append(append(append(b, '"'), s...), '"')
}

// appendHex8 appends v as 0x and 8 hex digits (%#08x with the padding
// after the 0x, as nft shows marks).
func appendHex8(b []byte, v uint32) []byte {
	const digits = "0123456789abcdef"
	b = append(b, '0', 'x')
	for shift := 28; shift >= 0; shift -= 4 {
		b = append(b, digits[v>>uint(shift)&0xf])
	}
	return b
}

// Render is the rule in nft syntax, comment included: what `nft list`
// shows, and the rule's identity when comparing rulesets.
func (r Rule) Render(f Family) string {
	b := make([]byte, 0, 128)
	for _, m := range r.Matches {
		b = append(m.appendRender(b, f), ' ')
	}
	b = append(b, "counter"...)
	if r.SetMark != 0 || r.ClearMark != 0 {
		b = appendHex8(append(b, " meta mark set mark & "...), ^(r.SetMark | r.ClearMark))
		b = appendHex8(append(b, " | "...), r.SetMark)
	}
	if r.LogPrefix != "" {
		b = appendQuote(append(b, " log prefix "...), r.LogPrefix)
	}
	switch r.Verdict {
	case Accept:
		b = append(b, " accept"...)
	case Drop:
		b = append(b, " drop"...)
	case Return:
		b = append(b, " return"...)
	case Jump:
		b = append(append(b, " jump "...), r.Target...)
	case Masquerade:
		b = append(b, " masquerade"...)
	case Goto:
		b = append(append(b, " goto "...), r.Target...)
	case DNAT:
		b = append(b, " dnat to "...)
		if f == IPv6 {
			b = append(r.NATAddr.AppendTo(append(b, '[')), ']')
		} else {
			b = r.NATAddr.AppendTo(b)
		}
		b = strconv.AppendUint(append(b, ':'), uint64(r.NATPort), 10)
	case Continue:
	default:
		b = append(b, fmt.Sprintf(" <unknown verdict %d>", r.Verdict)...)
	}
	if c := ClipComment(r.Comment); c != "" {
		b = appendQuote(append(b, " comment "...), c)
	}
	return string(b)
}

func (s Set) render(f Family) string {
	typ := "ifname"
	if s.Type == SetAddr {
		typ = "ipv4_addr"
		if f == IPv6 {
			typ = "ipv6_addr"
		}
	}
	flags := ""
	if s.Interval {
		flags = " flags interval;"
	}
	return fmt.Sprintf("set %s { type %s;%s elements = { %s } }", s.Name, typ, flags, strings.Join(s.Elements, ", "))
}

func (c Chain) header() string {
	if c.Base == nil {
		return "chain " + c.Name
	}
	return fmt.Sprintf("chain %s { type %s hook %s priority %d; policy accept; }", c.Name, c.Base.Type, c.Base.Hook, c.Base.Priority)
}

// Render is the table as text, one line per set, chain and rule, in a
// canonical order; two tables are equal when their renderings are.
func (t Table) Render() string {
	var b strings.Builder
	fmt.Fprintf(&b, "table %s\n", t.Family)
	sets := slices.Clone(t.Sets)
	slices.SortFunc(sets, func(a, b Set) int { return strings.Compare(a.Name, b.Name) })
	for _, s := range sets {
		fmt.Fprintf(&b, "  %s\n", s.render(t.Family))
	}
	chains := slices.Clone(t.Chains)
	slices.SortFunc(chains, func(a, b Chain) int { return strings.Compare(a.Name, b.Name) })
	for _, c := range chains {
		fmt.Fprintf(&b, "  %s\n", c.header())
		for _, r := range c.Rules {
			fmt.Fprintf(&b, "    %s\n", r.Render(t.Family))
		}
		un := make([]string, 0, len(c.Unordered))
		for _, r := range c.Unordered {
			un = append(un, r.Render(t.Family))
		}
		slices.Sort(un)
		for _, r := range un {
			fmt.Fprintf(&b, "    %s\n", r)
		}
	}
	return b.String()
}

// Render is every table, IPv4 first.
func (rs Ruleset) Render() string {
	var b strings.Builder
	for _, t := range rs.sortedTables() {
		b.WriteString(t.Render())
	}
	return b.String()
}

func (rs Ruleset) sortedTables() []Table {
	ts := slices.Clone(rs.Tables)
	slices.SortFunc(ts, func(a, b Table) int { return strings.Compare(string(a.Family), string(b.Family)) })
	return ts
}

// Table returns the table of family f.
func (rs Ruleset) Table(f Family) (Table, bool) {
	for _, t := range rs.Tables {
		if t.Family == f {
			return t, true
		}
	}
	return Table{}, false
}

// Set returns the set called name.
func (t Table) Set(name string) (Set, bool) {
	for _, s := range t.Sets {
		if s.Name == name {
			return s, true
		}
	}
	return Set{}, false
}

// Chain returns the chain called name.
func (t Table) Chain(name string) (Chain, bool) {
	for _, c := range t.Chains {
		if c.Name == name {
			return c, true
		}
	}
	return Chain{}, false
}

// RuleCount is the number of rules in the table.
func (t Table) RuleCount() int {
	n := 0
	for _, c := range t.Chains {
		n += len(c.Rules) + len(c.Unordered)
	}
	return n
}

// maxComment is what the kernel keeps of a rule comment
// (NFTNL_UDATA_COMMENT_MAXLEN is 128 with the terminating NUL).
const maxComment = 127

// ClipComment cuts a comment to what the kernel stores, at a rune boundary.
func ClipComment(s string) string {
	if len(s) <= maxComment {
		return s
	}
	cut := maxComment
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut]
}
