package reconcile_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"reflect"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"

	"github.com/calico-cnm/calico-cnm/dataplane"
	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/datastore/etcdtest"
	"github.com/calico-cnm/calico-cnm/ipam"
	"github.com/calico-cnm/calico-cnm/plugin"
	"github.com/calico-cnm/calico-cnm/reconcile"
)

// host is the node the reconciler under test runs on.
const host = "host-a"

// epID makes a Docker-like 64-character endpoint id from a short tag (not
// ending in 0); the tag leads, as it decides the interface name.
func epID(tag string) string {
	return tag + strings.Repeat("0", 64-len(tag))
}

func stored(node, tag, ip string, joined bool, rev int64) reconcile.StoredEndpoint {
	id := epID(tag)
	return reconcile.StoredEndpoint{Rev: rev, Endpoint: datastore.Endpoint{
		ID: id, Network: "net1", Node: node, IPv4: ip + "/32", Joined: joined,
		HostIfName: dataplane.HostIfName(id), MAC: "ee:ee:ee:ee:ee:ee",
	}}
}

func onEngine(engine string, se reconcile.StoredEndpoint) reconcile.StoredEndpoint {
	se.Endpoint.EngineID = engine
	return se
}

func onEngineView(engine string, v *reconcile.DockerView) *reconcile.DockerView {
	v.EngineID = engine
	return v
}

func alloc(ip, handle, node string) ipam.Allocation {
	a := ipam.Allocation{IP: net.ParseIP(ip).To4(), HandleID: handle, Block: "10.0.0.0/26", Host: host}
	if node != "" {
		a.Attrs = map[string]string{"node": node}
	}
	return a
}

func withHandles(se reconcile.StoredEndpoint, handles ...string) reconcile.StoredEndpoint {
	se.Endpoint.Handles = handles
	return se
}

// stampedAlloc is an assignment that records when it was made (every
// assignment since the engine stamps them).
func stampedAlloc(ip, handle, node string, at time.Time) ipam.Allocation {
	a := alloc(ip, handle, node)
	a.Attrs["assigned"] = at.UTC().Format(time.RFC3339Nano)
	return a
}

func withAttr(a ipam.Allocation, k, v string) ipam.Allocation {
	a.Attrs[k] = v
	return a
}

func dockerEP(tag, network string, ips ...string) reconcile.DockerEndpoint {
	de := reconcile.DockerEndpoint{ID: epID(tag), Network: network}
	for _, ip := range ips {
		de.IPs = append(de.IPs, netip.MustParseAddr(ip))
	}
	return de
}

func view(eps ...reconcile.DockerEndpoint) *reconcile.DockerView {
	v := &reconcile.DockerView{Endpoints: map[string]reconcile.DockerEndpoint{}}
	for _, e := range eps {
		v.Endpoints[e.ID] = e
	}
	return v
}

// planSummary flattens a plan into comparable strings.
type planSummary struct {
	Remove  []string // "<tag> veth=<bool> release=<ip:handle,...> kept=<n>"
	Orphans []string // "<ip>:<handle>"
	Routes  []string // tags
	Detach  []string // interface names
	Pending []string // candidate keys
	Unknown []string
}

func tagOf(id string) string { return strings.TrimRight(id, "0") }

func summarize(p reconcile.Plan) planSummary {
	var s planSummary
	for _, rm := range p.RemoveEndpoints {
		var rel []string
		for _, r := range rm.Release {
			rel = append(rel, r.IP.String()+":"+r.Handle)
		}
		s.Remove = append(s.Remove, fmt.Sprintf("%s veth=%v release=%s kept=%d", tagOf(rm.Endpoint.ID), rm.RemoveVeth, strings.Join(rel, ","), len(rm.Kept)))
	}
	for _, o := range p.ReleaseOrphans {
		s.Orphans = append(s.Orphans, o.IP.String()+":"+o.Handle)
	}
	for _, ep := range p.EnsureRoutes {
		s.Routes = append(s.Routes, tagOf(ep.ID))
	}
	s.Detach = append(s.Detach, p.RemoveDetached...)
	for k := range p.Pending {
		s.Pending = append(s.Pending, k)
	}
	for _, id := range p.Unknown {
		s.Unknown = append(s.Unknown, tagOf(id))
	}
	sort.Strings(s.Remove)
	sort.Strings(s.Orphans)
	sort.Strings(s.Routes)
	sort.Strings(s.Pending)
	return s
}

func epKey(node, tag string, rev int64) string {
	return fmt.Sprintf("endpoint/%s/%s@%d", node, epID(tag), rev)
}

