package ipam

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/calico-cnm/calico-cnm/datastore"
)

func TestCheckAndFix(t *testing.T) {
	v := newEnv(t, Options{})
	v.pool("10.0.0.0/24", 0)
	for _, h := range []string{"live1", "live2", "dead"} {
		assign(t, v.e, "h1", h)
	}
	blk := hostBlocks(t, v.e, "h1")[0]
	h2blk := blockOf(assign(t, v.engine(Options{}), "h2", "live3"), 26)
	isLive := func(h string) bool { return h != "dead" }

	s := v.m.Store
	corrupt := []struct {
		name string
		ops  []datastore.Op
	}{
		{"orphaned handle", []datastore.Op{datastore.Put(handleKey("ghost"), datastore.MustJSON(handleRecord{Blocks: map[string]int{blk.String(): 1}}))}},
		{"handle count off", []datastore.Op{datastore.Put(handleKey("live2"), datastore.MustJSON(handleRecord{Blocks: map[string]int{blk.String(): 5}}))}},
		{"affinity record lost", []datastore.Op{datastore.Delete(affinityKey("h2", h2blk), 0)}},
		{"affinity without block", []datastore.Op{datastore.Put(affinityKey("h9", pfx("10.0.0.192/26")), datastore.MustJSON(affinityRecord{State: stateConfirmed}))}},
	}
	for _, c := range corrupt {
		if err := s.Txn(v.ctx, c.ops...); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
	}

	r, err := v.e.Check(v.ctx, rulesOf(isLive))
	if err != nil {
		t.Fatal(err)
	}
	want := Report{
		LeakedHandles:      []string{"dead"},
		OrphanedHandles:    []string{"ghost"},
		MismatchedHandles:  []string{"live2"},
		MissingAffinities:  []string{"h2/" + h2blk.String()},
		DanglingAffinities: []string{"h9/10.0.0.192/26"},
	}
	for _, f := range []struct {
		name      string
		got, want []string
	}{
		{"leaked", r.LeakedHandles, want.LeakedHandles},
		{"orphaned", r.OrphanedHandles, want.OrphanedHandles},
		{"mismatched", r.MismatchedHandles, want.MismatchedHandles},
		{"missing affinities", r.MissingAffinities, want.MissingAffinities},
		{"dangling affinities", r.DanglingAffinities, want.DanglingAffinities},
	} {
		if !slices.Equal(f.got, f.want) {
			t.Errorf("%s: got %v, want %v", f.name, f.got, f.want)
		}
	}
	if r.Problems() != 5 {
		t.Fatalf("Problems() = %d, want 5", r.Problems())
	}
	if err := v.e.Fix(v.ctx, r); err != nil {
		t.Fatalf("Fix: %v", err)
	}
	mustCheckClean(t, v.e, isLive)
	if ips, _ := v.e.IPsByHandle(v.ctx, "dead"); len(ips) != 0 {
		t.Fatalf("leaked addresses not released: %v", ips)
	}
	if bs := hostBlocks(t, v.e, "h2"); len(bs) != 1 || bs[0] != h2blk {
		t.Fatalf("h2's affinity not restored: %v", bs)
	}
	// The engine keeps working on top of the repaired records (its cached
	// handle for live2 is stale and must be re-read, not trusted).
	if err := v.e.ReleaseByHandle(v.ctx, "live2"); err != nil {
		t.Fatal(err)
	}
	assign(t, v.e, "h1", "after")
	mustCheckClean(t, v.e, isLive)
}

// The leak rules of issue 12 item 1, one handle at a time.
func TestLeakRulesVerdict(t *testing.T) {
	now := time.Date(2024, 1, 1, 12, 0, 0, 0, time.UTC)
	at := func(d time.Duration) string { return now.Add(-d).Format(time.RFC3339Nano) }
	rules := &LeakRules{
		Now:       now,
		MinAge:    10 * time.Minute,
		InUse:     func(a Allocation) bool { return a.HandleID == "recorded" },
		Verified:  func(node string) bool { return node == "h1" },
		NodeKnown: func(node string) bool { return node == "h1" },
	}
	alloc := func(attrs map[string]string) []Allocation {
		return []Allocation{{IP: netipToIP("10.0.0.1"), Attrs: attrs}}
	}
	for _, tc := range []struct {
		name    string
		handle  string
		as      []Allocation
		leaked  bool
		suspect string // substring of Why; "" = no suspect
	}{
		{"old, unused, this node's", "dead", alloc(map[string]string{AttrNode: "h1", AttrAssigned: at(time.Hour)}), true, ""},
		{"in use", "recorded", alloc(map[string]string{AttrNode: "h1", AttrAssigned: at(time.Hour)}), false, ""},
		{"young", "young", alloc(map[string]string{AttrNode: "h1", AttrAssigned: at(time.Minute)}), false, ""},
		{"aux reservation", "aux", alloc(map[string]string{AttrNode: "h1", AttrAssigned: at(time.Hour), AttrReserved: ReservedAux}), false, ""},
		{"swarm manager's", "vip", alloc(map[string]string{AttrNode: "h1", AttrAssigned: at(time.Hour), AttrSwarm: "true"}), false, ""},
		{"another node's", "remote", alloc(map[string]string{AttrNode: "h2", AttrAssigned: at(time.Hour)}), false, "Docker on node h2"},
		{"no owner", "nobody", alloc(map[string]string{AttrAssigned: at(time.Hour)}), false, "no node"},
		{"age unknown", "legacy", alloc(map[string]string{AttrNode: "h1"}), false, "age is unknown"},
		{"VTEP of a known node", VXLANTunnelHandle("h1"), alloc(map[string]string{AttrType: AttrTypeVXLANTunnel, AttrAssigned: at(time.Hour)}), false, ""},
		{"VTEP of a deleted node", VXLANTunnelHandle("gone"), alloc(map[string]string{AttrType: AttrTypeVXLANTunnel, AttrAssigned: at(time.Hour)}), true, ""},
		{"young VTEP of a deleted node", VXLANTunnelHandle("gone"), alloc(map[string]string{AttrType: AttrTypeVXLANTunnel, AttrAssigned: at(time.Minute)}), false, ""},
		{"one of two addresses young", "dual", append(alloc(map[string]string{AttrNode: "h1", AttrAssigned: at(time.Hour)}),
			alloc(map[string]string{AttrNode: "h1", AttrAssigned: at(time.Second)})...), false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for i := range tc.as {
				tc.as[i].HandleID = tc.handle
			}
			leaked, sus := rules.verdict(tc.handle, tc.as)
			if leaked != tc.leaked {
				t.Errorf("leaked = %v, want %v", leaked, tc.leaked)
			}
			switch {
			case tc.suspect == "" && sus != nil:
				t.Errorf("suspect %+v, want none", sus)
			case tc.suspect != "" && (sus == nil || !strings.Contains(sus.Why, tc.suspect)):
				t.Errorf("suspect %+v, want one saying %q", sus, tc.suspect)
			}
		})
	}
}
