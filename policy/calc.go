package policy

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/calico-cnm/calico-cnm/dataplane"
	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/ipam"
	"github.com/calico-cnm/calico-cnm/nft"
	"github.com/calico-cnm/calico-cnm/policy/api"
)

// Calculator turns the datastore's records, one change at a time, into
// the tables: Felix's shape. OnUpdate takes one record's decoded value
// (ipam.Pool, datastore.Network, datastore.Endpoint, datastore.Node,
// api.GlobalNetworkPolicy, api.HostEndpoint or api.GlobalNetworkSet; an
// error for a record that does not decode; nil when it was deleted);
// CompleteDeferredWork computes what the updates since the last call
// affect and returns the whole desired Ruleset, equal to what Desired
// computes from the same records, with Desired's warnings (in any order).
// Whoever reads the datastore (today the syncer's followers) feeds it.
type Calculator interface {
	OnUpdate(key string, value any)
	CompleteDeferredWork() (Ruleset, []string)
}

// calcEndpoint is what the calculation keeps of one endpoint record.
type calcEndpoint struct {
	ep     datastore.Endpoint
	netKey string // its logical network
	// addrs are its valid addresses, as members (IPv4 first; an invalid
	// one: none of that family).
	addrs [2]netip.Addr
	// claims: a joined endpoint of this host with a workload interface
	// name, competing for that name's rules.
	claims   bool
	warnings []string // about its addresses or interface name
}

// incrementalCalc is the Calculator: the endpoints, the records there are
// thousands of, are indexed so that a change costs the work of that
// endpoint, its interface name and its logical network's member set; the
// other kinds are few and are re-read whole when one of them changes.
type incrementalCalc struct {
	node     string
	ipv6     bool
	failsafe Failsafe

	pools       records[ipam.Pool]
	networks    records[datastore.Network]
	nodes       records[datastore.Node]
	policies    records[api.GlobalNetworkPolicy]
	heps        records[api.HostEndpoint]
	networkSets records[api.GlobalNetworkSet]
	// unreadable: records that do not decode, by key, with the warning.
	unreadable map[string]string

	// dirty: the endpoint keys to take in again, with their new record
	// (nil: gone, or the one computed holds when only its network changed).
	dirty       map[string]*datastore.Endpoint
	computed    map[string]*calcEndpoint   // what was taken into the indexes, by key
	warned      map[string]bool            // endpoint keys with warnings
	byNetwork   map[string]map[string]bool // network id -> endpoint keys
	netByID     map[string]datastore.Network
	netsChanged map[string]bool // network ids whose record changed

	// members: logical network key -> family -> its addresses.
	members map[string]map[Family]*memberSet

	// claimants: interface name -> keys (sorted) of the endpoints claiming
	// it; the smallest key wins, as Desired takes the records in key order.
	claimants map[string][]string
	dirtyIf   map[string]bool
	// ifnames are the interface names with a winner, sorted, and locals
	// the winners, in the same order: changed in place, as desiredFrom
	// keeps neither.
	ifnames      []string
	locals       []localEndpoint
	localWarning map[string]string // interface name -> its winner's network warning
	conflicts    map[string][]string

	// selectors answers the policies' rule selectors from the cluster's
	// joined endpoints, following them change by change.
	selectors *selectorIndex

	// memo keeps policy-selected endpoints' rules and the policy plan
	// between computations.
	memo passMemo
}

// passMemo is what the Calculator keeps from one computation to the next
// (none in Desired: everything is built for the one computation).
type passMemo struct {
	plan planMemo
	// locals is each family's localsPart, and changed the interface names
	// whose endpoint changed since the parts were last brought up to date.
	locals  map[Family]*localsPart
	changed map[string]bool
	chains  map[Family]*chainMemo
}

// chainMemo is family f's chain memo under plan (nil without a memo).
func (m *passMemo) chainMemo(f Family, plan policyPlan) *chainMemo {
	if m == nil {
		return nil
	}
	cm := chainMemoFor(m.chains[f], plan.gen())
	m.chains[f] = cm
	return cm
}

