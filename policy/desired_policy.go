package policy

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/nft"
	"github.com/calico-cnm/calico-cnm/policy/api"
	"github.com/calico-cnm/calico-cnm/policy/selector"
)

// Packet mark bits a policy chain sets to tell the endpoint's chain what
// it decided: allowed, or pass (to the network's own rules). They are
// cleared before the packet leaves the endpoint's chain. Felix uses bits
// of the same upper half (0xffff0000) for the same purpose.
const (
	markAccept uint32 = 0x00010000
	markPass   uint32 = 0x00020000
	// markDeny: a Deny rule matched. The endpoint's dispatch chain drops
	// the packet in a rule of the endpoint's own, whose counter is the
	// endpoint's denied packets (a drop in the shared policy chain could
	// not tell whose they were).
	markDeny uint32 = 0x00080000
	markBits        = markAccept | markPass | markDeny
)

// DeniedComment is the comment of an endpoint's drop rule in a dispatch
// chain: its counter is what policy denied the endpoint in that
// direction (package plugin reads it for /metrics).
func DeniedComment(dir api.PolicyType, endpointID string) string {
	return "denied " + strings.ToLower(string(dir)) + " endpoint " + endpointID
}

// Chain and set name prefixes of the policy program.
const (
	toEndpointPrefix   = "to-"   // per policy list: ingress dispatch
	fromEndpointPrefix = "from-" // per policy list: egress dispatch
	policyInPrefix     = "pi-"   // per policy: its ingress rules
	policyOutPrefix    = "po-"   // per policy: its egress rules
	selSetPrefix       = "sel-"  // addresses selected by a rule selector
	notSelSetPrefix    = "nsel-" // addresses a notSelector excludes
	netsSetPrefix      = "nets-" // a rule's nets or notNets

	// LogPrefix starts the kernel log lines of Log rules; the policy's
	// name follows.
	LogPrefix = "calico-cnm "
	// maxLogPrefix is what the kernel keeps of a log prefix
	// (NF_LOG_PREFIXLEN 128 with the NUL).
	maxLogPrefix = 127
)

// dispatchChainName is the chain that runs an ordered list of policies
// for one direction and then decides (allow, pass to profile, deny). It
// is shared by every local endpoint with the same list and profile: an
// endpoint costs one jump rule per direction, however many policies
// select it.
func dispatchChainName(dir api.PolicyType, key string) string {
	if dir == api.Egress {
		return fromEndpointPrefix + hashName(key)
	}
	return toEndpointPrefix + hashName(key)
}

// PolicyChainName is the chain of a policy's rules for one direction.
func PolicyChainName(name string, dir api.PolicyType) string {
	if dir == api.Egress {
		return policyOutPrefix + hashName(name)
	}
	return policyInPrefix + hashName(name)
}

// compiledPolicy is a policy with its selectors parsed.
type compiledPolicy struct {
	api.GlobalNetworkPolicy
	sel selector.Selector
}

// selectsWorkloads: pre-DNAT policy applies to host endpoints only.
func (p compiledPolicy) selectsWorkloads() bool { return !p.Spec.PreDNAT }

// compilePolicies parses the selectors; a policy whose selectors do not
// parse (the record was validated, so only a newer or foreign writer) is
// left out with a warning.
func compilePolicies(ps []api.GlobalNetworkPolicy) ([]compiledPolicy, []string) {
	ps = slices.Clone(ps)
	api.Sort(ps)
	var out []compiledPolicy
	var warnings []string
	for _, p := range ps {
		sel, err := selector.Parse(p.Spec.Selector)
		if err == nil {
			err = checkRuleSelectors(p)
		}
		if err != nil {
			warnings = append(warnings, fmt.Sprintf("policy %s: %v; not enforced", p.Metadata.Name, err))
			continue
		}
		out = append(out, compiledPolicy{GlobalNetworkPolicy: p, sel: sel})
	}
	return out, warnings
}

func checkRuleSelectors(p api.GlobalNetworkPolicy) error {
	for _, r := range append(slices.Clone(p.Spec.Ingress), p.Spec.Egress...) {
		for _, s := range []string{r.Source.Selector, r.Source.NotSelector, r.Destination.Selector, r.Destination.NotSelector} {
			if _, err := selector.Parse(s); err != nil {
				return err
			}
		}
	}
	return nil
}

