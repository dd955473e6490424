package policy

import (
	"fmt"
	"github.com/calico-cnm/calico-cnm/nft"
	"github.com/calico-cnm/calico-cnm/policy/api"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/ipam"
)

// Test fixtures: Docker-like 64-hex ids, workload interface names as the
// driver derives them (cali + 11 characters of the id).
const (
	net1ID = "1111111111111111111111111111111111111111111111111111111111111111"
	net2ID = "2222222222222222222222222222222222222222222222222222222222222222"
	net3ID = "3333333333333333333333333333333333333333333333333333333333333333"
	net4ID = "4444444444444444444444444444444444444444444444444444444444444444"
	// net1 as created on another host: same name, another id.
	net1RemoteID = "9999999999999999999999999999999999999999999999999999999999999999"
)

func epID(n int) string { return strings.Repeat(string(rune('a'+n)), 64) }

func ifOf(id string) string { return "cali" + id[:11] }

func ep(n int, network, node, ip string, joined bool) datastore.Endpoint {
	id := epID(n)
	return datastore.Endpoint{ID: id, Network: network, Node: node, IPv4: ip + "/32", MAC: "ee:ee:ee:ee:ee:ee", HostIfName: ifOf(id), Joined: joined}
}

// baseState: this host h1 has endpoints 0,1 on net1 and 2 on net2; host h2
// has endpoint 3 on its own net1 (same name, other id) and 4 on net2.
func baseState() State {
	return State{
		Node: "h1",
		Pools: []ipam.Pool{
			{CIDR: "192.168.0.0/16", NATOutgoing: true},
			{CIDR: "10.66.0.0/16"},
			{CIDR: "fd00:1::/64", NATOutgoing: true},
		},
		Networks: []datastore.Network{
			{ID: net1ID, Name: "net1"},
			{ID: net2ID, Name: "net2"},
			{ID: net1RemoteID, Name: "net1"},
		},
		Endpoints: []datastore.Endpoint{
			ep(0, net1ID, "h1", "192.168.0.1", true),
			ep(1, net1ID, "h1", "192.168.0.2", true),
			ep(2, net2ID, "h1", "192.168.0.3", true),
			ep(3, net1RemoteID, "h2", "192.168.1.1", true),
			ep(4, net2ID, "h2", "192.168.1.2", true),
		},
		Nodes: []datastore.Node{{Name: "h1", IPv4: "172.31.0.2"}, {Name: "h2", IPv4: "172.31.0.3"}},
	}
}

func mustTable(t *testing.T, rs Ruleset, f Family) Table {
	t.Helper()
	tb, ok := rs.Table(f)
	if !ok {
		t.Fatalf("no %s table in\n%s", f, rs.Render())
	}
	return tb
}

func setElems(t *testing.T, tb Table, name string) []string {
	t.Helper()
	s, ok := tb.Set(name)
	if !ok {
		t.Fatalf("no set %s in\n%s", name, tb.Render())
	}
	return s.Elements
}

func rulesOf(t *testing.T, tb Table, chain string) []string {
	t.Helper()
	c, ok := tb.Chain(chain)
	if !ok {
		t.Fatalf("no chain %s in\n%s", chain, tb.Render())
	}
	var out []string
	for _, r := range nft.ChainRules(c) {
		out = append(out, r.Render(tb.Family))
	}
	return out
}

// rulesMentioning lists the table's rules containing s, and the rules
// matching an interface set that holds s, written as if they named s (the
// rules the traffic of interface s meets).
func rulesMentioning(tb Table, s string) []string {
	var out []string
	for _, c := range tb.Chains {
		for _, r := range nft.ChainRules(c) {
			txt := r.Render(tb.Family)
			if strings.Contains(txt, s) {
				out = append(out, c.Name+": "+txt)
				continue
			}
			for _, m := range r.Matches {
				if set, ok := tb.Set(m.Value); ok && m.Kind == MatchIfnameSet && !m.Negate && slices.Contains(set.Elements, s) {
					out = append(out, c.Name+": "+strings.Replace(txt, "@"+m.Value, strconv.Quote(s), 1))
				}
			}
		}
	}
	return out
}

