package nft

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
)

// OpKind is one kind of change to the project's tables.
type OpKind int

// Changes, in the order a batch applies them (see Diff).
const (
	OpAddTable OpKind = iota + 1
	OpDelTable
	OpAddSet      // Set, with its elements
	OpDelSet      // Set.Name
	OpFlushSet    // Set.Name
	OpAddElements // Set.Name, Set.Elements = the ones to add
	OpDelElements // Set.Name, Set.Elements = the ones to delete
	OpAddChain    // ChainDef (without rules)
	OpDelChain    // Chain
	OpFlushChain  // Chain
	OpAddRule     // Chain, Rule (appended)
	OpDelRule     // Chain, Rule (its Handle)
)

// Op is one change; a plan is a list of them applied as one netlink batch,
// i.e. atomically.
type Op struct {
	Kind     OpKind
	Table    string // the table's name (the family's table of that name)
	Family   Family
	Set      Set
	Chain    string
	ChainDef Chain
	Rule     Rule
}

func (o Op) String() string {
	t := string(o.Family) + " " + o.Table
	switch o.Kind {
	case OpAddTable:
		return "add table " + t
	case OpDelTable:
		return "delete table " + t
	case OpAddSet:
		return fmt.Sprintf("add %s %s", t, o.Set.render(o.Family))
	case OpDelSet:
		return fmt.Sprintf("delete set %s %s", t, o.Set.Name)
	case OpFlushSet:
		return fmt.Sprintf("flush set %s %s", t, o.Set.Name)
	case OpAddElements:
		return fmt.Sprintf("add element %s %s { %s }", t, o.Set.Name, strings.Join(o.Set.Elements, ", "))
	case OpDelElements:
		return fmt.Sprintf("delete element %s %s { %s }", t, o.Set.Name, strings.Join(o.Set.Elements, ", "))
	case OpAddChain:
		return fmt.Sprintf("add %s %s", t, o.ChainDef.header())
	case OpDelChain:
		return fmt.Sprintf("delete chain %s %s", t, o.Chain)
	case OpFlushChain:
		return fmt.Sprintf("flush chain %s %s", t, o.Chain)
	case OpAddRule:
		return fmt.Sprintf("add rule %s %s %s", t, o.Chain, o.Rule.Render(o.Family))
	case OpDelRule:
		return fmt.Sprintf("delete rule %s %s handle %d # %s", t, o.Chain, o.Rule.Handle, o.Rule.Render(o.Family))
	}
	return fmt.Sprintf("<op %d>", o.Kind)
}

// Diff is the plan that turns the tables called name in cur (as dumped: each chain's
// rules all in Rules, with handles) into want. Only the project's tables
// appear in either. An empty plan means cur already is want.
//
// Changes are made in place where the kernel allows it, so that an
// endpoint's join adds its rules and set elements and its leave deletes
// exactly those: rules are appended or deleted by handle, elements added
// or deleted. A table whose structure differs (a base chain's hook, a set's
// type) is replaced as a whole instead, in the same batch.
func Diff(name string, cur, want Ruleset) []Op { return DiffFrom(name, cur, nil, want) }

// DiffFrom is Diff knowing that cur is what applying the plan to applied
// (nil: unknown) left in the kernel: a chain whose rules are the very
// slices applied had is left alone, and one whose unordered rules changed
// is changed by what differs between applied's and want's, without
// comparing every rule of cur. The Calculator hands out the unchanged
// parts of the tables as the same slices, so that a Join among a thousand
// endpoints costs the plan of its own rules.
func DiffFrom(name string, cur Ruleset, applied *Ruleset, want Ruleset) []Op {
	var ops []Op
	for _, w := range want.sortedTables() {
		c, ok := cur.Table(w.Family)
		var prev *Table
		if applied != nil {
			if p, ok := applied.Table(w.Family); ok {
				prev = &p
			}
		}
		switch {
		case !ok:
			ops = append(ops, ReplaceTable(name, w, false)...)
		case needsReplace(c, w):
			ops = append(ops, ReplaceTable(name, w, true)...)
		default:
			ops = append(ops, diffTable(c, w, prev)...)
		}
	}
	for _, c := range cur.sortedTables() {
		if _, ok := want.Table(c.Family); !ok {
			ops = append(ops, Op{Kind: OpDelTable, Family: c.Family})
		}
	}
	for i := range ops {
		ops[i].Table = name
	}
	return ops
}

