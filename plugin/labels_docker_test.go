package plugin

import (
	"context"
	"errors"
	"io"
	"maps"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/events"
	"github.com/docker/docker/api/types/network"
	"github.com/sirupsen/logrus"

	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/datastore/etcdtest"
	"github.com/calico-cnm/calico-cnm/driver"
	"github.com/calico-cnm/calico-cnm/policy"
)

// fakeDocker is the Docker API of the label learner: a listing, networks'
// endpoint lists, and an event stream the test feeds. It counts calls.
type fakeDocker struct {
	mu         sync.Mutex
	containers map[string]container.Summary
	endpoints  map[string]network.EndpointResource // network inspect's Containers of testNetID
	inspectErr error
	streams    []chan events.Message
	errs       []chan error
	since      []string
	lists      []string // the filter of every ContainerList ("" for all)
	inspects   int
	listedAt   time.Time
	calls      chan string
}

func newFakeDocker() *fakeDocker {
	return &fakeDocker{containers: map[string]container.Summary{}, endpoints: map[string]network.EndpointResource{}, calls: make(chan string, 1000)}
}

func (f *fakeDocker) ContainerList(ctx context.Context, opts container.ListOptions) ([]container.Summary, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	id, name := opts.Filters.Get("id"), opts.Filters.Get("name")
	f.lists = append(f.lists, strings.Join(append(id, name...), ","))
	if f.listedAt.IsZero() {
		f.listedAt = time.Now()
	}
	var out []container.Summary
	for _, s := range f.containers {
		if len(id) > 0 && s.ID != id[0] || len(name) > 0 && s.Names[0] != "/"+name[0] {
			continue
		}
		out = append(out, s)
	}
	f.calls <- "list " + strings.Join(append(id, name...), ",")
	return out, nil
}

func (f *fakeDocker) NetworkInspect(ctx context.Context, id string, opts network.InspectOptions) (network.Inspect, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.inspects++
	f.calls <- "inspect"
	if f.inspectErr != nil {
		return network.Inspect{}, f.inspectErr
	}
	return network.Inspect{ID: id, Name: "net1", Containers: maps.Clone(f.endpoints)}, nil
}

func (f *fakeDocker) Events(ctx context.Context, opts events.ListOptions) (<-chan events.Message, <-chan error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.since = append(f.since, opts.Since)
	msgs, errs := make(chan events.Message), make(chan error, 1)
	f.streams, f.errs = append(f.streams, msgs), append(f.errs, errs)
	f.calls <- "events"
	return msgs, errs
}

// send delivers an event on the current stream (and waits until taken).
func (f *fakeDocker) send(t *testing.T, typ events.Type, action events.Action, id string, attrs map[string]string) {
	t.Helper()
	f.mu.Lock()
	s := f.streams[len(f.streams)-1]
	f.mu.Unlock()
	select {
	case s <- events.Message{Type: typ, Action: action, Actor: events.Actor{ID: id, Attributes: attrs}}:
	case <-time.After(10 * time.Second):
		t.Fatalf("the learner does not take event %s %s", typ, action)
	}
}

// create is a container create: in the listing (created, asking for
// net1) and as an event with its labels.
func (f *fakeDocker) create(t *testing.T, name string, labels map[string]string) {
	t.Helper()
	s := container.Summary{ID: name + "-id", Names: []string{"/" + name}, State: "created", Labels: labels}
	s.HostConfig.NetworkMode = "net1"
	f.mu.Lock()
	f.containers[s.ID] = s
	f.mu.Unlock()
	attrs := maps.Clone(labels)
	attrs["name"], attrs["image"] = name, "bb"
	f.send(t, events.ContainerEventType, events.ActionCreate, s.ID, attrs)
}

// failInspect makes network inspect fail (Docker cannot name endpoints).
func (f *fakeDocker) failInspect(fail bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.inspectErr = nil
	if fail {
		f.inspectErr = errors.New("injected: network inspect failed")
	}
}

// waitCall waits for a call of the learner.
func (f *fakeDocker) waitCall(t *testing.T, want string) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case c := <-f.calls:
			if c == want {
				return
			}
		case <-deadline:
			t.Fatalf("no %q call", want)
		}
	}
}

func (f *fakeDocker) counts() (lists, inspects, streams int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.lists), f.inspects, len(f.streams)
}

// countingStore counts the datastore listings.
type countingStore struct {
	*datastore.Store
	lists atomic.Int32
}

func (s *countingStore) List(ctx context.Context, prefix string) ([]datastore.KV, error) {
	s.lists.Add(1)
	return s.Store.List(ctx, prefix)
}

type learnerEnv struct {
	fd    *fakeDocker
	store *countingStore
	d     *dockerLabels
	ctx   context.Context
}

