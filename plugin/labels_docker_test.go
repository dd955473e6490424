package plugin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
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
	mu          sync.Mutex
	containers  map[string]container.Summary
	endpoints   map[string]network.EndpointResource // network inspect's Containers of testNetID
	inspectErr  error
	inspectHold chan struct{} // when set, network inspect waits for it
	listErr     error         // of the full listing
	streams     []chan events.Message
	errs        []chan error
	since       []string
	lists       []string // the filter of every ContainerList ("" for all)
	inspects    int
	listedAt    time.Time
	listTimes   []time.Time
	calls       chan string
}

func newFakeDocker() *fakeDocker {
	return &fakeDocker{containers: map[string]container.Summary{}, endpoints: map[string]network.EndpointResource{}, calls: make(chan string, 1000)}
}

func (f *fakeDocker) ContainerList(ctx context.Context, opts container.ListOptions) ([]container.Summary, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	id, name := opts.Filters.Get("id"), opts.Filters.Get("name")
	f.lists = append(f.lists, strings.Join(append(id, name...), ","))
	f.listTimes = append(f.listTimes, time.Now())
	if f.listedAt.IsZero() {
		f.listedAt = time.Now()
	}
	if f.listErr != nil && len(id)+len(name) == 0 {
		f.calls <- "list "
		return nil, f.listErr
	}
	var out []container.Summary
	for _, s := range f.containers {
		// Docker's name filter matches substrings too.
		if len(id) > 0 && s.ID != id[0] || len(name) > 0 && !strings.Contains(s.Names[0], name[0]) {
			continue
		}
		out = append(out, s)
	}
	f.calls <- "list " + strings.Join(append(id, name...), ",")
	return out, nil
}

func (f *fakeDocker) NetworkInspect(ctx context.Context, id string, opts network.InspectOptions) (network.Inspect, error) {
	f.mu.Lock()
	if hold := f.inspectHold; hold != nil {
		f.mu.Unlock()
		select {
		case <-hold:
		case <-ctx.Done():
			return network.Inspect{}, ctx.Err()
		}
		f.mu.Lock()
	}
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
	f.calls <- fmt.Sprintf("events %d", len(f.streams))
	return msgs, errs
}

