package nft

import (
	"net/netip"
	"slices"
)

// AddrRange is an inclusive range of addresses of one family.
type AddrRange struct {
	From, To netip.Addr
}

// LastAddr is the highest address of p.
func LastAddr(p netip.Prefix) netip.Addr {
	p = p.Masked()
	b := p.Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// MergeRanges sorts ranges and merges those that overlap or touch, so that
// an interval set never gets overlapping or adjacent elements (the kernel
// refuses overlaps, and adjacent ones are the same set written twice ways).
func MergeRanges(rs []AddrRange) []AddrRange {
	rs = slices.Clone(rs)
	slices.SortFunc(rs, func(a, b AddrRange) int { return a.From.Compare(b.From) })
	var out []AddrRange
	for _, r := range rs {
		if n := len(out); n > 0 {
			last := &out[n-1]
			next := last.To.Next()
			if r.From.Compare(last.To) <= 0 || (next.IsValid() && r.From == next) {
				if r.To.Compare(last.To) > 0 {
					last.To = r.To
				}
				continue
			}
		}
		out = append(out, r)
	}
	return out
}

// rangePrefixes is the minimal list of prefixes covering r exactly.
func rangePrefixes(r AddrRange) []netip.Prefix {
	var out []netip.Prefix
	from := r.From
	for from.IsValid() && from.Compare(r.To) <= 0 {
		// The shortest prefix that starts at from and ends within r.
		best := netip.PrefixFrom(from, from.BitLen())
		for bits := from.BitLen() - 1; bits >= 0; bits-- {
			p := netip.PrefixFrom(from, bits)
			if p.Masked().Addr() != from || LastAddr(p).Compare(r.To) > 0 {
				break
			}
			best = p
		}
		out = append(out, best)
		from = LastAddr(best).Next() // invalid after the last address: loop ends
	}
	return out
}

// IntervalElements is the canonical form of an interval set holding
// prefixes: the merged ranges as minimal prefix lists.
func IntervalElements(ps []netip.Prefix) []string {
	rs := make([]AddrRange, 0, len(ps))
	for _, p := range ps {
		p = p.Masked()
		rs = append(rs, AddrRange{From: p.Addr(), To: LastAddr(p)})
	}
	return RangesElements(MergeRanges(rs))
}

func RangesElements(rs []AddrRange) []string {
	var out []string
	for _, r := range rs {
		for _, p := range rangePrefixes(r) {
			out = append(out, p.String())
		}
	}
	return out
}

// ParseIntervalElements turns canonical elements back into ranges.
func ParseIntervalElements(elems []string) ([]AddrRange, error) {
	rs := make([]AddrRange, 0, len(elems))
	for _, e := range elems {
		p, err := netip.ParsePrefix(e)
		if err != nil {
			return nil, err
		}
		rs = append(rs, AddrRange{From: p.Addr(), To: LastAddr(p)})
	}
	return MergeRanges(rs), nil
}

// AddrElements is the canonical form of a plain address set.
func AddrElements(as []netip.Addr) []string {
	as = slices.Clone(as)
	slices.SortFunc(as, func(a, b netip.Addr) int { return a.Compare(b) })
	as = slices.Compact(as)
	out := make([]string, len(as))
	for i, a := range as {
		out[i] = a.String()
	}
	return out
}

func SortedUnique(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return slices.Compact(s)
}
