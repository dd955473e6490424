package policy

import (
	"fmt"
	"github.com/calico-cnm/calico-cnm/nft"
	"github.com/calico-cnm/calico-cnm/policy/api"
	"slices"
	"strings"
	"testing"

	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/ipam"
)

// handlesFrom numbers the rules ops add, from next on, as a kernel would.
func handlesFrom(ops []Op, next uint64) map[int]uint64 {
	h := map[int]uint64{}
	for i, op := range ops {
		if op.Kind == OpAddRule {
			h[i] = next
			next++
		}
	}
	return h
}

// TestAfterOpsFollowsDiff: the tables NFT remembers after applying
// Diff(cur, want) are want, in Dump's shape (every rule in Rules with
// the handle it was given, kept rules with their old ones), so that the
// next Diff against them is what a Diff against the kernel would be.
func TestAfterOpsFollowsDiff(t *testing.T) {
	withEP := func(st State, n int, network, ip string) State {
		st.Endpoints = append(slices.Clone(st.Endpoints), ep(n, network, "h1", ip, true))
		return st
	}
	base := baseState()
	base.IPv6 = true
	noV6 := baseState()
	vxlan := baseState()
	vxlan.Pools = append(slices.Clone(vxlan.Pools), ipam.Pool{CIDR: "10.77.0.0/16", VXLANMode: "Always"})
	vxlan.Nodes = []datastore.Node{{Name: "h1", IPv4: "172.31.0.2", VXLANTunnelAddr: "192.168.0.65"}}
	isolationOff := baseState()
	isolationOff.Networks = slices.Clone(isolationOff.Networks)
	isolationOff.Networks[0].Options = map[string]string{OptIsolation: "off"}
	morePools := baseState()
	morePools.Pools = append(slices.Clone(morePools.Pools), ipam.Pool{CIDR: "10.88.0.0/16", NATOutgoing: true})

	tests := []struct {
		name     string
		from, to State
		empty    bool // from nothing
	}{
		{name: "write from nothing", to: base, empty: true},
		{name: "a join", from: base, to: withEP(base, 7, net1ID, "192.168.0.7")},
		{name: "a leave", from: withEP(base, 7, net1ID, "192.168.0.7"), to: base},
		{name: "a join on a new network", from: base, to: withEP(base, 8, net3ID, "192.168.0.8")},
		{name: "the last endpoint of a network leaves", from: withEP(base, 8, net3ID, "192.168.0.8"), to: base},
		{name: "a pool added (interval sets rewritten)", from: base, to: morePools},
		{name: "isolation turned off (chain heads rewritten)", from: baseState(), to: isolationOff},
		{name: "VXLAN chains and sets", from: baseState(), to: vxlan},
		{name: "the ip6 table goes", from: base, to: noV6},
		{name: "the ip6 table comes", from: noV6, to: base},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var cur Ruleset
			if !tc.empty {
				cur = programmed(t, desired(t, tc.from))
			}
			before := cur.Render()
			want := desired(t, tc.to)
			ops := Diff(cur, want)
			if len(ops) == 0 {
				t.Fatal("the step changes nothing")
			}
			got, ok := nft.AfterOps(cur, ops, handlesFrom(ops, 10000))
			if !ok {
				t.Fatalf("nft.AfterOps cannot follow the plan:\n%s", strings.Join(opStrings(ops), "\n"))
			}
			if cur.Render() != before {
				t.Error("nft.AfterOps changed the tables it started from")
			}
			// Diff is exact: no plan means every set, chain and rule is as
			// wanted (Render would differ: appended rules are in write
			// order).
			if again := Diff(got, want); len(again) != 0 {
				t.Errorf("Diff against the remembered tables is not empty:\n%s", strings.Join(opStrings(again), "\n"))
			}
			for _, tb := range got.Tables {
				for _, c := range tb.Chains {
					if len(c.Unordered) > 0 {
						t.Errorf("chain %s has unordered rules: Dump's shape has them all in Rules", c.Name)
					}
					for _, r := range c.Rules {
						if r.Handle == 0 {
							t.Errorf("rule without a handle in %s: %s", c.Name, r.Render(tb.Family))
						}
					}
				}
			}
		})
	}
}