// send delivers an event on the current stream (and waits until taken).
func (f *fakeDocker) send(t *testing.T, typ events.Type, action events.Action, id string, attrs map[string]string) {
	t.Helper()
	f.mu.Lock()
	s := f.streams[len(f.streams)-1]
	f.mu.Unlock()
	select {
	case s <- events.Message{Type: typ, Action: action, Actor: events.Actor{ID: id, Attributes: attrs}, TimeNano: time.Now().UnixNano()}:
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
	// race, when set, runs once before a write (another writer winning
	// the race for the record).
	race atomic.Pointer[func(ctx context.Context)]
}

func (s *countingStore) Txn(ctx context.Context, ops ...datastore.Op) error {
	if race := s.race.Swap(nil); race != nil {
		(*race)(ctx)
	}
	return s.Store.Txn(ctx, ops...)
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
	if err := m.Store.Txn(context.Background(), datastore.Create(datastore.NetworkKey(testNetID), datastore.MustJSON(datastore.Network{ID: testNetID, Name: "net1"}))); err != nil {
		t.Fatal(err)
	}
	e.d, e.ctx = runLearner(t, e.fd, e.store)
	return e
}

// runLearner runs a learner on fd (given one running container "old" on
// net1) until the test ends, and waits for its first listing.
func runLearner(t *testing.T, fd *fakeDocker, store labelStore) (*dockerLabels, context.Context) {
	t.Helper()
	old := container.Summary{ID: "old-id", Names: []string{"/old"}, State: "running", Labels: map[string]string{policy.LabelPrefix + "role": "web"}}
	old.HostConfig.NetworkMode = "net1"
	fd.mu.Lock()
	fd.containers[old.ID] = old
	fd.mu.Unlock()
	ctx, cancel := context.WithCancel(context.Background())
	log := logrus.New()
	log.SetOutput(io.Discard)
	d := newDockerLabels(fd, store, "h1", log)
	done := make(chan struct{})
	go func() { defer close(done); d.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	select {
	case <-d.ready:
	case <-time.After(10 * time.Second):
		t.Fatal("the learner never listed")
	}
	return d, ctx
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
	e.joinedWith(t, endpointID, labels, nil)
}

// joinedWith records a joined endpoint with labels (nil: unknown) and
// driver-option labels.
func (e *learnerEnv) joinedWith(t *testing.T, endpointID string, labels, driverLabels map[string]string) {
	t.Helper()
	ep := datastore.Endpoint{ID: endpointID, Network: testNetID, Node: "h1", Joined: true, Labels: labels, LabelsUnknown: labels == nil, DriverLabels: driverLabels}
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
	e.singleCandidate(t, "c1", "web", "e1")
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
		// Both are candidates once described; the learner may describe
		// them in either order.
		e.described(t, tc.a+"-id")
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
	fd.waitCall(t, "events 2")
	e.waitRecord(t, "e-old", wantLabels("web", "old"))
	if lists, _, streams := fd.counts(); streams != 2 || lists != 2 {
		t.Errorf("after a broken stream: %d streams, %d listings; want 2, 2", streams, lists)
	}
}

// running is a container running on net1 that the learner's view does
// not hold (no event for it came in).
func (f *fakeDocker) running(name string, labels map[string]string, endpointID string) {
	s := container.Summary{ID: name + "-id", Names: []string{"/" + name}, State: "running", Labels: labels}
	s.HostConfig.NetworkMode = "net1"
	if endpointID != "" {
		s.NetworkSettings = &container.NetworkSettingsSummary{Networks: map[string]*network.EndpointSettings{"net1": {NetworkID: testNetID, EndpointID: endpointID}}}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.containers[s.ID] = s
}

// setEndpoint makes the network's endpoint list name an endpoint after
// key (a container id, or "ep-<endpoint>" before its Join completed).
func (f *fakeDocker) setEndpoint(key, name, endpointID string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.endpoints[key] = network.EndpointResource{Name: name, EndpointID: endpointID}
}

// Review of issue 21, P1.1: a single candidate taken when Docker cannot
// name the joining container is only a guess: the connect event names
// the container that really joined (one the view never heard of), and
// the record is corrected.
func TestLabelLearnerSingleCandidateChecked(t *testing.T) {
	e := startLearner(t)
	fd := e.fd
	e.joined(t, "e1", e.singleCandidate(t, "c1", "web", "e1"))
	fd.running("other", role("db"), "e1")
	fd.setEndpoint("other-id", "other", "e1")
	fd.failInspect(false)
	fd.send(t, events.NetworkEventType, events.ActionConnect, testNetID, map[string]string{"name": "net1", "container": "other-id", "type": "calico"})
	e.waitRecord(t, "e1", wantLabels("db", "other"))
}

// Review of issue 21, P1.1: while the event stream is down the view may
// be stale (a container died or went without its event): no candidate is
// guessed from it, the endpoint fails closed and stays pending.
func TestLabelLearnerStaleViewFailsClosed(t *testing.T) {
	e := startLearner(t)
	fd := e.fd
	fd.create(t, "c1", role("web"))
	e.described(t, "c1-id")
	fd.mu.Lock()
	fd.listErr = errors.New("injected: dockerd is restarting")
	fd.errs[0] <- errors.New("injected: the stream broke")
	fd.mu.Unlock()
	fd.waitCall(t, "events 2")
	fd.waitCall(t, "list ")
	fd.failInspect(true)
	if got, err := e.labels(t, "e1"); !errors.Is(err, ErrLabelsUnknown) {
		t.Errorf("a Join while the view is stale: %v %v, want unknown labels", got, err)
	}
	if _, ok := e.d.pendingNow()["e1"]; !ok {
		t.Error("the endpoint is not pending")
	}
}

// Review of issue 21, P1.2: an endpoint named by its container's name
// (before its Join completed) is the container Docker names so now, not
// an older one of that name the view still holds (removed and run again,
// its destroy event not in yet).
func TestLabelLearnerNameIsAskedOfDocker(t *testing.T) {
	e := startLearner(t)
	fd := e.fd
	fd.create(t, "web", role("web"))
	e.described(t, "web-id")
	fd.mu.Lock()
	delete(fd.containers, "web-id")
	fd.mu.Unlock()
	// "web2" also matches Docker's name filter for "web".
	fd.running("web2", role("other"), "")
	s := container.Summary{ID: "web-new-id", Names: []string{"/web"}, State: "created", Labels: role("db")}
	s.HostConfig.NetworkMode = "net1"
	fd.mu.Lock()
	fd.containers[s.ID] = s
	fd.mu.Unlock()
	fd.setEndpoint("ep-e9", "web", "e9")
	if got, err := e.labels(t, "e9"); err != nil || !maps.Equal(got, wantLabels("db", "web")) {
		t.Errorf("Join named by name: %v %v, want the current container's %v", got, err, wantLabels("db", "web"))
	}
}

// Review of issue 21, P1.3: a container listing taken before a destroy
// event does not bring the container back; one for a container the view
// does not hold adds it only when asked to.
func TestContainerCacheDescribed(t *testing.T) {
	got := &knownContainer{ID: "c", Name: "c", Networks: []string{"net1"}}
	for _, tc := range []struct {
		name    string
		known   bool // in the view before the listing
		destroy bool // destroyed while the listing was under way
		mayAdd  bool
		want    bool // in the view after
	}{
		{"known", true, false, false, true},
		{"destroyed meanwhile", true, true, false, false},
		{"destroyed meanwhile, may add", true, true, true, false},
		{"unknown", false, false, false, false},
		{"unknown, may add", false, false, true, true},
	} {
		cc := newContainerCache()
		if tc.known {
			cc.set(knownContainer{ID: "c", Name: "c"})
		}
		cc.describing("c")
		if tc.destroy {
			cc.remove("c")
		}
		cc.described("c", got, tc.mayAdd)
		c, ok := cc.get("c")
		if ok != tc.want || ok && !slices.Equal(c.Networks, got.Networks) {
			t.Errorf("%s: %+v %v, want present %v with the listing's networks", tc.name, c, ok, tc.want)
		}
		if len(cc.inFlight) != 0 || len(cc.gone) != 0 {
			t.Errorf("%s: listings under way %v, destroyed %v left behind", tc.name, cc.inFlight, cc.gone)
		}
	}
}

// singleCandidate makes Docker unable to name the joining container of
// ep, name (labelled role r) being the one starting on net1: a Join of ep
// gets its labels.
func (e *learnerEnv) singleCandidate(t *testing.T, name, r, ep string) map[string]string {
	t.Helper()
	e.fd.failInspect(true)
	e.fd.create(t, name, role(r))
	e.described(t, name+"-id")
	got, err := e.labels(t, ep)
	if err != nil || !maps.Equal(got, wantLabels(r, name)) {
		t.Fatalf("single candidate: %v %v, want %v", got, err, wantLabels(r, name))
	}
	return got
}

// twoCandidates makes Docker unable to name the joining container of ep
// among two starting ones with different labels: a Join of ep gets
// unknown labels. a joins.
func (e *learnerEnv) twoCandidates(t *testing.T, a, b, ep string, driverLabels map[string]string) {
	t.Helper()
	e.fd.failInspect(true)
	e.fd.create(t, a, role(a))
	e.fd.create(t, b, role(b))
	e.described(t, a+"-id")
	e.described(t, b+"-id")
	ctx, cancel := context.WithTimeout(e.ctx, 3*time.Second)
	defer cancel()
	if got, err := e.d.EndpointLabels(ctx, driver.LabelRequest{NetworkID: testNetID, EndpointID: ep, DriverLabels: driverLabels}); !errors.Is(err, ErrLabelsUnknown) {
		t.Fatalf("Join among two different candidates (driver labels %v): %v %v, want unknown labels", driverLabels, got, err)
	}
	e.joinedWith(t, ep, nil, driverLabels)
}

// waitNotPending waits until the learner gave up an endpoint.
func (e *learnerEnv) waitNotPending(t *testing.T, endpointID string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for _, ok := e.d.pendingNow()[endpointID]; ok; _, ok = e.d.pendingNow()[endpointID] {
		if time.Now().After(deadline) {
			t.Fatalf("endpoint %s is still pending", endpointID)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Review of issue 21, P2.4 and P2.5: a pending endpoint is retried (no
// connect event needed) once Docker names its container; one the
// network no longer lists is given up.
func TestLabelLearnerRetriesPending(t *testing.T) {
	e := startLearner(t)
	e.twoCandidates(t, "a", "b", "e-a", nil)
	ctx, cancel := context.WithTimeout(e.ctx, 3*time.Second)
	defer cancel()
	if _, err := e.d.EndpointLabels(ctx, driver.LabelRequest{NetworkID: testNetID, EndpointID: "e-left"}); !errors.Is(err, ErrLabelsUnknown) {
		t.Fatalf("Join of e-left: %v, want unknown labels", err)
	}
	e.fd.setEndpoint("a-id", "a", "e-a")
	e.fd.failInspect(false)
	e.waitRecord(t, "e-a", wantLabels("a", "a"))
	e.waitNotPending(t, "e-a")
	e.waitNotPending(t, "e-left")
}

// Review of issue 21, P2.7: driver-option labels alone do not make an
// endpoint known (fail closed); the labels learnt later are merged with
// them.
func TestLabelLearnerDriverLabels(t *testing.T) {
	e := startLearner(t)
	driverLabels := map[string]string{"zone": "a", "role": "override"}
	e.twoCandidates(t, "a", "b", "e-a", driverLabels)
	e.fd.setEndpoint("a-id", "a", "e-a")
	e.fd.failInspect(false)
	e.fd.send(t, events.NetworkEventType, events.ActionConnect, testNetID, map[string]string{"name": "net1", "container": "a-id", "type": "calico"})
	e.waitRecord(t, "e-a", policy.WithDriverLabels(wantLabels("a", "a"), driverLabels))
}

// Review of issue 21, P2.6: a connect event whose handling waits on
// Docker does not hold up the events after it.
func TestLabelLearnerConnectOffLoop(t *testing.T) {
	e := startLearner(t)
	e.twoCandidates(t, "a", "b", "e-a", nil)
	hold := make(chan struct{})
	e.fd.mu.Lock()
	e.fd.inspectHold = hold
	e.fd.mu.Unlock()
	e.fd.setEndpoint("a-id", "a", "e-a")
	e.fd.failInspect(false)
	e.fd.send(t, events.NetworkEventType, events.ActionConnect, testNetID, map[string]string{"name": "net1", "container": "a-id", "type": "calico"})
	e.fd.create(t, "later", role("web")) // fails the test if not taken
	e.fd.mu.Lock()
	e.fd.inspectHold = nil
	e.fd.mu.Unlock()
	close(hold)
	e.waitRecord(t, "e-a", wantLabels("a", "a"))
}

// Review of issue 21, P2.9: a renamed container's endpoints on this node
// get its new name.
func TestLabelLearnerRename(t *testing.T) {
	e := startLearner(t)
	e.fd.running("r", role("web"), "e-r")
	e.joined(t, "e-r", wantLabels("web", "r"))
	e.fd.mu.Lock()
	s := e.fd.containers["r-id"]
	s.Names = []string{"/r2"}
	e.fd.containers["r-id"] = s
	e.fd.mu.Unlock()
	e.fd.send(t, events.ContainerEventType, events.ActionRename, "r-id", map[string]string{"name": "r2", "oldName": "/r"})
	e.waitRecord(t, "e-r", wantLabels("web", "r2"))
}

// Reconcile's Relabel hook: an endpoint record rebuilt after a datastore
// restore gets its container's labels, at once when Docker names it, else
// by a retry once it does.
func TestLabelLearnerRelearn(t *testing.T) {
	e := startLearner(t)
	e.joined(t, "e-old", nil)
	e.fd.setEndpoint("old-id", "old", "e-old")
	e.d.Relearn(e.ctx, "e-old", testNetID)
	e.waitRecord(t, "e-old", wantLabels("web", "old"))

	e.fd.running("r", role("db"), "e-r")
	e.joined(t, "e-r", nil)
	e.fd.failInspect(true)
	e.d.Relearn(e.ctx, "e-r", testNetID)
	e.fd.setEndpoint("r-id", "r", "e-r")
	e.fd.failInspect(false)
	e.waitRecord(t, "e-r", wantLabels("db", "r"))
}

// Review of issue 21, P2.4: learning an endpoint's labels that loses the
// race for its record (another write between the read and the write)
// reads it again and records them.
func TestLabelLearnerLearnConflict(t *testing.T) {
	e := startLearner(t)
	e.joinedWith(t, "e1", nil, map[string]string{"zone": "a"})
	raced := false
	race := func(ctx context.Context) {
		key := datastore.EndpointKey("h1", "e1")
		var ep datastore.Endpoint
		rev, err := e.store.GetJSON(ctx, key, &ep)
		if err == nil {
			ep.Container = "sandbox-of-the-other-writer"
			err = e.store.Store.Txn(ctx, datastore.Update(key, datastore.MustJSON(ep), rev))
		}
		if err != nil {
			t.Errorf("the other writer: %v", err)
		}
		raced = true
	}
	e.store.race.Store(&race)
	if err := e.d.learn(e.ctx, "e1", wantLabels("web", "c1")); err != nil {
		t.Fatalf("learn after a lost race: %v", err)
	}
	if !raced {
		t.Fatal("the race was not run")
	}
	e.waitRecord(t, "e1", policy.WithDriverLabels(wantLabels("web", "c1"), map[string]string{"zone": "a"}))
	var ep datastore.Endpoint
	if _, err := e.store.GetJSON(e.ctx, datastore.EndpointKey("h1", "e1"), &ep); err != nil || ep.Container != "sandbox-of-the-other-writer" {
		t.Errorf("the other writer's change is lost: %+v %v", ep, err)
	}
}