func TestDesiredSetsAndNAT(t *testing.T) {
	st := baseState()
	rs, warnings := Desired(st)
	if len(warnings) != 0 {
		t.Errorf("warnings for a clean state: %v", warnings)
	}
	if _, ok := rs.Table(IPv6); ok {
		t.Errorf("an ip6 table without State.IPv6")
	}
	v4 := mustTable(t, rs, IPv4)
	if got, want := setElems(t, v4, setPools), []string{"10.66.0.0/16", "192.168.0.0/16"}; !slices.Equal(got, want) {
		t.Errorf("pools = %v, want %v", got, want)
	}
	if got, want := setElems(t, v4, setNATPools), []string{"192.168.0.0/16"}; !slices.Equal(got, want) {
		t.Errorf("nat-pools = %v, want %v (10.66.0.0/16 has natOutgoing off)", got, want)
	}
	if got, want := setElems(t, v4, setHosts), []string{"172.31.0.2", "172.31.0.3"}; !slices.Equal(got, want) {
		t.Errorf("hosts = %v, want %v", got, want)
	}
	if got, want := setElems(t, v4, setWorkloads), []string{ifOf(epID(0)), ifOf(epID(1)), ifOf(epID(2))}; !slices.Equal(got, want) {
		t.Errorf("workloads = %v, want only this host's joined interfaces %v", got, want)
	}
	nat := rulesOf(t, v4, chainNAT)
	if len(nat) != 1 || !strings.HasPrefix(nat[0], "ip saddr @nat-pools ip daddr != @pools counter masquerade") {
		t.Errorf("postrouting = %q, want one masquerade from @nat-pools to outside @pools", nat)
	}

	st.IPv6 = true
	rs, _ = Desired(st)
	v6 := mustTable(t, rs, IPv6)
	if got := setElems(t, v6, setPools); !slices.Equal(got, []string{"fd00:1::/64"}) {
		t.Errorf("ip6 pools = %v", got)
	}
	if got := setElems(t, v6, setHosts); len(got) != 0 {
		t.Errorf("ip6 hosts = %v, want none (node records have IPv4 only)", got)
	}
	if got := setElems(t, v6, setWorkloads); len(got) != 3 {
		t.Errorf("ip6 workloads = %v: every local interface must be known in both families (fail closed)", got)
	}
}