func TestPlanReconcile(t *testing.T) {
	const grace = 20 * time.Second
	t0 := time.Date(2024, 1, 1, 12, 0, 0, 0, time.UTC)
	now := t0.Add(time.Minute)
	seenAt := func(keys ...string) map[string]time.Time {
		m := map[string]time.Time{}
		for _, k := range keys {
			m[k] = t0
		}
		return m
	}
	tests := []struct {
		name      string
		eps       []reconcile.StoredEndpoint
		allocs    []ipam.Allocation
		docker    *reconcile.DockerView
		detached  []string
		firstSeen map[string]time.Time
		orphans   bool
		grace     time.Duration
		want      planSummary
		wantDue   time.Time
	}{
		{
			name:   "docker unknown: only routes of this node's joined endpoints; nothing removed even when overdue",
			eps:    []reconcile.StoredEndpoint{stored(host, "a1", "10.0.0.1", true, 5), stored(host, "a2", "10.0.0.2", false, 6), stored("host-b", "b1", "10.0.0.65", true, 7)},
			allocs: []ipam.Allocation{alloc("10.0.0.1", "h1", host), alloc("10.0.0.9", "h9", host)},
			// Overdue candidates are carried over, not acted on.
			firstSeen: seenAt(epKey(host, "a2", 6), "address/10.0.0.9/h9"),
			orphans:   true,
			want: planSummary{
				Routes:  []string{"a1"},
				Pending: []string{"address/10.0.0.9/h9", epKey(host, "a2", 6)},
			},
			wantDue: t0.Add(grace),
		},
		{
			name:    "live endpoints: routes for the joined one, nothing else",
			eps:     []reconcile.StoredEndpoint{stored(host, "a1", "10.0.0.1", true, 5), stored(host, "a2", "10.0.0.2", false, 6)},
			allocs:  []ipam.Allocation{alloc("10.0.0.1", "h1", host), alloc("10.0.0.2", "h2", host)},
			docker:  view(dockerEP("a1", "net1", "10.0.0.1"), dockerEP("a2", "net1", "10.0.0.2")),
			orphans: true,
			want:    planSummary{Routes: []string{"a1"}},
		},
		{
			name:    "stale endpoint seen for the first time: pending, not removed",
			eps:     []reconcile.StoredEndpoint{stored(host, "a1", "10.0.0.1", true, 5)},
			allocs:  []ipam.Allocation{alloc("10.0.0.1", "h1", host)},
			docker:  view(),
			orphans: true,
			want:    planSummary{Pending: []string{epKey(host, "a1", 5)}},
			wantDue: now.Add(grace),
		},
		{
			name:      "stale endpoint seen again within the grace period: still pending",
			eps:       []reconcile.StoredEndpoint{stored(host, "a1", "10.0.0.1", true, 5)},
			allocs:    []ipam.Allocation{alloc("10.0.0.1", "h1", host)},
			docker:    view(),
			firstSeen: map[string]time.Time{epKey(host, "a1", 5): now.Add(-grace + time.Second)},
			want:      planSummary{Pending: []string{epKey(host, "a1", 5)}},
			wantDue:   now.Add(time.Second),
		},
		{
			name:      "stale endpoint past the grace period: veth, its address (by handle) and record go",
			eps:       []reconcile.StoredEndpoint{stored(host, "a1", "10.0.0.1", true, 5), stored(host, "a3", "10.0.0.3", true, 8)},
			allocs:    []ipam.Allocation{alloc("10.0.0.1", "h1", host), alloc("10.0.0.3", "h3", host)},
			docker:    view(dockerEP("a3", "net1", "10.0.0.3")),
			firstSeen: seenAt(epKey(host, "a1", 5)),
			orphans:   true,
			want: planSummary{
				Remove: []string{"a1 veth=true release=10.0.0.1:h1 kept=0"},
				Routes: []string{"a3"},
			},
		},
		{
			name: "stale endpoint: its address re-assigned to a new handle since is kept; its own handle's address goes",
			eps: []reconcile.StoredEndpoint{
				withHandles(stored(host, "a1", "10.0.0.1", true, 5), "h1old"),
				withHandles(stored(host, "a2", "10.0.0.2", true, 6), "h2"),
			},
			allocs:    []ipam.Allocation{stampedAlloc("10.0.0.1", "h1new", host, t0), stampedAlloc("10.0.0.2", "h2", host, t0)},
			docker:    view(),
			firstSeen: seenAt(epKey(host, "a1", 5), epKey(host, "a2", 6)),
			want: planSummary{Remove: []string{
				"a1 veth=true release= kept=1",
				"a2 veth=true release=10.0.0.2:h2 kept=0",
			}},
		},
		{
			// A record written before handles were recorded cannot name its
			// handle; an assignment stamped with its time was made by a
			// daemon that records handles, so it is not this record's.
			name:      "stale record without handles: a newer (stamped) assignment of its address is kept",
			eps:       []reconcile.StoredEndpoint{stored(host, "a1", "10.0.0.1", true, 5)},
			allocs:    []ipam.Allocation{stampedAlloc("10.0.0.1", "h1new", host, t0)},
			docker:    view(),
			firstSeen: seenAt(epKey(host, "a1", 5)),
			want:      planSummary{Remove: []string{"a1 veth=true release= kept=1"}},
		},
		{
			name: "stale endpoint of a swarm task: the address stays with the swarm manager",
			eps:  []reconcile.StoredEndpoint{stored(host, "a1", "10.0.0.1", true, 5)},
			allocs: []ipam.Allocation{{IP: net.ParseIP("10.0.0.1").To4(), HandleID: "hm", Block: "10.0.0.0/26", Host: "manager",
				Attrs: map[string]string{"node": "manager", "swarm": "true"}}},
			docker:    view(),
			firstSeen: seenAt(epKey(host, "a1", 5)),
			want:      planSummary{Remove: []string{"a1 veth=true release= kept=1"}},
		},
		{
			name:      "a changed record restarts its grace period",
			eps:       []reconcile.StoredEndpoint{stored(host, "a1", "10.0.0.1", true, 9)},
			allocs:    []ipam.Allocation{alloc("10.0.0.1", "h1", host)},
			docker:    view(),
			firstSeen: seenAt(epKey(host, "a1", 5)),
			want:      planSummary{Pending: []string{epKey(host, "a1", 9)}},
			wantDue:   now.Add(grace),
		},
		{
			name:      "stale endpoint whose address is already free: only veth and record go",
			eps:       []reconcile.StoredEndpoint{stored(host, "a1", "10.0.0.1", false, 5)},
			docker:    view(),
			firstSeen: seenAt(epKey(host, "a1", 5)),
			want:      planSummary{Remove: []string{"a1 veth=true release= kept=0"}},
		},
		{
			name:      "stale endpoint whose address Docker shows on another endpoint: the address is kept",
			eps:       []reconcile.StoredEndpoint{stored(host, "a1", "10.0.0.1", true, 5)},
			allocs:    []ipam.Allocation{alloc("10.0.0.1", "h1", host)},
			docker:    view(dockerEP("zz", "othernet", "10.0.0.1")),
			firstSeen: seenAt(epKey(host, "a1", 5)),
			want:      planSummary{Remove: []string{"a1 veth=true release= kept=1"}},
		},
		{
			name: "stale endpoint sharing its interface name with a live one: the veth is kept",
			// Same first 11 characters, different ids.
			eps:       []reconcile.StoredEndpoint{stored(host, "abcdef123451", "10.0.0.1", true, 5)},
			allocs:    []ipam.Allocation{alloc("10.0.0.1", "h1", host)},
			docker:    view(dockerEP("abcdef123452", "net1", "10.0.0.2")),
			firstSeen: seenAt(epKey(host, "abcdef123451", 5)),
			want: planSummary{
				Remove:  []string{"abcdef123451 veth=false release=10.0.0.1:h1 kept=0"},
				Unknown: []string{"abcdef123452"},
			},
		},
		{
			name:      "other nodes' endpoints are never touched",
			eps:       []reconcile.StoredEndpoint{stored("host-b", "b1", "10.0.0.65", true, 5)},
			allocs:    []ipam.Allocation{alloc("10.0.0.65", "hb", "host-b")},
			docker:    view(),
			firstSeen: seenAt(epKey("host-b", "b1", 5)),
			orphans:   true,
			want:      planSummary{},
		},
		{
			// A cloned host running with our node name: its Docker is not
			// ours, so our Docker's view says nothing about its records.
			name:      "another Docker engine's endpoints under this node name are never touched; ours and unmarked ones are",
			eps:       []reconcile.StoredEndpoint{onEngine("engine-b", stored(host, "b1", "10.0.0.5", true, 5)), onEngine("engine-a", stored(host, "a1", "10.0.0.1", true, 6)), stored(host, "a2", "10.0.0.2", true, 7)},
			allocs:    []ipam.Allocation{alloc("10.0.0.5", "h5", host), alloc("10.0.0.1", "h1", host), alloc("10.0.0.2", "h2", host)},
			docker:    onEngineView("engine-a", view()),
			firstSeen: seenAt(epKey(host, "b1", 5), epKey(host, "a1", 6), epKey(host, "a2", 7), "address/10.0.0.5/h5"),
			orphans:   true,
			want:      planSummary{Remove: []string{"a1 veth=true release=10.0.0.1:h1 kept=0", "a2 veth=true release=10.0.0.2:h2 kept=0"}},
		},
		{
			name: "orphaned address: first pending, then released by handle; in-use, foreign and unattributed ones stay",
			eps:  []reconcile.StoredEndpoint{stored("host-b", "b1", "10.0.0.5", true, 5)},
			allocs: []ipam.Allocation{
				alloc("10.0.0.9", "h9", host),       // orphan, seen at t0: released
				alloc("10.0.0.10", "h10", host),     // orphan, new: pending
				alloc("10.0.0.11", "h11", host),     // used by a Docker endpoint (another driver's network)
				alloc("10.0.0.5", "h5", host),       // recorded on another node's endpoint (swarm-style)
				alloc("10.0.0.12", "h12", "host-b"), // another node's
				alloc("10.0.0.13", "h13", ""),       // no node attribute (CLI / old plugin)
			},
			docker:    view(dockerEP("x1", "bridge", "10.0.0.11")),
			firstSeen: seenAt("address/10.0.0.9/h9"),
			orphans:   true,
			want: planSummary{
				Orphans: []string{"10.0.0.9:h9"},
				Pending: []string{"address/10.0.0.10/h10"},
			},
			wantDue: now.Add(grace),
		},
		{
			name:      "an address re-assigned to a new handle restarts its grace period",
			allocs:    []ipam.Allocation{alloc("10.0.0.9", "h9new", host)},
			docker:    view(),
			firstSeen: seenAt("address/10.0.0.9/h9"),
			orphans:   true,
			want:      planSummary{Pending: []string{"address/10.0.0.9/h9new"}},
			wantDue:   now.Add(grace),
		},
		{
			name:   "detached veth pairs: a record's or a Docker endpoint's stay, others go after the grace period",
			eps:    []reconcile.StoredEndpoint{stored(host, "a1", "10.0.0.1", false, 5)},
			docker: view(dockerEP("a1", "net1", "10.0.0.1"), dockerEP("d2", "net1", "10.0.0.2")),
			detached: []string{
				dataplane.HostIfName(epID("a1")), // its record's (mid-Join)
				dataplane.HostIfName(epID("d2")), // a Docker endpoint's
				"calid3d3d3d3d3d",                // seen at t0: removed
				"calid4d4d4d4d4d",                // new: pending
			},
			firstSeen: seenAt("interface/calid3d3d3d3d3d"),
			want: planSummary{
				Detach:  []string{"calid3d3d3d3d3d"},
				Pending: []string{"interface/calid4d4d4d4d4d"},
				Unknown: []string{"d2"},
			},
			wantDue: now.Add(grace),
		},
		{
			name:      "detached veth pairs are kept while Docker is unreachable",
			detached:  []string{"calid3d3d3d3d3d"},
			firstSeen: seenAt("interface/calid3d3d3d3d3d"),
			want:      planSummary{Pending: []string{"interface/calid3d3d3d3d3d"}},
			wantDue:   t0.Add(grace),
		},
		{
			// Global scope sweeps orphans too (issue 12 item 5): the swarm
			// manager's assignments are not its to sweep, and aux/gateway
			// reservations never have an endpoint.
			name: "swarm assignments and reservations of this node are never orphans",
			allocs: []ipam.Allocation{
				withAttr(alloc("10.0.0.9", "h9", host), ipam.AttrSwarm, "true"),
				withAttr(alloc("10.0.0.10", "h10", host), ipam.AttrReserved, ipam.ReservedAux),
				alloc("10.0.0.11", "h11", host),
			},
			docker:    view(),
			firstSeen: seenAt("address/10.0.0.9/h9", "address/10.0.0.10/h10", "address/10.0.0.11/h11"),
			orphans:   true,
			want:      planSummary{Orphans: []string{"10.0.0.11:h11"}},
		},
		{
			// calico-ipam serving another driver's network cannot tell an
			// --aux-address request from others: Docker's network lists it.
			name: "an --aux-address of another driver's network is never an orphan",
			allocs: []ipam.Allocation{
				alloc("10.0.0.12", "h12", host),
				alloc("10.0.0.13", "h13", host),
			},
			docker: func() *reconcile.DockerView {
				v := view()
				v.AuxAddresses = map[netip.Addr]string{netip.MustParseAddr("10.0.0.12"): "macvlan1"}
				return v
			}(),
			firstSeen: seenAt("address/10.0.0.12/h12", "address/10.0.0.13/h13"),
			orphans:   true,
			want:      planSummary{Orphans: []string{"10.0.0.13:h13"}},
		},
		{
			name:      "global scope: orphaned addresses are never released",
			allocs:    []ipam.Allocation{alloc("10.0.0.9", "h9", host)},
			docker:    view(),
			firstSeen: seenAt("address/10.0.0.9/h9"),
			orphans:   false,
			want:      planSummary{},
		},
		{
			name:    "Docker endpoint on a calico network without a record is reported, others are not",
			docker:  view(dockerEP("c1", "net1", "10.0.0.20"), dockerEP("c2", "bridge", "172.17.0.2")),
			orphans: true,
			want:    planSummary{Unknown: []string{"c1"}},
		},
		{
			name:    "negative grace acts at once",
			eps:     []reconcile.StoredEndpoint{stored(host, "a1", "10.0.0.1", true, 5)},
			allocs:  []ipam.Allocation{alloc("10.0.0.1", "h1", host), alloc("10.0.0.9", "h9", host)},
			docker:  view(),
			orphans: true,
			grace:   -1,
			want: planSummary{
				Remove:  []string{"a1 veth=true release=10.0.0.1:h1 kept=0"},
				Orphans: []string{"10.0.0.9:h9"},
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			g := grace
			if tc.grace != 0 {
				g = tc.grace
			}
			plan := reconcile.MakePlan(reconcile.Input{
				Node: host, Now: now, Grace: g,
				Endpoints: tc.eps, Allocations: tc.allocs,
				Networks: map[string]bool{"net1": true},
				Docker:   tc.docker, FirstSeen: tc.firstSeen, ReleaseOrphans: tc.orphans,
				Detached: tc.detached,
			})
			if got := summarize(plan); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("plan:\n got %+v\nwant %+v", got, tc.want)
			}
			if !plan.NextDue.Equal(tc.wantDue) {
				t.Errorf("NextDue = %v, want %v", plan.NextDue, tc.wantDue)
			}
			for k, first := range plan.Pending {
				if prev, ok := tc.firstSeen[k]; ok && !first.Equal(prev) {
					t.Errorf("pending %s first seen %v, was %v: the clock must not restart", k, first, prev)
				}
			}
		})
	}
}