// SelectingPolicies are the names of the policies that select an endpoint
// with these labels for dir, in evaluation order.
func SelectingPolicies(ps []api.GlobalNetworkPolicy, labels map[string]string, dir api.PolicyType) []string {
	cps, _ := compilePolicies(ps)
	var out []string
	for _, p := range cps {
		if p.selectsWorkloads() && p.AppliesTo(dir) && p.sel.Evaluate(labels) {
			out = append(out, p.Metadata.Name)
		}
	}
	return out
}

// policyPlan is the family-independent part of the policy program.
type policyPlan struct {
	policies []compiledPolicy
	// selections says which policies select a local endpoint (see
	// selectionOf); the Calculator's is kept from one computation to the
	// next.
	selections *planMemo
	// joined are the cluster's joined endpoints: rule selectors pick
	// their addresses, and those of hostEndpoints (expectedIPs) and
	// networkSets (nets).
	// (Pointers into State.Endpoints: a copy of each record at every
	// change was most of the plan's cost at 1000 endpoints.)
	joined []*datastore.Endpoint
	// index, when set, answers the rule selectors instead of joined (the
	// Calculator's, which then leaves joined empty).
	index         *selectorIndex
	hostEndpoints []api.HostEndpoint
	networkSets   []api.GlobalNetworkSet
}

// selection is which policies select a label set: per direction the
// indexes of the selecting policies, in order, and the id of that list
// (0: none), which names a dispatch chain's content without comparing
// lists.
type selection struct {
	ingress, egress         []int
	ingressList, egressList int
}

// gen is the generation of the plan's selections (planMemo.gen).
func (p policyPlan) gen() uint64 { return p.selections.gen }

func (s *selection) of(dir api.PolicyType) ([]int, int) {
	if dir == api.Egress {
		return s.egress, s.egressList
	}
	return s.ingress, s.ingressList
}

// planMemo holds the compiled policies and the selection of every label
// set seen, while the policy list stays the one they were computed from:
// the Calculator's policy records hand out the same slice until a policy
// changes. With a thousand endpoints and fifty policies, evaluating every
// selector for every endpoint at every change was the largest part of a
// Join's work.
type planMemo struct {
	// gen counts the compilations: what was computed from a selection
	// (localsPart) is good while gen stays.
	gen      uint64
	policies []api.GlobalNetworkPolicy
	compiled []compiledPolicy
	warnings []string
	// anyFor: some policy selects workloads in the direction (egress,
	// ingress): an endpoint whose labels are unknown fails closed in it.
	anyFor     [2]bool
	selections map[string]*selection
	lists      map[string]int // a list of policy indexes, as text -> its id
}

// compile brings the memo to the policies ps, forgetting the selections
// when they changed or when it holds far more label sets than there are
// endpoints (those of endpoints gone).
func (m *planMemo) compile(ps []api.GlobalNetworkPolicy, endpoints int) {
	if m.compiled != nil && nft.SameSlice(ps, m.policies) {
		if len(m.selections) > 2*endpoints+64 {
			clear(m.selections)
		}
		return
	}
	m.gen++
	m.policies = ps
	m.compiled, m.warnings = compilePolicies(ps)
	if m.compiled == nil {
		m.compiled = []compiledPolicy{}
	}
	m.anyFor = [2]bool{}
	for _, p := range m.compiled {
		for i, dir := range []api.PolicyType{api.Egress, api.Ingress} {
			if p.selectsWorkloads() && p.AppliesTo(dir) {
				m.anyFor[i] = true
			}
		}
	}
	m.selections = map[string]*selection{}
	m.lists = map[string]int{}
}

// selectionOf is which policies select the endpoint l, or nil when its
// labels are unknown.
func (m *planMemo) selectionOf(l localEndpoint) *selection {
	if l.ep.LabelsUnknown {
		return nil
	}
	// Endpoints with the same labels (replicas) are selected alike:
	// each label set is evaluated once.
	if s, ok := m.selections[l.labels]; ok {
		return s
	}
	s := &selection{}
	for i, p := range m.compiled {
		if !p.selectsWorkloads() || !p.sel.Evaluate(l.ep.Labels) {
			continue
		}
		if p.AppliesTo(api.Ingress) {
			s.ingress = append(s.ingress, i)
		}
		if p.AppliesTo(api.Egress) {
			s.egress = append(s.egress, i)
		}
	}
	s.ingressList, s.egressList = m.listID(s.ingress), m.listID(s.egress)
	m.selections[l.labels] = s
	return s
}

