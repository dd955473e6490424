package ipam

import (
	"maps"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/calico-cnm/calico-cnm/datastore"
)

// An assignment's stamp is written once, in its handle record, and not in
// the block, which every assignment rewrites whole. Every reader of
// assignments still sees it as AttrAssigned; assignments made when blocks
// carried the stamp keep theirs; the leak check ages assignments by it.
func TestAssignmentStampLivesInTheHandleRecord(t *testing.T) {
	clock := time.Date(2026, 12, 7, 6, 0, 0, 0, time.UTC)
	v := newEnv(t, Options{Now: func() time.Time { return clock }})
	v.pool("10.9.0.0/16", 26)
	n, err := v.e.AutoAssign(v.ctx, AutoAssignArgs{Host: "h1", HandleID: "fresh", Attrs: map[string]string{AttrNode: "h1"}})
	if err != nil {
		t.Fatal(err)
	}
	stamp := clock.Format(time.RFC3339Nano)
	blockKV, err := v.m.Store.Get(v.ctx, blockKey(blockOf(mustAddr(t, n.IP), 26)))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(blockKV.Value), AttrAssigned) {
		t.Errorf("the block record carries a stamp, which every later assignment would write again:\n%s", blockKV.Value)
	}
	var rec handleRecord
	if _, err := v.m.Store.GetJSON(v.ctx, handleKey("fresh"), &rec); err != nil {
		t.Fatal(err)
	}
	if rec.Assigned != stamp {
		t.Errorf("handle record says assigned %q, want %q", rec.Assigned, stamp)
	}

	// An assignment as an engine that stamped blocks wrote it: the stamp
	// in the block's attributes, none in the handle record.
	oldStamp := clock.Add(-48 * time.Hour).Format(time.RFC3339Nano)
	old := netip.MustParseAddr("10.9.200.1")
	ob := newBlock(blockOf(old, 26), "h2")
	ord, _ := ordinalOf(ob.prefix, old)
	ob.allocate(ord, "old", map[string]string{AttrNode: "h2", AttrAssigned: oldStamp})
	if err := v.m.Store.Txn(v.ctx,
		datastore.Create(blockKey(ob.prefix), ob.value()),
		datastore.Create(handleKey("old"), datastore.MustJSON(handleRecord{Blocks: map[string]int{ob.CIDR: 1}})),
		datastore.Create(affinityKey("h2", ob.prefix), datastore.MustJSON(affinityRecord{State: stateConfirmed}))); err != nil {
		t.Fatal(err)
	}

	want := map[string]string{n.IP.String(): stamp, old.String(): oldStamp}
	all, err := v.e.Allocations(v.ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, a := range all {
		got[a.IP.String()] = a.Attrs[AttrAssigned]
	}
	if !maps.Equal(got, want) {
		t.Errorf("Allocations report stamps %v, want %v", got, want)
	}
	for ip, s := range want {
		a, found, err := v.e.AddressHolder(v.ctx, net.ParseIP(ip))
		if err != nil || !found || a.Attrs[AttrAssigned] != s {
			t.Errorf("AddressHolder(%s) = %v, %v, %v; want stamp %s", ip, a.Attrs, found, err, s)
		}
	}

	// Two hours on, neither is in use: both are leaks by age. One minute
	// on, only the old one is.
	for _, tc := range []struct {
		after time.Duration
		leak  []string
	}{
		{time.Minute, []string{"old"}},
		{2 * time.Hour, []string{"fresh", "old"}},
	} {
		rules := &LeakRules{
			Now: clock.Add(tc.after), MinAge: time.Hour,
			InUse:    func(Allocation) bool { return false },
			Verified: func(string) bool { return true },
		}
		r, err := v.e.Check(v.ctx, rules)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Join(r.LeakedHandles, ",") != strings.Join(tc.leak, ",") || len(r.Unverified) != 0 {
			t.Errorf("%s on: leaked %v, unverified %v; want leaked %v", tc.after, r.LeakedHandles, r.Unverified, tc.leak)
		}
	}

	// Relabelling stamps the assignment anew, in the handle record, and
	// moves an old assignment's stamp out of its block.
	clock = clock.Add(time.Hour)
	restamp := clock.Format(time.RFC3339Nano)
	for _, id := range []string{"fresh", "old"} {
		ip := n.IP
		if id == "old" {
			ip = net.IP(old.AsSlice())
		}
		a, found, err := v.e.UpdateHolder(v.ctx, ip, func(a Allocation) (map[string]string, error) {
			attrs := maps.Clone(a.Attrs)
			attrs[AttrPool] = "relabelled"
			return attrs, nil
		})
		if err != nil || !found {
			t.Fatalf("UpdateHolder(%s): %v, found %v", ip, err, found)
		}
		if a.Attrs[AttrAssigned] != restamp || a.Attrs[AttrPool] != "relabelled" {
			t.Errorf("UpdateHolder(%s) answered %v, want pool relabelled and stamp %s", ip, a.Attrs, restamp)
		}
		var rec handleRecord
		if _, err := v.m.Store.GetJSON(v.ctx, handleKey(id), &rec); err != nil {
			t.Fatal(err)
		}
		if rec.Assigned != restamp {
			t.Errorf("handle %s says assigned %q after the relabel, want %q", id, rec.Assigned, restamp)
		}
		kv, err := v.m.Store.Get(v.ctx, blockKey(blockOf(mustAddr(t, ip), 26)))
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(kv.Value), AttrAssigned) {
			t.Errorf("block of %s still carries a stamp after the relabel: %s", ip, kv.Value)
		}
	}
	mustCheckClean(t, v.e, func(string) bool { return true })
}

func mustAddr(t *testing.T, ip net.IP) netip.Addr {
	t.Helper()
	a, ok := addrFromIP(ip)
	if !ok {
		t.Fatalf("%v is not an address", ip)
	}
	return a
}
