package routing

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"reflect"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/calico-cnm/calico-cnm/internal/nlconv"
)

func learned(peer, prefix, nextHop string) LearnedPath {
	return LearnedPath{Peer: addr(peer), Prefix: netip.MustParsePrefix(prefix), NextHop: addr(nextHop)}
}

func sortedPaths(ps []LearnedPath) []LearnedPath {
	out := slices.Clone(ps)
	slices.SortFunc(out, func(a, b LearnedPath) int {
		if c := a.Peer.Compare(b.Peer); c != 0 {
			return c
		}
		return nlconv.ComparePrefix(a.Prefix, b.Prefix)
	})
	return out
}

// TestRIBMirror: the mirror lists only when it must (first read,
// invalidated, too old, after a failed list) and otherwise serves what the
// adj-in events made of the last list; events that arrive while a list is
// in flight are replayed on top of it.
func TestRIBMirror(t *testing.T) {
	a1 := learned("10.0.0.2", "192.168.0.0/26", "10.0.0.2")
	a1moved := learned("10.0.0.2", "192.168.0.0/26", "10.0.0.7")
	b1 := learned("10.0.0.3", "192.168.0.64/26", "10.0.0.3")
	c1 := learned("10.0.0.4", "192.168.0.128/26", "10.0.0.4")
	type step struct {
		events     []ribEvent // applied before the read
		invalidate bool
		// invalidateDuringList: a session event arrives while listing.
		invalidateDuringList bool
		rib                  []LearnedPath // what a list returns
		listErr              error
		duringList           []ribEvent // arrive while the list is in flight
		wantList             bool
		want                 []LearnedPath
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"first read lists, then events are served", []step{
			{rib: []LearnedPath{a1}, wantList: true, want: []LearnedPath{a1}},
			{events: []ribEvent{{path: b1}}, rib: []LearnedPath{a1}, want: []LearnedPath{a1, b1}},
			{events: []ribEvent{{path: a1moved}}, want: []LearnedPath{a1moved, b1}},
			{events: []ribEvent{{path: b1, withdraw: true}}, want: []LearnedPath{a1moved}},
		}},
		{"events before the first list are not kept (the list has them)", []step{
			{events: []ribEvent{{path: c1}}, rib: []LearnedPath{a1}, wantList: true, want: []LearnedPath{a1}},
		}},
		{"invalidate lists again", []step{
			{rib: []LearnedPath{a1, b1}, wantList: true, want: []LearnedPath{a1, b1}},
			{invalidate: true, rib: []LearnedPath{b1}, wantList: true, want: []LearnedPath{b1}},
			{want: []LearnedPath{b1}},
		}},
		{"events during a list are replayed on it", []step{
			{rib: []LearnedPath{a1, b1}, duringList: []ribEvent{{path: c1}, {path: a1, withdraw: true}}, wantList: true, want: []LearnedPath{b1, c1}},
			{want: []LearnedPath{b1, c1}},
		}},
		{"a session event during a list makes the next read list again", []step{
			{rib: []LearnedPath{a1}, invalidateDuringList: true, wantList: true, want: []LearnedPath{a1}},
			{rib: []LearnedPath{b1}, wantList: true, want: []LearnedPath{b1}},
			{want: []LearnedPath{b1}},
		}},
		{"a failed list is retried and its events dropped", []step{
			{listErr: errors.New("gobgp busy"), duringList: []ribEvent{{path: c1}}, wantList: true},
			{rib: []LearnedPath{a1}, wantList: true, want: []LearnedPath{a1}},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := newRIBMirror(time.Hour)
			for i, s := range tc.steps {
				m.apply(s.events)
				if s.invalidate {
					m.invalidate()
				}
				listed := false
				got, err := m.read(func() ([]LearnedPath, error) {
					listed = true
					m.apply(s.duringList)
					if s.invalidateDuringList {
						m.invalidate()
					}
					return s.rib, s.listErr
				})
				if (err != nil) != (s.listErr != nil) {
					t.Fatalf("step %d: err %v, want %v", i, err, s.listErr)
				}
				if listed != s.wantList {
					t.Errorf("step %d: listed %v, want %v", i, listed, s.wantList)
				}
				if !reflect.DeepEqual(sortedPaths(got), sortedPaths(s.want)) {
					t.Errorf("step %d: paths %v, want %v", i, got, s.want)
				}
			}
		})
	}
}