// fakeDocker is a DockerSource whose view the test sets.
type fakeDocker struct {
	mu      sync.Mutex
	view    reconcile.DockerView
	err     error
	changes chan struct{}
	views   int // View calls
}

func (f *fakeDocker) View(ctx context.Context) (reconcile.DockerView, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.views++
	if f.err != nil {
		return reconcile.DockerView{}, f.err
	}
	v := reconcile.DockerView{Endpoints: map[string]reconcile.DockerEndpoint{}}
	for k, e := range f.view.Endpoints {
		v.Endpoints[k] = e
	}
	return v, nil
}

func (f *fakeDocker) Changes(ctx context.Context) <-chan struct{} { return f.changes }

func (f *fakeDocker) viewCalls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.views
}

func (f *fakeDocker) set(v *reconcile.DockerView, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.view, f.err = *v, err
}

// fakeKernel is a Dataplane with interfaces and host routes.
type fakeKernel struct {
	mu       sync.Mutex
	ifaces   map[string]map[string]bool // interface -> routed IPs
	removed  []string                   // endpoint ids
	detached map[string]bool            // detached pairs (host-side names)
}

func (k *fakeKernel) ListDetachedWorkloads(ctx context.Context) ([]string, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	var out []string
	for n := range k.detached {
		out = append(out, n)
	}
	sort.Strings(out)
	return out, nil
}