// TestAfterOpsKeepsHandles: a join keeps the handles of the rules already
// there and gives the new ones theirs; a leave then deletes exactly those.
func TestAfterOpsKeepsHandles(t *testing.T) {
	before := baseState()
	after := baseState()
	// The first endpoint of a network on this host: its network's jumps
	// are the new rules.
	joined := ep(7, net3ID, "h1", "192.168.0.7", true)
	after.Endpoints = append(after.Endpoints, joined)

	cur := programmed(t, desired(t, before))
	fwd := func(rs Ruleset) Chain {
		t.Helper()
		c, ok := mustTable(t, rs, IPv4).Chain(chainForward)
		if !ok {
			t.Fatal("no forward chain")
		}
		return c
	}
	old := map[uint64]bool{}
	for _, r := range fwd(cur).Rules {
		old[r.Handle] = true
	}
	ops := Diff(cur, desired(t, after))
	joinedRS, ok := nft.AfterOps(cur, ops, handlesFrom(ops, 5000))
	if !ok {
		t.Fatal("nft.AfterOps cannot follow the join")
	}
	var added []uint64
	for _, r := range fwd(joinedRS).Rules {
		if !old[r.Handle] {
			added = append(added, r.Handle)
			if txt := r.Render(IPv4); !strings.Contains(txt, "@"+JumpSetName(api.Ingress, IngressChainName(net3ID))) && !strings.Contains(txt, "@"+JumpSetName(api.Egress, EgressChainName(net3ID))) {
				t.Errorf("new rule %d is not the joined endpoint's network's: %s", r.Handle, r.Render(IPv4))
			}
		}
	}
	if !slices.Equal(added, []uint64{5000, 5001}) {
		t.Errorf("handles of the join's rules = %v, want [5000 5001]", added)
	}
	var deleted []uint64
	for _, op := range Diff(joinedRS, desired(t, before)) {
		if op.Kind == OpDelRule {
			deleted = append(deleted, op.Rule.Handle)
		}
		if op.Kind == OpFlushChain {
			t.Errorf("the leave rewrites chain %s", op.Chain)
		}
	}
	if !slices.Equal(deleted, added) {
		t.Errorf("the leave deletes rules %v, want %v", deleted, added)
	}
}

// TestAfterOpsCannotTell: when the result is not known exactly, nft.AfterOps
// says so and NFT reads the kernel instead.
func TestAfterOpsCannotTell(t *testing.T) {
	cur := programmed(t, desired(t, baseState()))
	fwd, _ := mustTable(t, cur, IPv4).Chain(chainForward)
	tests := []struct {
		name    string
		ops     []Op
		handles map[int]uint64
	}{
		{"a new rule's handle was not echoed", []Op{{Kind: OpAddRule, Family: IPv4, Chain: chainForward, Rule: Rule{Verdict: Drop}}}, nil},
		{"deleting a handle the chain does not have", []Op{{Kind: OpDelRule, Family: IPv4, Chain: chainForward, Rule: Rule{Handle: 999999}}}, nil},
		{"deleting without a handle", []Op{{Kind: OpDelRule, Family: IPv4, Chain: chainForward, Rule: fwd.Rules[0]}}, nil},
		{"a rule in a chain that is not there", []Op{{Kind: OpAddRule, Family: IPv4, Chain: "nope", Rule: Rule{Verdict: Drop}}}, map[int]uint64{0: 1}},
		{"elements of a set that is not there", []Op{{Kind: OpAddElements, Family: IPv4, Set: Set{Name: "nope", Type: SetAddr, Elements: []string{"10.0.0.1"}}}}, nil},
		{"an element that does not parse", []Op{{Kind: OpAddElements, Family: IPv4, Set: Set{Name: setHosts, Type: SetAddr, Elements: []string{"not an address"}}}}, nil},
		{"a table that is not there", []Op{{Kind: OpAddSet, Family: IPv6, Set: Set{Name: "x", Type: SetAddr}}}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.name == "deleting without a handle" {
				tc.ops[0].Rule.Handle = 0
			}
			if _, ok := nft.AfterOps(cur, tc.ops, tc.handles); ok {
				t.Errorf("nft.AfterOps claims to know the result of %q", opStrings(tc.ops))
			}
		})
	}
}

// renderFmt is Rule.Render as it was written with fmt: the reference the
// quicker rendering must equal.
func renderFmt(r Rule, f Family) string {
	dir := func(in bool, a, b string) string {
		if in {
			return a
		}
		return b
	}
	var parts []string
	for _, m := range r.Matches {
		neg := ""
		if m.Negate {
			neg = "!= "
		}
		var s string
		switch m.Kind {
		case MatchCtEstablished:
			s = "ct state established,related"
		case MatchCtDNAT:
			s = "ct status dnat"
		case MatchIfname:
			v := m.Value
			if m.Prefix {
				v += "*"
			}
			s = fmt.Sprintf("%s %s%q", dir(m.In, "iifname", "oifname"), neg, v)
		case MatchIfnameSet:
			s = fmt.Sprintf("%s %s@%s", dir(m.In, "iifname", "oifname"), neg, m.Value)
		case MatchAddrSet:
			s = fmt.Sprintf("%s %s %s@%s", f, dir(m.In, "saddr", "daddr"), neg, m.Value)
		case MatchMark:
			op := "!="
			if m.Negate {
				op = "=="
			}
			s = fmt.Sprintf("meta mark & 0x%08x %s 0", m.Mark, op)
		case MatchL4Proto:
			s = fmt.Sprintf("meta l4proto %s%d", neg, m.Proto)
		case MatchPort:
			v := fmt.Sprint(m.Min)
			if m.Max != m.Min {
				v = fmt.Sprintf("%d-%d", m.Min, m.Max)
			}
			s = fmt.Sprintf("th %s %s%s", dir(m.In, "sport", "dport"), neg, v)
		case MatchICMPType, MatchICMPCode:
			proto, field := "icmp", "type"
			if f == IPv6 {
				proto = "icmpv6"
			}
			if m.Kind == MatchICMPCode {
				field = "code"
			}
			s = fmt.Sprintf("%s %s %d", proto, field, m.Proto)
		}
		parts = append(parts, s)
	}
	parts = append(parts, "counter")
	if r.SetMark != 0 || r.ClearMark != 0 {
		parts = append(parts, fmt.Sprintf("meta mark set mark & 0x%08x | 0x%08x", ^(r.SetMark|r.ClearMark), r.SetMark))
	}
	if r.LogPrefix != "" {
		parts = append(parts, fmt.Sprintf("log prefix %q", r.LogPrefix))
	}
	switch r.Verdict {
	case Accept:
		parts = append(parts, "accept")
	case Drop:
		parts = append(parts, "drop")
	case Return:
		parts = append(parts, "return")
	case Jump:
		parts = append(parts, "jump "+r.Target)
	case Masquerade:
		parts = append(parts, "masquerade")
	case Goto:
		parts = append(parts, "goto "+r.Target)
	}
	if c := nft.ClipComment(r.Comment); c != "" {
		parts = append(parts, fmt.Sprintf("comment %q", c))
	}
	return strings.Join(parts, " ")
}

