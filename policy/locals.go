package policy

import (
	"cmp"
	"slices"
	"strings"

	"github.com/calico-cnm/calico-cnm/policy/api"
)

// localsPart is what the host's joined endpoints put into one family's
// table: per Docker network its chains (and, isolated, its logical
// network's member set), per jump the set of interfaces whose traffic
// takes it with the forward chain's rule, per dispatch chain the drops of
// the endpoints using it. Desired builds it whole from the endpoints; the
// Calculator keeps one per family and changes it one endpoint at a time,
// so that a Join costs the work of its own endpoint and not that of the
// host's thousand. Both emit the same tables (TestCalculatorMatchesDesired).
//
// The slices it hands out in the tables (interface set elements, dispatch
// drops) never change within the length handed out, as a Ruleset handed
// out must stay what it was: a set's elements are copied when one comes
// or goes; a dispatch chain's drops, unordered rules, get a new one
// appended in place (a Ruleset handed out sees only its own length) and
// are copied when one goes.
type localsPart struct {
	f Family
	// gen is the policy plan's generation the contributions were computed
	// under (planMemo.gen): a new plan computes them all again.
	gen uint64
	// byIf is each endpoint's contribution, by interface name.
	byIf     map[string]*localContrib
	networks map[string]*networkPart // Docker network id -> its endpoints
	groups   map[endpointJump]*groupPart
	dispatch map[dispatchKey]*dispatchPart
	// targets names the dispatch chain of a key (a hash of its policies'
	// names): computed once per key and plan.
	targets map[dispatchKey]string
	// chains are the networks' chain names (ingress, egress) by network
	// id, shared by their endpoints' jumps.
	chains map[string][2]string
	// failClosed counts the endpoints failing closed, per direction
	// (dirSlot).
	failClosed [2]int
}

// localContrib is what one endpoint puts into the tables: its jumps
// (egress first) and, for those to a dispatch chain, its drop there; and
// what its network's chains are built from (the same for every endpoint
// of the network: the first one's builds them, as in the per-endpoint
// loop this replaces).
type localContrib struct {
	ifname  string
	network networkOf
	jumps   [2]endpointJump
	n       int
	// via is set when a jump goes to a dispatch chain: most endpoints of
	// a host without policies have none, and a thousand of them would
	// otherwise carry room for two drops each.
	via *policyJumps
}

// policyJumps is what an endpoint's jumps to dispatch chains need, by
// jump slot.
type policyJumps struct {
	keys  [2]dispatchKey // of the jumps via policies
	idx   [2][]int       // their policy indexes
	drops [2]Rule        // their drops
}

// networkOf is what a network's chains and member set are built from.
type networkOf struct {
	id, key, display string
	policy           NetworkPolicy
}

// networkPart is one Docker network's endpoints on this host, by
// interface name (sorted): the first one's contribution builds the
// chains, and the networks come in the order of their first interface.
type networkPart struct{ ifnames []string }

// groupPart is the interfaces (sorted) whose traffic takes one jump.
type groupPart struct{ ifnames []string }

// dispatchPart is the endpoints using one dispatch chain: their interface
// names and, in the same order, their drops (in interface order when
// built whole, then in the order of the changes).
type dispatchPart struct {
	idx     []int
	ifnames []string
	drops   []Rule
}

func newLocalsPart(f Family, gen uint64) *localsPart {
	return &localsPart{f: f, gen: gen,
		byIf:     map[string]*localContrib{},
		networks: map[string]*networkPart{},
		groups:   map[endpointJump]*groupPart{},
		dispatch: map[dispatchKey]*dispatchPart{},
		targets:  map[dispatchKey]string{},
		chains:   map[string][2]string{},
	}
}

// buildLocalsPart is the part of locals (sorted by interface name, each
// name once) under plan; old (nil: none) lends the drops it rendered
// already.
func buildLocalsPart(f Family, plan policyPlan, locals []localEndpoint, old *localsPart) *localsPart {
	p := newLocalsPart(f, plan.gen())
	for _, l := range locals {
		p.add(p.contribOf(plan, l, old), true)
	}
	return p
}

// update takes the changes of the interface names changed: each one's
// contribution is taken out and, if locals (sorted) still has an endpoint
// of that name, its new one put in.
func (p *localsPart) update(plan policyPlan, locals []localEndpoint, changed map[string]bool) {
	for ifname := range changed {
		var next *localContrib
		i, found := slices.BinarySearchFunc(locals, ifname, func(l localEndpoint, name string) int { return strings.Compare(l.ep.HostIfName, name) })
		if found {
			next = p.contribOf(plan, locals[i], p) // before the old one goes: its drops may serve again
		}
		if old := p.byIf[ifname]; old != nil {
			p.remove(old)
		}
		if next != nil {
			p.add(next, false)
		}
	}
}