// listID interns a list of policy indexes.
func (m *planMemo) listID(idx []int) int {
	if len(idx) == 0 {
		return 0
	}
	b := make([]byte, 0, 4*len(idx))
	for _, i := range idx {
		b = strconv.AppendInt(b, int64(i), 10)
		b = append(b, ',')
	}
	id, ok := m.lists[string(b)]
	if !ok {
		id = len(m.lists) + 1
		m.lists[string(b)] = id
	}
	return id
}

// failsClosed: l's labels are unknown while policies select workloads in
// dir, so that direction drops everything.
func (m *planMemo) failsClosed(l localEndpoint, dir api.PolicyType) bool {
	if !l.ep.LabelsUnknown {
		return false
	}
	if dir == api.Egress {
		return m.anyFor[0]
	}
	return m.anyFor[1]
}

// planPolicies compiles the policies (memo: the Calculator's, kept from
// one computation to the next; nil: built for this one) and gathers what
// the rule selectors read.
func planPolicies(st State, locals []localEndpoint, memo *planMemo) (policyPlan, []string) {
	if memo == nil {
		memo = &planMemo{}
	}
	memo.compile(st.Policies, len(locals))
	plan := policyPlan{policies: memo.compiled, selections: memo, hostEndpoints: st.HostEndpoints, networkSets: st.NetworkSets}
	if len(memo.compiled) == 0 {
		return plan, memo.warnings
	}
	for i := range st.Endpoints {
		if st.Endpoints[i].Joined {
			plan.joined = append(plan.joined, &st.Endpoints[i])
		}
	}
	return plan, memo.warnings
}

