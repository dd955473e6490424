package policy

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/calico-cnm/calico-cnm/policy/api"
)

// hostState is policyState with a host endpoint on eth0 of h1, a "*" one
// of another node, a network set and pre-DNAT, normal and forward
// policies selecting the endpoint.
func hostState(t *testing.T) State {
	t.Helper()
	st := policyState(t)
	res, err := api.DecodeResources(strings.NewReader(`
apiVersion: projectcalico.org/v3
kind: HostEndpoint
metadata: {name: h1-eth0, labels: {role: host}}
spec: {node: h1, interfaceName: eth0, expectedIPs: [10.0.0.11]}
---
apiVersion: projectcalico.org/v3
kind: HostEndpoint
metadata: {name: h2-all, labels: {role: host}}
spec: {node: h2, interfaceName: "*", expectedIPs: [10.0.0.12]}
---
apiVersion: projectcalico.org/v3
kind: GlobalNetworkSet
metadata: {name: office, labels: {clients: office}}
spec: {nets: [10.1.0.0/24, 10.1.1.0/24, 10.9.0.7]}
---
apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata: {name: port-from-office}
spec:
  order: 10
  selector: role == 'host'
  preDNAT: true
  applyOnForward: true
  ingress:
  - {action: Allow, protocol: TCP, source: {selector: "clients == 'office'"}, destination: {ports: [8080]}}
  - {action: Deny, protocol: TCP, destination: {ports: [8080]}}
---
apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata: {name: host-open}
spec:
  order: 20
  selector: role == 'host'
  types: [Ingress, Egress]
  ingress: [{action: Allow, source: {selector: "role == 'host'"}}]
  egress: [{action: Allow}]
---
apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata: {name: forward-in}
spec:
  selector: role == 'host'
  applyOnForward: true
  ingress: [{action: Allow, source: {notSelector: "clients == 'office'"}}]
`))
	if err != nil {
		t.Fatal(err)
	}
	st.HostEndpoints, st.NetworkSets = res.HostEndpoints, res.NetworkSets
	st.Policies = append(st.Policies, res.Policies...)
	st.Failsafe = DefaultFailsafe()
	return st
}

func TestDesiredHostEndpoints(t *testing.T) {
	st := hostState(t)
	tb := mustTable(t, mustDesired(t, st), IPv4)
	pre, ok := tb.Chain(chainHostPre)
	if !ok || pre.Base == nil || pre.Base.Hook != "prerouting" || pre.Base.Priority >= -100 {
		t.Fatalf("prerouting chain %+v: want a filter chain before dstnat", pre)
	}
	// Failsafe before the endpoint's policies; only h1's endpoint.
	text := strings.Join(rulesOf(t, tb, chainHostPre), "\n")
	if fs, jump := strings.Index(text, `th dport 22 counter accept comment "failsafe inbound tcp:22"`), strings.Index(text, `iifname "eth0" counter jump hep-`); fs < 0 || jump < fs {
		t.Errorf("prerouting: want failsafe ports then eth0's pre-DNAT jump:\n%s", text)
	}
	if strings.Contains(text, "h2-all") {
		t.Errorf("another node's endpoint has rules here:\n%s", text)
	}
	// The selector set holds the network set's nets and the host
	// endpoints' expected addresses, merged.
	sel := selSetPrefix + hashName(`clients == "office"`)
	if got := setElems(t, tb, sel); !slices.Equal(got, []string{"10.1.0.0/23", "10.9.0.7/32"}) {
		t.Errorf("office selector set %v", got)
	}
	hostSel := selSetPrefix + hashName(`role == "host"`)
	if got := setElems(t, tb, hostSel); !slices.Equal(got, []string{"10.0.0.11/32", "10.0.0.12/32"}) {
		t.Errorf("host selector set %v", got)
	}
	// Input: default deny after the policies; output: the host to its
	// containers is not filtered.
	in := strings.Join(rulesOf(t, tb, chainHostInput), "\n")
	for _, want := range []string{`meta mark & 0x00040000 != 0 counter accept`, `iifname "eth0" counter jump hep-`} {
		if !strings.Contains(in, want) {
			t.Errorf("input lacks %q:\n%s", want, in)
		}
	}
	out := strings.Join(rulesOf(t, tb, chainHostOutput), "\n")
	if !strings.Contains(out, `oifname "cali*" counter accept`) || !strings.Contains(out, `udp dport 53`) && !strings.Contains(out, `th dport 53`) {
		t.Errorf("output:\n%s", out)
	}
	// Forward: eth0's applyOnForward ingress, skipped after a pre-DNAT allow.
	fwd := strings.Join(rulesOf(t, tb, chainForward), "\n")
	if !strings.Contains(fwd, `iifname "eth0" meta mark & 0x00040000 == 0 counter jump hep-`) {
		t.Errorf("forward lacks eth0's applyOnForward jump:\n%s", fwd)
	}
	// Pre-DNAT policy selects no container.
	for _, ep := range st.Endpoints {
		if got := SelectingPolicies(st.Policies, ep.Labels, api.Ingress); slices.Contains(got, "port-from-office") {
			t.Errorf("endpoint %s selected by the pre-DNAT policy", ep.ID)
		}
	}
	// No host endpoint here: no host chains at all.
	st.HostEndpoints = st.HostEndpoints[1:]
	tb = mustTable(t, mustDesired(t, st), IPv4)
	if _, ok := tb.Chain(chainHostInput); ok {
		t.Errorf("host chains without a local host endpoint")
	}
}