func (k *fakeKernel) RemoveDetachedWorkload(ctx context.Context, name string) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	delete(k.detached, name)
	delete(k.ifaces, name)
	return nil
}

func (k *fakeKernel) RemoveWorkload(ctx context.Context, id string, ips []net.IPNet) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	delete(k.ifaces, dataplane.HostIfName(id))
	k.removed = append(k.removed, id)
	return nil
}

func (k *fakeKernel) MissingWorkloadRoutes(ctx context.Context, ifName string, ips []net.IPNet) ([]net.IPNet, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	routes, ok := k.ifaces[ifName]
	if !ok {
		return nil, fmt.Errorf("checking %s: %w", ifName, dataplane.ErrNoInterface)
	}
	var missing []net.IPNet
	for _, ip := range ips {
		if !routes[ip.IP.String()] {
			missing = append(missing, ip)
		}
	}
	return missing, nil
}

func (k *fakeKernel) EnsureWorkloadRoutes(ctx context.Context, ifName string, ips []net.IPNet) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, ip := range ips {
		k.ifaces[ifName][ip.IP.String()] = true
	}
	return nil
}

// recEnv is a Reconciler on a real datastore and IPAM engine.
type recEnv struct {
	store  *datastore.Store
	engine *ipam.Engine
	docker *fakeDocker
	kernel *fakeKernel
	rec    *reconcile.Reconciler
	// metrics are the daemon's, which the reconciler counts into.
	metrics *plugin.Metrics
	clock   time.Time
}