func TestDesiredIsolation(t *testing.T) {
	rs, _ := Desired(baseState())
	v4 := mustTable(t, rs, IPv4)
	net1Set := NetworkSetName("name:net1")
	// The network set holds the logical network's members on every host:
	// net1 of h1 and net1 of h2 (other Docker id, same name).
	if got, want := setElems(t, v4, net1Set), []string{"192.168.0.1", "192.168.0.2", "192.168.1.1"}; !slices.Equal(got, want) {
		t.Errorf("%s = %v, want %v", net1Set, got, want)
	}
	if got, want := setElems(t, v4, NetworkSetName("name:net2")), []string{"192.168.0.3", "192.168.1.2"}; !slices.Equal(got, want) {
		t.Errorf("net2 set = %v, want %v", got, want)
	}
	// Two rules per local endpoint, in the forward chain.
	for i, nw := range map[int]string{0: net1ID, 1: net1ID, 2: net2ID} {
		got := rulesMentioning(v4, ifOf(epID(i)))
		want := []string{
			"forward: iifname \"" + ifOf(epID(i)) + "\" counter jump " + EgressChainName(nw),
			"forward: oifname \"" + ifOf(epID(i)) + "\" counter jump " + IngressChainName(nw),
		}
		for j := range got {
			got[j] = strings.Split(got[j], " comment ")[0]
		}
		slices.Sort(got)
		if !slices.Equal(got, want) {
			t.Errorf("rules of endpoint %d = %q, want %q", i, got, want)
		}
	}
	// The remote endpoints get no rules here.
	for _, i := range []int{3, 4} {
		if got := rulesMentioning(v4, ifOf(epID(i))); len(got) != 0 {
			t.Errorf("rules for h2's endpoint %d on h1: %q", i, got)
		}
	}
	in := rulesOf(t, v4, IngressChainName(net1ID))
	wantIn := []string{
		"ct status dnat counter return",
		"ip saddr @" + net1Set + " counter return",
		"ip saddr @pools counter drop",
		"ip saddr @hosts counter return",
		"counter drop",
	}
	if len(in) != len(wantIn) {
		t.Fatalf("ingress chain of net1 = %q, want %q", in, wantIn)
	}
	for i := range in {
		if !strings.HasPrefix(in[i], wantIn[i]) {
			t.Errorf("ingress rule %d = %q, want %q...", i, in[i], wantIn[i])
		}
	}
	out := rulesOf(t, v4, EgressChainName(net1ID))
	if len(out) != 3 || !strings.HasPrefix(out[0], "ct status dnat counter return") || !strings.HasPrefix(out[1], "ip daddr @"+net1Set+" counter return") || !strings.HasPrefix(out[2], "ip daddr @pools counter drop") {
		t.Errorf("egress chain of net1 = %q", out)
	}
	// 20 more endpoints on net1 add no rule, no chain and no set: their
	// addresses go into net1's member set, their interfaces into net1's
	// interface set.
	st := baseState()
	for i := 5; i < 25; i++ {
		st.Endpoints = append(st.Endpoints, ep(i, net1ID, "h1", fmt.Sprintf("192.168.2.%d", i), true))
	}
	more, _ := Desired(st)
	v4more := mustTable(t, more, IPv4)
	if got, want := v4more.RuleCount()-v4.RuleCount(), 0; got != want {
		t.Errorf("20 more local endpoints added %d rules, want %d", got, want)
	}
	if len(v4more.Sets) != len(v4.Sets) || len(v4more.Chains) != len(v4.Chains) {
		t.Errorf("more endpoints of an existing network added sets or chains: %d/%d -> %d/%d", len(v4.Sets), len(v4.Chains), len(v4more.Sets), len(v4more.Chains))
	}
	if got := len(setElems(t, v4more, net1Set)); got != 23 {
		t.Errorf("net1 set has %d members, want 23", got)
	}
	if got := len(setElems(t, v4more, JumpSetName(api.Ingress, IngressChainName(net1ID)))); got != 22 {
		t.Errorf("net1's interface set has %d interfaces, want 22 (h1's)", got)
	}
}