// contribOf computes what l puts into the tables (old: a part whose drops
// may be reused).
func (p *localsPart) contribOf(plan policyPlan, l localEndpoint, old *localsPart) *localContrib {
	c := &localContrib{ifname: l.ep.HostIfName, network: networkOf{id: l.network.ID, key: l.key, display: networkDisplayName(l.network), policy: l.policy}}
	in, out := p.chainNames(l.network.ID)
	outProfile := ""
	if l.policy.Isolated {
		outProfile = out
	}
	if p.policyJump(c, plan, l, api.Egress, outProfile, old) {
		c.n++
	} else if l.policy.Isolated {
		c.jumps[c.n], c.n = endpointJump{dir: api.Egress, target: out}, c.n+1
	}
	if p.policyJump(c, plan, l, api.Ingress, in, old) {
		c.n++
	} else {
		c.jumps[c.n], c.n = endpointJump{dir: api.Ingress, target: in}, c.n+1
	}
	return c
}

// chainNames are network id's ingress and egress chains.
func (p *localsPart) chainNames(id string) (in, out string) {
	names, ok := p.chains[id]
	if !ok {
		names = [2]string{IngressChainName(id), EgressChainName(id)}
		p.chains[id] = names
	}
	return names[0], names[1]
}

// policyJump sets c's next jump for dir when policies decide it (or fail
// it closed); false when the network's own chains apply. profile is the
// network's chain for the direction ("" when it has none: everything
// returns).
func (p *localsPart) policyJump(c *localContrib, plan policyPlan, l localEndpoint, dir api.PolicyType, profile string, old *localsPart) bool {
	if len(plan.policies) == 0 {
		return false
	}
	k := c.n
	if plan.selections.failsClosed(l, dir) {
		c.jumps[k] = endpointJump{dir: dir, target: dispatchChainName(dir, failClosedKey), via: viaFailClosed}
		return true
	}
	sel := plan.selections.selectionOf(l)
	if sel == nil {
		return false
	}
	idx, list := sel.of(dir)
	if len(idx) == 0 {
		return false
	}
	key := dispatchKey{dir: dir, profile: profile, list: list}
	target, ok := p.targets[key]
	if !ok {
		target = dispatchTarget(plan, key, idx)
		p.targets[key] = target
	}
	c.jumps[k] = endpointJump{dir: dir, target: target, via: viaPolicies}
	if c.via == nil {
		c.via = &policyJumps{}
	}
	c.via.keys[k], c.via.idx[k] = key, idx
	c.via.drops[k] = old.droppedRule(p.f, l, dir, k)
	return true
}

// droppedRule is l's drop for dir: the one p (nil: none) holds for the
// same endpoint and interface in slot k, else a new one.
func (p *localsPart) droppedRule(f Family, l localEndpoint, dir api.PolicyType, k int) Rule {
	if p != nil {
		if c := p.byIf[l.ep.HostIfName]; c != nil && c.n > k && c.jumps[k].via == viaPolicies && c.jumps[k].dir == dir && c.via.drops[k].Comment == DeniedComment(dir, l.ep.ID) {
			return c.via.drops[k]
		}
	}
	return deniedRule(f, l, dir)
}

// add puts c in; bulk: the interfaces come in increasing order and nothing
// was handed out yet, so the lists are appended to in place.
func (p *localsPart) add(c *localContrib, bulk bool) {
	p.byIf[c.ifname] = c
	np := p.networks[c.network.id]
	if np == nil {
		np = &networkPart{}
		p.networks[c.network.id] = np
	}
	np.ifnames = insertName(np.ifnames, c.ifname, true)
	for k, j := range c.jumps[:c.n] {
		g := p.groups[j]
		if g == nil {
			g = &groupPart{}
			p.groups[j] = g
		}
		g.ifnames = insertName(g.ifnames, c.ifname, bulk)
		switch j.via {
		case viaFailClosed:
			p.failClosed[dirSlot(j.dir)]++
		case viaPolicies:
			d := p.dispatch[c.via.keys[k]]
			if d == nil {
				d = &dispatchPart{idx: c.via.idx[k]}
				p.dispatch[c.via.keys[k]] = d
			}
			d.ifnames = append(d.ifnames, c.ifname)
			d.drops = append(d.drops, c.via.drops[k])
		}
	}
}

