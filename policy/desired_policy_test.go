package policy

import (
	"fmt"
	"github.com/calico-cnm/calico-cnm/nft"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/policy/api"
)

func threeTier(t *testing.T) api.GlobalNetworkPolicy {
	t.Helper()
	f, err := os.Open("api/testdata/three-tier.yaml")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ps, err := api.Decode(f)
	if err != nil {
		t.Fatal(err)
	}
	return ps[0]
}

func labelled(e datastore.Endpoint, kv ...string) datastore.Endpoint {
	e.Labels = map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		e.Labels[kv[i]] = kv[i+1]
	}
	return e
}

// policyState: on h1 endpoint 0 is a frontend, 1 a backend, 2 unlabelled;
// on h2 endpoint 3 is a db and 4 a frontend.
func policyState(t *testing.T) State {
	st := baseState()
	st.Endpoints[0] = labelled(st.Endpoints[0], "role", "frontend")
	st.Endpoints[1] = labelled(st.Endpoints[1], "role", "backend")
	st.Endpoints[3] = labelled(st.Endpoints[3], "role", "db")
	st.Endpoints[4] = labelled(st.Endpoints[4], "role", "frontend")
	st.Policies = []api.GlobalNetworkPolicy{threeTier(t)}
	return st
}

func TestDesiredPolicyThreeTier(t *testing.T) {
	rs, warnings := Desired(policyState(t))
	if len(warnings) > 0 {
		t.Fatalf("warnings: %v", warnings)
	}
	tb := mustTable(t, rs, IPv4)
	pi := PolicyChainName("three-tier", api.Ingress)
	selFront := selSetPrefix + hashName(`role == "frontend"`)
	selBack := selSetPrefix + hashName(`role == "backend"`)
	selDB := selSetPrefix + hashName(`role == "db"`)
	selAny := selSetPrefix + hashName(`has(role)`)
	// Rule selectors hold the cluster's matching addresses, both hosts.
	for set, want := range map[string][]string{
		selFront: {"192.168.0.1/32", "192.168.1.2/32"},
		selBack:  {"192.168.0.2/32"},
		selDB:    {"192.168.1.1/32"},
		selAny:   {"192.168.0.1/32", "192.168.0.2/32", "192.168.1.1/32", "192.168.1.2/32"},
	} {
		if got := setElems(t, tb, set); !slices.Equal(got, want) {
			t.Errorf("set %s = %v, want %v", set, got, want)
		}
	}
	wantPolicy := []string{
		"meta l4proto 6 ip saddr @" + selFront + " ip daddr @" + selBack + " th dport 8080 counter meta mark set mark & 0xfffeffff | 0x00010000 return comment \"three-tier ingress rule 0: Allow\"",
		"meta l4proto 6 ip saddr @" + selBack + " ip daddr @" + selDB + " th dport 5432 counter meta mark set mark & 0xfffeffff | 0x00010000 return comment \"three-tier ingress rule 1: Allow\"",
		"ip saddr @" + selAny + " counter meta mark set mark & 0xfff7ffff | 0x00080000 return comment \"three-tier ingress rule 2: Deny\"",
	}
	if got := rulesOf(t, tb, pi); !slices.Equal(got, wantPolicy) {
		t.Errorf("policy chain:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(wantPolicy, "\n"))
	}
	// Endpoints 0 and 1 (labelled, local) go through their policy chains;
	// 2 (no role) keeps its network's chain; no egress policy: the
	// network's egress chains stay.
	for n, selected := range map[int]bool{0: true, 1: true, 2: false} {
		to, from := jumpTarget(tb, epID(n), false), jumpTarget(tb, epID(n), true)
		if strings.HasPrefix(to, toEndpointPrefix) != selected || strings.HasPrefix(from, fromEndpointPrefix) {
			t.Errorf("endpoint %d: ingress via %s (policies: %v), egress via %s (want the network's)", n, to, selected, from)
		}
	}
	to := jumpTarget(tb, epID(1), false)
	if other := jumpTarget(tb, epID(0), false); other != to {
		t.Errorf("endpoints with the same policies use different chains %s and %s", to, other)
	}
	wantEP := []string{
		`counter meta mark set mark & 0xfff4ffff | 0x00000000 comment "policies three-tier"`,
		`counter jump ` + pi + ` comment "policy three-tier"`,
		`meta mark & 0x00010000 != 0 counter meta mark set mark & 0xfff4ffff | 0x00000000 return comment "allowed by a policy"`,
		`meta mark & 0x00020000 != 0 counter meta mark set mark & 0xfff4ffff | 0x00000000 goto ` + IngressChainName(net1ID) + ` comment "pass: the network's rules"`,
		// No policy decided, or one denied: dropped in the endpoint's own
		// rule, whose counter is its denied packets.
		`oifname "caliaaaaaaaaaaa" counter drop comment "` + DeniedComment(api.Ingress, strings.Repeat("a", 64)) + `"`,
		`oifname "calibbbbbbbbbbb" counter drop comment "` + DeniedComment(api.Ingress, strings.Repeat("b", 64)) + `"`,
	}
	if got := rulesOf(t, tb, to); !slices.Equal(got, wantEP) {
		t.Errorf("endpoint chain:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(wantEP, "\n"))
	}
	// Rules grow with local endpoints x policies, not with the cluster:
	// more remote frontends only add set elements.
	st := policyState(t)
	before := tb.RuleCount()
	for i := 0; i < 50; i++ {
		e := labelled(ep(5+i, net2ID, "h2", "192.168.2."+strconv.Itoa(i+1), true), "role", "frontend")
		e.ID = fmt.Sprintf("%064x", 0xf000+i)
		st.Endpoints = append(st.Endpoints, e)
	}
	rs2, _ := Desired(st)
	tb2 := mustTable(t, rs2, IPv4)
	if tb2.RuleCount() != before {
		t.Errorf("50 remote endpoints changed the rule count %d -> %d", before, tb2.RuleCount())
	}
	// An interval set: 192.168.2.1-50 are 6 prefixes.
	if got := setElems(t, tb2, selFront); !slices.Equal(got, []string{"192.168.0.1/32", "192.168.1.2/32", "192.168.2.1/32", "192.168.2.2/31",
		"192.168.2.4/30", "192.168.2.8/29", "192.168.2.16/28", "192.168.2.32/28", "192.168.2.48/31", "192.168.2.50/32"}) {
		t.Errorf("frontend set %v", got)
	}
}

func TestDesiredPolicyActions(t *testing.T) {
	st := policyState(t)
	in := `apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata: {name: acts}
spec:
  order: 1
  selector: role == 'backend'
  egress:
  - action: Log
  - action: Pass
    protocol: UDP
    destination: {ports: [53, "50:60", 100], notPorts: [55]}
  - action: Allow
    ipVersion: 6
  - action: Allow
    protocol: ICMP
    icmp: {type: 8, code: 0}
    destination: {nets: [10.0.0.0/8, "fd00::/8"], notNets: [10.1.0.0/16]}
  - action: Deny
    notProtocol: TCP
    destination: {notSelector: "role == 'db'"}
`
	ps, err := api.Decode(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	st.Policies = append(st.Policies, ps...)
	st.IPv6 = true
	// An endpoint whose labels are unknown matches no selector.
	st.Endpoints[2].LabelsUnknown = true
	rs, _ := Desired(st)
	tb := mustTable(t, rs, IPv4)
	po := PolicyChainName("acts", api.Egress)
	nets := netsSetPrefix + hashName("10.0.0.0/8")
	notNets := netsSetPrefix + hashName("10.1.0.0/16")
	nsel := notSelSetPrefix + hashName(`role == "db"`)
	want := []string{
		`counter log prefix "calico-cnm acts " comment "acts egress rule 0: Log"`,
		`meta l4proto 17 th dport != 55 th dport 50-60 counter meta mark set mark & 0xfffdffff | 0x00020000 return comment "acts egress rule 1: Pass"`,
		`meta l4proto 17 th dport != 55 th dport 100 counter meta mark set mark & 0xfffdffff | 0x00020000 return comment "acts egress rule 1: Pass"`,
		`meta l4proto 1 icmp type 8 icmp code 0 ip daddr @` + nets + ` ip daddr != @` + notNets + ` counter meta mark set mark & 0xfffeffff | 0x00010000 return comment "acts egress rule 3: Allow"`,
		`meta l4proto != 6 ip daddr != @` + nsel + ` counter meta mark set mark & 0xfff7ffff | 0x00080000 return comment "acts egress rule 4: Deny"`,
	}
	if got := rulesOf(t, tb, po); !slices.Equal(got, want) {
		t.Errorf("policy chain:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	// The excluded set holds the db and the endpoint of unknown labels.
	if got := setElems(t, tb, nsel); !slices.Equal(got, []string{"192.168.0.3/32", "192.168.1.1/32"}) {
		t.Errorf("notSelector set %v", got)
	}
	// IPv6: the ipVersion 6 rule is there, the ICMP (v4) one is not.
	tb6 := mustTable(t, rs, IPv6)
	got6 := rulesOf(t, tb6, po)
	if !slices.ContainsFunc(got6, func(s string) bool { return strings.Contains(s, "rule 2: Allow") }) || slices.ContainsFunc(got6, func(s string) bool { return strings.Contains(s, "rule 3") }) {
		t.Errorf("ip6 policy chain:\n%s", strings.Join(got6, "\n"))
	}
	if slices.ContainsFunc(rulesOf(t, tb, po), func(s string) bool { return strings.Contains(s, "rule 2") }) {
		t.Error("ipVersion 6 rule in the ip table")
	}
	// Backend (endpoint 1): egress through from-chain, with the network's
	// egress chain as its profile; ingress through three-tier.
	from := jumpTarget(tb, epID(1), true)
	r := rulesOf(t, tb, from)
	if !strings.Contains(r[3], "goto "+EgressChainName(net1ID)) {
		t.Errorf("pass of the egress chain: %v", r)
	}
	// Endpoint 2 (labels unknown) is fail-closed in both directions.
	to2, from2 := jumpTarget(tb, epID(2), false), jumpTarget(tb, epID(2), true)
	for _, c := range []string{to2, from2} {
		if got := rulesOf(t, tb, c); len(got) != 1 || !strings.Contains(got[0], "drop") {
			t.Errorf("unknown labels chain %s: %v", c, got)
		}
	}
}

// Deleting the last policy leaves nothing of the policy program behind.
func TestDesiredPolicyRemoved(t *testing.T) {
	without, _ := Desired(baseState())
	st := policyState(t)
	st.Policies = nil
	rs, _ := Desired(st)
	if rs.Render() != without.Render() {
		t.Errorf("labels without policies changed the tables:\n%s\nwant\n%s", rs.Render(), without.Render())
	}
	ops := Diff(mustDesired(t, policyState(t)), without)
	if len(ops) == 0 {
		t.Fatal("no diff")
	}
}

func mustDesired(t *testing.T, st State) Ruleset {
	rs, w := Desired(st)
	if len(w) > 0 {
		t.Fatal(w)
	}
	return rs
}

// jumpTarget is the chain the forward chain sends an endpoint's traffic to
// (from it: in; to it: !in).
func jumpTarget(tb Table, id string, in bool) string {
	c, _ := tb.Chain(chainForward)
	for _, r := range nft.ChainRules(c) {
		if len(r.Matches) != 1 || r.Matches[0].In != in || r.Verdict != Jump {
			continue
		}
		switch m := r.Matches[0]; m.Kind {
		case MatchIfname:
			if m.Value == ifOf(id) {
				return r.Target
			}
		case MatchIfnameSet:
			if set, ok := tb.Set(m.Value); ok && slices.Contains(set.Elements, ifOf(id)) {
				return r.Target
			}
		}
	}
	return ""
}