func newRecEnv(t *testing.T) *recEnv {
	t.Helper()
	m := etcdtest.Start(t)
	e := &recEnv{
		store:   m.Store,
		engine:  ipam.New(m.Store, ipam.Options{Log: quietLog()}),
		docker:  &fakeDocker{},
		kernel:  &fakeKernel{ifaces: map[string]map[string]bool{}, detached: map[string]bool{}},
		clock:   time.Date(2024, 1, 1, 12, 0, 0, 0, time.UTC),
		metrics: plugin.NewMetrics(nil, quietLog()),
	}
	if _, err := e.engine.AddPool(context.Background(), ipam.Pool{CIDR: "10.20.0.0/16"}); err != nil {
		t.Fatal(err)
	}
	if err := e.store.Txn(context.Background(), datastore.Create(datastore.NetworkKey("net1"), datastore.MustJSON(datastore.Network{ID: "net1"}))); err != nil {
		t.Fatal(err)
	}
	e.rec = &reconcile.Reconciler{
		Node: host, Store: m.Store, IPAM: e.engine, Dataplane: e.kernel, Docker: e.docker,
		Grace: 20 * time.Second, ReleaseOrphans: true,
		Metrics: e.metrics,
		Log:     quietLog(), Now: func() time.Time { return e.clock },
	}
	return e
}

// container does what Docker and the driver do for a running container:
// an address (as RequestAddress), an endpoint record naming its handle (as
// CreateEndpoint), a veth with its route.
func (e *recEnv) container(t *testing.T, tag string) (string, net.IP) {
	t.Helper()
	ctx := context.Background()
	ipn, err := e.engine.AutoAssign(ctx, ipam.AutoAssignArgs{Host: host, HandleID: "cnm." + tag, Attrs: map[string]string{"node": host}})
	if err != nil {
		t.Fatal(err)
	}
	id := epID(tag)
	ep := datastore.Endpoint{ID: id, Network: "net1", Node: host, IPv4: ipn.String(), MAC: "ee:ee:ee:ee:ee:ee", HostIfName: dataplane.HostIfName(id), Joined: true, Handles: []string{"cnm." + tag}}
	if err := e.store.Txn(ctx, datastore.Create(datastore.EndpointKey(host, id), datastore.MustJSON(ep))); err != nil {
		t.Fatal(err)
	}
	e.kernel.mu.Lock()
	e.kernel.ifaces[ep.HostIfName] = map[string]bool{ipn.IP.String(): true}
	e.kernel.mu.Unlock()
	return id, ipn.IP
}

