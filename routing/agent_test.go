package routing

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/datastore/etcdtest"
	"github.com/calico-cnm/calico-cnm/internal/follow/followtest"
	"github.com/calico-cnm/calico-cnm/internal/nlconv"
	"github.com/calico-cnm/calico-cnm/ipam"
)

// fakeSpeaker records what the agent asks for and serves paths the test
// sets.
type fakeSpeaker struct {
	mu         sync.Mutex
	global     GlobalSpec
	peers      map[netip.Addr]PeerSpec
	advertised map[netip.Prefix]bool
	nextHops   map[netip.Prefix]netip.Addr
	paths      []LearnedPath
	states     []PeerState
	changes    chan struct{}
	ops        []string // "add ADDR" / "delete ADDR", in order
	passes     int      // Paths calls: one per reconcile pass
	// afterPathsRead, when set, runs once right after a Paths read: what
	// the speaker receives just after the agent read its RIB.
	afterPathsRead func()
	// pathsGate, when set, holds every Paths read until it is closed
	// (gobgp's server loop busy with a burst of updates); inPaths hears
	// that a read is held.
	pathsGate chan struct{}
	inPaths   chan struct{}
}

func newFakeSpeaker() *fakeSpeaker {
	return &fakeSpeaker{peers: map[netip.Addr]PeerSpec{}, advertised: map[netip.Prefix]bool{}, nextHops: map[netip.Prefix]netip.Addr{}, changes: make(chan struct{}, 1)}
}

func (f *fakeSpeaker) Start(_ context.Context, g GlobalSpec) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.global = g
	return nil
}
func (f *fakeSpeaker) AddPeer(_ context.Context, p PeerSpec) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.peers[p.Address] = p
	f.ops = append(f.ops, "add "+p.Address.String())
	return nil
}
func (f *fakeSpeaker) DeletePeer(_ context.Context, a netip.Addr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.peers, a)
	f.ops = append(f.ops, "delete "+a.String())
	return nil
}
func (f *fakeSpeaker) Advertise(_ context.Context, p netip.Prefix, nh netip.Addr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.advertised[p] = true
	f.nextHops[p] = nh
	return nil
}
func (f *fakeSpeaker) Withdraw(_ context.Context, p netip.Prefix) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.advertised, p)
	return nil
}
func (f *fakeSpeaker) Paths(context.Context) ([]LearnedPath, error) {
	f.mu.Lock()
	gate, in := f.pathsGate, f.inPaths
	f.mu.Unlock()
	if gate != nil {
		select {
		case in <- struct{}{}:
		default:
		}
		<-gate
	}
	f.mu.Lock()
	f.passes++
	out := slices.Clone(f.paths)
	arrive := f.afterPathsRead
	f.afterPathsRead = nil
	f.mu.Unlock()
	if arrive != nil {
		arrive()
	}
	return out, nil
}
func (f *fakeSpeaker) Peers(context.Context) ([]PeerState, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.states), nil
}
func (f *fakeSpeaker) Changes() <-chan struct{} { return f.changes }
func (f *fakeSpeaker) Stop(bool)                {}

func (f *fakeSpeaker) set(paths []LearnedPath, states []PeerState) {
	f.mu.Lock()
	f.paths, f.states = paths, states
	f.mu.Unlock()
	f.poke()
}

// poke signals a change, as the real speaker does on any RIB or session
// event.
func (f *fakeSpeaker) poke() {
	select {
	case f.changes <- struct{}{}:
	default:
	}
}

func (f *fakeSpeaker) snapshot() (map[netip.Addr]PeerSpec, []netip.Prefix) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var adv []netip.Prefix
	for p := range f.advertised {
		adv = append(adv, p)
	}
	slices.SortFunc(adv, nlconv.ComparePrefix)
	peers := map[netip.Addr]PeerSpec{}
	for k, v := range f.peers {
		peers[k] = v
	}
	return peers, adv
}

// syncTable is fakeTable made safe for the agent's goroutine.
type syncTable struct {
	mu sync.Mutex
	ft fakeTable
}

func (s *syncTable) ListLearned(ctx context.Context) ([]KernelRoute, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ft.ListLearned(ctx)
}
func (s *syncTable) Add(ctx context.Context, r KernelRoute) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ft.Add(ctx, r)
}
func (s *syncTable) Replace(ctx context.Context, r KernelRoute) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ft.Replace(ctx, r)
}
func (s *syncTable) Delete(ctx context.Context, d netip.Prefix) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ft.Delete(ctx, d)
}
func (s *syncTable) routes() map[netip.Prefix][]netip.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[netip.Prefix][]netip.Addr{}
	for k, v := range s.ft.learned {
		out[k] = v
	}
	return out
}

