package policy

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/datastore/etcdtest"
	"github.com/calico-cnm/calico-cnm/internal/retry"
	"github.com/calico-cnm/calico-cnm/ipam"
)

// fakeDataplane records what the syncer applies; failures can be injected.
type fakeDataplane struct {
	mu      sync.Mutex
	last    Ruleset
	applies int
	fail    int // fail this many applies first
}

func (f *fakeDataplane) Apply(ctx context.Context, want Ruleset) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail > 0 {
		f.fail--
		return 0, errors.New("injected failure")
	}
	f.last = want
	f.applies++
	return 1, nil
}

func (f *fakeDataplane) current() (Ruleset, int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.last, f.applies
}

// fakeNames knows the names of some network ids.
type fakeNames struct {
	mu    sync.Mutex
	names map[string]string
	calls map[string]int
}

func (f *fakeNames) NetworkName(ctx context.Context, id string) (string, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls[id]++
	n, ok := f.names[id]
	return n, ok, nil
}

func (f *fakeNames) set(id, name string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.names[id] = name
}

func eventually(t *testing.T, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	var err error
	for time.Now().Before(deadline) {
		if err = cond(); err == nil {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("%s: %v", what, err)
}

func put(t *testing.T, s *datastore.Store, key string, v any) {
	t.Helper()
	if err := s.Txn(context.Background(), datastore.Put(key, datastore.MustJSON(v))); err != nil {
		t.Fatal(err)
	}
}

func del(t *testing.T, s *datastore.Store, key string) {
	t.Helper()
	if err := s.Txn(context.Background(), datastore.Delete(key, 0)); err != nil {
		t.Fatal(err)
	}
}

func TestSyncerFollowsDatastore(t *testing.T) {
	m := etcdtest.Start(t)
	store := m.Store
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	engine := ipam.New(store, ipam.Options{})
	if _, err := engine.AddPool(ctx, ipam.Pool{CIDR: "192.168.0.0/16", NATOutgoing: true}); err != nil {
		t.Fatal(err)
	}
	// net1 on this host (h1) is unnamed until Docker tells its name; its
	// twin on h2 is already named.
	put(t, store, datastore.NetworkKey(net1ID), datastore.Network{ID: net1ID})
	put(t, store, datastore.NetworkKey(net1RemoteID), datastore.Network{ID: net1RemoteID, Name: "net1"})
	e0 := ep(0, net1ID, "h1", "192.168.0.1", true)
	put(t, store, datastore.EndpointKey("h1", e0.ID), e0)
	e3 := ep(3, net1RemoteID, "h2", "192.168.1.1", true)
	put(t, store, datastore.EndpointKey("h2", e3.ID), e3)

	dp := &fakeDataplane{fail: 1}
	names := &fakeNames{names: map[string]string{}, calls: map[string]int{}}
	s, err := NewSyncer(Config{Store: m.Client(t), Records: etcdtest.Records(t, m.Client(t), RecordKinds()...), Node: "h1", Dataplane: dp, Names: names, ResyncInterval: time.Hour, Log: testLog(t)})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()

	v4 := func() Table {
		rs, _ := dp.current()
		tb, _ := rs.Table(IPv4)
		return tb
	}
	elems := func(set string) []string {
		st, _ := v4().Set(set)
		return st.Elements
	}
	// The injected failure is retried; the first state is programmed.
	eventually(t, "first apply", func() error {
		if got := elems(setWorkloads); !slices.Equal(got, []string{e0.HostIfName}) {
			return errors.New("workloads = " + strings.Join(got, ","))
		}
		return nil
	})
	// Unnamed: its own set, without h2's endpoint.
	if got := elems(NetworkSetName("id:" + net1ID)); !slices.Equal(got, []string{"192.168.0.1"}) {
		t.Errorf("before naming, members = %v", got)
	}

	// Docker now knows the name: recorded in the datastore, and the two
	// hosts' net1 become one network.
	names.set(net1ID, "net1")
	eventually(t, "name recorded", func() error {
		var n datastore.Network
		if _, err := store.GetJSON(ctx, datastore.NetworkKey(net1ID), &n); err != nil {
			return err
		}
		if n.Name != "net1" {
			return errors.New("name still " + n.Name)
		}
		return nil
	})
	eventually(t, "merged membership", func() error {
		if got := elems(NetworkSetName("name:net1")); !slices.Equal(got, []string{"192.168.0.1", "192.168.1.1"}) {
			return errors.New("members " + strings.Join(got, ","))
		}
		return nil
	})

	// Join on this host.
	e1 := ep(1, net1ID, "h1", "192.168.0.2", false)
	put(t, store, datastore.EndpointKey("h1", e1.ID), e1) // created, not joined: no rules
	e1.Joined = true
	put(t, store, datastore.EndpointKey("h1", e1.ID), e1)
	eventually(t, "join", func() error {
		if got := len(rulesMentioning(v4(), e1.HostIfName)); got != 2 {
			return errors.New("rules for the joined endpoint: " + strings.Join(rulesMentioning(v4(), e1.HostIfName), "; "))
		}
		return nil
	})
	// Leave, then delete.
	e1.Joined = false
	put(t, store, datastore.EndpointKey("h1", e1.ID), e1)
	eventually(t, "leave", func() error {
		if got := rulesMentioning(v4(), e1.HostIfName); len(got) != 0 {
			return errors.New("rules left: " + strings.Join(got, "; "))
		}
		return nil
	})
	del(t, store, datastore.EndpointKey("h1", e1.ID))
	eventually(t, "delete", func() error {
		if slices.Contains(elems(NetworkSetName("name:net1")), "192.168.0.2") {
			return errors.New("deleted endpoint still a member")
		}
		return nil
	})

	// Pools and nodes.
	if _, err := engine.AddPool(ctx, ipam.Pool{CIDR: "10.66.0.0/16"}); err != nil {
		t.Fatal(err)
	}
	put(t, store, datastore.NodeKey("h2"), datastore.Node{Name: "h2", IPv4: "172.31.0.3"})
	eventually(t, "pool and node", func() error {
		if got := elems(setPools); !slices.Equal(got, []string{"10.66.0.0/16", "192.168.0.0/16"}) {
			return errors.New("pools " + strings.Join(got, ","))
		}
		if got := elems(setNATPools); !slices.Equal(got, []string{"192.168.0.0/16"}) {
			return errors.New("nat-pools " + strings.Join(got, ","))
		}
		if got := elems(setHosts); !slices.Equal(got, []string{"172.31.0.3"}) {
			return errors.New("hosts " + strings.Join(got, ","))
		}
		return nil
	})

	// Unchanged state is not applied again.
	_, n := dp.current()
	put(t, store, "unrelated/key", "x")
	rev, err := store.TxnRev(ctx, datastore.Put(datastore.NodeKey("h2"), datastore.MustJSON(datastore.Node{Name: "h2", IPv4: "172.31.0.3"})))
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "a pass that took in the rewritten node", func() error {
		if got := s.passedRev.Load(); got < rev {
			return fmt.Errorf("passes have taken in revision %d, want %d", got, rev)
		}
		return nil
	})
	if _, n2 := dp.current(); n2 != n {
		t.Errorf("%d applies for a change that does not change the tables", n2-n)
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not stop")
	}
}

// TestSyncerStateDecodesKeys: records are decoded by their keys, and bad
// ones are reported and skipped, never fatal.
func TestSyncerStateDecodesKeys(t *testing.T) {
	s, err := NewSyncer(Config{Store: &datastore.Store{}, Node: "h1", Dataplane: &fakeDataplane{}})
	if err != nil {
		t.Fatal(err)
	}
	records := map[string]map[string][]byte{
		datastore.EndpointsPrefix: {
			// The key says which node; a record claiming another is not believed.
			datastore.EndpointKey("h1", epID(0)): datastore.MustJSON(datastore.Endpoint{Network: net1ID, Node: "h9", IPv4: "192.168.0.1/32", HostIfName: ifOf(epID(0)), Joined: true}),
			"endpoints/broken":                   []byte("{}"),
			datastore.EndpointKey("h1", epID(1)): []byte("not json"),
		},
		datastore.NetworksPrefix: {datastore.NetworkKey(net1ID): []byte(`{"name":"net1"}`)},
	}
	st, bad := s.state(records)
	if len(bad) != 2 {
		t.Errorf("bad records reported: %q, want 2", bad)
	}
	if len(st.Endpoints) != 1 || st.Endpoints[0].Node != "h1" || st.Endpoints[0].ID != epID(0) {
		t.Errorf("endpoints = %+v", st.Endpoints)
	}
	if len(st.Networks) != 1 || st.Networks[0].ID != net1ID {
		t.Errorf("networks = %+v", st.Networks)
	}
}

// resyncingDataplane is a fakeDataplane that remembers (like *NFT) and
// counts the Resyncs asked of it.
type resyncingDataplane struct {
	fakeDataplane
	resyncs int
}

func (r *resyncingDataplane) Resync() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.resyncs++
}