func TestDesiredNetworkOptions(t *testing.T) {
	tests := []struct {
		name     string
		networks []datastore.Network
		eps      []datastore.Endpoint
		check    func(t *testing.T, v4 Table, warnings []string)
	}{
		{
			name:     "isolation off: ingress rule only, accepts every pool",
			networks: []datastore.Network{{ID: net3ID, Name: "net3", Options: map[string]string{OptIsolation: "off"}}},
			eps:      []datastore.Endpoint{ep(0, net3ID, "h1", "192.168.0.1", true)},
			check: func(t *testing.T, v4 Table, _ []string) {
				got := rulesMentioning(v4, ifOf(epID(0)))
				if len(got) != 1 || !strings.Contains(got[0], "oifname") {
					t.Errorf("rules = %q, want the ingress jump only", got)
				}
				in := rulesOf(t, v4, IngressChainName(net3ID))
				if len(in) != 4 || !strings.HasPrefix(in[0], "ct status dnat counter return") || !strings.HasPrefix(in[1], "ip saddr @pools counter return") {
					t.Errorf("ingress chain = %q", in)
				}
				if _, ok := v4.Chain(EgressChainName(net3ID)); ok {
					t.Errorf("an egress chain for a network with isolation off")
				}
				if _, ok := v4.Set(NetworkSetName("name:net3")); ok {
					t.Errorf("a member set for a network with isolation off (nothing refers to it)")
				}
			},
		},
		{
			name:     "ingress any: no drop for outside sources",
			networks: []datastore.Network{{ID: net1ID, Name: "net1", Options: map[string]string{OptIngress: "any"}}},
			eps:      []datastore.Endpoint{ep(0, net1ID, "h1", "192.168.0.1", true)},
			check: func(t *testing.T, v4 Table, _ []string) {
				in := rulesOf(t, v4, IngressChainName(net1ID))
				if len(in) != 3 || !strings.HasPrefix(in[2], "ip saddr @pools counter drop") {
					t.Errorf("ingress chain = %q, want published ports, same-network return and other-pools drop only", in)
				}
			},
		},
		{
			name:     "ingress host: hosts set not consulted",
			networks: []datastore.Network{{ID: net1ID, Name: "net1", Options: map[string]string{OptIngress: "Host"}}},
			eps:      []datastore.Endpoint{ep(0, net1ID, "h1", "192.168.0.1", true)},
			check: func(t *testing.T, v4 Table, _ []string) {
				in := rulesOf(t, v4, IngressChainName(net1ID))
				if len(in) != 4 || strings.Contains(strings.Join(in, "\n"), "@hosts") || !strings.HasPrefix(in[3], "counter drop") {
					t.Errorf("ingress chain = %q", in)
				}
			},
		},
		{
			name: "calico.network joins a differently named network to net1",
			networks: []datastore.Network{
				{ID: net1ID, Name: "net1"},
				{ID: net2ID, Name: "frontend", Options: map[string]string{OptNetwork: "net1"}},
			},
			eps: []datastore.Endpoint{ep(0, net1ID, "h1", "192.168.0.1", true), ep(1, net2ID, "h2", "192.168.1.1", true)},
			check: func(t *testing.T, v4 Table, _ []string) {
				if got := setElems(t, v4, NetworkSetName("name:net1")); !slices.Equal(got, []string{"192.168.0.1", "192.168.1.1"}) {
					t.Errorf("net1 members = %v", got)
				}
			},
		},
		{
			name: "an unnamed network is its id only: another host's same-subnet network stays apart",
			networks: []datastore.Network{
				{ID: net1ID},
				{ID: net1RemoteID, Name: "net1"},
			},
			eps: []datastore.Endpoint{ep(0, net1ID, "h1", "192.168.0.1", true), ep(1, net1RemoteID, "h2", "192.168.1.1", true)},
			check: func(t *testing.T, v4 Table, _ []string) {
				if got := setElems(t, v4, NetworkSetName("id:"+net1ID)); !slices.Equal(got, []string{"192.168.0.1"}) {
					t.Errorf("members = %v", got)
				}
			},
		},
		{
			name:     "a bad option value warns and keeps the network isolated",
			networks: []datastore.Network{{ID: net1ID, Name: "net1", Options: map[string]string{OptIsolation: "of"}}},
			eps:      []datastore.Endpoint{ep(0, net1ID, "h1", "192.168.0.1", true)},
			check: func(t *testing.T, v4 Table, warnings []string) {
				if len(warnings) != 1 || !strings.Contains(warnings[0], OptIsolation) {
					t.Errorf("warnings = %q", warnings)
				}
				if _, ok := v4.Chain(EgressChainName(net1ID)); !ok {
					t.Errorf("no egress chain: the network is not isolated")
				}
			},
		},
		{
			name:     "endpoint of a missing network record: isolated by its network id",
			networks: nil,
			eps:      []datastore.Endpoint{ep(0, net4ID, "h1", "192.168.0.1", true), ep(1, net4ID, "h1", "192.168.0.2", false)},
			check: func(t *testing.T, v4 Table, _ []string) {
				if got := setElems(t, v4, NetworkSetName("id:"+net4ID)); !slices.Equal(got, []string{"192.168.0.1", "192.168.0.2"}) {
					t.Errorf("members = %v", got)
				}
				if got := rulesMentioning(v4, ifOf(epID(1))); len(got) != 0 {
					t.Errorf("rules for an endpoint that has not joined: %q", got)
				}
				if got := setElems(t, v4, setWorkloads); !slices.Equal(got, []string{ifOf(epID(0))}) {
					t.Errorf("workloads = %v", got)
				}
			},
		},
		{
			name:     "bad records: odd interface name and address are skipped with warnings",
			networks: []datastore.Network{{ID: net1ID, Name: "net1"}},
			eps: []datastore.Endpoint{
				{ID: epID(0), Network: net1ID, Node: "h1", IPv4: "192.168.0.1/32", HostIfName: "eth0", Joined: true},
				{ID: epID(1), Network: net1ID, Node: "h1", IPv4: "not-an-ip", HostIfName: ifOf(epID(1)), Joined: true},
				{ID: epID(2), Network: net1ID, Node: "h1", IPv4: "192.168.0.3/32", HostIfName: `cali"; drop`, Joined: true},
			},
			check: func(t *testing.T, v4 Table, warnings []string) {
				if len(warnings) != 3 {
					t.Errorf("warnings = %q, want 3", warnings)
				}
				if got := setElems(t, v4, setWorkloads); !slices.Equal(got, []string{ifOf(epID(1))}) {
					t.Errorf("workloads = %v", got)
				}
				if got := setElems(t, v4, NetworkSetName("name:net1")); !slices.Equal(got, []string{"192.168.0.1", "192.168.0.3"}) {
					t.Errorf("members = %v", got)
				}
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			st := State{Node: "h1", Pools: []ipam.Pool{{CIDR: "192.168.0.0/16", NATOutgoing: true}}, Networks: tc.networks, Endpoints: tc.eps}
			rs, warnings := Desired(st)
			tc.check(t, mustTable(t, rs, IPv4), warnings)
		})
	}
}