func eventually(t *testing.T, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %v", what, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// runAgent starts an agent on deps until the test ends: cancel stops it and
// the test waits for Run to return.
// newAgentFixtureWithPeer is newAgentFixture with the pool 192.168.0.0/16
// and a node b (returned: its address 10.0.0.2) recorded, as most agent
// tests start.
func newAgentFixtureWithPeer(t *testing.T) (*datastore.Store, *ipam.Engine, context.Context, context.CancelFunc, *logrus.Logger, netip.Addr) {
	t.Helper()
	store, eng, ctx, cancel, log := followtest.Fixture(t)
	if _, err := eng.AddPool(ctx, ipam.Pool{CIDR: "192.168.0.0/16"}); err != nil {
		cancel()
		t.Fatal(err)
	}
	b := addr("10.0.0.2")
	if err := store.Txn(ctx, datastore.Put(datastore.NodeKey("b"), datastore.MustJSON(datastore.Node{Name: "b", IPv4: b.String()}))); err != nil {
		cancel()
		t.Fatal(err)
	}
	return store, eng, ctx, cancel, log, b
}

func runAgent(t *testing.T, ctx context.Context, cancel context.CancelFunc, deps Deps) *Agent {
	t.Helper()
	if deps.Records == nil {
		deps.Records = syncedRecords(t, deps.Store)
	}
	agent, err := NewAgent(deps)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = agent.Run(ctx)
	}()
	t.Cleanup(func() { cancel(); <-done })
	return agent
}

// TestAgentRestart drives the agent against a real (embedded) etcd with a
// fake speaker and route table: registration keeps the reflector settings,
// blocks and borrowed addresses are exported before any session exists,
// and learned routes left by a previous run survive until every peer has
// sent its End-of-RIB, then the stale one goes.
func TestAgentRestart(t *testing.T) {
	store, eng, ctx, cancel, log := followtest.Fixture(t)
	defer cancel()
	if _, err := eng.AddPool(ctx, ipam.Pool{CIDR: "192.168.0.0/16"}); err != nil {
		t.Fatal(err)
	}
	// Another node, and this node's record as `bgp config --node a` left it.
	for _, n := range []datastore.Node{{Name: "b", IPv4: "10.0.0.2"}, {Name: "a", RouteReflector: true, ClusterID: "1.0.0.1"}} {
		if err := store.Txn(ctx, datastore.Put(datastore.NodeKey(n.Name), datastore.MustJSON(n))); err != nil {
			t.Fatal(err)
		}
	}
	_, pool, _ := net.ParseCIDR("192.168.0.0/16")
	ip, err := eng.AutoAssign(ctx, ipam.AutoAssignArgs{Host: "a", HandleID: "h1", Within: pool})
	if err != nil {
		t.Fatal(err)
	}
	myBlock := netip.MustParsePrefix((&net.IPNet{IP: ip.IP.Mask(net.CIDRMask(26, 32)), Mask: net.CIDRMask(26, 32)}).String())
	// A workload with an address borrowed from b's block.
	ep := datastore.Endpoint{ID: "e1", Network: "n", Node: "a", IPv4: "192.168.200.7/32"}
	if err := store.Txn(ctx, datastore.Put(datastore.EndpointKey("a", "e1"), datastore.MustJSON(ep))); err != nil {
		t.Fatal(err)
	}

	sp := newFakeSpeaker()
	rt := &syncTable{ft: fakeTable{learned: map[netip.Prefix][]netip.Addr{
		pfx("192.168.1.0/26"): {addr("10.0.0.2")}, // still announced by b
		pfx("192.168.9.0/26"): {addr("10.0.0.2")}, // gone while we were down
	}}}
	agent := runAgent(t, ctx, cancel, Deps{
		Store: store, Blocks: eng, Speaker: sp, Routes: rt, NodeName: "a", Log: log,
		Config: Config{Enabled: true, NodeIP: "10.0.0.1", SyncTimeout: time.Hour},
	})

	eventually(t, "exports and the session to b", func() error {
		peers, adv := sp.snapshot()
		want := []netip.Prefix{myBlock, pfx("192.168.200.7/32")}
		slices.SortFunc(want, nlconv.ComparePrefix)
		if !slices.Equal(adv, want) {
			return fmt.Errorf("advertised %v, want %v", adv, want)
		}
		// The mesh is on by default (the reflector flag matters only with
		// it off), a session added while syncing announces a restart, and
		// the lower address (ours) waits for b to dial.
		p, ok := peers[addr("10.0.0.2")]
		if !ok || p.Type != PeerMesh || !p.Restarting || !p.Passive {
			return fmt.Errorf("peer b = %+v (present %v)", p, ok)
		}
		return nil
	})
	var n datastore.Node
	if _, err := store.GetJSON(ctx, datastore.NodeKey("a"), &n); err != nil {
		t.Fatal(err)
	}
	if n.IPv4 != "10.0.0.1" || !n.RouteReflector || n.ClusterID != "1.0.0.1" {
		t.Errorf("node record after registration = %+v: address missing or reflector settings lost", n)
	}

	// b is back but has not finished: both old routes stay.
	b := addr("10.0.0.2")
	sp.set([]LearnedPath{{Prefix: pfx("192.168.1.0/26"), NextHop: b, Peer: b}}, []PeerState{{Address: b, State: "Established"}})
	// The status is written at the end of the pass that programs the
	// kernel: once it shows b's new session, that pass is over.
	eventually(t, "a pass that saw b's session without End-of-RIB", func() error {
		st := agent.Status(ctx)
		for _, p := range st.Peers {
			if p.Address == b.String() && p.State == "Established" && p.Received == 1 {
				return nil
			}
		}
		return fmt.Errorf("peers %+v", st.Peers)
	})
	if r := rt.routes(); len(r) != 2 {
		t.Fatalf("before b's End-of-RIB the kernel routes changed: %v", r)
	}
	// End-of-RIB from b: the route b no longer announces goes.
	sp.set([]LearnedPath{{Prefix: pfx("192.168.1.0/26"), NextHop: b, Peer: b}}, []PeerState{{Address: b, State: "Established", EORReceived: true}})
	eventually(t, "stale route removed after End-of-RIB", func() error {
		r := rt.routes()
		if len(r) != 1 || r[pfx("192.168.1.0/26")] == nil {
			return fmt.Errorf("routes %v", r)
		}
		return nil
	})
	if st := agent.Status(ctx); !st.Synced || len(st.Routes) != 1 {
		t.Errorf("status = %+v", st)
	}

	// Releasing the borrowed address's endpoint withdraws its /32.
	if err := store.Txn(ctx, datastore.Delete(datastore.EndpointKey("a", "e1"), 0)); err != nil {
		t.Fatal(err)
	}
	eventually(t, "borrowed /32 withdrawn", func() error {
		_, adv := sp.snapshot()
		if !slices.Equal(adv, []netip.Prefix{myBlock}) {
			return fmt.Errorf("advertised %v", adv)
		}
		return nil
	})
}

