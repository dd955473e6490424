package policy

import (
	"net/netip"
	"slices"
)

// addrRange is an inclusive range of addresses of one family.
type addrRange struct {
	from, to netip.Addr
}

// lastAddr is the highest address of p.
func lastAddr(p netip.Prefix) netip.Addr {
	p = p.Masked()
	b := p.Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// mergeRanges sorts ranges and merges those that overlap or touch, so that
// an interval set never gets overlapping or adjacent elements (the kernel
// refuses overlaps, and adjacent ones are the same set written twice ways).
func mergeRanges(rs []addrRange) []addrRange {
	rs = slices.Clone(rs)
	slices.SortFunc(rs, func(a, b addrRange) int { return a.from.Compare(b.from) })
	var out []addrRange
	for _, r := range rs {
		if n := len(out); n > 0 {
			last := &out[n-1]
			next := last.to.Next()
			if r.from.Compare(last.to) <= 0 || (next.IsValid() && r.from == next) {
				if r.to.Compare(last.to) > 0 {
					last.to = r.to
				}
				continue
			}
		}
		out = append(out, r)
	}
	return out
}

// rangePrefixes is the minimal list of prefixes covering r exactly.
func rangePrefixes(r addrRange) []netip.Prefix {
	var out []netip.Prefix
	from := r.from
	for from.IsValid() && from.Compare(r.to) <= 0 {
		// The shortest prefix that starts at from and ends within r.
		best := netip.PrefixFrom(from, from.BitLen())
		for bits := from.BitLen() - 1; bits >= 0; bits-- {
			p := netip.PrefixFrom(from, bits)
			if p.Masked().Addr() != from || lastAddr(p).Compare(r.to) > 0 {
				break
			}
			best = p
		}
		out = append(out, best)
		from = lastAddr(best).Next() // invalid after the last address: loop ends
	}
	return out
}

// intervalElements is the canonical form of an interval set holding
// prefixes: the merged ranges as minimal prefix lists.
func intervalElements(ps []netip.Prefix) []string {
	rs := make([]addrRange, 0, len(ps))
	for _, p := range ps {
		p = p.Masked()
		rs = append(rs, addrRange{from: p.Addr(), to: lastAddr(p)})
	}
	return rangesElements(mergeRanges(rs))
}

func rangesElements(rs []addrRange) []string {
	var out []string
	for _, r := range rs {
		for _, p := range rangePrefixes(r) {
			out = append(out, p.String())
		}
	}
	return out
}

// parseIntervalElements turns canonical elements back into ranges.
func parseIntervalElements(elems []string) ([]addrRange, error) {
	rs := make([]addrRange, 0, len(elems))
	for _, e := range elems {
		p, err := netip.ParsePrefix(e)
		if err != nil {
			return nil, err
		}
		rs = append(rs, addrRange{from: p.Addr(), to: lastAddr(p)})
	}
	return mergeRanges(rs), nil
}

// addrElements is the canonical form of a plain address set.
func addrElements(as []netip.Addr) []string {
	as = slices.Clone(as)
	slices.SortFunc(as, func(a, b netip.Addr) int { return a.Compare(b) })
	as = slices.Compact(as)
	out := make([]string, len(as))
	for i, a := range as {
		out[i] = a.String()
	}
	return out
}

func sortedUnique(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return slices.Compact(s)
}