// partFor is the part of family f's table that locals (sorted by
// interface name) make under plan: the one kept, brought up to date with
// the interfaces changed, or built anew when the plan changed; without a
// memo (Desired), built for this computation.
func (m *passMemo) partFor(f Family, plan policyPlan, locals []localEndpoint) *localsPart {
	if m == nil {
		return buildLocalsPart(f, plan, locals, nil)
	}
	p := m.locals[f]
	if p == nil || p.gen != plan.gen() {
		p = buildLocalsPart(f, plan, locals, p)
		m.locals[f] = p
		return p
	}
	p.update(plan, locals, m.changed)
	return p
}

// changesTaken: every family's part took the changes.
func (m *passMemo) changesTaken() {
	if m != nil {
		clear(m.changed)
	}
}

// records is one small kind's decoded records by key, and their list in
// key order (nil when it must be rebuilt).
type records[T any] struct {
	byKey  map[string]T
	sorted []T
	dirty  bool
}

func (r *records[T]) set(key string, v T) {
	if r.byKey == nil {
		r.byKey = map[string]T{}
	}
	r.byKey[key] = v
	r.dirty = true
}

func (r *records[T]) remove(key string) bool {
	if _, ok := r.byKey[key]; !ok {
		return false
	}
	delete(r.byKey, key)
	r.dirty = true
	return true
}

func (r *records[T]) list() []T {
	if r.dirty || r.sorted == nil {
		out := make([]T, 0, len(r.byKey))
		for _, k := range sortedKeys(r.byKey) {
			out = append(out, r.byKey[k])
		}
		r.sorted, r.dirty = out, false
	}
	return r.sorted
}

// NewCalculator is the incremental Calculator for node's tables.
func NewCalculator(node string, ipv6 bool, fs Failsafe) Calculator {
	return newIncrementalCalc(node, ipv6, fs)
}

func newIncrementalCalc(node string, ipv6 bool, fs Failsafe) *incrementalCalc {
	return &incrementalCalc{
		node: node, ipv6: ipv6, failsafe: fs,
		unreadable:   map[string]string{},
		computed:     map[string]*calcEndpoint{},
		dirty:        map[string]*datastore.Endpoint{},
		warned:       map[string]bool{},
		byNetwork:    map[string]map[string]bool{},
		netByID:      map[string]datastore.Network{},
		netsChanged:  map[string]bool{},
		members:      map[string]map[Family]*memberSet{},
		claimants:    map[string][]string{},
		dirtyIf:      map[string]bool{},
		localWarning: map[string]string{},
		conflicts:    map[string][]string{},
		selectors:    newSelectorIndex(),
		memo:         passMemo{locals: map[Family]*localsPart{}, changed: map[string]bool{}, chains: map[Family]*chainMemo{}},
	}
}

// OnUpdate takes one record's change; the key's prefix says its kind.
func (c *incrementalCalc) OnUpdate(key string, value any) {
	delete(c.unreadable, key)
	if err, ok := value.(error); ok {
		c.unreadable[key] = fmt.Sprintf("ignoring unreadable record %s: %v", key, err)
		value = nil // as Desired: an unreadable record is left out
	}
	switch {
	case strings.HasPrefix(key, datastore.EndpointsPrefix):
		if ep, ok := value.(datastore.Endpoint); ok {
			c.dirty[key] = &ep
		} else {
			c.dirty[key] = nil
		}
	case strings.HasPrefix(key, datastore.NetworksPrefix):
		old, had := c.networks.byKey[key]
		if had {
			c.netsChanged[old.ID] = true
		}
		if n, ok := value.(datastore.Network); ok {
			c.networks.set(key, n)
			c.netsChanged[n.ID] = true
		} else {
			c.networks.remove(key)
		}
	case strings.HasPrefix(key, ipam.PoolsPrefix):
		updateRecord(&c.pools, key, value)
	case strings.HasPrefix(key, datastore.NodesPrefix):
		updateRecord(&c.nodes, key, value)
	case strings.HasPrefix(key, api.PoliciesPrefix):
		updateRecord(&c.policies, key, value)
	case strings.HasPrefix(key, api.HostEndpointsPrefix):
		updateRecord(&c.heps, key, value)
	case strings.HasPrefix(key, api.NetworkSetsPrefix):
		updateRecord(&c.networkSets, key, value)
	}
}