func TestParseOptions(t *testing.T) {
	tests := []struct {
		opts    map[string]string
		want    NetworkPolicy
		wantErr string
	}{
		{nil, NetworkPolicy{Isolated: true, Ingress: IngressCluster}, ""},
		{map[string]string{"com.docker.network.enable_ipv6": "true"}, NetworkPolicy{Isolated: true, Ingress: IngressCluster}, ""},
		{map[string]string{OptIsolation: "off"}, NetworkPolicy{Isolated: false, Ingress: IngressCluster}, ""},
		{map[string]string{OptIsolation: "OFF", OptIngress: "any"}, NetworkPolicy{Isolated: false, Ingress: IngressAny}, ""},
		{map[string]string{OptIsolation: "on", OptIngress: "host"}, NetworkPolicy{Isolated: true, Ingress: IngressHost}, ""},
		{map[string]string{OptIsolation: "maybe"}, NetworkPolicy{Isolated: true, Ingress: IngressCluster}, OptIsolation},
		{map[string]string{OptIngress: "world"}, NetworkPolicy{Isolated: true, Ingress: IngressCluster}, OptIngress},
		{map[string]string{OptNetwork: "  "}, NetworkPolicy{Isolated: true, Ingress: IngressCluster}, OptNetwork},
	}
	for _, tc := range tests {
		got, err := ParseOptions(tc.opts)
		if got != tc.want {
			t.Errorf("ParseOptions(%v) = %+v, want %+v", tc.opts, got, tc.want)
		}
		switch {
		case tc.wantErr == "" && err != nil:
			t.Errorf("ParseOptions(%v): %v", tc.opts, err)
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("ParseOptions(%v) error = %v, want one naming %s", tc.opts, err, tc.wantErr)
		}
	}
}

