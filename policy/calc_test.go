package policy

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/internal/retry"
	"github.com/calico-cnm/calico-cnm/ipam"
	"github.com/calico-cnm/calico-cnm/nft"
	"github.com/calico-cnm/calico-cnm/policy/api"
)

// calcResources are the policy resources the random sequences write:
// policies selecting by role (with rule selectors, a notSelector and a
// network set), one selecting nothing, a preDNAT host policy, host
// endpoints and network sets.
const calcResources = `
apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata: {name: web}
spec:
  order: 10
  selector: role == 'r0'
  ingress:
  - {action: Allow, protocol: TCP, source: {selector: "role == 'r1'"}, destination: {ports: [80]}}
  - {action: Deny, source: {notSelector: "role == 'r2'"}}
  egress:
  - {action: Allow, destination: {selector: "deny == 'yes'"}}
---
apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata: {name: all}
spec:
  order: 20
  selector: has(role)
  types: [Ingress]
  ingress:
  - {action: Pass, source: {nets: [10.9.0.0/16]}}
  - {action: Allow, source: {selector: "has(role)"}}
---
apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata: {name: nobody}
spec:
  selector: role == 'none'
  ingress: [{action: Allow}]
---
apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata: {name: host}
spec:
  selector: role == 'host'
  preDNAT: true
  applyOnForward: true
  types: [Ingress]
  ingress: [{action: Deny, source: {selector: "deny == 'yes'"}}]
---
apiVersion: projectcalico.org/v3
kind: HostEndpoint
metadata: {name: h1-eth0, labels: {role: host}}
spec: {node: h1, interfaceName: eth0, expectedIPs: [172.31.0.2]}
---
apiVersion: projectcalico.org/v3
kind: HostEndpoint
metadata: {name: h2-eth0, labels: {role: r1}}
spec: {node: h2, interfaceName: eth0, expectedIPs: [172.31.0.3]}
---
apiVersion: projectcalico.org/v3
kind: GlobalNetworkSet
metadata: {name: bad-guys, labels: {deny: "yes"}}
spec: {nets: [198.51.100.0/24, 203.0.113.7/32]}
---
apiVersion: projectcalico.org/v3
kind: GlobalNetworkSet
metadata: {name: more, labels: {deny: "yes"}}
spec: {nets: [198.51.100.128/25, "2001:db8::/64"]}
`

// calcGen writes random records.
type calcGen struct {
	r         *rand.Rand
	resources map[string][]byte // policy resources by key
}

func newCalcGen(t *testing.T, seed uint64) *calcGen {
	t.Helper()
	res, err := api.DecodeResources(strings.NewReader(calcResources))
	if err != nil {
		t.Fatal(err)
	}
	g := &calcGen{r: rand.New(rand.NewPCG(seed, 1)), resources: map[string][]byte{}}
	for _, p := range res.Policies {
		g.resources[api.PolicyKey(p.Metadata.Name)] = datastore.MustJSON(p)
	}
	for _, h := range res.HostEndpoints {
		g.resources[api.HostEndpointKey(h.Metadata.Name)] = datastore.MustJSON(h)
	}
	for _, n := range res.NetworkSets {
		g.resources[api.NetworkSetKey(n.Metadata.Name)] = datastore.MustJSON(n)
	}
	return g
}

func (g *calcGen) pick(vs ...string) string { return vs[g.r.IntN(len(vs))] }

// networks: two with records, one without (an endpoint of it gets the
// stand-in).
var calcNetworks = []string{net1ID, net2ID, net1RemoteID}

func (g *calcGen) endpoint() (string, []byte) {
	n := g.r.IntN(14)
	node := g.pick("h1", "h1", "h2")
	id := epID(n)
	e := datastore.Endpoint{ID: id, Network: calcNetworks[g.r.IntN(len(calcNetworks))], Joined: g.r.IntN(4) > 0,
		IPv4:       g.pick("192.168.0."+fmt.Sprint(g.r.IntN(6)+1)+"/32", "192.168.0.1/32", "10.66.0.3", "", "bogus", "fd00:1::1/128"),
		IPv6:       g.pick("", "", "fd00:1::"+fmt.Sprint(g.r.IntN(4)+1)+"/128", "192.168.7.7/32"),
		HostIfName: g.pick(ifOf(id), ifOf(id), ifOf(id), "caliShared1", "eth0")}
	switch g.r.IntN(5) {
	case 0:
		e.LabelsUnknown = true
	case 1:
	default:
		e.Labels = map[string]string{"role": g.pick("r0", "r1", "r2"), "deny": g.pick("yes", "no")}
	}
	if g.r.IntN(20) == 0 {
		return datastore.EndpointKey(node, id), []byte("not json")
	}
	return datastore.EndpointKey(node, id), datastore.MustJSON(e)
}

