package nft

import (
	"net/netip"
	"slices"
	"testing"
)

func TestRangeChanges(t *testing.T) {
	tests := []struct {
		name        string
		cur, want   []string
		gone, added []string
	}{
		{"same", []string{"10.0.0.0/24"}, []string{"10.0.0.0/24"}, nil, nil},
		{"one added apart", []string{"10.0.0.0/24"}, []string{"10.0.0.0/24", "10.0.5.0/24"}, nil, []string{"10.0.5.0/24"}},
		{"one removed", []string{"10.0.0.0/24", "10.0.5.0/24"}, []string{"10.0.5.0/24"}, []string{"10.0.0.0/24"}, nil},
		// A network touching a kept range merges with it: the old range
		// goes, the merged one comes.
		{"adjacent merges", []string{"10.0.0.0/24"}, []string{"10.0.0.0/23"}, []string{"10.0.0.0/24"}, []string{"10.0.0.0/23"}},
		{"split", []string{"10.0.0.0/23"}, []string{"10.0.1.0/24"}, []string{"10.0.0.0/23"}, []string{"10.0.1.0/24"}},
		{"to empty", []string{"10.0.0.1/32"}, nil, []string{"10.0.0.1/32"}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			gone, added, ok := rangeChanges(tc.cur, tc.want)
			if !ok || !slices.Equal(gone, tc.gone) || !slices.Equal(added, tc.added) {
				t.Errorf("gone %v added %v ok %v; want %v %v", gone, added, ok, tc.gone, tc.added)
			}
		})
	}
	if _, _, ok := rangeChanges([]string{"nope"}, nil); ok {
		t.Errorf("an unparsable element did not ask for a rewrite")
	}
}

// TestSetChanges: what leaves and comes between two canonical element
// lists, with the common head and tail skipped.
func TestSetChanges(t *testing.T) {
	tests := []struct {
		name              string
		cur, want         []string
		wantGone, wantAdd []string
	}{
		{"equal", []string{"a", "b", "c"}, []string{"a", "b", "c"}, nil, nil},
		{"one added inside", []string{"a", "b", "d"}, []string{"a", "b", "c", "d"}, nil, []string{"c"}},
		{"one gone inside", []string{"a", "b", "c", "d"}, []string{"a", "c", "d"}, []string{"b"}, nil},
		{"added at the ends", []string{"b"}, []string{"a", "b", "c"}, nil, []string{"a", "c"}},
		{"replaced", []string{"a", "b", "c"}, []string{"a", "x", "c"}, []string{"b"}, []string{"x"}},
		{"from empty", nil, []string{"a", "b"}, nil, []string{"a", "b"}},
		{"to empty", []string{"a", "b"}, nil, []string{"a", "b"}, nil},
		{"shifted", []string{"a", "b", "c", "d"}, []string{"b", "c", "d", "e"}, []string{"a"}, []string{"e"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			gone, added := setChanges(tc.cur, tc.want)
			if !slices.Equal(gone, tc.wantGone) || !slices.Equal(added, tc.wantAdd) {
				t.Errorf("gone %q added %q; want %q %q", gone, added, tc.wantGone, tc.wantAdd)
			}
		})
	}
}

func TestIntervalElements(t *testing.T) {
	p := netip.MustParsePrefix
	tests := []struct {
		in   []netip.Prefix
		want []string
	}{
		{nil, nil},
		{[]netip.Prefix{p("192.168.0.0/16")}, []string{"192.168.0.0/16"}},
		// Adjacent halves merge; a contained prefix disappears.
		{[]netip.Prefix{p("10.128.0.0/9"), p("10.0.0.0/9"), p("10.1.0.0/16")}, []string{"10.0.0.0/8"}},
		// Adjacent but not alignable: the minimal cover of the range.
		{[]netip.Prefix{p("10.0.1.0/24"), p("10.0.2.0/24")}, []string{"10.0.1.0/24", "10.0.2.0/24"}},
		{[]netip.Prefix{p("10.0.0.0/24"), p("10.0.1.0/24"), p("10.0.2.0/24")}, []string{"10.0.0.0/23", "10.0.2.0/24"}},
		// Host bits are ignored; the top of the space works.
		{[]netip.Prefix{p("255.255.255.0/24"), p("fd00::1/64")}, []string{"255.255.255.0/24", "fd00::/64"}},
	}
	for _, tc := range tests {
		if got := IntervalElements(tc.in); !slices.Equal(got, tc.want) {
			t.Errorf("IntervalElements(%v) = %v, want %v", tc.in, got, tc.want)
		}
	}
}