func updateRecord[T any](r *records[T], key string, value any) {
	if v, ok := value.(T); ok {
		r.set(key, v)
		return
	}
	r.remove(key)
}

// CompleteDeferredWork brings the indexes up to date with the updates
// taken since the last call and assembles the tables.
func (c *incrementalCalc) CompleteDeferredWork() (Ruleset, []string) {
	c.takeNetworks()
	for _, key := range sortedKeys(c.dirty) {
		c.takeEndpoint(key, c.dirty[key])
	}
	clear(c.dirty)
	for _, ifname := range sortedKeys(c.dirtyIf) {
		c.takeIfname(ifname)
	}
	clear(c.dirtyIf)

	st := State{Node: c.node, IPv6: c.ipv6, Failsafe: c.failsafe,
		Pools: c.pools.list(), Networks: c.networks.list(), Nodes: c.nodes.list(),
		Policies: c.policies.list(), HostEndpoints: c.heps.list(), NetworkSets: c.networkSets.list()}
	rs, more := desiredFrom(st, c.locals, c.memberElements, &c.memo, c.selectors)
	c.selectors.sweep()
	return rs, append(c.warnings(), more...)
}

// LocalEndpoints is how many of this host's joined endpoints have rules.
func (c *incrementalCalc) LocalEndpoints() int { return len(c.ifnames) }

// takeNetworks re-reads the network records' index and marks the
// endpoints of the networks that changed: their logical network, options
// and names come from the record.
func (c *incrementalCalc) takeNetworks() {
	if len(c.netsChanged) == 0 {
		return
	}
	c.netByID = networksByID(c.networks.list())
	for id := range c.netsChanged {
		for key := range c.byNetwork[id] {
			if _, pending := c.dirty[key]; !pending {
				ep := c.computed[key].ep
				c.dirty[key] = &ep
			}
		}
	}
	clear(c.netsChanged)
}

// takeEndpoint replaces what the indexes hold of the endpoint at key by
// what its current record (nil: none) gives.
func (c *incrementalCalc) takeEndpoint(key string, rec *datastore.Endpoint) {
	c.selectors.update(key, rec)
	if old := c.computed[key]; old != nil {
		c.addMembers(old, -1)
		if old.claims {
			c.claimants[old.ep.HostIfName] = deleteName(c.claimants[old.ep.HostIfName], key, true)
			c.dirtyIf[old.ep.HostIfName] = true
		}
		if ks := c.byNetwork[old.ep.Network]; ks != nil {
			delete(ks, key)
			if len(ks) == 0 {
				delete(c.byNetwork, old.ep.Network)
			}
		}
		delete(c.computed, key)
		delete(c.warned, key)
	}
	if rec == nil {
		return
	}
	ep := *rec
	ce := &calcEndpoint{ep: ep, netKey: "id:" + ep.Network}
	if n, known := c.netByID[ep.Network]; known {
		ce.netKey = NetworkKey(n)
	}
	ce.addrs[0], ce.addrs[1] = ep.Addrs()
	if !ce.addrs[0].IsValid() && ep.IPv4 != "" {
		ce.warnings = append(ce.warnings, fmt.Sprintf("endpoint %s: ignoring invalid IPv4 address %q", dataplane.ShortID(ep.ID), ep.IPv4))
	}
	if !ce.addrs[1].IsValid() && ep.IPv6 != "" {
		ce.warnings = append(ce.warnings, fmt.Sprintf("endpoint %s: ignoring invalid IPv6 address %q", dataplane.ShortID(ep.ID), ep.IPv6))
	}
	if ep.Node == c.node && ep.Joined {
		if validIfname(ep.HostIfName) {
			ce.claims = true
			c.claimants[ep.HostIfName] = insertName(c.claimants[ep.HostIfName], key, true)
			c.dirtyIf[ep.HostIfName] = true
		} else {
			ce.warnings = append(ce.warnings, fmt.Sprintf("endpoint %s: host interface name %q is not a workload interface name; no rules for it", dataplane.ShortID(ep.ID), ep.HostIfName))
		}
	}
	c.addMembers(ce, 1)
	if c.byNetwork[ep.Network] == nil {
		c.byNetwork[ep.Network] = map[string]bool{}
	}
	c.byNetwork[ep.Network][key] = true
	c.computed[key] = ce
	if len(ce.warnings) > 0 {
		c.warned[key] = true
	}
}