// ReplaceTable is the plan that writes t from scratch. With exists, the
// old table is deleted first; the add before the delete makes that work
// even if it is gone by now (nft's own idiom), and being one batch, no
// packet ever sees the table half-built.
func ReplaceTable(name string, t Table, exists bool) []Op {
	f := t.Family
	var ops []Op
	if exists {
		ops = append(ops, Op{Kind: OpAddTable, Family: f}, Op{Kind: OpDelTable, Family: f})
	}
	ops = append(ops, Op{Kind: OpAddTable, Family: f})
	for _, s := range sortedSets(t.Sets) {
		ops = append(ops, Op{Kind: OpAddSet, Family: f, Set: s})
	}
	chains := sortedChains(t.Chains)
	for _, c := range chains {
		ops = append(ops, Op{Kind: OpAddChain, Family: f, ChainDef: Chain{Name: c.Name, Base: c.Base}})
	}
	for _, c := range chains {
		for _, r := range ChainRules(c) {
			ops = append(ops, Op{Kind: OpAddRule, Family: f, Chain: c.Name, Rule: r})
		}
	}
	for i := range ops {
		ops[i].Table = name
	}
	return ops
}

// ChainRules is the order rules are written in: the ordered ones, then the
// unordered ones sorted (deterministic plans).
func ChainRules(c Chain) []Rule {
	un := slices.Clone(c.Unordered)
	slices.SortFunc(un, func(a, b Rule) int { return strings.Compare(a.Render(""), b.Render("")) })
	return append(slices.Clone(c.Rules), un...)
}

func sortedSets(ss []Set) []Set {
	ss = slices.Clone(ss)
	slices.SortFunc(ss, func(a, b Set) int { return strings.Compare(a.Name, b.Name) })
	return ss
}

func sortedChains(cs []Chain) []Chain {
	cs = slices.Clone(cs)
	slices.SortFunc(cs, func(a, b Chain) int { return strings.Compare(a.Name, b.Name) })
	return cs
}

// needsReplace: a set or chain the kernel cannot change in place.
func needsReplace(cur, want Table) bool {
	for _, w := range want.Sets {
		if c, ok := cur.Set(w.Name); ok && (c.Type != w.Type || c.Interval != w.Interval) {
			return true
		}
	}
	for _, w := range want.Chains {
		c, ok := cur.Chain(w.Name)
		if !ok {
			continue
		}
		if (c.Base == nil) != (w.Base == nil) || (c.Base != nil && *c.Base != *w.Base) {
			return true
		}
	}
	return false
}

