package policy

import (
	"github.com/calico-cnm/calico-cnm/nft"
	"github.com/calico-cnm/calico-cnm/policy/api"
	"slices"
	"strings"
	"testing"

	"github.com/calico-cnm/calico-cnm/datastore"
)

// asDumped is rs as Dump would return it after writing it with
// ReplaceTable: each chain's rules in write order, with handles.
func asDumped(rs Ruleset) Ruleset {
	var out Ruleset
	handle := uint64(100)
	for _, t := range rs.Tables {
		dt := Table{Family: t.Family, Sets: slices.Clone(t.Sets)}
		for _, c := range t.Chains {
			dc := Chain{Name: c.Name, Base: c.Base}
			for _, r := range nft.ChainRules(c) {
				handle++
				r.Handle = handle
				dc.Rules = append(dc.Rules, r)
			}
			dt.Chains = append(dt.Chains, dc)
		}
		out.Tables = append(out.Tables, dt)
	}
	return out
}

func opStrings(ops []Op) []string {
	out := make([]string, len(ops))
	for i, o := range ops {
		out[i] = o.String()
	}
	return out
}

func desired(t *testing.T, st State) Ruleset {
	t.Helper()
	rs, warnings := Desired(st)
	if len(warnings) > 0 {
		t.Fatalf("%d warnings, the first: %v", len(warnings), warnings[0])
	}
	return rs
}

func TestDiffInSyncIsEmpty(t *testing.T) {
	st := baseState()
	st.IPv6 = true
	want := desired(t, st)
	if ops := Diff(asDumped(want), want); len(ops) != 0 {
		t.Errorf("Diff of a table with itself = %q", opStrings(ops))
	}
}

func TestDiffFromNothingWritesEverything(t *testing.T) {
	want := desired(t, baseState())
	ops := Diff(Ruleset{}, want)
	if len(ops) == 0 || ops[0].Kind != OpAddTable {
		t.Fatalf("plan does not start with add table: %q", opStrings(ops))
	}
	for _, o := range ops {
		if o.Kind == OpDelTable {
			t.Errorf("plan for an absent table deletes it: %q", opStrings(ops))
		}
	}
	v4, _ := want.Table(IPv4)
	var sets, chains, rules int
	for _, o := range ops {
		switch o.Kind {
		case OpAddSet:
			sets++
		case OpAddChain:
			chains++
		case OpAddRule:
			rules++
		}
	}
	if sets != len(v4.Sets) || chains != len(v4.Chains) || rules != v4.RuleCount() {
		t.Errorf("plan adds %d sets, %d chains, %d rules; table has %d, %d, %d", sets, chains, rules, len(v4.Sets), len(v4.Chains), v4.RuleCount())
	}
	// Sets and chains come before any rule that refers to them.
	firstRule := slices.IndexFunc(ops, func(o Op) bool { return o.Kind == OpAddRule })
	for i, o := range ops {
		if (o.Kind == OpAddSet || o.Kind == OpAddChain) && i > firstRule {
			t.Errorf("op %d %q comes after the first rule", i, o)
		}
	}
}

// TestDiffJoinAndLeave: an endpoint joining adds exactly its set elements
// (its network's interface set, its network's members, the workloads) and
// no rule; leaving undoes exactly that.
func TestDiffJoinAndLeave(t *testing.T) {
	before := baseState()
	after := baseState()
	joined := ep(7, net1ID, "h1", "192.168.0.7", true)
	after.Endpoints = append(after.Endpoints, joined)
	ifn := joined.HostIfName
	net1Set := NetworkSetName("name:net1")
	inSet, outSet := JumpSetName(api.Ingress, IngressChainName(net1ID)), JumpSetName(api.Egress, EgressChainName(net1ID))

	join := opStrings(Diff(asDumped(desired(t, before)), desired(t, after)))
	wantJoin := []string{
		"add element ip calico-cnm " + inSet + " { " + ifn + " }",
		"add element ip calico-cnm " + outSet + " { " + ifn + " }",
		"add element ip calico-cnm " + net1Set + " { 192.168.0.7 }",
		"add element ip calico-cnm workloads { " + ifn + " }",
	}
	slices.Sort(wantJoin) // the sets' names are hashes: the plan adds in name order
	if !slices.Equal(join, wantJoin) {
		t.Errorf("join plan:\n%s\nwant:\n%s", strings.Join(join, "\n"), strings.Join(wantJoin, "\n"))
	}

	dumped := asDumped(desired(t, after))
	leave := Diff(dumped, desired(t, before))
	var got []string
	for _, o := range leave {
		switch o.Kind {
		case OpDelElements:
			got = append(got, o.String())
		default:
			t.Errorf("leave plan has %s", o)
		}
	}
	wantLeave := []string{
		"delete element ip calico-cnm " + inSet + " { " + ifn + " }",
		"delete element ip calico-cnm " + outSet + " { " + ifn + " }",
		"delete element ip calico-cnm " + net1Set + " { 192.168.0.7 }",
		"delete element ip calico-cnm workloads { " + ifn + " }",
	}
	slices.Sort(wantLeave)
	if !slices.Equal(got, wantLeave) {
		t.Errorf("leave plan %q, want %q", opStrings(leave), wantLeave)
	}

	// Leaving the last endpoint of a network removes its chains and set.
	last := baseState()
	last.Endpoints = slices.DeleteFunc(last.Endpoints, func(e datastore.Endpoint) bool { return e.ID == epID(2) })
	plan := opStrings(Diff(asDumped(desired(t, baseState())), desired(t, last)))
	for _, w := range []string{
		"delete chain ip calico-cnm " + IngressChainName(net2ID),
		"delete chain ip calico-cnm " + EgressChainName(net2ID),
		"delete set ip calico-cnm " + NetworkSetName("name:net2"),
	} {
		if !slices.Contains(plan, w) {
			t.Errorf("plan lacks %q:\n%s", w, strings.Join(plan, "\n"))
		}
	}
	// ...after the rules jumping there, and the set after the chains.
	idx := func(prefix string) int {
		return slices.IndexFunc(plan, func(s string) bool { return strings.HasPrefix(s, prefix) })
	}
	if !(idx("delete rule") < idx("delete chain") && idx("delete chain") < idx("delete set")) {
		t.Errorf("plan order wrong:\n%s", strings.Join(plan, "\n"))
	}
}