// TestAgentPeerSecrets: a peer record that names a secret gets its password
// from the node's secrets directory; a changed file re-keys the session at
// the next resync, and an unreadable one removes the session (a peer must
// never be offered a session without its MD5 key).
func TestAgentPeerSecrets(t *testing.T) {
	store, eng, ctx, cancel, log := followtest.Fixture(t)
	defer cancel()
	dir := t.TempDir()
	secret := filepath.Join(dir, "tor-key")
	writeSecret := func(content string) {
		t.Helper()
		if err := os.WriteFile(secret+".tmp", []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(secret+".tmp", secret); err != nil {
			t.Fatal(err)
		}
	}
	writeSecret("first-key\n")
	peers := []datastore.BGPPeer{
		{Name: "tor", PeerIP: "10.0.0.254", ASN: 65000, PasswordSecret: "tor-key"},
		{Name: "plain", PeerIP: "10.0.0.253", ASN: 65000},
	}
	for _, p := range peers {
		if err := store.Txn(ctx, datastore.Put(datastore.BGPPeerKey(p.Name), datastore.MustJSON(p))); err != nil {
			t.Fatal(err)
		}
	}
	sp := newFakeSpeaker()
	runAgent(t, ctx, cancel, Deps{
		Store: store, Blocks: eng, Speaker: sp, Routes: &syncTable{ft: fakeTable{learned: map[netip.Prefix][]netip.Addr{}}}, NodeName: "a", Log: log,
		Config:         Config{Enabled: true, NodeIP: "10.0.0.1", SyncTimeout: time.Hour, SecretsDir: dir},
		ResyncInterval: 100 * time.Millisecond,
	})

	tor, plain := addr("10.0.0.254"), addr("10.0.0.253")
	wantPassword := func(what, pw string) {
		t.Helper()
		eventually(t, what, func() error {
			got, _ := sp.snapshot()
			if p, ok := got[plain]; !ok || p.Password != "" {
				return fmt.Errorf("plain peer = %+v (present %v)", p, ok)
			}
			p, ok := got[tor]
			if pw == "" {
				if ok {
					return fmt.Errorf("tor still configured: %+v", p)
				}
				return nil
			}
			if !ok || p.Password != pw {
				return fmt.Errorf("tor peer present %v with password %q, want %q", ok, p.Password, pw)
			}
			return nil
		})
	}
	wantPassword("session keyed from the secret file", "first-key")
	writeSecret("second-key\n")
	wantPassword("session re-keyed after the file changed", "second-key")
	if err := os.Remove(secret); err != nil {
		t.Fatal(err)
	}
	wantPassword("no session without the secret", "")
	writeSecret("third-key\n")
	wantPassword("session back once the secret is there again", "third-key")
}

// TestAgentIPv6: the detected IPv6 next hop goes into the node record, IPv6
// blocks and borrowed IPv6 addresses are advertised with it (IPv4 ones with
// the IPv4 address), and with "none" no IPv6 is advertised at all.
func TestAgentIPv6(t *testing.T) {
	for _, tc := range []struct {
		name     string
		nodeIPv6 string
		wantV6   bool
	}{{"detected", "", true}, {"off", NoIPv6, false}} {
		t.Run(tc.name, func(t *testing.T) {
			store, eng, ctx, cancel, log := followtest.Fixture(t)
			defer cancel()
			for _, cidr := range []string{"192.168.0.0/16", "fd00:10::/64"} {
				if _, err := eng.AddPool(ctx, ipam.Pool{CIDR: cidr}); err != nil {
					t.Fatal(err)
				}
			}
			var blocks []netip.Prefix
			for _, cidr := range []string{"192.168.0.0/16", "fd00:10::/64"} {
				_, within, _ := net.ParseCIDR(cidr)
				n, err := eng.AutoAssign(ctx, ipam.AutoAssignArgs{Host: "a", HandleID: "h-" + cidr, Within: within, IPv6: strings.Contains(cidr, ":")})
				if err != nil {
					t.Fatal(err)
				}
				bits := 26
				if n.IP.To4() == nil {
					bits = 122
				}
				a, _ := netip.AddrFromSlice(n.IP)
				blocks = append(blocks, netip.PrefixFrom(a.Unmap(), bits).Masked())
			}
			// A workload with an IPv6 address borrowed from another block.
			ep := datastore.Endpoint{ID: "e1", Network: "n", Node: "a", IPv6: "fd00:10::ffff/128"}
			if err := store.Txn(ctx, datastore.Put(datastore.EndpointKey("a", "e1"), datastore.MustJSON(ep))); err != nil {
				t.Fatal(err)
			}
			sp := newFakeSpeaker()
			runAgent(t, ctx, cancel, Deps{
				Store: store, Blocks: eng, Speaker: sp, Routes: &syncTable{ft: fakeTable{learned: map[netip.Prefix][]netip.Addr{}}}, NodeName: "a", Log: log,
				Config:     Config{Enabled: true, NodeIP: "10.0.0.1", NodeIPv6: tc.nodeIPv6, SyncTimeout: time.Hour},
				DetectIPv6: func(v4 netip.Addr) (netip.Addr, bool, error) { return addr("fd00:f::1"), v4 == addr("10.0.0.1"), nil },
			})

			want := map[netip.Prefix]netip.Addr{blocks[0]: addr("10.0.0.1")}
			if tc.wantV6 {
				want[blocks[1]] = addr("fd00:f::1")
				want[pfx("fd00:10::ffff/128")] = addr("fd00:f::1")
			}
			eventually(t, "exports", func() error {
				sp.mu.Lock()
				defer sp.mu.Unlock()
				if len(sp.advertised) != len(want) {
					return fmt.Errorf("advertised %v, want %v", sp.nextHops, want)
				}
				for p, nh := range want {
					if !sp.advertised[p] || sp.nextHops[p] != nh {
						return fmt.Errorf("advertised %v, want %v", sp.nextHops, want)
					}
				}
				return nil
			})
			var n datastore.Node
			if _, err := store.GetJSON(ctx, datastore.NodeKey("a"), &n); err != nil {
				t.Fatal(err)
			}
			if wantRec := map[bool]string{true: "fd00:f::1", false: ""}[tc.wantV6]; n.IPv6 != wantRec {
				t.Errorf("node record IPv6 = %q, want %q", n.IPv6, wantRec)
			}
		})
	}
}

// syncedRecords is the daemon's syncer over the store under s.
func syncedRecords(t *testing.T, s Store) datastore.Records {
	t.Helper()
	store, ok := s.(*datastore.Store)
	if !ok {
		t.Fatalf("no datastore under %T", s)
	}
	return etcdtest.Records(t, store, append(datastore.Kinds(), ipam.Kinds()...)...)
}

// TestAgentSeesNodesRegisteredBeforeItsWatchWasLive: a node that registers
// after the agent's first read of the node records is seen at once, not at
// the next resync. The scale bench's 28 s at 32 nodes with reflectors: a
// client had read the nodes while the last ones still registered, its
// watch went live after they had, and the blocks the reflectors passed on
// with those nodes' addresses as next hop were rejected ("next hop is not
// the peer's node address") until the 30 s resync. The agent now reads the
// syncer's memory, which lists and watches from one revision, so no
// change falls between a read and a watch.
func TestAgentSeesNodesRegisteredBeforeItsWatchWasLive(t *testing.T) {
	store, eng, ctx, cancel, log := followtest.Fixture(t)
	defer cancel()
	if _, err := eng.AddPool(ctx, ipam.Pool{CIDR: "192.168.0.0/16"}); err != nil {
		t.Fatal(err)
	}
	off := false
	r, c := addr("10.0.0.2"), addr("10.0.0.3")
	if err := store.Txn(ctx,
		datastore.Put(datastore.BGPConfigKey, datastore.MustJSON(datastore.BGPConfig{NodeToNodeMesh: &off})),
		datastore.Put(datastore.NodeKey("r"), datastore.MustJSON(datastore.Node{Name: "r", IPv4: r.String(), RouteReflector: true, ClusterID: "1.0.0.1"})),
	); err != nil {
		t.Fatal(err)
	}
	sp := newFakeSpeaker()
	rt := &syncTable{ft: fakeTable{learned: map[netip.Prefix][]netip.Addr{}}}
	agent := runAgent(t, ctx, cancel, Deps{
		Store: store, Blocks: eng, Speaker: sp, Routes: rt, NodeName: "a", Log: log,
		Config:         Config{Enabled: true, NodeIP: "10.0.0.1", SyncTimeout: time.Hour},
		ResyncInterval: time.Hour, // only a watch event can bring c in
	})
	eventually(t, "the session to the reflector", func() error {
		if got, _ := sp.snapshot(); len(got) != 1 {
			return fmt.Errorf("peers %v", got)
		}
		return nil
	})
	// The agent has read the nodes; c registers, and the reflector passes
	// c's block on with c's address as next hop.
	if err := store.Txn(ctx, datastore.Put(datastore.NodeKey("c"), datastore.MustJSON(datastore.Node{Name: "c", IPv4: c.String()}))); err != nil {
		t.Fatal(err)
	}
	block := pfx("192.168.3.0/26")
	sp.afterPass(t, func() {
		sp.set([]LearnedPath{{Prefix: block, NextHop: c, Peer: r}}, []PeerState{{Address: r, State: "Established", EORReceived: true}})
	})
	eventually(t, "c's block installed via c", func() error {
		if got := rt.routes()[block]; !slices.Equal(got, []netip.Addr{c}) {
			return fmt.Errorf("routes %v; rejected %v", rt.routes(), agent.Status(ctx).Rejected)
		}
		return nil
	})
}

// TestAgentAdvertisesWhileReadingTheRIB: a block claimed on this node is
// advertised while the pass in flight still waits for the speaker's RIB
// (on a busy reflector that read waited 1-3 s, and the reflector's own
// block was the last route of the 64-node bench), not after it.
func TestAgentAdvertisesWhileReadingTheRIB(t *testing.T) {
	store, eng, ctx, cancel, log, b := newAgentFixtureWithPeer(t)
	defer cancel()
	sp := newFakeSpeaker()
	runAgent(t, ctx, cancel, Deps{
		Store: store, Blocks: eng, Speaker: sp, Routes: &syncTable{ft: fakeTable{learned: map[netip.Prefix][]netip.Addr{}}}, NodeName: "a", Log: log,
		Config: Config{Enabled: true, NodeIP: "10.0.0.1", SyncTimeout: time.Hour}, ResyncInterval: time.Hour,
	})
	eventually(t, "the session to b", func() error {
		if got, _ := sp.snapshot(); len(got) != 1 {
			return fmt.Errorf("peers %v", got)
		}
		return nil
	})
	// The next pass's RIB read is held.
	gate, in := make(chan struct{}), make(chan struct{}, 1)
	sp.mu.Lock()
	sp.pathsGate, sp.inPaths = gate, in
	sp.mu.Unlock()
	released := false
	release := func() {
		if !released {
			released = true
			close(gate)
		}
	}
	defer release()
	sp.set(nil, []PeerState{{Address: b, State: "Established", EORReceived: true}})
	select {
	case <-in:
	case <-time.After(10 * time.Second):
		t.Fatal("no pass read the RIB")
	}
	_, pool, _ := net.ParseCIDR("192.168.0.0/16")
	ip, err := eng.AutoAssign(ctx, ipam.AutoAssignArgs{Host: "a", HandleID: "h1", Within: pool})
	if err != nil {
		t.Fatal(err)
	}
	block := netip.MustParsePrefix((&net.IPNet{IP: ip.IP.Mask(net.CIDRMask(26, 32)), Mask: net.CIDRMask(26, 32)}).String())
	eventually(t, "the new block advertised while the RIB read is held", func() error {
		if _, adv := sp.snapshot(); !slices.Contains(adv, block) {
			return fmt.Errorf("advertised %v", adv)
		}
		return nil
	})
	release()
	sp.mu.Lock()
	sp.pathsGate = nil
	sp.mu.Unlock()
	// And the passes after it leave it advertised.
	sp.afterPass(t, sp.poke)
	if _, adv := sp.snapshot(); !slices.Contains(adv, block) {
		t.Errorf("advertised %v after the pass, want %s", adv, block)
	}
}

// listCountingTable is syncTable counting the kernel listings.
type listCountingTable struct {
	syncTable
	lists int
}

func (c *listCountingTable) ListLearned(ctx context.Context) ([]KernelRoute, error) {
	c.mu.Lock()
	c.lists++
	c.mu.Unlock()
	return c.syncTable.ListLearned(ctx)
}

func (c *listCountingTable) listCount() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lists
}

