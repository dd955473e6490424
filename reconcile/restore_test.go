package reconcile_test

import (
	"context"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/calico-cnm/calico-cnm/dataplane"
	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/ipam"
	"github.com/calico-cnm/calico-cnm/reconcile"
)

func TestPlanReconcileReclaims(t *testing.T) {
	tests := []struct {
		name   string
		allocs []ipam.Allocation
		docker *reconcile.DockerView
		want   []string // "ip endpoint-tag"
		// rebuilt are the tags of the records to rebuild, handles the
		// handles they come with (by tag).
		rebuilt []string
		handles map[string][]string
	}{
		{
			name:   "a live endpoint's address no assignment holds is reclaimed, with or without its record",
			allocs: []ipam.Allocation{alloc("10.0.0.1", "h1", host)},
			docker: view(dockerEP("a1", "net1", "10.0.0.1"), dockerEP("a2", "net1", "10.0.0.2"), dockerEP("a3", "net1", "10.0.0.3")),
			want:   []string{"10.0.0.2 a2", "10.0.0.3 a3"},
			// No record and no assignment: the datastore lost them all.
			rebuilt: []string{"a2", "a3"},
		},
		{
			name:   "an unknown endpoint whose address is still held (a renamed node's) is not rebuilt",
			allocs: []ipam.Allocation{alloc("10.0.0.2", "h2", "old-name")},
			docker: view(dockerEP("a2", "net1", "10.0.0.2")),
		},
		{
			// An earlier pass reclaimed it with a view of the records
			// older than the loss (or the daemon stopped before the
			// rebuild): the record is rebuilt with that handle.
			name:    "an unknown endpoint whose address a reclaim holds for it is rebuilt",
			allocs:  []ipam.Allocation{reclaimedAlloc("10.0.0.2", "h2", host, epID("a2")), reclaimedAlloc("10.0.0.3", "h3", host, epID("a2"))},
			docker:  view(dockerEP("a2", "net1", "10.0.0.2", "10.0.0.4"), dockerEP("a3", "net1", "10.0.0.3")),
			want:    []string{"10.0.0.4 a2"},
			rebuilt: []string{"a2"},
			handles: map[string][]string{"a2": {"h2"}},
		},
		{
			name:   "held by anyone (another node, the swarm manager) is not reclaimed",
			allocs: []ipam.Allocation{alloc("10.0.0.2", "h2", "host-b")},
			docker: view(dockerEP("a2", "net1", "10.0.0.2")),
		},
		{
			name:   "another driver's network is not ours to reclaim",
			docker: view(dockerEP("c2", "bridge", "172.17.0.2")),
		},
		{
			name: "Docker unknown: nothing",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			plan := reconcile.MakePlan(reconcile.Input{
				Node: host, Now: time.Now(), Grace: time.Minute,
				Allocations: tc.allocs, Networks: map[string]bool{"net1": true},
				Docker: tc.docker, ReleaseOrphans: true,
			})
			var got []string
			for _, r := range plan.Reclaim {
				got = append(got, r.IP.String()+" "+tagOf(r.Endpoint))
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("reclaim = %v, want %v", got, tc.want)
			}
			var rebuilt []string
			handles := map[string][]string{}
			for _, ep := range plan.Rebuild {
				rebuilt = append(rebuilt, tagOf(ep.ID))
				if len(ep.Handles) > 0 {
					handles[tagOf(ep.ID)] = ep.Handles
				}
			}
			if !reflect.DeepEqual(rebuilt, tc.rebuilt) {
				t.Errorf("rebuild = %v, want %v", rebuilt, tc.rebuilt)
			}
			if want := tc.handles; len(want)+len(handles) > 0 && !reflect.DeepEqual(handles, want) {
				t.Errorf("rebuilt with handles %v, want %v", handles, want)
			}
		})
	}
}

// reclaimedAlloc is the assignment a reclaim made on node for endpoint id.
func reclaimedAlloc(ip, handle, node, id string) ipam.Allocation {
	a := alloc(ip, handle, node)
	a.Attrs[ipam.AttrReclaimedFor] = id
	return a
}