// addMembers counts (n = 1) or uncounts (n = -1) ce's addresses in its
// logical network's members.
func (c *incrementalCalc) addMembers(ce *calcEndpoint, n int) {
	m := c.members[ce.netKey]
	if m == nil {
		m = map[Family]*memberSet{}
		c.members[ce.netKey] = m
	}
	for _, a := range ce.addrs {
		if !a.IsValid() {
			continue
		}
		f := nft.FamilyOf(a)
		if m[f] == nil {
			m[f] = &memberSet{count: map[netip.Addr]int{}, elems: []string{}}
		}
		m[f].add(a, n)
	}
}

// memberElements is a logical network's member set elements, as
// addrElements gives them.
func (c *incrementalCalc) memberElements(key string, f Family) []string {
	if ms := c.members[key][f]; ms != nil {
		return ms.elems
	}
	return nft.AddrElements(nil)
}

// memberSet is one family's addresses of a logical network: how many
// endpoints have each, and the distinct ones sorted with their set
// elements. A change copies the slices (a Ruleset handed out keeps the
// old ones): a join costs a copy, not a sort and formatting of them all.
type memberSet struct {
	count map[netip.Addr]int
	addrs []netip.Addr
	elems []string
}

func (ms *memberSet) add(a netip.Addr, n int) {
	before := ms.count[a]
	after := before + n
	if after <= 0 {
		delete(ms.count, a)
	} else {
		ms.count[a] = after
	}
	i, found := slices.BinarySearchFunc(ms.addrs, a, netip.Addr.Compare)
	switch {
	case before == 0 && after > 0 && !found:
		ms.addrs = slices.Insert(slices.Clone(ms.addrs), i, a)
		ms.elems = slices.Insert(slices.Clone(ms.elems), i, a.String())
	case before > 0 && after <= 0 && found:
		ms.addrs = slices.Delete(slices.Clone(ms.addrs), i, i+1)
		ms.elems = slices.Delete(slices.Clone(ms.elems), i, i+1)
	}
}

// takeIfname decides which claimant of an interface name gets its rules.
func (c *incrementalCalc) takeIfname(ifname string) {
	c.memo.changed[ifname] = true
	keys := c.claimants[ifname]
	delete(c.conflicts, ifname)
	delete(c.localWarning, ifname)
	i, had := slices.BinarySearch(c.ifnames, ifname)
	if len(keys) == 0 {
		delete(c.claimants, ifname)
		if had {
			c.ifnames = slices.Delete(c.ifnames, i, i+1)
			c.locals = slices.Delete(c.locals, i, i+1)
		}
		return
	}
	for _, k := range keys[1:] {
		c.conflicts[ifname] = append(c.conflicts[ifname], fmt.Sprintf("endpoint %s: interface %s is claimed by another endpoint record too; using the first", dataplane.ShortID(c.computed[k].ep.ID), ifname))
	}
	ce := c.computed[keys[0]]
	l, _, warning := newLocalEndpoint(&ce.ep, ce.netKey, c.netByID, map[string]bool{})
	if warning != "" {
		c.localWarning[ifname] = warning
	}
	if had {
		c.locals[i] = l
		return
	}
	c.ifnames = slices.Insert(c.ifnames, i, ifname)
	c.locals = slices.Insert(c.locals, i, l)
}

// warnings are the unreadable records' and the endpoints' warnings.
func (c *incrementalCalc) warnings() []string {
	var out []string
	for _, k := range sortedKeys(c.unreadable) {
		out = append(out, c.unreadable[k])
	}
	for k := range c.warned {
		out = append(out, c.computed[k].warnings...)
	}
	for _, ws := range c.conflicts {
		out = append(out, ws...)
	}
	for _, w := range c.localWarning {
		out = append(out, w)
	}
	return out
}