func (e *recEnv) allocated(t *testing.T) map[string]string {
	t.Helper()
	as, err := e.engine.Allocations(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, a := range as {
		out[a.IP.String()] = a.HandleID
	}
	return out
}

// expectFixes checks the daemon's reconcile fixes counter: want's count
// for its kinds, 0 for every other.
func (e *recEnv) expectFixes(t *testing.T, want map[string]int) {
	t.Helper()
	var b strings.Builder
	b.WriteString("# HELP calico_cnm_reconcile_fixes_total Repairs made by the reconcile loop, by kind.\n# TYPE calico_cnm_reconcile_fixes_total counter\n")
	for _, kind := range slices.Sorted(slices.Values(reconcile.FixKinds())) {
		fmt.Fprintf(&b, "calico_cnm_reconcile_fixes_total{kind=%q} %d\n", kind, want[kind])
	}
	if err := testutil.GatherAndCompare(e.metrics.Registry, strings.NewReader(b.String()), plugin.MetricReconcileFixes); err != nil {
		t.Error(err)
	}
}

func (e *recEnv) pass(t *testing.T) reconcile.PassResult {
	t.Helper()
	res, err := e.rec.Pass(context.Background())
	if err != nil {
		t.Fatalf("reconcile pass: %v", err)
	}
	return res
}

func TestReconcilerRepairsAfterACrash(t *testing.T) {
	e := newRecEnv(t)
	ctx := context.Background()
	id1, ip1 := e.container(t, "c1")
	id2, ip2 := e.container(t, "c2")
	id3, ip3 := e.container(t, "c3")
	// An address whose container never got an endpoint (the daemon died
	// between RequestAddress and CreateEndpoint).
	orphan, err := e.engine.AutoAssign(ctx, ipam.AutoAssignArgs{Host: host, HandleID: "cnm.orphan", Attrs: map[string]string{"node": host}})
	if err != nil {
		t.Fatal(err)
	}
	// A veth pair of a Join that died half way, its record long gone.
	e.kernel.detached["cali0dead0beef0"] = true
	// c2 was removed while the daemon was down; c3's route was deleted.
	e.docker.set(view(dockerEP("c1", "net1", ip1.String()), dockerEP("c3", "net1", ip3.String())), nil)
	delete(e.kernel.ifaces[dataplane.HostIfName(id3)], ip3.String())

	res := e.pass(t)
	if res.Fixes[reconcile.FixRouteRestored] != 1 || !e.kernel.ifaces[dataplane.HostIfName(id3)][ip3.String()] {
		t.Errorf("c3's route not restored at once: fixes %v", res.Fixes)
	}
	if len(e.kernel.removed) != 0 || len(e.allocated(t)) != 4 {
		t.Fatalf("first pass removed something inside the grace period: removed %v, allocated %v", e.kernel.removed, e.allocated(t))
	}

	e.clock = e.clock.Add(21 * time.Second)
	res = e.pass(t)
	want := map[string]int{reconcile.FixEndpointRemoved: 1, reconcile.FixAddressReleased: 1, reconcile.FixOrphanReleased: 1, reconcile.FixInterfaceRemoved: 1}
	if !reflect.DeepEqual(res.Fixes, want) {
		t.Errorf("fixes %v, want %v", res.Fixes, want)
	}
	if !reflect.DeepEqual(e.kernel.removed, []string{id2}) {
		t.Errorf("veths removed: %v, want only c2's", e.kernel.removed)
	}
	if len(e.kernel.detached) != 0 {
		t.Errorf("detached pairs left: %v", e.kernel.detached)
	}
	got := e.allocated(t)
	wantAlloc := map[string]string{ip1.String(): "cnm.c1", ip3.String(): "cnm.c3"}
	if !reflect.DeepEqual(got, wantAlloc) {
		t.Errorf("allocations %v, want %v (c2's %s and the orphan %s released)", got, wantAlloc, ip2, orphan.IP)
	}
	if _, err := e.store.Get(ctx, datastore.EndpointKey(host, id2)); !errors.Is(err, datastore.ErrNotFound) {
		t.Errorf("c2's record: %v, want it deleted", err)
	}
	for _, id := range []string{id1, id3} {
		if _, err := e.store.Get(ctx, datastore.EndpointKey(host, id)); err != nil {
			t.Errorf("live endpoint record %s: %v", id[:12], err)
		}
	}
	e.expectFixes(t, map[string]int{
		reconcile.FixAddressReleased: 1, reconcile.FixEndpointRemoved: 1, reconcile.FixInterfaceRemoved: 1,
		reconcile.FixOrphanReleased: 1, reconcile.FixRouteRestored: 1,
	})

	// Nothing left to do: a further pass is a no-op.
	e.clock = e.clock.Add(time.Minute)
	if res := e.pass(t); len(res.Fixes) != 0 || res.Plan.Actions() != 0 {
		t.Errorf("third pass still fixed %v", res.Fixes)
	}
}

func TestReconcilerReleasesNothingWhileDockerIsUnreachable(t *testing.T) {
	e := newRecEnv(t)
	id1, ip1 := e.container(t, "c1")
	if _, err := e.engine.AutoAssign(context.Background(), ipam.AutoAssignArgs{Host: host, HandleID: "cnm.orphan", Attrs: map[string]string{"node": host}}); err != nil {
		t.Fatal(err)
	}
	e.docker.set(view(), errors.New("Cannot connect to the Docker daemon"))
	delete(e.kernel.ifaces[dataplane.HostIfName(id1)], ip1.String())
	for i := 0; i < 3; i++ {
		res := e.pass(t)
		if res.DockerKnown {
			t.Fatal("Docker's view reported known")
		}
		e.clock = e.clock.Add(time.Minute)
	}
	if len(e.kernel.removed) != 0 || len(e.allocated(t)) != 2 {
		t.Errorf("released or removed while Docker was unreachable: removed %v, allocated %v", e.kernel.removed, e.allocated(t))
	}
	// Routes through existing veths are still restored.
	if !e.kernel.ifaces[dataplane.HostIfName(id1)][ip1.String()] {
		t.Error("route not restored while Docker was unreachable")
	}
	if got := counterValue(t, e.metrics, plugin.MetricReconcileRuns, "docker_unavailable"); got != 3 {
		t.Errorf("docker_unavailable runs = %v, want 3", got)
	}

	// Docker answers again, without c1: the candidates' clocks start when
	// Docker's view is first known, not when Docker was unreachable.
	e.docker.set(view(), nil)
	if res := e.pass(t); res.Plan.Actions() != 0 {
		t.Errorf("acted on the first pass with Docker's view: %+v", res.Plan)
	}
	e.clock = e.clock.Add(21 * time.Second)
	if res := e.pass(t); res.Fixes[reconcile.FixEndpointRemoved] != 1 || res.Fixes[reconcile.FixOrphanReleased] != 1 {
		t.Errorf("after the grace period: fixes %v", res.Fixes)
	}
	if n := len(e.allocated(t)); n != 0 {
		t.Errorf("%d addresses still allocated", n)
	}
}

// counterValue is one sample of a counter vector, by its single label value.
func counterValue(t *testing.T, m *plugin.Metrics, name, label string) float64 {
	t.Helper()
	mfs, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, mt := range mf.GetMetric() {
			if len(mt.GetLabel()) == 1 && mt.GetLabel()[0].GetValue() == label {
				return mt.GetCounter().GetValue()
			}
		}
	}
	t.Fatalf("no %s{%q}", name, label)
	return 0
}