// TestAgentListsKernelRoutesOnlyAtResync: passes between resyncs diff
// against what the agent programmed (no kernel listing per pass), and the
// periodic resync lists the kernel again and restores a learned route
// deleted behind the agent's back.
func TestAgentListsKernelRoutesOnlyAtResync(t *testing.T) {
	dst := netip.MustParsePrefix("192.168.1.0/26")
	for _, tc := range []struct {
		name   string
		resync time.Duration
	}{{"between resyncs", time.Hour}, {"at a resync", 200 * time.Millisecond}} {
		t.Run(tc.name, func(t *testing.T) {
			store, eng, ctx, cancel, log, b := newAgentFixtureWithPeer(t)
			defer cancel()
			sp := newFakeSpeaker()
			rt := &listCountingTable{syncTable: syncTable{ft: fakeTable{learned: map[netip.Prefix][]netip.Addr{}, foreign: map[netip.Prefix]bool{}}}}
			runAgent(t, ctx, cancel, Deps{
				Store: store, Blocks: eng, Speaker: sp, Routes: rt, NodeName: "a", Log: log,
				Config: Config{Enabled: true, NodeIP: "10.0.0.1", SyncTimeout: time.Hour}, ResyncInterval: tc.resync,
			})
			eventually(t, "the session to b", func() error {
				if got, _ := sp.snapshot(); len(got) != 1 {
					return fmt.Errorf("peers %v", got)
				}
				return nil
			})
			sp.set([]LearnedPath{{Prefix: dst, NextHop: b, Peer: b}}, []PeerState{{Address: b, State: "Established", EORReceived: true}})
			installed := func() error {
				if gws := rt.routes()[dst]; !slices.Equal(gws, []netip.Addr{b}) {
					return fmt.Errorf("route to %s via %v, want via %s", dst, gws, b)
				}
				return nil
			}
			eventually(t, "the learned route", installed)
			if tc.resync == time.Hour {
				before := rt.listCount()
				for range 5 {
					sp.afterPass(t, sp.poke)
				}
				if n := rt.listCount() - before; n != 0 {
					t.Errorf("5 passes listed the kernel's routes %d times, want 0", n)
				}
				return
			}
			rt.mu.Lock()
			delete(rt.ft.learned, dst) // an admin's `ip route del`
			rt.mu.Unlock()
			eventually(t, "the deleted route restored by a resync", installed)
		})
	}
}