func (g *calcGen) network() (string, []byte) {
	id := calcNetworks[g.r.IntN(2)]
	n := datastore.Network{Name: g.pick("", "net1", "net2"), Options: map[string]string{}}
	switch g.r.IntN(5) {
	case 0:
		n.Options[OptIsolation] = "off"
	case 1:
		n.Options[OptIngress] = g.pick(IngressAny, IngressHost, "sideways")
	case 2:
		n.Options[OptNetwork] = g.pick("shared", "other")
	}
	return datastore.NetworkKey(id), datastore.MustJSON(n)
}

func (g *calcGen) pool() (string, []byte) {
	cidr := g.pick("192.168.0.0/16", "10.66.0.0/16", "fd00:1::/64", "not-a-cidr")
	return ipam.PoolsPrefix + strings.ReplaceAll(cidr, "/", "-"), datastore.MustJSON(ipam.Pool{CIDR: cidr, NATOutgoing: g.r.IntN(2) == 0})
}

func (g *calcGen) node() (string, []byte) {
	name := g.pick("h1", "h2", "h3")
	n := datastore.Node{Name: name, IPv4: g.pick("172.31.0.2", "172.31.0.3", "bad"), VXLANTunnelAddr: g.pick("", "192.168.200.1")}
	return datastore.NodesPrefix + name, datastore.MustJSON(n)
}

func (g *calcGen) resource() (string, []byte) {
	keys := sortedKeys(g.resources)
	k := keys[g.r.IntN(len(keys))]
	return k, g.resources[k]
}

// prefixOf is the followed prefix key lies under.
func prefixOf(key string) string {
	for _, p := range followed {
		if strings.HasPrefix(key, p) {
			return p
		}
	}
	return ""
}

// TestCalculatorMatchesDesired: random sequences of changes (endpoints
// joining, leaving, moving between networks, sharing interface names and
// addresses; networks renamed or their options changed; pools, nodes,
// policies, host endpoints and network sets written and deleted; whole
// re-lists), taken in by the syncer's intake in bursts, give after each
// burst the Ruleset and warnings Desired computes from all the records.
func TestCalculatorMatchesDesired(t *testing.T) {
	for seed := uint64(1); seed <= 40; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			g, s, ss := startCalcGen(t, seed)
			for burst := 0; burst < 60; burst++ {
				g.burst(s, ss)
				checkCalc(t, s, ss, fmt.Sprintf("burst %d", burst))
			}
		})
	}
}

// startCalcGen is seed's generator and a syncer (IPv6 on even seeds)
// whose intake has read every kind once, empty.
func startCalcGen(t *testing.T, seed uint64) (*calcGen, *Syncer, *syncState) {
	t.Helper()
	g := newCalcGen(t, seed)
	s, err := NewSyncer(Config{Store: &datastore.Store{}, Node: "h1", Dataplane: &fakeDataplane{}, IPv6: seed%2 == 0})
	if err != nil {
		t.Fatal(err)
	}
	ss := &syncState{records: map[string]map[string][]byte{}, loaded: map[string]bool{}, delay: retry.New(retry.Standard()), warned: map[string]bool{}}
	for _, p := range followed {
		ss.merge(s, update{prefix: p, snapshot: map[string][]byte{}, rev: 1})
	}
	return g, s, ss
}

// burst makes one to four random changes through ss's intake.
func (g *calcGen) burst(s *Syncer, ss *syncState) {
	for n := g.r.IntN(4) + 1; n > 0; n-- {
		g.step(s, ss)
	}
}

// step makes one random change through ss's intake.
func (g *calcGen) step(s *Syncer, ss *syncState) {
	var key string
	var val []byte
	switch k := g.r.IntN(20); {
	case k < 10:
		key, val = g.endpoint()
	case k < 12:
		key, val = g.network()
	case k < 13:
		key, val = g.pool()
	case k < 14:
		key, val = g.node()
	case k < 18:
		key, val = g.resource()
	default:
		// A re-list: the prefix's records with some dropped and one
		// changed.
		p := followed[g.r.IntN(len(followed))]
		snap := map[string][]byte{}
		for k, v := range ss.records[p] {
			if g.r.IntN(3) > 0 {
				snap[k] = v
			}
		}
		if p == datastore.EndpointsPrefix {
			k, v := g.endpoint()
			snap[k] = v
		}
		ss.merge(s, update{prefix: p, snapshot: snap, rev: 2})
		return
	}
	ev := datastore.Event{Type: datastore.EventPut, Key: key, Value: val, ModRevision: 2}
	if g.r.IntN(4) == 0 {
		ev = datastore.Event{Type: datastore.EventDelete, Key: key, ModRevision: 2}
	}
	ss.merge(s, update{prefix: prefixOf(key), event: &ev})
}