func diffTable(cur, want Table, prev *Table) []Op {
	f := want.Family
	var adds, elems, chainAdds, rules, chainDels, setDels []Op
	curSets, curChains := byName(cur.Sets, func(s Set) string { return s.Name }), byName(cur.Chains, func(c Chain) string { return c.Name })
	wantSets, wantChains := byName(want.Sets, func(s Set) string { return s.Name }), byName(want.Chains, func(c Chain) string { return c.Name })
	var prevChains map[string]*Chain
	if prev != nil {
		prevChains = make(map[string]*Chain, len(prev.Chains))
		for i := range prev.Chains {
			prevChains[prev.Chains[i].Name] = &prev.Chains[i]
		}
	}

	for _, w := range sortedSets(want.Sets) {
		c, ok := curSets[w.Name]
		if !ok {
			adds = append(adds, Op{Kind: OpAddSet, Family: f, Set: w})
			continue
		}
		if slices.Equal(c.Elements, w.Elements) {
			continue
		}
		ref := Set{Name: w.Name, Type: w.Type, Interval: w.Interval}
		var gone, added []string
		if w.Interval {
			var ok bool
			if gone, added, ok = rangeChanges(c.Elements, w.Elements); !ok {
				elems = append(elems, Op{Kind: OpFlushSet, Family: f, Set: ref})
				gone, added = nil, w.Elements
			}
		} else {
			gone, added = setChanges(c.Elements, w.Elements)
		}
		if len(gone) > 0 {
			r := ref
			r.Elements = gone
			elems = append(elems, Op{Kind: OpDelElements, Family: f, Set: r})
		}
		if len(added) > 0 {
			r := ref
			r.Elements = added
			elems = append(elems, Op{Kind: OpAddElements, Family: f, Set: r})
		}
	}

	for _, w := range sortedChains(want.Chains) {
		c, ok := curChains[w.Name]
		if !ok {
			chainAdds = append(chainAdds, Op{Kind: OpAddChain, Family: f, ChainDef: Chain{Name: w.Name, Base: w.Base}})
			for _, r := range ChainRules(w) {
				rules = append(rules, Op{Kind: OpAddRule, Family: f, Chain: w.Name, Rule: r})
			}
			continue
		}
		rules = append(rules, diffChain(f, c, w, prevChains[w.Name])...)
	}
	for _, c := range sortedChains(cur.Chains) {
		if _, ok := wantChains[c.Name]; !ok {
			chainDels = append(chainDels, Op{Kind: OpDelChain, Family: f, Chain: c.Name})
		}
	}
	// A chain goes before the chains it jumps to (the kernel refuses to
	// delete a chain a rule still refers to).
	height := jumpHeights(cur, chainDels)
	slices.SortStableFunc(chainDels, func(a, b Op) int { return height[b.Chain] - height[a.Chain] })
	for _, c := range sortedSets(cur.Sets) {
		if _, ok := wantSets[c.Name]; !ok {
			setDels = append(setDels, Op{Kind: OpDelSet, Family: f, Set: Set{Name: c.Name}})
		}
	}
	// Order matters within the batch: sets and chains exist before rules
	// refer to them; rules that jump to a chain or look up a set are gone
	// before it is deleted (deleting a chain takes its own rules along).
	var ops []Op
	for _, part := range [][]Op{adds, elems, chainAdds, rules, chainDels, setDels} {
		ops = append(ops, part...)
	}
	return ops
}