// loopEnv is an environment for the reconcile loop itself: real time
// (the loop's timers run on it), the given grace, no periodic pass within
// a test, Docker events on a channel and Docker showing nothing yet.
func loopEnv(t *testing.T, grace time.Duration) *recEnv {
	t.Helper()
	e := newRecEnv(t)
	e.rec.Now = nil
	e.rec.Grace = grace
	e.rec.Interval = time.Hour
	e.docker.changes = make(chan struct{}, 1)
	e.docker.set(view(), nil)
	return e
}

// runLoop runs e's reconcile loop until the test ends, logging at debug,
// and returns why each of its passes so far started, in order.
func runLoop(t *testing.T, e *recEnv) (triggers func() []string) {
	t.Helper()
	log, hook := logtest.NewNullLogger()
	log.SetLevel(logrus.DebugLevel)
	e.rec.Log = log
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); e.rec.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return func() []string {
		var out []string
		for _, en := range hook.AllEntries() {
			if en.Message == "reconcile pass" {
				out = append(out, fmt.Sprint(en.Data["trigger"]))
			}
		}
		return out
	}
}

// TestReconcilerRun: the loop passes at start, again when a pending
// candidate matures (not only every Interval), and after Docker events.
func TestReconcilerRun(t *testing.T) {
	e := loopEnv(t, 300*time.Millisecond)
	id1, _ := e.container(t, "c1")
	triggers := runLoop(t, e)

	gone := func(id string, within time.Duration) bool {
		deadline := time.Now().Add(within)
		for time.Now().Before(deadline) {
			if _, err := e.store.Get(context.Background(), datastore.EndpointKey(host, id)); errors.Is(err, datastore.ErrNotFound) {
				return true
			}
			time.Sleep(50 * time.Millisecond)
		}
		return false
	}
	if !gone(id1, 5*time.Second) {
		t.Fatal("stale endpoint not removed by the follow-up pass")
	}
	calls := e.docker.viewCalls()
	if calls < 2 {
		t.Errorf("%d passes, want the first one and a follow-up", calls)
	}

	// A Docker event triggers a pass, spaced from the previous one by
	// minEventGap (5 s). A pass without a reason (a follow-up timer left
	// armed with nothing pending fires after at most ~1 s) would start
	// before it: once the event's pass has started, it must be the only
	// one since the follow-up.
	before := len(triggers())
	e.docker.changes <- struct{}{}
	deadline := time.Now().Add(15 * time.Second)
	for !slices.Contains(triggers()[before:], reconcile.PassDockerEvent) && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if got := triggers()[before:]; !slices.Equal(got, []string{reconcile.PassDockerEvent}) {
		t.Errorf("passes after the follow-up, for one Docker event: %q", got)
	}
}

// TestReconcilerFollowUpOnlyForWhatIsDue: a candidate pending at one
// pass (an endpoint Docker does not show yet, as during a `docker run`)
// that the next pass finds live leaves no follow-up behind: the pass after
// is the next Docker event's, not one at the old candidate's due time.
func TestReconcilerFollowUpOnlyForWhatIsDue(t *testing.T) {
	// A grace longer than the spacing of event passes (minEventGap, 5 s),
	// so the second event's pass comes after the stale due time.
	e := loopEnv(t, 7*time.Second)
	id, ip := e.container(t, "c1")
	triggers := runLoop(t, e)
	waitFor := func(n int) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for len(triggers()) < n && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
		if got := triggers(); len(got) < n {
			t.Fatalf("passes %q, want at least %d", got, n)
		}
	}

	waitFor(1) // the start pass: the endpoint is pending (Docker does not show it)
	e.docker.set(view(dockerEP("c1", "net1", ip.String())), nil)
	e.docker.changes <- struct{}{}
	waitFor(2) // the event's pass: it is live now, nothing is due
	e.docker.changes <- struct{}{}
	waitFor(3)
	if got := triggers(); !slices.Equal(got[:3], []string{reconcile.PassAtStart, reconcile.PassDockerEvent, reconcile.PassDockerEvent}) {
		t.Errorf("passes %q, want start, event, event (no follow-up with nothing due)", got)
	}
	if _, err := e.store.Get(context.Background(), datastore.EndpointKey(host, id)); err != nil {
		t.Errorf("the live endpoint's record: %v", err)
	}
}