// TestReconcilerAfterRestore: a backup taken with c1 and c2 running, c3
// started afterwards, the backup restored while all three still run. The
// pass keeps every live address: c1's and c2's are back with their
// records, c3's is reclaimed and its record (gone with the restore)
// rebuilt, and the next assignment is none of them.
func TestReconcilerAfterRestore(t *testing.T) {
	e := newRecEnv(t)
	ctx := context.Background()
	if _, err := e.store.EnsureFormat(ctx, "", "test"); err != nil {
		t.Fatal(err)
	}
	id1, ip1 := e.container(t, "c1")
	id2, ip2 := e.container(t, "c2")
	b, err := e.store.Export(ctx)
	if err != nil {
		t.Fatal(err)
	}
	id3, ip3 := e.container(t, "c3")
	if _, err := e.store.Restore(ctx, b, "test"); err != nil {
		t.Fatalf("restore: %v", err)
	}
	// Until this node has reconciled, the restore holds assignments back:
	// c3's address looks free.
	gated := ipam.New(e.store, ipam.Options{Log: quietLog(), AssignGate: e.store.CheckRestoreHold})
	if _, err := gated.AutoAssign(ctx, ipam.AutoAssignArgs{Host: host, HandleID: "cnm.early"}); !errors.Is(err, datastore.ErrRestoreInProgress) {
		t.Fatalf("AutoAssign before the pass after a restore: %v; want ErrRestoreInProgress", err)
	}
	if _, held := e.allocated(t)[ip3.String()]; held {
		t.Fatalf("the restore should have lost c3's assignment (taken after the backup)")
	}
	c3 := dockerEP("c3", "net1", ip3.String())
	c3.MAC = "ee:ee:ee:ee:ee:03"
	e.docker.set(view(dockerEP("c1", "net1", ip1.String()), dockerEP("c2", "net1", ip2.String()), c3), nil)
	var relabelled []string
	e.rec.Relabel = func(_ context.Context, endpointID, networkID string) {
		relabelled = append(relabelled, endpointID+"@"+networkID)
	}

	res := e.pass(t)
	if want := []string{id3 + "@net1"}; !reflect.DeepEqual(relabelled, want) {
		t.Fatalf("labels asked for %v; want the rebuilt endpoint's (%v)", relabelled, want)
	}
	if res.Fixes[reconcile.FixAddressReclaimed] != 1 || len(res.Plan.Unknown) != 1 || tagOf(res.Plan.Unknown[0]) != "c3" {
		t.Fatalf("pass after restore: fixes %v, unknown %v; want c3's address reclaimed and c3 reported", res.Fixes, res.Plan.Unknown)
	}
	as, err := e.engine.Allocations(ctx)
	if err != nil {
		t.Fatal(err)
	}
	byIP := map[string]ipam.Allocation{}
	for _, a := range as {
		byIP[a.IP.String()] = a
	}
	if a := byIP[ip3.String()]; a.Attrs[ipam.AttrNode] != host || a.Attrs[ipam.AttrReclaimedFor] != id3 {
		t.Fatalf("c3's address %s after the pass: %+v; want assigned to %s, reclaimed for %s", ip3, a, host, id3[:12])
	}
	if byIP[ip1.String()].HandleID != "cnm.c1" || byIP[ip2.String()].HandleID != "cnm.c2" {
		t.Fatalf("c1/c2 lost their restored assignments: %v", byIP)
	}
	if len(e.kernel.removed) != 0 {
		t.Fatalf("reconcile removed veths of running containers: %v", e.kernel.removed)
	}
	for _, id := range []string{id1, id2} {
		if _, err := e.store.Get(ctx, datastore.EndpointKey(host, id)); err != nil {
			t.Fatalf("restored record %s: %v", id[:12], err)
		}
	}
	// c3's record is rebuilt from Docker's view, with the reclaimed
	// handle and its labels left to be learnt.
	var ep3 datastore.Endpoint
	if _, err := e.store.GetJSON(ctx, datastore.EndpointKey(host, id3), &ep3); err != nil {
		t.Fatalf("c3's record not rebuilt: %v", err)
	}
	want3 := datastore.Endpoint{ID: id3, Network: "net1", Node: host, IPv4: ip3.String() + "/32", MAC: "ee:ee:ee:ee:ee:03", HostIfName: dataplane.HostIfName(id3),
		Joined: true, LabelsUnknown: true, Handles: []string{byIP[ip3.String()].HandleID}}
	if !reflect.DeepEqual(ep3, want3) {
		t.Fatalf("c3's rebuilt record:\n got %+v\nwant %+v", ep3, want3)
	}
	if res.Fixes[reconcile.FixEndpointRebuilt] != 1 {
		t.Fatalf("fixes %v: want one endpoint rebuilt", res.Fixes)
	}
	if !e.kernel.ifaces[dataplane.HostIfName(id3)][ip3.String()] {
		t.Fatalf("c3's veth or route was touched")
	}

	if err := e.store.CheckRestoreHold(ctx); err != nil {
		t.Fatalf("the pass did not release the restore hold: %v", err)
	}
	// The next container gets a fresh address, and the reclaimed one
	// outlives the grace period: it is in use, not an orphan.
	next, err := gated.AutoAssign(ctx, ipam.AutoAssignArgs{Host: host, HandleID: "cnm.c4", Attrs: map[string]string{"node": host}})
	if err != nil {
		t.Fatal(err)
	}
	for _, ip := range []string{ip1.String(), ip2.String(), ip3.String()} {
		if next.IP.String() == ip {
			t.Fatalf("a live address %s was handed out again", ip)
		}
	}
	e.clock = e.clock.Add(time.Hour)
	e.pass(t)
	if _, held := e.allocated(t)[ip3.String()]; !held {
		t.Fatalf("the reclaimed address %s was released while c3 runs", ip3)
	}
}

// TestReconcilerKick: a kick (the datastore was restored) runs a pass at
// once, without waiting for the interval or a Docker event.
func TestReconcilerKick(t *testing.T) {
	e := newRecEnv(t)
	_, ip1 := e.container(t, "c1")
	kick := make(chan struct{}, 1)
	e.rec.Kick = kick
	e.rec.Interval = time.Hour
	e.docker.set(view(dockerEP("c1", "net1", ip1.String())), nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	done := make(chan struct{})
	go func() { defer close(done); e.rec.Run(ctx) }()
	defer func() { cancel(); <-done }()
	waitFor := func(n int) {
		t.Helper()
		for e.docker.viewCalls() < n {
			if ctx.Err() != nil {
				t.Fatalf("no pass %d (view calls %d)", n, e.docker.viewCalls())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitFor(1) // the pass at start
	kick <- struct{}{}
	waitFor(2)
}
