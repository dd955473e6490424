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
	return afterOps(cur, ops, handles, nil, false)
}

// afterOps is AfterOps knowing more of ops, for Conn, which derives each
// known state once:
//   - want (nil: unknown) is the Ruleset ops are the plan to: a set whose
//     elements the change makes exactly want's (checked, without copying)
//     takes want's slice, which nobody changes, instead of a copy;
//   - derivedOnce: cur will not be derived from again nor read after
//     this returns (Conn drops it for the result, or for nothing when ok
//     is false), so its tables' set and chain arrays are changed in place
//     and a rule added to one of its chains is appended in place; a rule
//     deletion still copies the chain's rules.
func afterOps(cur Ruleset, ops []Op, handles map[int]uint64, want *Ruleset, derivedOnce bool) (Ruleset, bool) {
	tables := map[Family]*Table{}
	var order []Family
	for _, t := range cur.Tables {
		t := t
		if !derivedOnce {
			// Otherwise cur is dead once this returns: its arrays are
			// changed in place, and an Apply at a thousand endpoints does
			// not copy two thousand chains (and the collector scan them).
			t.Sets, t.Chains = slices.Clone(t.Sets), slices.Clone(t.Chains)
		}
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
			if !applySetOp(t, op, wantedSet(want, op)) {
				return Ruleset{}, false
			}
		case OpAddChain, OpDelChain, OpFlushChain, OpAddRule, OpDelRule:
			if !applyChainOp(t, op, copiedChain, handles[i], derivedOnce) {
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
	if len(more) > 0 && len(more) <= fewElements && len(s.Elements) > 0 && !s.Interval {
		// A Join adds an element or two to a set of a thousand: put them
		// in place rather than sort and format the whole set again.
		return insertElements(f, s, more)
	}
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

// fewElements is how many added elements canonicalSet inserts one by one
// into a set already canonical.
const fewElements = 8

// insertElements is canonicalSet of a set that is not an interval set
// and holds elements (canonical, as Dump read or canonicalSet made them):
// each new element is put at its place by binary search.
func insertElements(f Family, s Set, more []string) (Set, bool) {
	elems := slices.Clone(s.Elements)
	for _, e := range more {
		switch s.Type {
		case SetIfname:
			if i, found := slices.BinarySearch(elems, e); !found {
				elems = slices.Insert(elems, i, e)
			}
		case SetAddr:
			a, err := netip.ParseAddr(e)
			if err != nil || FamilyOf(a) != f {
				return s, false
			}
			a = a.Unmap()
			bad := false
			i, found := slices.BinarySearchFunc(elems, a, func(el string, a netip.Addr) int {
				b, err := netip.ParseAddr(el)
				if err != nil {
					bad = true
					return 0
				}
				return b.Compare(a)
			})
			if bad {
				return s, false
			}
			if !found {
				elems = slices.Insert(elems, i, a.String())
			}
		default:
			return s, false
		}
	}
	s.Elements = elems
	return s, true
}

// wantedSet is want's set that op changes (nil: none).
func wantedSet(want *Ruleset, op Op) *Set {
	if want == nil {
		return nil
	}
	t, ok := want.Table(op.Family)
	if !ok {
		return nil
	}
	for i := range t.Sets {
		if t.Sets[i].Name == op.Set.Name {
			return &t.Sets[i]
		}
	}
	return nil
}

// becomes says whether the elements has (canonical), with changes added
// (del: deleted), are exactly to, in to's order, and to canonical: a
// merge of the lists that builds nothing. Only the added elements are
// compared with their neighbours in to (before: element order), as has's
// own are in order already.
func becomes(has, changes, to []string, del bool, before func(a, b string) bool) bool {
	in := make(map[string]bool, len(changes))
	for _, e := range changes {
		in[e] = true
	}
	i := 0
	if del {
		for _, e := range has {
			if in[e] {
				continue
			}
			if i >= len(to) || to[i] != e {
				return false
			}
			i++
		}
		return i == len(to)
	}
	seen := make(map[string]bool, len(changes))
	for k, e := range to {
		switch {
		case i < len(has) && has[i] == e:
			i++
		case in[e] && !seen[e]:
			if (k > 0 && !before(to[k-1], e)) || (k+1 < len(to) && !before(e, to[k+1])) {
				return false
			}
		default:
			return false
		}
		if in[e] {
			// Only the changes are looked up: a map of every element
			// would cost an allocation per element of a set of a
			// thousand endpoints at each change.
			seen[e] = true
		}
	}
	if i != len(has) {
		return false
	}
	for _, e := range changes {
		if !seen[e] {
			return false
		}
	}
	return true
}

// elementOrder is the canonical order of a set type's elements (false:
// a type whose order is not told here).
func elementOrder(t SetType) (func(a, b string) bool, bool) {
	switch t {
	case SetIfname:
		return func(a, b string) bool { return a < b }, true
	case SetAddr:
		return func(a, b string) bool {
			x, err1 := netip.ParseAddr(a)
			y, err2 := netip.ParseAddr(b)
			return err1 == nil && err2 == nil && x.Compare(y) < 0
		}, true
	}
	return nil, false
}

// applySetOp is AfterOps for an operation on a set of t; want (nil: none)
// is the set the plan makes of it.
func applySetOp(t *Table, op Op, want *Set) bool {
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
		if s := t.Sets[j]; want != nil && !s.Interval && len(want.Elements) > 0 && op.Kind != OpFlushSet && s.Type == want.Type {
			if before, ok := elementOrder(s.Type); ok && becomes(s.Elements, op.Set.Elements, want.Elements, op.Kind == OpDelElements, before) {
				s.Elements = want.Elements
				t.Sets[j] = s
				return true
			}
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
func applyChainOp(t *Table, op Op, copied map[Family]map[string]bool, handle uint64, derivedOnce bool) bool {
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
		if derivedOnce && op.Kind == OpAddRule && len(c.Unordered) == 0 {
			return changeRules(c, op, handle) // appends (see afterOps)
		}
		if !copied[op.Family][op.Chain] {
			c.Rules, c.Unordered = slices.Clone(c.Rules), nil
			mark(copied, op.Family, op.Chain)
		}
		return changeRules(c, op, handle)
	}
	return true
}