// diffChain: the ordered head must match exactly (otherwise the chain is
// rewritten); the unordered rest is compared as a multiset, deleting the
// extra rules by handle and appending the missing ones. prev (nil: none)
// is the chain as last applied, cur being what that left.
func diffChain(f Family, cur, want Chain, prev *Chain) []Op {
	if prev != nil && SameSlice(prev.Rules, want.Rules) && SameSlice(prev.Unordered, want.Unordered) {
		return nil // cur is what applying want's very rules left
	}
	n := len(cur.Rules) + len(cur.Unordered)
	at := func(i int) *Rule { // the i-th rule of cur, without copying them all
		if i < len(cur.Rules) {
			return &cur.Rules[i]
		}
		return &cur.Unordered[i-len(cur.Rules)]
	}
	rewrite := func() []Op {
		ops := []Op{{Kind: OpFlushChain, Family: f, Chain: want.Name}}
		for _, r := range ChainRules(want) {
			ops = append(ops, Op{Kind: OpAddRule, Family: f, Chain: want.Name, Rule: r})
		}
		return ops
	}
	if n < len(want.Rules) {
		return rewrite()
	}
	for i, r := range want.Rules {
		if at(i).Text(f) != r.Text(f) {
			return rewrite()
		}
	}
	// cur's head is want's; if it is as long as prev's, cur's rest holds
	// prev's unordered rules: only what differs between those and want's
	// need be looked up in cur.
	if prev != nil && len(prev.Rules) == len(want.Rules) && n == len(prev.Rules)+len(prev.Unordered) {
		if ops, ok := unorderedChanges(f, want.Name, len(want.Rules), n, at, prev.Unordered, want.Unordered); ok {
			return ops
		}
	}
	// The rest as a multiset, by rendering: the first rule of each text
	// in have (its index), further ones with the same text in dups.
	have := make(map[string]int, n-len(want.Rules))
	dups := map[string][]int{}
	for i := len(want.Rules); i < n; i++ {
		k := at(i).Text(f)
		if _, ok := have[k]; ok {
			dups[k] = append(dups[k], i)
			continue
		}
		have[k] = i
	}
	var ops []Op
	var missing []Rule
	for _, r := range want.Unordered {
		k := r.Text(f)
		if d := dups[k]; len(d) > 0 {
			dups[k] = d[1:]
			continue
		}
		if _, ok := have[k]; ok {
			delete(have, k)
			continue
		}
		missing = append(missing, r)
	}
	// Deletions first, in handle order for a deterministic plan.
	var extra []Rule
	for _, i := range have {
		extra = append(extra, *at(i)) // sorted below
	}
	for _, d := range dups {
		for _, i := range d {
			extra = append(extra, *at(i))
		}
	}
	slices.SortFunc(extra, func(a, b Rule) int {
		return cmp.Or(cmp.Compare(a.Handle, b.Handle), strings.Compare(a.Render(f), b.Render(f))) // handle 0: unaddressable, rewritten below
	})
	for _, r := range extra {
		if r.Handle == 0 {
			// Cannot address it: rewrite the chain instead.
			return rewrite()
		}
		ops = append(ops, Op{Kind: OpDelRule, Family: f, Chain: want.Name, Rule: r})
	}
	slices.SortFunc(missing, func(a, b Rule) int { return strings.Compare(a.Text(f), b.Text(f)) })
	for _, r := range missing {
		ops = append(ops, Op{Kind: OpAddRule, Family: f, Chain: want.Name, Rule: r})
	}
	return ops
}

// unorderedChanges is the plan from a chain whose rules from index head
// to n (at) hold the rules was, as a multiset, to one holding want
// instead: was and want are compared between their common head and tail
// (a Join adds one rule among a thousand), and only the rules that leave
// are looked up in the chain for their handles. ok is false when one of
// those has no handle or is not there (the caller compares everything).
func unorderedChanges(f Family, chain string, head, n int, at func(int) *Rule, was, want []Rule) ([]Op, bool) {
	i := 0
	for i < len(was) && i < len(want) && was[i].Text(f) == want[i].Text(f) {
		i++
	}
	j := 0
	for j < len(was)-i && j < len(want)-i && was[len(was)-1-j].Text(f) == want[len(want)-1-j].Text(f) {
		j++
	}
	gone, added := ruleMultisetChanges(f, was[i:len(was)-j], want[i:len(want)-j])
	var ops []Op
	var dels []Rule
	taken := map[int]bool{}
	for _, r := range gone {
		k, text := head, r.Text(f)
		for ; k < n; k++ {
			if !taken[k] && at(k).Text(f) == text {
				break
			}
		}
		if k == n || at(k).Handle == 0 {
			return nil, false
		}
		taken[k] = true
		dels = append(dels, *at(k))
	}
	slices.SortFunc(dels, func(a, b Rule) int { return cmp.Compare(a.Handle, b.Handle) })
	for _, r := range dels {
		ops = append(ops, Op{Kind: OpDelRule, Family: f, Chain: chain, Rule: r})
	}
	slices.SortFunc(added, func(a, b Rule) int { return strings.Compare(a.Text(f), b.Text(f)) })
	for _, r := range added {
		ops = append(ops, Op{Kind: OpAddRule, Family: f, Chain: chain, Rule: r})
	}
	return ops, true
}

// ruleMultisetChanges are the rules of a not in b (gone) and of b not in
// a (added), by text, counting repeats.
func ruleMultisetChanges(f Family, a, b []Rule) (gone, added []Rule) {
	count := make(map[string]int, len(a))
	for _, r := range a {
		count[r.Text(f)]++
	}
	for _, r := range b {
		if t := r.Text(f); count[t] > 0 {
			count[t]--
			continue
		}
		added = append(added, r)
	}
	for _, r := range a {
		if t := r.Text(f); count[t] > 0 {
			count[t]--
			gone = append(gone, r)
		}
	}
	return gone, added
}