// remove takes c out.
func (p *localsPart) remove(c *localContrib) {
	delete(p.byIf, c.ifname)
	if np := p.networks[c.network.id]; np != nil {
		if np.ifnames = deleteName(np.ifnames, c.ifname, true); len(np.ifnames) == 0 {
			delete(p.networks, c.network.id)
			delete(p.chains, c.network.id)
		}
	}
	for k, j := range c.jumps[:c.n] {
		if g := p.groups[j]; g != nil {
			if g.ifnames = deleteName(g.ifnames, c.ifname, false); len(g.ifnames) == 0 {
				delete(p.groups, j)
			}
		}
		switch j.via {
		case viaFailClosed:
			p.failClosed[dirSlot(j.dir)]--
		case viaPolicies:
			d := p.dispatch[c.via.keys[k]]
			if d == nil {
				continue
			}
			if i := slices.Index(d.ifnames, c.ifname); i >= 0 {
				d.ifnames = slices.Delete(d.ifnames, i, i+1)
				d.drops = slices.Delete(slices.Clone(d.drops), i, i+1)
			}
			if len(d.ifnames) == 0 {
				delete(p.dispatch, c.via.keys[k])
				delete(p.targets, c.via.keys[k])
			}
		}
	}
}

// insertName puts name into the sorted names; inPlace: names was not
// handed out (else it is copied first).
func insertName(names []string, name string, inPlace bool) []string {
	i, found := slices.BinarySearch(names, name)
	if found {
		return names
	}
	if !inPlace {
		names = slices.Clone(names)
	}
	return slices.Insert(names, i, name)
}

// deleteName takes name out of the sorted names, as insertName.
func deleteName(names []string, name string, inPlace bool) []string {
	i, found := slices.BinarySearch(names, name)
	if !found {
		return names
	}
	if !inPlace {
		names = slices.Clone(names)
	}
	return slices.Delete(names, i, i+1)
}

// emit adds the part to t: the networks' chains and member sets and the
// jumps' interface sets, in the order of their first interface (as the
// per-endpoint loop met them), the forward chain's jumps, and the
// dispatch chains with their drops (through pt, which builds the policy
// chains they jump to).
func (p *localsPart) emit(pt *policyTable, t *Table, forward *Chain, memberElems func(key string, f Family) []string, vxlan bool) {
	nets := make([]*localContrib, 0, len(p.networks))
	for _, np := range p.networks {
		nets = append(nets, p.byIf[np.ifnames[0]])
	}
	slices.SortFunc(nets, func(a, b *localContrib) int { return strings.Compare(a.ifname, b.ifname) })
	memberSets := map[string]bool{}
	for _, c := range nets {
		n := c.network
		set := NetworkSetName(n.key)
		if n.policy.Isolated && !memberSets[set] {
			memberSets[set] = true
			t.Sets = append(t.Sets, Set{Name: set, Type: SetAddr, Elements: memberElems(n.key, p.f), Comment: "members of " + n.key})
		}
		t.Chains = append(t.Chains, ingressChain(IngressChainName(n.id), set, n.display, n.policy, vxlan))
		if n.policy.Isolated {
			t.Chains = append(t.Chains, egressChain(EgressChainName(n.id), set, n.display))
		}
	}

	// The groups in the order the per-endpoint loop met them: by their
	// first interface, and for one interface its egress jump first.
	type firstSeen struct {
		g    jumpGroup
		slot int
	}
	groups := make([]firstSeen, 0, len(p.groups))
	for j, g := range p.groups {
		first := p.byIf[g.ifnames[0]]
		slot := slices.Index(first.jumps[:first.n], j)
		groups = append(groups, firstSeen{g: jumpGroup{endpointJump: j, network: first.network.display, ifnames: g.ifnames}, slot: slot})
	}
	slices.SortFunc(groups, func(a, b firstSeen) int {
		return cmp.Or(strings.Compare(a.g.ifnames[0], b.g.ifnames[0]), a.slot-b.slot)
	})
	var jumps jumpGroups
	for _, g := range groups {
		jumps.groups = append(jumps.groups, g.g)
	}
	jumps.addTo(p.f, t, forward)

	for key, d := range p.dispatch {
		target := pt.dispatchChain(key, d.idx)
		c := pt.chains[target]
		c.Unordered = d.drops
		pt.chains[target] = c
	}
	for _, dir := range []api.PolicyType{api.Egress, api.Ingress} {
		if p.failClosed[dirSlot(dir)] > 0 {
			target := dispatchChainName(dir, failClosedKey)
			pt.chains[target] = Chain{Name: target, Rules: []Rule{{Verdict: Drop, Comment: "endpoint labels unknown: fail closed while policies exist"}}}
		}
	}
}

// dirSlot numbers the directions: egress 0, ingress 1.
func dirSlot(dir api.PolicyType) int {
	if dir == api.Egress {
		return 0
	}
	return 1
}