// startLearner runs a learner on a fake Docker with one running container
// and a real datastore holding network net1.
func startLearner(t *testing.T) *learnerEnv {
	t.Helper()
	m := etcdtest.Start(t)
	e := &learnerEnv{fd: newFakeDocker(), store: &countingStore{Store: m.Store}}
	old := container.Summary{ID: "old-id", Names: []string{"/old"}, State: "running", Labels: map[string]string{policy.LabelPrefix + "role": "web"}}
	old.HostConfig.NetworkMode = "net1"
	e.fd.containers[old.ID] = old
	ctx, cancel := context.WithCancel(context.Background())
	e.ctx = ctx
	if err := m.Store.Txn(ctx, datastore.Create(datastore.NetworkKey(testNetID), datastore.MustJSON(datastore.Network{ID: testNetID, Name: "net1"}))); err != nil {
		t.Fatal(err)
	}
	log := logrus.New()
	log.SetOutput(io.Discard)
	e.d = newDockerLabels(e.fd, e.store, "h1", log)
	done := make(chan struct{})
	go func() { defer close(done); e.d.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	select {
	case <-e.d.ready:
	case <-time.After(10 * time.Second):
		t.Fatal("the learner never listed")
	}
	return e
}

func (e *learnerEnv) labels(t *testing.T, endpointID string) (map[string]string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(e.ctx, 3*time.Second)
	defer cancel()
	return e.d.EndpointLabels(ctx, driver.LabelRequest{NetworkID: testNetID, EndpointID: endpointID})
}

// joined records a joined endpoint with labels (nil: unknown).
func (e *learnerEnv) joined(t *testing.T, endpointID string, labels map[string]string) {
	t.Helper()
	ep := datastore.Endpoint{ID: endpointID, Network: testNetID, Node: "h1", Joined: true, Labels: labels, LabelsUnknown: labels == nil}
	if err := e.store.Txn(e.ctx, datastore.Create(datastore.EndpointKey("h1", endpointID), datastore.MustJSON(ep))); err != nil {
		t.Fatal(err)
	}
}

// waitRecord waits until the endpoint's record has labels want.
func (e *learnerEnv) waitRecord(t *testing.T, endpointID string, want map[string]string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var ep datastore.Endpoint
		if _, err := e.store.GetJSON(e.ctx, datastore.EndpointKey("h1", endpointID), &ep); err != nil {
			t.Fatal(err)
		}
		if maps.Equal(ep.Labels, want) && !ep.LabelsUnknown {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("endpoint %s: labels %v (unknown %v), want %v", endpointID, ep.Labels, ep.LabelsUnknown, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// described waits until the learner knows the networks of a container.
func (e *learnerEnv) described(t *testing.T, id string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(e.ctx, 10*time.Second)
	defer cancel()
	if _, err := e.d.cache.waitFor(ctx, func(c knownContainer) bool { return c.ID == id && c.Networks != nil }); err != nil {
		t.Fatalf("the learner never learnt the networks of %s: %v", id, err)
	}
}

func role(r string) map[string]string { return map[string]string{policy.LabelPrefix + "role": r} }

func wantLabels(r, name string) map[string]string {
	l := map[string]string{"role": r, policy.LabelNetwork: "net1"}
	if name != "" {
		l[policy.LabelContainer] = name
	}
	return l
}

// The learner follows Docker's events from before its listing and gives a
// joining endpoint its container's labels: the one the network's endpoint
// list names; when Docker cannot name it, the one container starting on
// the network, or the labels all candidates share, completed (or, if they
// differ, learnt) at the network connect event.
func TestLabelLearner(t *testing.T) {
	e := startLearner(t)
	fd := e.fd
	if since, err := strconv.ParseFloat(fd.since[0], 64); err != nil || time.Unix(0, int64(since*1e9)).After(fd.listedAt) {
		t.Errorf("events followed since %q, not before the listing at %s", fd.since[0], fd.listedAt)
	}

	// Docker cannot name it, one container is starting on net1 (the
	// running one is not starting): that one.
	fd.failInspect(true)
	fd.create(t, "c1", role("web"))
	e.described(t, "c1-id")
	got, err := e.labels(t, "e1")
	if err != nil || !maps.Equal(got, wantLabels("web", "c1")) {
		t.Errorf("single candidate: %v %v", got, err)
	}
	fd.send(t, events.ContainerEventType, events.ActionStart, "c1-id", nil)
	fd.failInspect(false)

	// Two with different labels, and a running container being
	// connected while one of them waits: the network's endpoint list
	// names each (e2, e3 before their Join completed, e-old by its
	// container's id).
	fd.create(t, "c2", role("db"))
	fd.create(t, "c3", role("web"))
	fd.mu.Lock()
	fd.endpoints["ep-e2"] = network.EndpointResource{Name: "c2", EndpointID: "e2"}
	fd.endpoints["ep-e3"] = network.EndpointResource{Name: "c3", EndpointID: "e3"}
	fd.endpoints["old-id"] = network.EndpointResource{Name: "old", EndpointID: "e-old"}
	fd.mu.Unlock()
	for ep, want := range map[string]map[string]string{"e2": wantLabels("db", "c2"), "e3": wantLabels("web", "c3"), "e-old": wantLabels("web", "old")} {
		if got, err := e.labels(t, ep); err != nil || !maps.Equal(got, want) {
			t.Errorf("%s: %v %v, want %v", ep, got, err, want)
		}
	}
	fd.send(t, events.ContainerEventType, events.ActionStart, "c2-id", nil)
	fd.send(t, events.ContainerEventType, events.ActionStart, "c3-id", nil)

	// Docker cannot name it: candidates whose labels are the same give
	// those labels at once, the name with the connect event; different
	// ones leave it unknown (fail closed) until the connect event.
	for _, tc := range []struct {
		what       string
		a, b       string // the joining container and the other candidate
		roleA      string
		roleB      string
		atJoin     map[string]string // nil: unknown
		afterEvent map[string]string
	}{
		{"identical candidates", "c4", "c5", "api", "api", wantLabels("api", ""), wantLabels("api", "c4")},
		{"different candidates", "c6", "c7", "x", "y", nil, wantLabels("x", "c6")},
	} {
		fd.failInspect(true)
		fd.create(t, tc.a, role(tc.roleA))
		fd.create(t, tc.b, role(tc.roleB))
		e.described(t, tc.b+"-id")
		ep := "e-" + tc.a
		got, err := e.labels(t, ep)
		if tc.atJoin == nil && !errors.Is(err, ErrLabelsUnknown) || tc.atJoin != nil && (err != nil || !maps.Equal(got, tc.atJoin)) {
			t.Errorf("%s: at Join %v %v, want %v", tc.what, got, err, tc.atJoin)
		}
		e.joined(t, ep, tc.atJoin)
		fd.failInspect(false)
		fd.mu.Lock()
		fd.endpoints[tc.a+"-id"] = network.EndpointResource{Name: tc.a, EndpointID: ep}
		fd.mu.Unlock()
		fd.send(t, events.NetworkEventType, events.ActionConnect, testNetID, map[string]string{"name": "net1", "container": tc.a + "-id", "type": "calico"})
		e.waitRecord(t, ep, tc.afterEvent)
		fd.send(t, events.ContainerEventType, events.ActionStart, tc.a+"-id", nil)
	}
	fd.send(t, events.ContainerEventType, events.ActionDestroy, "c5-id", nil)

	// A rename is followed; a destroyed container is forgotten.
	fd.send(t, events.ContainerEventType, events.ActionRename, "c7-id", map[string]string{"name": "c7b", "oldName": "/c7"})
	fd.send(t, events.ContainerEventType, events.ActionDestroy, "c6-id", nil)
	fd.send(t, events.ContainerEventType, events.ActionStart, "old-id", nil) // a no-op event: the ones before are applied
	if c, ok := e.d.cache.get("c7-id"); !ok || c.Name != "c7b" {
		t.Errorf("after rename: %+v", c)
	}
	if _, ok := e.d.cache.get("c6-id"); ok {
		t.Error("a destroyed container is still known")
	}
}

// A broken event stream is opened again and the listing redone; an
// endpoint left unknown by an earlier run is learnt from that listing.
func TestLabelLearnerReopens(t *testing.T) {
	e := startLearner(t)
	fd := e.fd
	// An endpoint of "old" recorded with unknown labels (a previous run).
	e.joined(t, "e-old", nil)
	fd.mu.Lock()
	s := fd.containers["old-id"]
	s.NetworkSettings = &container.NetworkSettingsSummary{Networks: map[string]*network.EndpointSettings{"net1": {NetworkID: testNetID, EndpointID: "e-old"}}}
	fd.containers["old-id"] = s
	fd.errs[0] <- errors.New("injected: dockerd restarted")
	fd.mu.Unlock()
	fd.waitCall(t, "events")
	e.waitRecord(t, "e-old", wantLabels("web", "old"))
	if lists, _, streams := fd.counts(); streams != 2 || lists != 2 {
		t.Errorf("after a broken stream: %d streams, %d listings; want 2, 2", streams, lists)
	}
}

// Issue 20 item 6: at idle the learner asks neither Docker nor the
// datastore anything. Over an idle window of 3 s (three times the
// interval the re-learn loop used to list at), then an event to show it
// was alive: the only calls are the start's listings and that event's.
func TestLabelLearnerIdle(t *testing.T) {
	e := startLearner(t)
	fd := e.fd
	lists0, inspects0, streams0 := fd.counts()
	storeLists0 := e.store.lists.Load()
	if lists0 != 1 || storeLists0 != 1 {
		t.Fatalf("start: %d Docker listings, %d datastore listings; want 1, 1", lists0, storeLists0)
	}
	<-time.After(3 * time.Second)
	fd.create(t, "late", role("web"))
	fd.waitCall(t, "list late-id")
	lists, inspects, streams := fd.counts()
	if lists != lists0+1 || inspects != inspects0 || streams != streams0 || e.store.lists.Load() != storeLists0 {
		t.Errorf("idle, then one create event: Docker listings %d -> %d (want +1 for the event), inspects %d -> %d, streams %d -> %d, datastore listings %d -> %d",
			lists0, lists, inspects0, inspects, streams0, streams, storeLists0, e.store.lists.Load())
	}
}
