package bandwidth

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/vishvananda/netlink"

	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/datastore/etcdtest"
)

const testNode = "node-a"

func quiet() logrus.FieldLogger {
	l := logrus.New()
	l.SetLevel(logrus.WarnLevel)
	return l
}

func endpointID(n int) string { return fmt.Sprintf("e%02x%061x", n, n) }

func put(t *testing.T, s *datastore.Store, key string, v any) {
	t.Helper()
	if err := s.Txn(context.Background(), datastore.Put(key, datastore.MustJSON(v))); err != nil {
		t.Fatal(err)
	}
}

// TestManagerSync: the reconcile pass shapes each joined endpoint of this
// node from its records (labels and driver options over network
// defaults), follows a change of the network's defaults, removes the
// shaping of endpoints that left or lost their limits and what a crash
// left behind, leaves endpoints with unknown labels alone, and changes
// nothing when all is in place.
func TestManagerSync(t *testing.T) {
	m := etcdtest.Start(t)
	ctx := context.Background()
	k := newFakeKernel()
	mgr := NewManager(etcdtest.Records(t, m.Store), testNode, NewShaper(k), func() string { return "engine-a" }, quiet())

	nw := datastore.Network{ID: "net1", Options: map[string]string{NetworkOptionPrefix + Ingress: "100mbit", NetworkOptionPrefix + Egress: "40mbit"}}
	put(t, m.Store, datastore.NetworkKey(nw.ID), nw)
	eps := []datastore.Endpoint{
		{Joined: true},
		{Joined: true, Labels: map[string]string{EndpointLabelPrefix + Ingress: "50mbit"}},
		{Joined: true, BandwidthOptions: map[string]string{LabelPrefix + Egress: "20mbit"}},
		{Joined: false},
		{Joined: true, LabelsUnknown: true},
		// Another Docker engine's, under this node name: not ours.
		{Joined: false, EngineID: "engine-b"},
	}
	for i := range eps {
		eps[i].ID, eps[i].Network, eps[i].Node = endpointID(i), nw.ID, testNode
		eps[i].HostIfName = "cali" + eps[i].ID[:11]
		k.addVeth(eps[i].HostIfName)
		put(t, m.Store, datastore.EndpointKey(testNode, eps[i].ID), eps[i])
	}
	// What a crash left: the unjoined endpoint's shaping and an ifb
	// device of an endpoint long gone.
	if _, err := NewShaper(k).Apply(ctx, eps[3].ID, eps[3].HostIfName, Limits{IngressRate: 1e6, EgressRate: 1e6}); err != nil {
		t.Fatal(err)
	}
	gone := endpointID(99)
	if _, _, err := NewShaper(k).ensureIfb(IfbName(gone), 1500, true); err != nil {
		t.Fatal(err)
	}
	// The endpoint with unknown labels keeps what it has; so do the
	// other engine's endpoint and a cali veth of no record of ours
	// (another Calico's, shaped by its CNI bandwidth plugin).
	foreign := "cali" + endpointID(77)[:11]
	k.addVeth(foreign)
	for _, e := range []struct{ id, host string }{{eps[4].ID, eps[4].HostIfName}, {eps[5].ID, eps[5].HostIfName}, {endpointID(77), foreign}} {
		if _, err := NewShaper(k).Apply(ctx, e.id, e.host, Limits{IngressRate: 5e6, EgressRate: 3e6}); err != nil {
			t.Fatal(err)
		}
	}
	// The foreign veth's redirect goes to a device not named like ours.
	k.mu.Lock()
	k.links["bwp"+endpointID(77)[:11]] = k.links[IfbName(endpointID(77))]
	delete(k.links, IfbName(endpointID(77)))
	k.links["bwp"+endpointID(77)[:11]].Attrs().Name = "bwp" + endpointID(77)[:11]
	k.mu.Unlock()

	type rates struct {
		in, out  uint64
		redirect bool
	}
	check := func(want []rates) {
		t.Helper()
		for i, w := range want {
			in, out, redirect := k.shaping(eps[i].ID, eps[i].HostIfName)
			if (rates{in, out, redirect}) != w {
				t.Errorf("endpoint %d: ingress %d egress %d redirect %v; want %+v", i, in, out, redirect, w)
			}
		}
		if _, err := k.LinkByName(IfbName(gone)); err == nil {
			t.Error("the ifb device of a gone endpoint is still there")
		}
		other, err := k.LinkByName("bwp" + endpointID(77)[:11])
		if err != nil {
			t.Fatal("a device not named like ours was removed")
		}
		in, _, _ := k.shaping(endpointID(77), foreign)
		k.mu.Lock()
		redirect := slices.ContainsFunc(k.filters, func(f netlink.Filter) bool { return redirectsTo(f, other.Attrs().Index) })
		k.mu.Unlock()
		if in != 5e6 || !redirect {
			t.Errorf("the qdiscs of a veth of no endpoint of ours were touched: ingress %d, redirect %v", in, redirect)
		}
	}

	fixes, err := mgr.Sync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	check([]rates{{100e6, 40e6, true}, {50e6, 40e6, true}, {100e6, 20e6, true}, {0, 0, false}, {5e6, 3e6, true}, {5e6, 3e6, true}})
	if fixes != 3+3+1 {
		t.Errorf("fixes = %d, want 3 endpoints shaped + 3 leftovers (2 qdiscs, 1 ifb) + 1 orphaned ifb", fixes)
	}

	stats, err := mgr.Stats(ctx)
	if err != nil || len(stats) != 6 {
		t.Errorf("Stats = %+v, %v; want ingress and egress of 3 endpoints", stats, err)
	}

	before := k.mutations()
	if fixes, err := mgr.Sync(ctx); err != nil || fixes != 0 || k.mutations() != before {
		t.Fatalf("a second Sync changed things: %d fixes, %d kernel calls, %v", fixes, k.mutations()-before, err)
	}

	// The network's defaults change (its record): the endpoints that use
	// them follow; dropping the egress default removes the ifb devices.
	nw.Options = map[string]string{NetworkOptionPrefix + Ingress: "30mbit"}
	put(t, m.Store, datastore.NetworkKey(nw.ID), nw)
	if _, err := mgr.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	check([]rates{{30e6, 0, false}, {50e6, 0, false}, {30e6, 20e6, true}, {0, 0, false}, {5e6, 3e6, true}, {5e6, 3e6, true}})
	if _, err := k.LinkByName(IfbName(eps[0].ID)); err == nil {
		t.Error("the ifb device of an endpoint without egress limit is still there")
	}

	// The veth of a joined endpoint vanished (its container is going):
	// its ifb device goes too.
	k.mu.Lock()
	delete(k.links, eps[2].HostIfName)
	k.mu.Unlock()
	if _, err := mgr.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := k.LinkByName(IfbName(eps[2].ID)); err == nil {
		t.Error("the ifb device of an endpoint without veth is still there")
	}
}