// TestRIBMirrorAge: a mirror older than its maximum age lists again.
func TestRIBMirrorAge(t *testing.T) {
	m := newRIBMirror(time.Nanosecond)
	lists := 0
	list := func() ([]LearnedPath, error) { lists++; return nil, nil }
	for range 2 {
		if _, err := m.read(list); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Millisecond) // older than 1 ns: nothing is awaited
	}
	if lists != 2 {
		t.Errorf("listed %d times, want 2", lists)
	}
}

// countingTable is a fakeTable that counts kernel listings and can fail
// changes.
type countingTable struct {
	*fakeTable
	lists   int
	failAdd error
}

func (c *countingTable) ListLearned(ctx context.Context) ([]KernelRoute, error) {
	c.lists++
	return c.fakeTable.ListLearned(ctx)
}

func (c *countingTable) Add(ctx context.Context, r KernelRoute) error {
	if c.failAdd != nil {
		return c.failAdd
	}
	return c.fakeTable.Add(ctx, r)
}

// TestKnownRoutes: routing lists the kernel once and then diffs against
// what it programmed; a failed change or forget lists again, a conflict
// (a route not ours) does not.
func TestKnownRoutes(t *testing.T) {
	ctx := context.Background()
	p1, p2 := netip.MustParsePrefix("192.168.0.0/26"), netip.MustParsePrefix("192.168.0.64/26")
	gw := []netip.Addr{addr("10.0.0.2")}
	ft := &fakeTable{learned: map[netip.Prefix][]netip.Addr{p1: gw}, foreign: map[netip.Prefix]bool{}}
	ct := &countingTable{fakeTable: ft}
	k := newKnownRoutes(ct)
	list := func(wantLists int, want ...netip.Prefix) {
		t.Helper()
		got, err := k.ListLearned(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var dsts []netip.Prefix
		for _, r := range got {
			dsts = append(dsts, r.Dst)
		}
		slices.SortFunc(dsts, nlconv.ComparePrefix)
		if !slices.Equal(dsts, want) || ct.lists != wantLists {
			t.Errorf("routes %v after %d kernel lists, want %v after %d", dsts, ct.lists, want, wantLists)
		}
	}
	list(1, p1)
	if err := k.Add(ctx, KernelRoute{Dst: p2, Gateways: gw}); err != nil {
		t.Fatal(err)
	}
	list(1, p1, p2)
	if err := k.Delete(ctx, p1); err != nil {
		t.Fatal(err)
	}
	list(1, p2)
	ft.foreign[p1] = true
	if err := k.Add(ctx, KernelRoute{Dst: p1, Gateways: gw}); !errors.Is(err, ErrRouteConflict) {
		t.Fatalf("add over a foreign route: %v", err)
	}
	list(1, p2)
	ct.failAdd = errors.New("netlink: no buffer space")
	if err := k.Add(ctx, KernelRoute{Dst: netip.MustParsePrefix("192.168.1.0/26"), Gateways: gw}); err == nil {
		t.Fatal("add did not fail")
	}
	list(2, p2)
	delete(ft.learned, p2) // removed behind routing's back
	list(2, p2)
	k.forget()
	list(3)
}

// TestGoBGPPathsFollowAdjIn runs two in-process speakers on loopback: what
// one advertises and withdraws reaches the other's Paths through adj-in
// events alone (no listing of the RIB), the mirror equals a listing, and a
// session that ends takes its paths with it.
func TestGoBGPPathsFollowAdjIn(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	port := freePort(t)
	log := logrus.New()
	log.SetLevel(logrus.ErrorLevel)
	aAddr, bAddr := addr("127.0.0.1"), addr("127.0.0.2")
	a, b := NewGoBGP(log), NewGoBGP(log)
	for _, s := range []struct {
		g          *GoBGP
		self, peer netip.Addr
		passive    bool
	}{{a, aAddr, bAddr, false}, {b, bAddr, aAddr, true}} {
		spec := GlobalSpec{ASN: 64512, RouterID: s.self, ListenAddress: s.self.String(), Port: port, RestartTime: 2 * time.Second}
		if err := s.g.Start(ctx, spec); err != nil {
			t.Fatal(err)
		}
		if err := s.g.AddPeer(ctx, PeerSpec{Address: s.peer, ASN: 64512, Type: PeerMesh, Name: "peer", Passive: s.passive}); err != nil {
			t.Fatal(err)
		}
	}
	stopped := false
	defer func() {
		b.Stop(false)
		if !stopped {
			a.Stop(false)
		}
	}()
	p1, p2 := netip.MustParsePrefix("192.168.0.0/26"), netip.MustParsePrefix("192.168.0.64/26")
	// Each wait is shorter than ribMaxAge, so the age limit cannot be
	// what brings the mirror up to date.
	waitPaths := func(what string, want ...netip.Prefix) {
		t.Helper()
		ctx, cancel := context.WithTimeout(ctx, ribMaxAge/3)
		defer cancel()
		var got []netip.Prefix
		for ctx.Err() == nil {
			paths, err := b.Paths(ctx)
			if err != nil {
				t.Fatal(err)
			}
			got = got[:0]
			for _, p := range paths {
				got = append(got, p.Prefix)
			}
			slices.SortFunc(got, nlconv.ComparePrefix)
			if slices.Equal(got, want) {
				return
			}
			select {
			case <-b.Changes():
			case <-ctx.Done():
			}
		}
		t.Fatalf("%s: b has %v, want %v", what, got, want)
	}
	for synced := false; !synced; {
		states, err := b.Peers(ctx)
		if err != nil {
			t.Fatal(err)
		}
		synced = len(states) == 1 && states[0].State == "Established" && states[0].EORReceived
		if !synced {
			select {
			case <-b.Changes():
			case <-ctx.Done():
				t.Fatalf("session not established with End-of-RIB: %+v", states)
			}
		}
	}
	waitPaths("before any advertisement")
	listsAfterSync := b.rib.listCount()
	for _, p := range []netip.Prefix{p1, p2} {
		if err := a.Advertise(ctx, p, aAddr); err != nil {
			t.Fatal(err)
		}
	}
	waitPaths("after two advertisements", p1, p2)
	if err := a.Withdraw(ctx, p1); err != nil {
		t.Fatal(err)
	}
	waitPaths("after a withdrawal", p2)
	// At most one list: the End-of-RIB event may still have been queued
	// when the wait for the session saw it in a list of the sessions.
	if n := b.rib.listCount() - listsAfterSync; n > 1 {
		t.Errorf("b listed its RIB %d times for three route updates; adj-in events should have carried them", n)
	}
	listed, err := b.listPaths(ctx)
	if err != nil {
		t.Fatal(err)
	}
	mirrored, _ := b.Paths(ctx)
	if !reflect.DeepEqual(sortedPaths(listed), sortedPaths(mirrored)) {
		t.Errorf("mirror %v differs from the RIB %v", mirrored, listed)
	}
	a.Stop(false) // a NOTIFICATION: b drops a's paths (no adj-in event)
	stopped = true
	waitPaths("after the session ended")
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	_, p, _ := net.SplitHostPort(l.Addr().String())
	n, _ := strconv.Atoi(p)
	return n
}

// TestSameSessions: which changes in a list of the sessions make the next
// Paths list the RIB (a session's state or End-of-RIB) and which do not.
func TestSameSessions(t *testing.T) {
	x, y := addr("10.0.0.2"), addr("10.0.0.3")
	up := PeerState{Address: x, State: "Established"}
	synced := PeerState{Address: x, State: "Established", EORReceived: true}
	for _, tc := range []struct {
		name string
		a, b []PeerState
		want bool
	}{
		{"nothing listed before", nil, []PeerState{up}, false},
		{"unchanged", []PeerState{synced}, []PeerState{synced}, true},
		{"only counters changed", []PeerState{synced}, []PeerState{{Address: x, State: "Established", EORReceived: true, Received: 9}}, true},
		{"End-of-RIB arrived", []PeerState{up}, []PeerState{synced}, false},
		{"session went down", []PeerState{synced}, []PeerState{{Address: x, State: "Active"}}, false},
		{"another session", []PeerState{synced}, []PeerState{{Address: y, State: "Established", EORReceived: true}}, false},
		{"a session added", []PeerState{synced}, []PeerState{synced, {Address: y, State: "Idle"}}, false},
	} {
		if got := sameSessions(tc.a, tc.b); got != tc.want {
			t.Errorf("%s: sameSessions = %v, want %v", tc.name, got, tc.want)
		}
	}
}
