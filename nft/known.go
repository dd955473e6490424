package nft

import (
	"net/netip"
	"slices"
)

// AfterOps is the tables cur (in Dump's shape: each chain's rules in
// Rules, with their handles) once the kernel has applied ops, in the same
// shape: what NFT keeps as the kernel's state instead of reading it back
// after every change. handles are the kernel's handles of the rules the
// OpAddRule ops created, by index in ops. ok is false when the result
// cannot be told exactly (a rule's handle is missing, an op refers to
// something cur does not have): the caller then reads the kernel.
//
// cur is not changed: the chains and sets ops touch are copied.
func AfterOps(cur Ruleset, ops []Op, handles map[int]uint64) (Ruleset, bool) {
	tables := map[Family]*Table{}
	var order []Family
	for _, t := range cur.Tables {
		t := t
		t.Sets, t.Chains = slices.Clone(t.Sets), slices.Clone(t.Chains)
		tables[t.Family] = &t
		order = append(order, t.Family)
	}
	// copiedChain: the chains already copied (their rule slices are this
	// function's own to change). Sets are replaced whole, never changed.
	copiedChain := map[Family]map[string]bool{}
	for i, op := range ops {
		t := tables[op.Family]
		if t == nil && op.Kind != OpAddTable {
			return Ruleset{}, false
		}
		switch op.Kind {
		case OpAddTable:
			if t == nil {
				tables[op.Family] = &Table{Family: op.Family}
				order = append(order, op.Family)
			}
		case OpDelTable:
			delete(tables, op.Family)
			order = slices.DeleteFunc(order, func(f Family) bool { return f == op.Family })
			delete(copiedChain, op.Family)
		case OpAddSet, OpDelSet, OpFlushSet, OpAddElements, OpDelElements:
			if !applySetOp(t, op) {
				return Ruleset{}, false
			}
		case OpAddChain, OpDelChain, OpFlushChain, OpAddRule, OpDelRule:
			if !applyChainOp(t, op, copiedChain, handles[i]) {
				return Ruleset{}, false
			}
		default:
			return Ruleset{}, false
		}
	}
	var out Ruleset
	for _, f := range order {
		out.Tables = append(out.Tables, *tables[f])
	}
	return out, true
}

func mark(m map[Family]map[string]bool, f Family, name string) {
	if m[f] == nil {
		m[f] = map[string]bool{}
	}
	m[f][name] = true
}

// changeRules applies a flush, append or delete to c's rules (all in
// Rules, as dumped).
func changeRules(c *Chain, op Op, handle uint64) bool {
	switch op.Kind {
	case OpFlushChain:
		c.Rules = nil
	case OpAddRule:
		if handle == 0 {
			return false
		}
		r := op.Rule
		r.Handle, r.Packets, r.Bytes, r.Comment = handle, 0, 0, ClipComment(r.Comment)
		c.Rules = append(c.Rules, r.WithText(op.Family))
	case OpDelRule:
		j := slices.IndexFunc(c.Rules, func(r Rule) bool { return r.Handle == op.Rule.Handle })
		if j < 0 || op.Rule.Handle == 0 {
			return false
		}
		c.Rules = slices.Delete(c.Rules, j, j+1)
	}
	return true
}

// changedSet is s after a flush, an add or a delete of elements, in the
// canonical form Dump reads.
func changedSet(op Op, s Set) (Set, bool) {
	switch op.Kind {
	case OpFlushSet:
		s.Elements = nil
		return s, true
	case OpAddElements:
		return canonicalSet(op.Family, s, op.Set.Elements)
	}
	gone := map[string]bool{}
	for _, e := range op.Set.Elements {
		gone[e] = true
	}
	if s.Interval {
		// Diff deletes whole ranges (rangeChanges); anything else cannot
		// be told here.
		cur, err1 := ParseIntervalElements(s.Elements)
		del, err2 := ParseIntervalElements(op.Set.Elements)
		if err1 != nil || err2 != nil {
			return s, false
		}
		for _, d := range del {
			n := len(cur)
			cur = slices.DeleteFunc(cur, func(r AddrRange) bool { return r == d })
			if len(cur) == n {
				return s, false
			}
		}
		s.Elements = RangesElements(cur)
		if len(s.Elements) == 0 {
			s.Elements = nil
		}
		return s, true
	}
	s.Elements = slices.DeleteFunc(slices.Clone(s.Elements), func(e string) bool { return gone[e] })
	return s, true
}

// canonicalSet is s with more elements, canonical as Dump reads them
// (sorted addresses, merged ranges, sorted names).
func canonicalSet(f Family, s Set, more []string) (Set, bool) {
	all := append(slices.Clone(s.Elements), more...)
	switch {
	case s.Type == SetIfname:
		s.Elements = SortedUnique(all)
	case s.Type != SetAddr:
		return s, false
	case s.Interval:
		rs, err := ParseIntervalElements(all)
		if err != nil {
			return s, false
		}
		s.Elements = RangesElements(rs)
	default:
		as := make([]netip.Addr, 0, len(all))
		for _, e := range all {
			a, err := netip.ParseAddr(e)
			if err != nil || FamilyOf(a) != f {
				return s, false
			}
			as = append(as, a.Unmap())
		}
		s.Elements = AddrElements(as)
	}
	if len(s.Elements) == 0 {
		s.Elements = nil
	}
	return s, true
}

// applySetOp is AfterOps for an operation on a set of t.
func applySetOp(t *Table, op Op) bool {
	switch op.Kind {
	case OpAddSet:
		if _, ok := t.Set(op.Set.Name); ok {
			return false
		}
		s, ok := canonicalSet(op.Family, op.Set, nil)
		if !ok {
			return false
		}
		s.Comment = "" // Dump does not read it back
		t.Sets = append(t.Sets, s)
	case OpDelSet:
		t.Sets = slices.DeleteFunc(t.Sets, func(s Set) bool { return s.Name == op.Set.Name })
	default: // OpFlushSet, OpAddElements, OpDelElements
		j := slices.IndexFunc(t.Sets, func(s Set) bool { return s.Name == op.Set.Name })
		if j < 0 {
			return false
		}
		s, ok := changedSet(op, t.Sets[j])
		if !ok {
			return false
		}
		t.Sets[j] = s
	}
	return true
}

// applyChainOp is AfterOps for an operation on a chain of t; copied are
// the chains whose rule slices AfterOps owns already, handle the kernel's
// handle of an added rule.
func applyChainOp(t *Table, op Op, copied map[Family]map[string]bool, handle uint64) bool {
	switch op.Kind {
	case OpAddChain:
		if _, ok := t.Chain(op.ChainDef.Name); !ok {
			t.Chains = append(t.Chains, Chain{Name: op.ChainDef.Name, Base: op.ChainDef.Base})
			mark(copied, op.Family, op.ChainDef.Name)
		}
	case OpDelChain:
		t.Chains = slices.DeleteFunc(t.Chains, func(c Chain) bool { return c.Name == op.Chain })
		delete(copied[op.Family], op.Chain)
	default: // OpFlushChain, OpAddRule, OpDelRule
		j := slices.IndexFunc(t.Chains, func(c Chain) bool { return c.Name == op.Chain })
		if j < 0 {
			return false
		}
		c := &t.Chains[j]
		if !copied[op.Family][op.Chain] {
			c.Rules, c.Unordered = slices.Clone(c.Rules), nil
			mark(copied, op.Family, op.Chain)
		}
		return changeRules(c, op, handle)
	}
	return true
}