// TestNFTHostProgram writes the host endpoint program to the kernel and
// reads it back equal; a network set of 10,000 networks changes by a
// few elements when one network is added or removed.
func TestNFTHostProgram(t *testing.T) {
	requireNetns(t)
	ctx := context.Background()
	ns := newNetns(t, "cnmhep-")
	n, err := NewNFT("/var/run/netns/"+ns, testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	st := hostState(t)
	st.IPv6 = true
	var nets []string
	for i := 0; i < 10000; i++ {
		nets = append(nets, fmt.Sprintf("10.%d.%d.0/25", 100+i/256, i%256))
	}
	st.NetworkSets[0].Spec.Nets = nets
	want := mustDesired(t, st)
	if _, err := n.Apply(ctx, want); err != nil {
		t.Fatal(err)
	}
	checkInSync(t, n, want)
	listing := nftIn(t, ns, "list", "chain", "ip", TableName, chainHostPre)
	if !strings.Contains(listing, "hook prerouting priority mangle") {
		t.Errorf("prerouting chain:\n%s", listing)
	}
	for i, change := range []func(){
		func() { st.NetworkSets[0].Spec.Nets = append(st.NetworkSets[0].Spec.Nets, "10.200.0.0/24") },
		func() { st.NetworkSets[0].Spec.Nets = st.NetworkSets[0].Spec.Nets[1:] },
		// Adjacent to a kept one: the two merge into one range.
		func() { st.NetworkSets[0].Spec.Nets = append(st.NetworkSets[0].Spec.Nets, "10.200.1.0/24") },
	} {
		change()
		want = mustDesired(t, st)
		changes, err := n.Apply(ctx, want)
		// Two sets hold the network set (its selector and notSelector):
		// per set an add, or a delete and an add.
		if err != nil || changes == 0 || changes > 4 {
			t.Fatalf("change %d: %d changes, %v (want one or two element ops per set)", i, changes, err)
		}
		checkInSync(t, n, want)
		n.Resync() // the kernel's elements, read back, are what was meant
		if changes, err := n.Apply(ctx, want); err != nil || changes != 0 {
			t.Fatalf("change %d, from the kernel: %d changes, %v", i, changes, err)
		}
	}
	sel := selSetPrefix + hashName(`clients == "office"`)
	tb := mustTable(t, want, IPv4)
	if els := setElems(t, tb, sel); !slices.Contains(els, "10.200.0.0/23") {
		t.Errorf("the adjacent networks are not one range: %d elements", len(els))
	}
}

// TestNFTCounters reads the policy counters back from the kernel: one per
// rule of each policy, one denied counter per selected endpoint and
// direction; what the chains counted is what Counters sums.
func TestNFTCounters(t *testing.T) {
	requireNetns(t)
	ctx := context.Background()
	ns := newNetns(t, "cnmctr-")
	n, err := NewNFT("/var/run/netns/"+ns, testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	st := policyState(t)
	st.IPv6 = true
	if _, err := n.Apply(ctx, mustDesired(t, st)); err != nil {
		t.Fatal(err)
	}
	cs, err := n.Counters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var rules []string
	for _, r := range cs.Rules {
		rules = append(rules, fmt.Sprintf("%s %s[%d] %s %d", r.Policy, r.Direction, r.Index, r.Action, r.Packets))
	}
	want := []string{"three-tier Ingress[0] Allow 0", "three-tier Ingress[1] Allow 0", "three-tier Ingress[2] Deny 0"}
	if !slices.Equal(rules, want) {
		t.Errorf("rule counters %v, want %v", rules, want)
	}
	// h1's local endpoints the policy selects (a, b): an ingress drop each.
	var denied []string
	for _, d := range cs.Denied {
		denied = append(denied, d.Endpoint[:4]+" "+string(d.Direction))
	}
	if !slices.Equal(denied, []string{"aaaa Ingress", "bbbb Ingress"}) {
		t.Errorf("denied counters %v", denied)
	}
}

// TestHostFailsafeBeforeAnyDrop: in each host chain, the failsafe ports
// and the cluster's tunnels (VXLAN with the nodes, this node's WireGuard
// port) are accepted before any drop or policy jump, under deny-all
// policies of every kind, and the tunnels stay open when the failsafe
// lists are emptied.
func TestHostFailsafeBeforeAnyDrop(t *testing.T) {
	denyAll, err := api.DecodeResources(strings.NewReader(`
apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata: {name: deny-prednat}
spec: {order: 0, selector: all(), preDNAT: true, applyOnForward: true, types: [Ingress], ingress: [{action: Deny}]}
---
apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata: {name: deny-host}
spec: {order: 0, selector: all(), types: [Ingress, Egress], ingress: [{action: Deny}], egress: [{action: Deny}]}
`))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		failsafe Failsafe
		want     map[string][]string // chain: comments that must come first
	}{
		{"default failsafe", DefaultFailsafe(), map[string][]string{
			chainHostPre:    {"failsafe inbound tcp:22", "failsafe inbound tcp:179", "failsafe inbound tcp:2380", "cluster: VXLAN from a node", "cluster: WireGuard to this node"},
			chainHostInput:  {"failsafe inbound tcp:22", "failsafe inbound tcp:2379", "cluster: VXLAN from a node", "cluster: WireGuard to this node"},
			chainHostOutput: {"failsafe outbound tcp:179", "failsafe outbound tcp:2380", "cluster: VXLAN to a node", "cluster: WireGuard from this node"},
		}},
		{"no failsafe ports", Failsafe{}, map[string][]string{
			chainHostPre:    {"cluster: VXLAN from a node", "cluster: WireGuard to this node"},
			chainHostInput:  {"cluster: VXLAN from a node", "cluster: WireGuard to this node"},
			chainHostOutput: {"cluster: VXLAN to a node", "cluster: WireGuard from this node"},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := hostState(t)
			st.Policies = append(st.Policies, denyAll.Policies...)
			st.Failsafe = tc.failsafe
			st.Nodes[0].WireGuardPublicKey = "bm90IGEga2V5IGJ1dCBsb25nIGVub3VnaCB0byBwYXNzISE="
			st.IPv6 = true
			rs := mustDesired(t, st)
			first(t, mustTable(t, rs, IPv4), tc.want)
			ndp := map[string][]string{}
			for _, chain := range []string{chainHostPre, chainHostInput, chainHostOutput} {
				ndp[chain] = []string{"IPv6 neighbor discovery, type 135", "IPv6 neighbor discovery, type 136"}
			}
			first(t, mustTable(t, rs, IPv6), ndp)
		})
	}
}

// first checks that in each chain the rules commented wants accept before
// any drop or policy jump.
func first(t *testing.T, tb Table, want map[string][]string) {
	t.Helper()
	for chain, wants := range want {
		c, ok := tb.Chain(chain)
		if !ok {
			t.Fatalf("no chain %s", chain)
		}
		firstCut := -1
		for i, r := range c.Rules {
			if r.Verdict == Drop || r.Verdict == Jump && strings.HasPrefix(r.Target, hostDispatchPref) {
				firstCut = i
				break
			}
		}
		if firstCut < 0 {
			t.Fatalf("%s: no policy jump or drop under deny-all:\n%s", chain, strings.Join(rulesOf(t, tb, chain), "\n"))
		}
		for _, w := range wants {
			at := slices.IndexFunc(c.Rules, func(r Rule) bool { return r.Comment == w && r.Verdict == Accept })
			if at < 0 || at > firstCut {
				t.Errorf("%s %s: %q at %d, the first drop or policy jump at %d:\n%s", tb.Family, chain, w, at, firstCut, strings.Join(rulesOf(t, tb, chain), "\n"))
			}
		}
	}
}

// TestHostEndpointWithoutInterface: an endpoint of this host that names
// no interface puts nothing under policy, and Desired says so.
func TestHostEndpointWithoutInterface(t *testing.T) {
	st := hostState(t)
	st.HostEndpoints[0].Spec.InterfaceName = ""
	rs, warnings := Desired(st)
	tb := mustTable(t, rs, IPv4)
	if _, ok := tb.Chain(chainHostInput); ok {
		t.Errorf("host chains for an endpoint without an interface")
	}
	if !slices.ContainsFunc(warnings, func(w string) bool {
		return strings.Contains(w, "host endpoint h1-eth0 names no interfaceName")
	}) {
		t.Errorf("no warning about the endpoint without an interface: %q", warnings)
	}
}