// checkCalc compares the incremental calculation with Desired over the
// same records.
func checkCalc(t *testing.T, s *Syncer, ss *syncState, when string) {
	t.Helper()
	got, gotWarnings := ss.calculator(s).CompleteDeferredWork()
	st, bad := s.state(ss.records)
	want, wantWarnings := Desired(st)
	if !reflect.DeepEqual(withoutText(got), withoutText(want)) {
		t.Fatalf("%s: the incremental Ruleset differs from Desired's:\nops from Desired's to it: %v\nincremental:\n%s\nDesired:\n%s", when, Diff(want, got), got.Render(), want.Render())
	}
	if g, w := uniqueSorted(gotWarnings), uniqueSorted(append(bad, wantWarnings...)); !slices.Equal(g, w) {
		t.Fatalf("%s: warnings\n%q\nwant\n%q", when, g, w)
	}
}

// withoutText is rs without the rules' cached nft text (rendered once
// and kept by whoever memoises rules), each chain's unordered rules in
// the order nft writes them (the Calculator appends a dispatch chain's
// drops in the order endpoints come): the rules as such are compared.
func withoutText(rs Ruleset) Ruleset {
	var out Ruleset
	for _, t := range rs.Tables {
		nt := t
		nt.Chains = make([]Chain, len(t.Chains))
		for i, c := range t.Chains {
			un := nft.ChainRules(Chain{Unordered: c.Unordered})
			if c.Unordered == nil {
				un = nil
			}
			c.Rules, c.Unordered = plainRules(c.Rules), plainRules(un)
			nt.Chains[i] = c
		}
		out.Tables = append(out.Tables, nt)
	}
	return out
}

func plainRules(rs []Rule) []Rule {
	if rs == nil {
		return nil
	}
	out := make([]Rule, len(rs))
	for i, r := range rs {
		out[i] = r.WithoutText()
	}
	return out
}

func uniqueSorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return slices.Compact(s)
}

// TestCalculatorOnUpdateKinds: a table of single changes from a common
// start, each checked against Desired, so that a kind the random
// sequences miss shows by name.
func TestCalculatorOnUpdateKinds(t *testing.T) {
	g := newCalcGen(t, 99)
	e0 := ep(0, net1ID, "h1", "192.168.0.1", true)
	e1 := ep(1, net1ID, "h1", "192.168.0.2", true)
	moved := e1
	moved.Network = net2ID
	sameIf := ep(2, net1ID, "h1", "192.168.0.3", true)
	sameIf.HostIfName = e0.HostIfName
	left := e0
	left.Joined = false
	steps := []struct {
		name string
		key  string
		val  []byte // nil: delete
	}{
		{"an endpoint joins", datastore.EndpointKey("h1", e0.ID), datastore.MustJSON(e0)},
		{"a second joins", datastore.EndpointKey("h1", e1.ID), datastore.MustJSON(e1)},
		{"a network record appears", datastore.NetworkKey(net1ID), datastore.MustJSON(datastore.Network{Name: "net1"})},
		{"an endpoint moves network", datastore.EndpointKey("h1", e1.ID), datastore.MustJSON(moved)},
		{"another claims the same interface, after it in key order", datastore.EndpointKey("h1", sameIf.ID), datastore.MustJSON(sameIf)},
		{"the network's isolation is turned off", datastore.NetworkKey(net1ID), datastore.MustJSON(datastore.Network{Name: "net1", Options: map[string]string{OptIsolation: "off"}})},
		{"a policy", api.PolicyKey("web"), g.resources[api.PolicyKey("web")]},
		{"a network set", api.NetworkSetKey("bad-guys"), g.resources[api.NetworkSetKey("bad-guys")]},
		{"the first claimant leaves", datastore.EndpointKey("h1", e0.ID), datastore.MustJSON(left)},
		{"the first claimant is deleted", datastore.EndpointKey("h1", e0.ID), nil},
		{"an unreadable endpoint record", datastore.EndpointKey("h1", e1.ID), []byte("{")},
		{"the network record goes", datastore.NetworkKey(net1ID), nil},
		{"the policy goes", api.PolicyKey("web"), nil},
	}
	s, err := NewSyncer(Config{Store: &datastore.Store{}, Node: "h1", Dataplane: &fakeDataplane{}, IPv6: true})
	if err != nil {
		t.Fatal(err)
	}
	ss := &syncState{records: map[string]map[string][]byte{}, loaded: map[string]bool{}, delay: retry.New(retry.Standard()), warned: map[string]bool{}}
	for _, p := range followed {
		ss.merge(s, update{prefix: p, snapshot: map[string][]byte{}, rev: 1})
	}
	for _, st := range steps {
		ev := datastore.Event{Type: datastore.EventPut, Key: st.key, Value: st.val, ModRevision: 2}
		if st.val == nil {
			ev = datastore.Event{Type: datastore.EventDelete, Key: st.key, ModRevision: 2}
		}
		ss.merge(s, update{prefix: prefixOf(st.key), event: &ev})
		checkCalc(t, s, ss, st.name)
	}
}
