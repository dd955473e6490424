package ipam

import (
	"encoding/json"
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
	if stamped := blockStamps(t, blockKV.Value); len(stamped) != 0 {
		t.Errorf("the block record stamps %v, which every later assignment would write again:\n%s", stamped, blockKV.Value)
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
	for ip, handle := range map[string]string{n.IP.String(): "fresh", old.String(): "old"} {
		a, found, err := v.e.AddressHolder(v.ctx, net.ParseIP(ip))
		if err != nil || !found || a.HandleID != handle {
			t.Errorf("AddressHolder(%s) = %+v, %v, %v; want handle %s", ip, a, found, err, handle)
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
		if stamped := blockStamps(t, kv.Value); len(stamped) != 0 {
			t.Errorf("block of %s still stamps %v after the relabel: %s", ip, stamped, kv.Value)
		}
	}
	mustCheckClean(t, v.e, func(string) bool { return true })

	// ipam check's repair of a handle record whose counts are wrong keeps
	// its time; one made without a time gets the repair's, which counts as
	// young (a missing time would let reconcile take the address for one
	// older than handle records).
	clock = clock.Add(time.Hour)
	for _, tc := range []struct{ id, had, want string }{
		{"fresh", restamp, restamp},
		{"old", "", clock.Format(time.RFC3339Nano)},
	} {
		kv, err := v.m.Store.Get(v.ctx, handleKey(tc.id))
		if err != nil {
			t.Fatal(err)
		}
		if err := v.m.Store.Txn(v.ctx, datastore.Update(handleKey(tc.id),
			datastore.MustJSON(handleRecord{Blocks: map[string]int{"10.9.0.0/26": 7}, Assigned: tc.had}), kv.ModRevision)); err != nil {
			t.Fatal(err)
		}
	}
	r, err := v.e.Check(v.ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.MismatchedHandles) != 2 {
		t.Fatalf("check found mismatched handles %v, want fresh and old", r.MismatchedHandles)
	}
	if err := v.e.Fix(v.ctx, r); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ id, want string }{{"fresh", restamp}, {"old", clock.Format(time.RFC3339Nano)}} {
		var rec handleRecord
		if _, err := v.m.Store.GetJSON(v.ctx, handleKey(tc.id), &rec); err != nil {
			t.Fatal(err)
		}
		if rec.Assigned != tc.want || rec.total() != 1 {
			t.Errorf("handle %s after the repair: %+v, want one address assigned at %s", tc.id, rec, tc.want)
		}
	}
	mustCheckClean(t, v.e, func(string) bool { return true })
}

// blockStamps lists the handles whose attributes in the block record carry
// an assignment stamp.
func blockStamps(t *testing.T, record []byte) []string {
	t.Helper()
	var b struct {
		Attributes []struct {
			HandleID  string            `json:"handleID"`
			Secondary map[string]string `json:"secondary"`
		} `json:"attributes"`
	}
	if err := json.Unmarshal(record, &b); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, a := range b.Attributes {
		if _, ok := a.Secondary[AttrAssigned]; ok {
			out = append(out, a.HandleID)
		}
	}
	return out
}

func mustAddr(t *testing.T, ip net.IP) netip.Addr {
	t.Helper()
	a, ok := addrFromIP(ip)
	if !ok {
		t.Fatalf("%v is not an address", ip)
	}
	return a
}