// TestIntervalRoundTrip: the elements written for an interval set read
// back as the same canonical list (what Dump relies on).
func TestIntervalRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		f     Family
		elems []string
	}{
		{IPv4, []string{"10.0.0.0/23", "10.0.2.0/24", "192.168.0.0/16"}},
		{IPv4, []string{"255.255.255.0/24"}},
		{IPv6, []string{"fd00::/64", "ffff:ffff:ffff:ffff::/64"}},
	} {
		s := Set{Name: "pools", Type: SetAddr, Interval: true, Elements: tc.elems}
		kernel, err := setElements(tc.f, s)
		if err != nil {
			t.Fatal(err)
		}
		// The kernel lists them in its own (reverse) order.
		slices.Reverse(kernel)
		got := RangesElements(elementsToRanges(tc.f, kernel))
		if !slices.Equal(got, tc.elems) {
			t.Errorf("%v read back as %v", tc.elems, got)
		}
	}
	// A mismatched family is refused, not written.
	if _, err := setElements(IPv4, Set{Name: "pools", Type: SetAddr, Interval: true, Elements: []string{"fd00::/64"}}); err == nil {
		t.Error("an IPv6 prefix was accepted for the ip table")
	}
	if _, err := setElements(IPv4, Set{Name: "w", Type: SetIfname, Elements: []string{"cali0123456789abcdef"}}); err == nil {
		t.Error("an over-long interface name was accepted")
	}
}

// TestDiffChainMultiset: the unordered rules are compared as a multiset,
// duplicates included, whether their texts are remembered (WithText) or
// rendered; extra copies are deleted by handle, missing ones appended.
func TestDiffChainMultiset(t *testing.T) {
	head := Rule{Matches: []Match{{Kind: MatchCtEstablished}}, Verdict: Accept}
	a := Rule{Matches: []Match{{Kind: MatchIfname, Value: "calia"}}, Verdict: Drop}
	b := Rule{Matches: []Match{{Kind: MatchIfname, Value: "calib"}}, Verdict: Drop}
	h := func(r Rule, handle uint64, remembered bool) Rule {
		r.Handle = handle
		if remembered {
			r = r.WithText(IPv4)
		}
		return r
	}
	tests := []struct {
		name        string
		cur         []Rule
		want        []Rule
		wantDeleted []uint64
		wantAdded   int
		rewrite     bool
	}{
		{name: "equal", cur: []Rule{h(head, 1, true), h(a, 2, true), h(b, 3, false)}, want: []Rule{b, a}},
		{name: "a duplicate too many", cur: []Rule{h(head, 1, false), h(a, 2, true), h(a, 3, true), h(a, 4, false)}, want: []Rule{a, a}, wantDeleted: []uint64{2}},
		{name: "every copy extra", cur: []Rule{h(head, 1, false), h(a, 2, true), h(a, 3, false)}, want: []Rule{b}, wantDeleted: []uint64{2, 3}, wantAdded: 1},
		{name: "a copy missing", cur: []Rule{h(head, 1, false), h(a, 5, true)}, want: []Rule{a, a, b}, wantAdded: 2},
		{name: "an extra rule without a handle", cur: []Rule{h(head, 1, false), h(a, 0, false)}, want: nil, rewrite: true},
		{name: "the ordered head differs", cur: []Rule{h(a, 1, true)}, want: []Rule{a}, rewrite: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ops := diffChain(IPv4, Chain{Name: "c", Rules: tc.cur}, Chain{Name: "c", Rules: []Rule{head}, Unordered: tc.want}, nil)
			var deleted []uint64
			added, flushed := 0, false
			for _, op := range ops {
				switch op.Kind {
				case OpDelRule:
					deleted = append(deleted, op.Rule.Handle)
				case OpAddRule:
					added++
				case OpFlushChain:
					flushed = true
				}
			}
			if flushed != tc.rewrite {
				t.Fatalf("rewrite = %v, want %v: %q", flushed, tc.rewrite, ops)
			}
			if tc.rewrite {
				return
			}
			if !slices.Equal(deleted, tc.wantDeleted) || added != tc.wantAdded {
				t.Errorf("deleted %v, added %d; want %v, %d: %q", deleted, added, tc.wantDeleted, tc.wantAdded, ops)
			}
		})
	}
}