// TestSyncerApplyPasses: a pass applies only when the records changed or
// when forced (the periodic resync, a retry), and a forced pass, or the
// first after a failure, makes the dataplane compare with the kernel
// (Resync) instead of what it last programmed.
func TestSyncerApplyPasses(t *testing.T) {
	dp := &resyncingDataplane{}
	s, err := NewSyncer(Config{Store: &datastore.Store{}, Node: "h1", Dataplane: dp})
	if err != nil {
		t.Fatal(err)
	}
	ss := &syncState{records: map[string]map[string][]byte{}, loaded: map[string]bool{}, delay: retry.New(retry.Standard()), warned: map[string]bool{}}
	for _, p := range followed {
		ss.merge(s, update{prefix: p, snapshot: map[string][]byte{}, rev: 1})
	}
	e0 := ep(0, net1ID, "h1", "192.168.0.1", true)
	key := datastore.EndpointKey("h1", e0.ID)
	event := func(rev int64, v any) update {
		return update{prefix: datastore.EndpointsPrefix, event: &datastore.Event{Type: datastore.EventPut, Key: key, Value: datastore.MustJSON(v), ModRevision: rev}}
	}
	steps := []struct {
		name        string
		update      *update
		force       bool
		fail        bool
		wantApplies int // Apply calls so far
		wantResyncs int
		programmed  int64 // WaitProgrammed(this) returns at once
	}{
		{name: "first pass", wantApplies: 1, wantResyncs: 1, programmed: 1},
		{name: "nothing changed", wantApplies: 1, wantResyncs: 1, programmed: 1},
		{name: "an endpoint joins", update: ptr(event(5, e0)), wantApplies: 2, wantResyncs: 1, programmed: 5},
		{name: "the same record written again", update: ptr(event(6, e0)), wantApplies: 2, wantResyncs: 1, programmed: 6},
		{name: "periodic resync", force: true, wantApplies: 3, wantResyncs: 2, programmed: 6},
		{name: "a failed apply", update: ptr(event(7, ep(0, net1ID, "h1", "192.168.0.9", true))), fail: true, wantApplies: 3, wantResyncs: 2, programmed: 6},
		{name: "the retry compares with the kernel", force: true, wantApplies: 4, wantResyncs: 3, programmed: 7},
	}
	for _, st := range steps {
		if st.update != nil {
			ss.merge(s, *st.update)
		}
		dp.mu.Lock()
		if st.fail {
			dp.fail = 1
		}
		dp.mu.Unlock()
		s.apply(context.Background(), ss, st.force)
		if ss.retryTimer != nil {
			ss.retryTimer.Stop()
			ss.retryTimer, ss.retryC = nil, nil
		}
		_, applies := dp.current()
		dp.mu.Lock()
		resyncs := dp.resyncs
		dp.mu.Unlock()
		if applies != st.wantApplies || resyncs != st.wantResyncs {
			t.Errorf("%s: %d applies, %d resyncs; want %d, %d", st.name, applies, resyncs, st.wantApplies, st.wantResyncs)
		}
		ctx, cancel := context.WithCancel(context.Background())
		cancel() // answers now or not at all
		if err := s.WaitProgrammed(ctx, st.programmed); err != nil {
			t.Errorf("%s: revision %d not programmed: %v", st.name, st.programmed, err)
		}
		if st.fail {
			if err := s.WaitProgrammed(ctx, 7); err == nil {
				t.Errorf("%s: a failed pass counts as programmed", st.name)
			}
		}
	}
}