// An interval set changes by whole ranges: the new pool's range is added,
// the kept one is not written again.
func TestDiffIntervalSetByRanges(t *testing.T) {
	before := baseState()
	after := baseState()
	after.Pools[1].NATOutgoing = true
	plan := opStrings(Diff(asDumped(desired(t, before)), desired(t, after)))
	want := []string{
		"add element ip calico-cnm nat-pools { 10.66.0.0/16 }",
	}
	if !slices.Equal(plan, want) {
		t.Errorf("plan %q, want %q", plan, want)
	}
}

func TestDiffRepairs(t *testing.T) {
	want := desired(t, baseState())
	tests := []struct {
		name   string
		tamper func(rs *Ruleset)
		check  func(t *testing.T, plan []string)
	}{
		{
			name: "foreign rule among the endpoint rules is deleted by handle",
			tamper: func(rs *Ruleset) {
				c := &rs.Tables[0].Chains[chainIndex(rs.Tables[0], chainForward)]
				c.Rules = append(c.Rules, Rule{Handle: 999, Comment: "unrecognised: "})
			},
			check: func(t *testing.T, plan []string) {
				if len(plan) != 1 || !strings.HasPrefix(plan[0], "delete rule ip calico-cnm forward handle 999") {
					t.Errorf("plan %q", plan)
				}
			},
		},
		{
			name: "changed head rule rewrites the chain",
			tamper: func(rs *Ruleset) {
				c := &rs.Tables[0].Chains[chainIndex(rs.Tables[0], chainForward)]
				c.Rules[0].Verdict = Drop
			},
			check: func(t *testing.T, plan []string) {
				if len(plan) == 0 || plan[0] != "flush chain ip calico-cnm forward" {
					t.Errorf("plan %q", plan)
				}
			},
		},
		{
			name: "a base chain with another hook replaces the table",
			tamper: func(rs *Ruleset) {
				c := &rs.Tables[0].Chains[chainIndex(rs.Tables[0], chainNAT)]
				c.Base = &BaseChain{Type: "nat", Hook: "postrouting", Priority: 50}
			},
			check: func(t *testing.T, plan []string) {
				if len(plan) < 3 || plan[0] != "add table ip calico-cnm" || plan[1] != "delete table ip calico-cnm" {
					t.Errorf("plan %q", plan)
				}
			},
		},
		{
			name: "missing element is added, extra set deleted",
			tamper: func(rs *Ruleset) {
				tb := &rs.Tables[0]
				for i := range tb.Sets {
					if tb.Sets[i].Name == setHosts {
						tb.Sets[i].Elements = []string{"172.31.0.2", "172.31.0.99"}
					}
				}
				tb.Sets = append(tb.Sets, Set{Name: "stray", Type: SetAddr})
			},
			check: func(t *testing.T, plan []string) {
				want := []string{
					"delete element ip calico-cnm hosts { 172.31.0.99 }",
					"add element ip calico-cnm hosts { 172.31.0.3 }",
					"delete set ip calico-cnm stray",
				}
				if !slices.Equal(plan, want) {
					t.Errorf("plan %q, want %q", plan, want)
				}
			},
		},
		{
			name: "an ip6 table no longer wanted is deleted",
			tamper: func(rs *Ruleset) {
				rs.Tables = append(rs.Tables, Table{Family: IPv6})
			},
			check: func(t *testing.T, plan []string) {
				if !slices.Equal(plan, []string{"delete table ip6 calico-cnm"}) {
					t.Errorf("plan %q", plan)
				}
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cur := asDumped(want)
			tc.tamper(&cur)
			tc.check(t, opStrings(Diff(cur, want)))
		})
	}
}

func chainIndex(t Table, name string) int {
	return slices.IndexFunc(t.Chains, func(c Chain) bool { return c.Name == name })
}