// TestDiffTables: the plan between two rulesets, table-driven: in-place
// changes where the kernel allows them, a chain deleted before the chains
// it jumps to, a table rewritten when a base chain changes, and only the
// named table in every op.
func TestDiffTables(t *testing.T) {
	dnat := func(port uint16) Rule {
		return Rule{Matches: []Match{{Kind: MatchL4Proto, Proto: 6}, {Kind: MatchPort, Min: port, Max: port}}, Verdict: DNAT, NATAddr: netip.MustParseAddr("10.0.0.5"), NATPort: 80}
	}
	jumpTo := func(target string) Rule { return Rule{Verdict: Jump, Target: target} }
	base := &BaseChain{Type: "nat", Hook: "prerouting", Priority: -100}
	table := func(pub []Rule, extra ...Chain) Ruleset {
		chains := append([]Chain{{Name: "pre", Base: base, Rules: []Rule{jumpTo("pub")}}, {Name: "pub", Unordered: pub}}, extra...)
		return Ruleset{Tables: []Table{{Family: IPv4, Sets: []Set{{Name: "s", Type: SetAddr, Elements: []string{"10.0.0.1"}}}, Chains: chains}}}
	}
	// dumped is rs as the kernel lists it once written from nothing:
	// every rule in Rules, with a handle.
	dumped := func(rs Ruleset) Ruleset {
		ops := Diff("t", Ruleset{}, rs)
		handles := map[int]uint64{}
		for i, op := range ops {
			if op.Kind == OpAddRule {
				handles[i] = uint64(11 + len(handles))
			}
		}
		out, ok := AfterOps(Ruleset{}, ops, handles)
		if !ok {
			t.Fatalf("cannot tell the tables after writing %q", ops)
		}
		return out
	}
	hooked := table(nil)
	hooked.Tables[0].Chains[0].Base = &BaseChain{Type: "nat", Hook: "output", Priority: -100}
	withSet := table(nil)
	withSet.Tables[0].Sets[0].Elements = []string{"10.0.0.1", "10.0.0.2"}
	for _, tc := range []struct {
		name      string
		cur, want Ruleset
		plan      []string
	}{
		{"in sync", table([]Rule{dnat(1)}), table([]Rule{dnat(1)}), nil},
		{"a rule added", table([]Rule{dnat(1)}), table([]Rule{dnat(1), dnat(2)}),
			[]string{"add rule ip t pub meta l4proto 6 th dport 2 counter dnat to 10.0.0.5:80"}},
		{"a rule deleted by handle", table([]Rule{dnat(1), dnat(2)}), table([]Rule{dnat(2)}),
			[]string{"delete rule ip t pub handle 12 # meta l4proto 6 th dport 1 counter dnat to 10.0.0.5:80"}},
		{"an element added", table(nil), withSet, []string{"add element ip t s { 10.0.0.2 }"}},
		{"a referring chain deleted before its target", table(nil, Chain{Name: "a", Rules: []Rule{{Verdict: Accept}}}, Chain{Name: "b", Rules: []Rule{jumpTo("a")}}), table(nil),
			[]string{"delete chain ip t b", "delete chain ip t a"}},
		{"a base chain's hook changed: the table rewritten", table(nil), hooked, []string{"add table ip t", "delete table ip t", "add table ip t",
			"add ip t set s { type ipv4_addr; elements = { 10.0.0.1 } }", "add ip t chain pre { type nat hook output priority -100; policy accept; }",
			"add ip t chain pub", "add rule ip t pre counter jump pub"}},
		{"a table no longer wanted", table(nil), Ruleset{}, []string{"delete table ip t"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, op := range Diff("t", dumped(tc.cur), tc.want) {
				got = append(got, op.String())
			}
			if !slices.Equal(got, tc.plan) {
				t.Errorf("plan\n%q\nwant\n%q", got, tc.plan)
			}
		})
	}
}