// byName indexes xs by name (the first of a name, as Table.Set and
// Table.Chain find): a table's lookups in a map, not a scan each.
func byName[T any](xs []T, name func(T) string) map[string]T {
	m := make(map[string]T, len(xs))
	for _, x := range xs {
		if _, dup := m[name(x)]; !dup {
			m[name(x)] = x
		}
	}
	return m
}

// SameSlice: a and b are the very same elements (the same array and
// length), which says they are equal without comparing them.
func SameSlice[T any](a, b []T) bool {
	return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0])
}

// setChanges are the elements that leave (gone) and come (added) from cur
// to want, both canonical (sorted, no duplicates): only what lies between
// their common head and tail is compared by set, so that a join or leave
// does not build maps of every member.
func setChanges(cur, want []string) (gone, added []string) {
	i := 0
	for i < len(cur) && i < len(want) && cur[i] == want[i] {
		i++
	}
	j := 0
	for j < len(cur)-i && j < len(want)-i && cur[len(cur)-1-j] == want[len(want)-1-j] {
		j++
	}
	c, w := cur[i:len(cur)-j], want[i:len(want)-j]
	return minus(c, w), minus(w, c)
}

// minus is a \ b, in a's order.
func minus(a, b []string) []string {
	in := make(map[string]bool, len(b))
	for _, x := range b {
		in[x] = true
	}
	var out []string
	for _, x := range a {
		if !in[x] {
			out = append(out, x)
		}
	}
	return out
}

// jumpHeights is, for each chain dels deletes, the length of the longest
// path of jumps and gotos from it through other deleted chains of cur: a
// chain with a greater height refers (maybe indirectly) to those with a
// smaller one, so deleting in decreasing height never leaves a rule
// referring to a chain already gone.
func jumpHeights(cur Table, dels []Op) map[string]int {
	deleted := make(map[string]bool, len(dels))
	for _, d := range dels {
		deleted[d.Chain] = true
	}
	height := make(map[string]int, len(dels))
	var of func(name string, depth int) int
	of = func(name string, depth int) int {
		if h, ok := height[name]; ok {
			return h
		}
		h := 0
		c, _ := cur.Chain(name)
		if depth <= len(dels) { // the kernel forbids loops; never recurse forever
			for _, r := range append(slices.Clone(c.Rules), c.Unordered...) {
				if (r.Verdict == Jump || r.Verdict == Goto) && deleted[r.Target] && r.Target != name {
					h = max(h, of(r.Target, depth+1)+1)
				}
			}
		}
		height[name] = h
		return h
	}
	for _, d := range dels {
		of(d.Chain, 0)
	}
	return height
}

// rangeChanges is the change of an interval set as whole ranges: the
// kernel holds one element per merged range, so a range that is not
// exactly in both is deleted or added as a whole (a one-address change
// in a set of thousands of networks costs an element or three, not a
// rewrite). Ranges of the wanted set never touch (they are merged), so
// an added range never touches a kept one. ok is false when an element
// does not parse (the set is rewritten).
func rangeChanges(cur, want []string) (gone, added []string, ok bool) {
	cr, err1 := ParseIntervalElements(cur)
	wr, err2 := ParseIntervalElements(want)
	if err1 != nil || err2 != nil {
		return nil, nil, false
	}
	in := func(rs []AddrRange) map[AddrRange]bool {
		m := make(map[AddrRange]bool, len(rs))
		for _, r := range rs {
			m[r] = true
		}
		return m
	}
	cm, wm := in(cr), in(wr)
	var g, a []AddrRange
	for _, r := range cr {
		if !wm[r] {
			g = append(g, r)
		}
	}
	for _, r := range wr {
		if !cm[r] {
			a = append(a, r)
		}
	}
	return RangesElements(g), RangesElements(a), true
}