// TestRenderMatchesFmt: Render, written without fmt for speed, says what
// the fmt version said for every kind of match and statement, and quotes
// what needs quoting.
func TestRenderMatchesFmt(t *testing.T) {
	rules := []Rule{
		{Matches: []Match{{Kind: MatchCtEstablished}}, Verdict: Accept, Comment: "replies"},
		{Matches: []Match{{Kind: MatchCtDNAT}}, Verdict: Return},
		{Matches: []Match{{Kind: MatchIfname, In: true, Value: "cali", Prefix: true}, {Kind: MatchIfnameSet, In: true, Value: setWorkloads, Negate: true}}, Verdict: Drop},
		{Matches: []Match{{Kind: MatchIfname, Value: "cali0123456789a", Negate: true}}, Verdict: Jump, Target: "in-abc"},
		{Matches: []Match{{Kind: MatchAddrSet, In: true, Value: "pools"}, {Kind: MatchAddrSet, Value: "nat-pools", Negate: true}}, Verdict: Masquerade},
		{Matches: []Match{{Kind: MatchMark, Mark: markAccept}, {Kind: MatchMark, Mark: markBits, Negate: true}}, ClearMark: markBits, Verdict: Return},
		{Matches: []Match{{Kind: MatchL4Proto, Proto: 6}, {Kind: MatchPort, Min: 80, Max: 80}, {Kind: MatchPort, In: true, Min: 1000, Max: 2000, Negate: true}}, SetMark: markAccept, Verdict: Return},
		{Matches: []Match{{Kind: MatchL4Proto, Proto: 17, Negate: true}}, Verdict: Goto, Target: "out-x"},
		{Matches: []Match{{Kind: MatchL4Proto, Proto: 1}, {Kind: MatchICMPType, Proto: 8}, {Kind: MatchICMPCode, Proto: 0}}, Verdict: Drop},
		{LogPrefix: "calico-cnm p1 ", Verdict: Continue, Comment: `a "quoted" \ comment`},
		{Verdict: Drop, Comment: "ünïcode and a tab\t" + strings.Repeat("x", 200)},
		{Matches: []Match{{Kind: MatchIfname, Value: "we\"ird\x01"}}, Verdict: Accept},
	}
	for _, f := range []Family{IPv4, IPv6} {
		for i, r := range rules {
			if got, want := r.Render(f), renderFmt(r, f); got != want {
				t.Errorf("%s rule %d:\n got %s\nwant %s", f, i, got, want)
			}
		}
	}
}

// TestDiffFromFollowsTheCalculator: random changes through the
// Calculator, each Ruleset it hands out planned with nft.DiffFrom against
// the previous one (which skips the chains handed out unchanged and
// compares only what differs in the others) and applied to a model of the
// kernel (nft.AfterOps): the model is always exactly the Ruleset, as a
// plan against the whole tables (Diff) finds. It fails if the Calculator
// changed a slice it handed out, or if DiffFrom missed a change.
func TestDiffFromFollowsTheCalculator(t *testing.T) {
	for seed := uint64(1); seed <= 30; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			g, s, ss := startCalcGen(t, seed)
			var kernel Ruleset
			var applied *Ruleset
			next := uint64(1)
			for burst := 0; burst < 60; burst++ {
				g.burst(s, ss)
				want, _ := ss.calculator(s).CompleteDeferredWork()
				ops := nft.DiffFrom(TableName, kernel, applied, want)
				handles := handlesFrom(ops, next)
				next += uint64(len(handles))
				after, ok := nft.AfterOps(kernel, ops, handles)
				if !ok {
					t.Fatalf("burst %d: AfterOps cannot follow the plan %v", burst, ops)
				}
				if rest := Diff(after, want); len(rest) > 0 {
					t.Fatalf("burst %d: after DiffFrom's plan the tables still differ from the Ruleset: %v\nplan: %v", burst, rest, ops)
				}
				kernel, applied = after, &want
			}
		})
	}
}