// TestManagerFollowsRecords: Run applies a network's new defaults without
// waiting for a reconcile pass.
func TestManagerFollowsRecords(t *testing.T) {
	m := etcdtest.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	k := newFakeKernel()
	mgr := NewManager(etcdtest.Records(t, m.Store), testNode, NewShaper(k), func() string { return "engine-a" }, quiet())
	nw := datastore.Network{ID: "net1"}
	put(t, m.Store, datastore.NetworkKey(nw.ID), nw)
	ep := datastore.Endpoint{ID: endpointID(1), Network: nw.ID, Node: testNode, Joined: true, HostIfName: "cali" + endpointID(1)[:11]}
	k.addVeth(ep.HostIfName)
	put(t, m.Store, datastore.EndpointKey(testNode, ep.ID), ep)
	done := make(chan struct{})
	go func() { defer close(done); mgr.Run(ctx) }()
	defer func() { cancel(); <-done }()

	// The watch may start after a first write: write until it is seen.
	deadline := time.Now().Add(20 * time.Second)
	for rate := 1; ; rate++ {
		nw.Options = map[string]string{NetworkOptionPrefix + Ingress: fmt.Sprintf("%dmbit", rate)}
		put(t, m.Store, datastore.NetworkKey(nw.ID), nw)
		waitUntil := time.Now().Add(time.Second)
		for time.Now().Before(waitUntil) {
			if in, _, _ := k.shaping(ep.ID, ep.HostIfName); in == uint64(rate)*1e6 {
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
		if time.Now().After(deadline) {
			t.Fatal("the network's new default was never applied")
		}
	}
}

// TestManagerAffects: the record changes that need no Sync (the Join's own
// write after its shaping, a Leave's, another engine's, an unlimited
// endpoint's) are told from those that do (labels learnt after Join, a
// network no Sync has read, shaping to remove).
func TestManagerAffects(t *testing.T) {
	m := etcdtest.Start(t)
	ctx := context.Background()
	k := newFakeKernel()
	mgr := NewManager(etcdtest.Records(t, m.Store), testNode, NewShaper(k), func() string { return "engine-a" }, quiet())
	nw := datastore.Network{ID: "net1", Options: map[string]string{NetworkOptionPrefix + Egress: "40mbit"}}
	put(t, m.Store, datastore.NetworkKey(nw.ID), nw)
	if _, err := mgr.Sync(ctx); err != nil { // reads the network
		t.Fatal(err)
	}
	id, other := endpointID(1), endpointID(2)
	host := "cali" + id[:11]
	k.addVeth(host)
	if err := mgr.Apply(ctx, id, host, Limits{EgressRate: 40e6}); err != nil { // Join
		t.Fatal(err)
	}
	ev := func(id string, ep *datastore.Endpoint) datastore.Change {
		key := datastore.EndpointKey(testNode, id)
		if ep == nil {
			return datastore.Change{Key: key}
		}
		ep.ID, ep.HostIfName = id, "cali"+id[:11]
		if ep.Network == "" {
			ep.Network = nw.ID
		}
		v, _ := json.Marshal(ep)
		w, err := datastore.ParseEndpoint(key, v)
		if err != nil {
			t.Fatal(err)
		}
		return datastore.Change{Key: key, New: &datastore.Synced{Key: key, Value: w}}
	}
	tests := []struct {
		name string
		ev   datastore.Change
		want bool
	}{
		{"the Join's own write", ev(id, &datastore.Endpoint{Joined: true}), false},
		{"labels learnt after Join", ev(id, &datastore.Endpoint{Joined: true, Labels: map[string]string{EndpointLabelPrefix + Ingress: "5mbit"}}), true},
		{"labels still unknown", ev(id, &datastore.Endpoint{Joined: true, LabelsUnknown: true}), true},
		{"a network no Sync has read", ev(id, &datastore.Endpoint{Joined: true, Network: "net2"}), true},
		{"a bad value", ev(id, &datastore.Endpoint{Joined: true, BandwidthOptions: map[string]string{LabelPrefix + Egress: "fast"}}), true},
		{"left while shaped", ev(id, &datastore.Endpoint{}), true},
		{"deleted while shaped", ev(id, nil), true},
		{"another engine's", ev(other, &datastore.Endpoint{Joined: true, EngineID: "engine-b", BandwidthOptions: map[string]string{LabelPrefix + Ingress: "1mbit"}}), false},
		{"created, not joined", ev(other, &datastore.Endpoint{}), false},
		{"joined, not yet shaped", ev(other, &datastore.Endpoint{Joined: true}), true},
		{"joined, labels unknown, not shaped", ev(other, &datastore.Endpoint{Joined: true, LabelsUnknown: true}), false},
		{"deleted, never shaped", ev(other, nil), false},
	}
	for _, tt := range tests {
		if got := mgr.affects(tt.ev); got != tt.want {
			t.Errorf("%s: affects = %v, want %v", tt.name, got, tt.want)
		}
	}
	// After its Leave (shaping removed) the record's last writes need no
	// Sync either.
	if err := mgr.Remove(ctx, id, host); err != nil {
		t.Fatal(err)
	}
	for _, e := range []datastore.Change{ev(id, &datastore.Endpoint{}), ev(id, nil)} {
		if mgr.affects(e) {
			t.Errorf("a write after the Leave (deleted: %v) needs a Sync", e.Deleted())
		}
	}
}