func ptr[T any](v T) *T { return &v }

// TestSyncerMergeNotesChanges: merge says whether a record really
// changed; only then does a pass recompute.
func TestSyncerMergeNotesChanges(t *testing.T) {
	s, err := NewSyncer(Config{Store: &datastore.Store{}, Node: "h1", Dataplane: &fakeDataplane{}})
	if err != nil {
		t.Fatal(err)
	}
	records := map[string]map[string][]byte{}
	loaded := map[string]bool{}
	p := datastore.NodesPrefix
	steps := []struct {
		name string
		u    update
		want bool
	}{
		{"first snapshot", update{prefix: p, snapshot: map[string][]byte{"nodes/a": []byte("1")}}, true},
		{"the same snapshot again", update{prefix: p, snapshot: map[string][]byte{"nodes/a": []byte("1")}}, false},
		{"a snapshot with another value", update{prefix: p, snapshot: map[string][]byte{"nodes/a": []byte("2")}}, true},
		{"a put of the same value", update{prefix: p, event: &datastore.Event{Type: datastore.EventPut, Key: "nodes/a", Value: []byte("2")}}, false},
		{"a put of a new value", update{prefix: p, event: &datastore.Event{Type: datastore.EventPut, Key: "nodes/a", Value: []byte("3")}}, true},
		{"a new key", update{prefix: p, event: &datastore.Event{Type: datastore.EventPut, Key: "nodes/b", Value: []byte("3")}}, true},
		{"a delete", update{prefix: p, event: &datastore.Event{Type: datastore.EventDelete, Key: "nodes/b"}}, true},
		{"a delete of what is not there", update{prefix: p, event: &datastore.Event{Type: datastore.EventDelete, Key: "nodes/b"}}, false},
	}
	for _, st := range steps {
		if _, got := s.merge(records, loaded, st.u); got != st.want {
			t.Errorf("%s: changed = %v, want %v", st.name, got, st.want)
		}
	}
}
