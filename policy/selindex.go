package policy

import (
	"net/netip"

	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/nft"
	"github.com/calico-cnm/calico-cnm/policy/selector"
)

// selectorIndex keeps, for each rule selector the tables use, the
// addresses of the cluster's joined endpoints it picks, and follows the
// endpoints one change at a time: a Join then costs one evaluation per
// selector, not one per selector and endpoint of the cluster. It is the
// Calculator's; Desired evaluates every selector over every endpoint, and
// the two must agree (TestCalculatorMatchesDesired).
type selectorIndex struct {
	endpoints map[string]indexedEndpoint // the joined endpoints, by key
	selectors map[selectorKey]*selectorMembers
}

// indexedEndpoint is what selectors read of a joined endpoint.
type indexedEndpoint struct {
	labels        map[string]string
	labelsUnknown bool
	addrs         []netip.Addr // those of its addresses that parse
}

type selectorKey struct {
	text    string // the selector's canonical text
	exclude bool   // a notSelector: see picks
}

// selectorMembers is what one selector picks.
type selectorMembers struct {
	sel     selector.Selector
	exclude bool
	members map[string][]netip.Addr // endpoint key -> its addresses
	// merged are the members' addresses of each family as merged ranges
	// and their interval-set elements; nil once members changed. They are
	// shared with the tables handed out, so never changed in place.
	merged map[Family]mergedAddrs
	used   bool // since the last sweep
}

func newSelectorIndex() *selectorIndex {
	return &selectorIndex{endpoints: map[string]indexedEndpoint{}, selectors: map[selectorKey]*selectorMembers{}}
}

// picks is selectorSet's rule: an endpoint whose labels are unknown
// matches no selector, so a notSelector's set (what is excluded) holds it.
func (m *selectorMembers) picks(e indexedEndpoint) bool {
	if e.labelsUnknown {
		return m.exclude
	}
	return m.sel.Evaluate(e.labels)
}

// update takes the endpoint record at key (nil: gone); only joined
// endpoints are members.
func (x *selectorIndex) update(key string, ep *datastore.Endpoint) {
	if ep == nil || !ep.Joined {
		if _, had := x.endpoints[key]; !had {
			return
		}
		delete(x.endpoints, key)
		for _, m := range x.selectors {
			if _, in := m.members[key]; in {
				delete(m.members, key)
				m.merged = nil
			}
		}
		return
	}
	e := indexedEndpoint{labels: ep.Labels, labelsUnknown: ep.LabelsUnknown}
	for _, a := range []string{ep.IPv4, ep.IPv6} {
		if addr, ok := datastore.ParseEndpointAddr(a); ok {
			e.addrs = append(e.addrs, addr)
		}
	}
	x.endpoints[key] = e
	for _, m := range x.selectors {
		_, was := m.members[key]
		switch {
		case m.picks(e):
			m.members[key] = e.addrs
			m.merged = nil
		case was:
			delete(m.members, key)
			m.merged = nil
		}
	}
}

// mergedAddrs are addresses as merged ranges and as interval-set elements.
type mergedAddrs struct {
	ranges   []nft.AddrRange
	elements []string
}

// addrs are the addresses of family f s picks (exclude: as a
// notSelector); s joins the index at its first use.
func (x *selectorIndex) addrs(s selector.Selector, exclude bool, f Family) mergedAddrs {
	k := selectorKey{text: s.String(), exclude: exclude}
	m := x.selectors[k]
	if m == nil {
		m = &selectorMembers{sel: s, exclude: exclude, members: map[string][]netip.Addr{}}
		for key, e := range x.endpoints {
			if m.picks(e) {
				m.members[key] = e.addrs
			}
		}
		x.selectors[k] = m
	}
	m.used = true
	if m.merged == nil {
		byFamily := map[Family][]nft.AddrRange{}
		for _, addrs := range m.members {
			for _, a := range addrs {
				byFamily[nft.FamilyOf(a)] = append(byFamily[nft.FamilyOf(a)], nft.AddrRange{From: a, To: a})
			}
		}
		m.merged = map[Family]mergedAddrs{}
		for fam, rs := range byFamily {
			rs = nft.MergeRanges(rs)
			m.merged[fam] = mergedAddrs{ranges: rs, elements: nft.RangesElements(rs)}
		}
	}
	return m.merged[f]
}

// sweep forgets the selectors no computation used since the last sweep
// (their policy rules are gone or changed).
func (x *selectorIndex) sweep() {
	for k, m := range x.selectors {
		if !m.used {
			delete(x.selectors, k)
			continue
		}
		m.used = false
	}
}