// Issue 12 item 5, swarm scope: an assignment the engine answered as failed
// while etcd could not tell whether it landed is released by the next
// reconcile pass (by its handle, which nobody else knows), whatever the
// scope: the swarm manager's timed-out assignments have no endpoint and no
// Docker container, so nothing else would ever free them.
func TestReconcilerReleasesAbandonedAssignments(t *testing.T) {
	m := etcdtest.Start(t)
	ctx := context.Background()
	faulty, fault := m.FaultyClient(t)
	engine := ipam.New(faulty, ipam.Options{Log: quietLog()})
	if _, err := engine.AddPool(ctx, ipam.Pool{CIDR: "10.20.0.0/16"}); err != nil {
		t.Fatal(err)
	}
	task := map[string]string{ipam.AttrNode: host, ipam.AttrSwarm: "true"}
	if _, err := engine.AutoAssign(ctx, ipam.AutoAssignArgs{Host: host, HandleID: "cnm.task1", Attrs: task}); err != nil {
		t.Fatal(err)
	}
	fault.CommitThenTimeout(func() { fault.SetReadsDown(true) })
	if _, err := engine.AutoAssign(ctx, ipam.AutoAssignArgs{Host: host, HandleID: "cnm.task2", Attrs: task}); err == nil || !fault.Fired() {
		t.Fatalf("the faulty assignment answered %v (fault fired: %v); want a failure", err, fault.Fired())
	}
	fault.SetReadsDown(false)
	held := func(h string) bool {
		t.Helper()
		ips, err := engine.IPsByHandle(ctx, h)
		if err != nil {
			t.Fatal(err)
		}
		return len(ips) > 0
	}
	if !held("cnm.task2") {
		t.Fatal("fixture: the timed-out assignment did not land")
	}
	rec := &reconcile.Reconciler{
		Node: host, Store: m.Store, IPAM: engine, Dataplane: &fakeKernel{ifaces: map[string]map[string]bool{}, detached: map[string]bool{}},
		Docker: &fakeDocker{}, ReleaseOrphans: false, // as a swarm manager that releases no orphans
		Metrics: plugin.NewMetrics(nil, quietLog()), Log: quietLog(),
	}
	res, err := rec.Pass(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if res.Fixes[reconcile.FixOrphanReleased] != 1 || held("cnm.task2") {
		t.Errorf("after a pass: fixes %v, cnm.task2 still held: %v; want it released", res.Fixes, held("cnm.task2"))
	}
	if !held("cnm.task1") {
		t.Error("the pass released the manager's live assignment cnm.task1")
	}
}

// TestDockerViewUses: what Docker holds is its endpoints' addresses and the
// networks' --aux-address reservations (ipam check judges leaks by it).
func TestDockerViewUses(t *testing.T) {
	v := &reconcile.DockerView{
		Endpoints:    map[string]reconcile.DockerEndpoint{"e1": {ID: "e1", IPs: []netip.Addr{netip.MustParseAddr("10.0.0.1")}}},
		AuxAddresses: map[netip.Addr]string{netip.MustParseAddr("10.0.0.2"): "macvlan1"},
	}
	got := v.Uses()
	want := map[netip.Addr]bool{netip.MustParseAddr("10.0.0.1"): true, netip.MustParseAddr("10.0.0.2"): true}
	if !maps.Equal(got, want) {
		t.Errorf("Uses() = %v, want %v", got, want)
	}
}

// TestReconcilerUnknownEndpointWarnedOnSecondPass: a Docker endpoint the
// datastore does not record is warned about when a second pass in a row
// still finds it (a container created between one pass's two reads is
// unknown to that pass only), once, and again after it went away and came
// back.
func TestReconcilerUnknownEndpointWarnedOnSecondPass(t *testing.T) {
	e := newRecEnv(t)
	log, hook := logtest.NewNullLogger()
	e.rec.Log = log
	_, ip := e.container(t, "c1")
	// u1's address is held (its record is what is missing, as after a
	// rename), so the pass does not rebuild it.
	u1, err := e.engine.AutoAssign(context.Background(), ipam.AutoAssignArgs{Host: host, HandleID: "cnm.u1", Attrs: map[string]string{"node": host}})
	if err != nil {
		t.Fatal(err)
	}
	unknown := view(dockerEP("c1", "net1", ip.String()), dockerEP("u1", "net1", u1.IP.String()))
	warnings := func() int {
		n := 0
		for _, en := range hook.AllEntries() {
			if en.Level <= logrus.WarnLevel && strings.Contains(en.Message, "does not record") {
				n++
			}
		}
		return n
	}
	e.docker.set(unknown, nil)
	e.pass(t)
	if n := warnings(); n != 0 {
		t.Fatalf("%d warnings on the first pass that saw the unknown endpoint, want none yet", n)
	}
	e.pass(t)
	e.pass(t)
	if n := warnings(); n != 1 {
		t.Fatalf("%d warnings after three passes with the unknown endpoint, want 1", n)
	}
	e.docker.set(view(dockerEP("c1", "net1", ip.String())), nil)
	e.pass(t)
	e.docker.set(unknown, nil)
	e.pass(t)
	e.pass(t)
	if n := warnings(); n != 2 {
		t.Errorf("%d warnings after the endpoint went away and came back for two passes, want 2", n)
	}
}

// gaugeValue is the value of a gauge without labels.
func gaugeValue(t *testing.T, m *plugin.Metrics, name string) float64 {
	t.Helper()
	mfs, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no %s", name)
	return 0
}

// TestReconcilerReportsScheduledPasses: the loop says when a pass besides
// the periodic one is due: a follow-up for a pending candidate, a Docker
// event's pass; and that none is once a pass found nothing due (what a
// test of an idle host waits for before it measures).
func TestReconcilerReportsScheduledPasses(t *testing.T) {
	e := loopEnv(t, 7*time.Second)
	_, ip := e.container(t, "c1")
	triggers := runLoop(t, e)
	await := func(what string, ok func() bool) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for !ok() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within 20s (passes %q)", what, triggers())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	scheduled := func() float64 { return gaugeValue(t, e.metrics, plugin.MetricReconcileScheduled) }
	// The start pass finds the endpoint pending: its follow-up is due.
	await("a follow-up due after the start pass", func() bool { return len(triggers()) >= 1 && scheduled() == 1 })
	e.docker.set(view(dockerEP("c1", "net1", ip.String())), nil)
	e.docker.changes <- struct{}{}
	// The event's pass finds it live: nothing is due any more.
	await("nothing due after the event's pass", func() bool { return len(triggers()) >= 2 && scheduled() == 0 })
	if got := triggers(); !slices.Equal(got, []string{reconcile.PassAtStart, reconcile.PassDockerEvent}) {
		t.Errorf("passes %q, want start, event", got)
	}
}