// labelsKey is a canonical text of a label set.
func labelsKey(l map[string]string) string {
	keys := make([]string, 0, len(l))
	for k := range l {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	for _, k := range keys {
		b.WriteString(k)
		b.WriteByte(0)
		b.WriteString(l[k])
		b.WriteByte(0)
	}
	return b.String()
}

// policyTable adds what the plan needs to one family's table: per local
// endpoint the dispatch chains, per used policy its chain, and the sets
// its rules look up. It returns the forward rules that send an endpoint's
// traffic to its policy chains (they replace the network jumps).
type policyTable struct {
	f      Family
	plan   policyPlan
	sets   map[string]Set
	chains map[string]Chain
	// dispatch memoises the dispatch chain of a (direction, profile,
	// policy list).
	dispatch map[dispatchKey]string
	// memo keeps the rules of the policy and dispatch chains from one
	// computation to the next (nil: Desired builds them each time).
	memo *chainMemo
	// using, while a policy chain is built for memo, collects the sets
	// its rules look up.
	using *[]usedSet
}

func newPolicyTable(f Family, plan policyPlan, memo *chainMemo) *policyTable {
	return &policyTable{f: f, plan: plan, sets: map[string]Set{}, chains: map[string]Chain{}, dispatch: map[dispatchKey]string{}, memo: memo}
}

// chainMemo is one family's policy chains and dispatch chain heads as
// computed under one plan generation (policyPlan.gen): they are functions
// of the policies alone, so the Calculator hands out the very same rules
// until a policy changes, and nft.DiffFrom passes over them. Only the
// contents of the sets the rules look up (the endpoints a rule selector
// picks) are computed at every change.
type chainMemo struct {
	gen      uint64
	policies map[policyDir]memoPolicyChain
	heads    map[dispatchKey][]Rule
}

type policyDir struct {
	name string
	dir  api.PolicyType
}

type memoPolicyChain struct {
	rules []Rule
	sets  []usedSet
}

// usedSet is a set a policy chain's rules look up: a nets set (set, whose
// contents are the rule's) or a rule selector's (computed again each time).
type usedSet struct {
	set      Set
	selector string
	exclude  bool
}

// maxMemoHeads bounds the dispatch heads a chainMemo keeps: their keys
// name networks' chains, and networks come and go while the policies
// stay.
const maxMemoHeads = 256

// chainMemoFor is m's memo for generation gen, or a new one.
func chainMemoFor(m *chainMemo, gen uint64) *chainMemo {
	if m != nil && m.gen == gen {
		if len(m.heads) > maxMemoHeads {
			clear(m.heads)
		}
		return m
	}
	return &chainMemo{gen: gen, policies: map[policyDir]memoPolicyChain{}, heads: map[dispatchKey][]Rule{}}
}

// dispatchKey identifies a dispatch chain by what it is built from: list
// is the id of the policy list (planMemo.listID).
type dispatchKey struct {
	dir     api.PolicyType
	profile string
	list    int
}

// dispatchChain builds the dispatch chain of a (direction, profile,
// policy list) and returns its name.
func (pt *policyTable) dispatchChain(key dispatchKey, idx []int) string {
	if target, done := pt.dispatch[key]; done {
		return target
	}
	dir, profile := key.dir, key.profile
	target := dispatchTarget(pt.plan, key, idx)
	pt.dispatch[key] = target
	if pt.memo != nil {
		if head, ok := pt.memo.heads[key]; ok {
			for _, i := range idx {
				pt.policyChain(pt.plan.policies[i], dir)
			}
			pt.chains[target] = Chain{Name: target, Rules: head}
			return target
		}
	}
	c := Chain{Name: target}
	c.Rules = append(c.Rules, Rule{ClearMark: markBits, Verdict: Continue, Comment: nft.ClipComment("policies " + strings.Join(policyNames(pt.plan, idx), ", "))})
	for n, i := range idx {
		p := pt.plan.policies[i]
		r := Rule{Verdict: Jump, Target: pt.policyChain(p, dir), Comment: "policy " + p.Metadata.Name}
		if n > 0 {
			r.Matches = []Match{{Kind: MatchMark, Mark: markBits, Negate: true}}
		}
		c.Rules = append(c.Rules, r)
	}
	c.Rules = append(c.Rules, Rule{Matches: []Match{{Kind: MatchMark, Mark: markAccept}}, ClearMark: markBits, Verdict: Return, Comment: "allowed by a policy"})
	pass := Rule{Matches: []Match{{Kind: MatchMark, Mark: markPass}}, ClearMark: markBits, Verdict: Return, Comment: "pass: the network's rules"}
	if profile != "" {
		pass.Verdict, pass.Target = Goto, profile
	}
	// No rule decided, or a Deny did: the endpoints' drops (Unordered).
	c.Rules = append(c.Rules, pass)
	if pt.memo != nil {
		c.Rules = renderTexts(pt.f, c.Rules)
		pt.memo.heads[key] = c.Rules
	}
	pt.chains[target] = c
	return target
}

// renderTexts renders each of rules' nft text and keeps it in the rule,
// in place (what a memoised chain's rules are compared by), and returns
// rules.
func renderTexts(f Family, rules []Rule) []Rule {
	for i := range rules {
		rules[i] = rules[i].WithText(f)
	}
	return rules
}

// failClosedKey names the dispatch chains (one per direction) of the
// endpoints whose labels are unknown while policies exist.
const failClosedKey = "fail-closed"

// policyNames are the names of the plan's policies at idx.
func policyNames(plan policyPlan, idx []int) []string {
	names := make([]string, 0, len(idx))
	for _, i := range idx {
		names = append(names, plan.policies[i].Metadata.Name)
	}
	return names
}

// dispatchTarget is the name of the dispatch chain of key (idx: its
// policies), as dispatchChain builds it.
func dispatchTarget(plan policyPlan, key dispatchKey, idx []int) string {
	return dispatchChainName(key.dir, key.profile+"|"+strings.Join(policyNames(plan, idx), ","))
}

// deniedRule is the endpoint's drop at the end of its dispatch chain:
// what no policy allowed, counted per endpoint (Counters).
func deniedRule(f Family, l localEndpoint, dir api.PolicyType) Rule {
	match := Match{Kind: MatchIfname, In: dir == api.Egress, Value: l.ep.HostIfName}
	return Rule{Matches: []Match{match}, Verdict: Drop, Comment: DeniedComment(dir, l.ep.ID)}.WithText(f)
}

// policyChain builds (once) the chain of p's rules for dir.
func (pt *policyTable) policyChain(p compiledPolicy, dir api.PolicyType) string {
	name := PolicyChainName(p.Metadata.Name, dir)
	if _, done := pt.chains[name]; done {
		return name
	}
	key := policyDir{name: p.Metadata.Name, dir: dir}
	if pt.memo != nil {
		if m, ok := pt.memo.policies[key]; ok {
			for _, u := range m.sets {
				if u.set.Name != "" {
					pt.sets[u.set.Name] = u.set
				} else {
					pt.selectorSet(u.selector, u.exclude)
				}
			}
			pt.chains[name] = Chain{Name: name, Rules: m.rules}
			return name
		}
		pt.using = &[]usedSet{}
		defer func() { pt.using = nil }()
	}
	rules := p.Spec.Ingress
	if dir == api.Egress {
		rules = p.Spec.Egress
	}
	c := Chain{Name: name}
	for i, r := range rules {
		c.Rules = append(c.Rules, pt.rules(p.Metadata.Name, dir, i, r)...)
	}
	if pt.memo != nil {
		c.Rules = renderTexts(pt.f, c.Rules)
		pt.memo.policies[key] = memoPolicyChain{rules: c.Rules, sets: *pt.using}
	}
	pt.chains[name] = c
	return name
}

// rules turns one policy rule into this family's nftables rules: none if
// it cannot match here (another IP version), several when its port lists
// are ORs.
func (pt *policyTable) rules(policy string, dir api.PolicyType, i int, r api.Rule) []Rule {
	if r.IPVersion != nil && (*r.IPVersion == 4) != (pt.f == IPv4) {
		return nil
	}
	var ms []Match
	if r.Protocol != nil {
		if (r.Protocol.Num == 1 && pt.f == IPv6) || (r.Protocol.Num == 58 && pt.f == IPv4) {
			return nil
		}
		ms = append(ms, Match{Kind: MatchL4Proto, Proto: r.Protocol.Num})
	}
	if r.NotProtocol != nil {
		ms = append(ms, Match{Kind: MatchL4Proto, Proto: r.NotProtocol.Num, Negate: true})
	}
	if r.ICMP != nil && r.ICMP.Type != nil {
		ms = append(ms, Match{Kind: MatchICMPType, Proto: uint8(*r.ICMP.Type)})
		if r.ICMP.Code != nil {
			ms = append(ms, Match{Kind: MatchICMPCode, Proto: uint8(*r.ICMP.Code)})
		}
	}
	for _, e := range []struct {
		src bool
		er  api.EntityRule
	}{{true, r.Source}, {false, r.Destination}} {
		em, ok := pt.entityMatches(e.src, e.er)
		if !ok {
			return nil
		}
		ms = append(ms, em...)
	}
	base := Rule{Matches: ms, Comment: ruleComment(policy, dir, i, r.Action)}
	switch r.Action {
	case api.Allow:
		base.SetMark, base.Verdict = markAccept, Return
	case api.Pass:
		base.SetMark, base.Verdict = markPass, Return
	case api.Deny:
		base.SetMark, base.Verdict = markDeny, Return
	case api.Log:
		base.LogPrefix, base.Verdict = clipLogPrefix(LogPrefix+policy+" "), Continue
	}
	out := []Rule{base}
	for _, pm := range []struct {
		src   bool
		ports []api.Port
	}{{true, r.Source.Ports}, {false, r.Destination.Ports}} {
		if len(pm.ports) == 0 {
			continue
		}
		var expanded []Rule
		for _, rng := range mergePorts(pm.ports) {
			for _, o := range out {
				o.Matches = append(slices.Clone(o.Matches), Match{Kind: MatchPort, In: pm.src, Min: rng.Min, Max: rng.Max})
				expanded = append(expanded, o)
			}
		}
		out = expanded
	}
	return out
}

// entityMatches are the address and port exclusions of one side; false
// when nets are given but none is of this family (the rule cannot match).
func (pt *policyTable) entityMatches(src bool, e api.EntityRule) ([]Match, bool) {
	var ms []Match
	if len(e.Nets) > 0 {
		name, ok := pt.netsSet(e.Nets)
		if !ok {
			return nil, false
		}
		ms = append(ms, Match{Kind: MatchAddrSet, In: src, Value: name})
	}
	if len(e.NotNets) > 0 {
		if name, ok := pt.netsSet(e.NotNets); ok {
			ms = append(ms, Match{Kind: MatchAddrSet, In: src, Value: name, Negate: true})
		}
	}
	if e.Selector != "" {
		ms = append(ms, Match{Kind: MatchAddrSet, In: src, Value: pt.selectorSet(e.Selector, false)})
	}
	if e.NotSelector != "" {
		ms = append(ms, Match{Kind: MatchAddrSet, In: src, Value: pt.selectorSet(e.NotSelector, true), Negate: true})
	}
	for _, p := range e.NotPorts {
		ms = append(ms, Match{Kind: MatchPort, In: src, Min: p.Min, Max: p.Max, Negate: true})
	}
	return ms, true
}

func (pt *policyTable) netsSet(nets []string) (string, bool) {
	var ps []netip.Prefix
	for _, n := range nets {
		p, err := api.ParseNet(n)
		if err == nil && nft.FamilyOf(p.Addr()) == pt.f {
			ps = append(ps, p)
		}
	}
	if len(ps) == 0 {
		return "", false
	}
	elems := nft.IntervalElements(ps)
	name := netsSetPrefix + hashName(strings.Join(elems, ","))
	pt.sets[name] = Set{Name: name, Type: SetAddr, Interval: true, Elements: elems, Comment: "nets " + strings.Join(elems, ",")}
	if pt.using != nil {
		*pt.using = append(*pt.using, usedSet{set: pt.sets[name]})
	}
	return name, true
}

// selectorSet holds the addresses of the cluster's joined endpoints the
// selector picks, the expectedIPs of the host endpoints and the nets of
// the network sets it picks: an interval set, as network sets hold
// networks. For a notSelector (exclude) it also holds the endpoints whose
// labels are unknown: they match no selector, not even a negated one.
func (pt *policyTable) selectorSet(sel string, exclude bool) string {
	if pt.using != nil {
		*pt.using = append(*pt.using, usedSet{selector: sel, exclude: exclude})
	}
	s := selector.MustParse(sel) // checked by compilePolicies
	name := RuleSelectorSetName(s, exclude)
	if _, done := pt.sets[name]; done {
		return name
	}
	var ranges []nft.AddrRange
	addAddr := func(a string) {
		if addr, ok := datastore.ParseEndpointAddr(a); ok && nft.FamilyOf(addr) == pt.f {
			ranges = append(ranges, nft.AddrRange{From: addr, To: addr})
		}
	}
	for _, ep := range pt.plan.joined {
		if ep.LabelsUnknown && !exclude || !ep.LabelsUnknown && !s.Evaluate(ep.Labels) {
			continue
		}
		addAddr(ep.IPv4)
		addAddr(ep.IPv6)
	}
	for _, h := range pt.plan.hostEndpoints {
		if s.Evaluate(h.Metadata.Labels) {
			for _, a := range h.Spec.ExpectedIPs {
				addAddr(a)
			}
		}
	}
	var sets []memoNets
	for _, ns := range pt.plan.networkSets {
		if s.Evaluate(ns.Metadata.Labels) {
			sets = append(sets, networkSetRanges(ns.Spec.Nets, pt.f))
		}
	}
	var indexed mergedAddrs
	if pt.plan.index != nil {
		indexed = pt.plan.index.addrs(s, exclude, pt.f)
	}
	var elems []string
	switch {
	case len(ranges) == 0 && len(sets) == 0:
		elems = indexed.elements // the endpoints' addresses only (nil without an index)
	case len(ranges) == 0 && len(indexed.ranges) == 0 && len(sets) == 1:
		elems = sets[0].elements // the usual deny or allow list: as it is
	default:
		ranges = append(ranges, indexed.ranges...)
		for _, m := range sets {
			ranges = append(ranges, m.ranges...)
		}
		elems = nft.RangesElements(nft.MergeRanges(ranges))
	}
	pt.sets[name] = Set{Name: name, Type: SetAddr, Interval: true, Elements: elems, Comment: nft.ClipComment("selector " + s.String())}
	return name
}

// memoNets is a network set's networks of one family, merged, and their
// canonical set elements.
type memoNets struct {
	ranges   []nft.AddrRange
	elements []string
}

// networkSetRanges are a network set's networks of family f as merged
// ranges, remembered by the identity of the nets slice: the syncer decodes
// a record again only when it changes, so an unchanged set of thousands of
// networks is parsed and merged once, not at every pass.
func networkSetRanges(nets []string, f Family) memoNets {
	if len(nets) == 0 {
		return memoNets{}
	}
	key := netsKey{first: &nets[0], n: len(nets), f: f}
	netsMu.Lock()
	m, ok := netsMemo[key]
	netsMu.Unlock()
	if ok {
		return m
	}
	for _, n := range nets {
		if p, err := netip.ParsePrefix(n); err == nil && nft.FamilyOf(p.Addr()) == f {
			p = p.Masked()
			m.ranges = append(m.ranges, nft.AddrRange{From: p.Addr(), To: nft.LastAddr(p)})
		}
	}
	m.ranges = nft.MergeRanges(m.ranges)
	m.elements = nft.RangesElements(m.ranges)
	netsMu.Lock()
	if len(netsMemo) >= maxNetsMemo {
		clear(netsMemo)
	}
	netsMemo[key] = m
	netsMu.Unlock()
	return m
}

type netsKey struct {
	first *string
	n     int
	f     Family
}

var (
	netsMu   sync.Mutex
	netsMemo = map[netsKey]memoNets{}
)

const maxNetsMemo = 256

// RuleSelectorSetName is the set holding what a rule selector (exclude: a
// notSelector) matches.
func RuleSelectorSetName(s selector.Selector, exclude bool) string {
	if exclude {
		return notSelSetPrefix + hashName(s.String())
	}
	return selSetPrefix + hashName(s.String())
}

// mergePorts merges overlapping and adjacent ranges, so that a packet
// matches at most one of the expanded rules (a Log rule logs once).
func mergePorts(ps []api.Port) []api.Port {
	ps = slices.Clone(ps)
	slices.SortFunc(ps, func(a, b api.Port) int { return int(a.Min) - int(b.Min) })
	var out []api.Port
	for _, p := range ps {
		if n := len(out); n > 0 && int(p.Min) <= int(out[n-1].Max)+1 {
			out[n-1].Max = max(out[n-1].Max, p.Max)
			continue
		}
		out = append(out, p)
	}
	return out
}

func clipLogPrefix(s string) string {
	if len(s) <= maxLogPrefix {
		return s
	}
	return s[:maxLogPrefix]
}

// finish adds the chains and sets to t, sorted by name.
func (pt *policyTable) finish(t *Table) {
	for _, k := range sortedKeys(pt.sets) {
		t.Sets = append(t.Sets, pt.sets[k])
	}
	for _, k := range sortedKeys(pt.chains) {
		t.Chains = append(t.Chains, pt.chains[k])
	}
}

// RuleCounter is the packet count of one policy rule on this host (the sum
// over its nftables rules, when its port lists expanded it).
type RuleCounter struct {
	Policy    string
	Direction api.PolicyType
	Index     int
	Action    api.Action
	Packets   uint64
	Bytes     uint64
}

// PolicyCounters reads the per-rule counters of the policy chains from a
// dump of the tables, both families added up.
func PolicyCounters(rs Ruleset, ps []api.GlobalNetworkPolicy) []RuleCounter {
	var out []RuleCounter
	for _, p := range ps {
		for _, dir := range []api.PolicyType{api.Ingress, api.Egress} {
			rules := p.Spec.Ingress
			if dir == api.Egress {
				rules = p.Spec.Egress
			}
			for i, r := range rules {
				rc := RuleCounter{Policy: p.Metadata.Name, Direction: dir, Index: i, Action: r.Action}
				want := ruleComment(p.Metadata.Name, dir, i, r.Action)
				for _, t := range rs.Tables {
					c, ok := t.Chain(PolicyChainName(p.Metadata.Name, dir))
					if !ok {
						continue
					}
					for _, kr := range append(slices.Clone(c.Rules), c.Unordered...) {
						if kr.Comment == want {
							rc.Packets += kr.Packets
							rc.Bytes += kr.Bytes
						}
					}
				}
				out = append(out, rc)
			}
		}
	}
	return out
}

func ruleComment(policy string, dir api.PolicyType, i int, a api.Action) string {
	return nft.ClipComment(fmt.Sprintf("%s %s rule %d: %s", policy, strings.ToLower(string(dir)), i, a))
}