func TestNetworkKey(t *testing.T) {
	tests := []struct {
		n    datastore.Network
		want string
	}{
		{datastore.Network{ID: net1ID}, "id:" + net1ID},
		{datastore.Network{ID: net1ID, Name: "net1"}, "name:net1"},
		{datastore.Network{ID: net1ID, Name: "frontend", Options: map[string]string{OptNetwork: "net1"}}, "name:net1"},
	}
	for _, tc := range tests {
		if got := NetworkKey(tc.n); got != tc.want {
			t.Errorf("NetworkKey(%+v) = %q, want %q", tc.n, got, tc.want)
		}
	}
	// Names of nftables objects stay short whatever the network is called.
	long := strings.Repeat("x", 255)
	for _, n := range []string{NetworkSetName("name:" + long), IngressChainName(long), EgressChainName(long)} {
		if len(n) > 31 {
			t.Errorf("%q is longer than older kernels allow", n)
		}
	}
}

func TestDesiredIsDeterministic(t *testing.T) {
	st := baseState()
	a, _ := Desired(st)
	slices.Reverse(st.Endpoints)
	slices.Reverse(st.Networks)
	slices.Reverse(st.Pools)
	b, _ := Desired(st)
	if a.Render() != b.Render() {
		t.Errorf("record order changed the ruleset:\n%s\nvs\n%s", a.Render(), b.Render())
	}
}

// TestDesiredVXLANHosts: with VTEPs in the node records, an isolated
// network lets the cluster's hosts in from their VTEP addresses (which lie
// in the pools) before it drops the pools, unless ingress is "host"; the
// VTEP addresses get a set of their own, never the @hosts set that vouches
// for VXLAN packets.
func TestDesiredVXLANHosts(t *testing.T) {
	st := baseState()
	st.Nodes[1].VXLANTunnelAddr = "10.66.0.1"
	rs, warnings := Desired(st)
	if len(warnings) != 0 {
		t.Fatalf("warnings: %q", warnings)
	}
	v4 := mustTable(t, rs, IPv4)
	if got := setElems(t, v4, setVTEPs); len(got) != 1 || got[0] != "10.66.0.1" {
		t.Errorf("vteps set = %q, want [10.66.0.1]", got)
	}
	for _, e := range setElems(t, v4, setHosts) {
		if e == "10.66.0.1" {
			t.Errorf("a VTEP address in the hosts set: %q", setElems(t, v4, setHosts))
		}
	}
	in := rulesOf(t, v4, IngressChainName(net1ID))
	if len(in) < 4 || !strings.HasPrefix(in[1], "ip saddr @vteps counter return") || !strings.HasPrefix(in[3], "ip saddr @pools counter drop") {
		t.Errorf("ingress chain of net1 = %q, want the VTEPs let in before the pools drop", in)
	}

	st.Networks[0].Options = map[string]string{OptIngress: "host"}
	rs, _ = Desired(st)
	if in := rulesOf(t, mustTable(t, rs, IPv4), IngressChainName(net1ID)); strings.Contains(strings.Join(in, "\n"), "@vteps") {
		t.Errorf("ingress host lets the VTEPs in: %q", in)
	}

	// A WireGuard device address is a host's tunnel address too.
	st = baseState()
	st.Nodes[1].WireGuardInterfaceAddr = "10.66.0.9"
	rs, _ = Desired(st)
	if got := setElems(t, mustTable(t, rs, IPv4), setVTEPs); len(got) != 1 || got[0] != "10.66.0.9" {
		t.Errorf("vteps set with a WireGuard device address = %q, want [10.66.0.9]", got)
	}

	st = baseState()
	rs, _ = Desired(st)
	if in := rulesOf(t, mustTable(t, rs, IPv4), IngressChainName(net1ID)); strings.Contains(strings.Join(in, "\n"), "@vteps") {
		t.Errorf("a rule for VTEPs without any VXLAN node: %q", in)
	}
}
