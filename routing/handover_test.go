package routing

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/sirupsen/logrus/hooks/test"

	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/internal/follow/followtest"
	"github.com/calico-cnm/calico-cnm/ipam"
)

func TestPlanPeers(t *testing.T) {
	a, b, r := addr("10.0.0.2"), addr("10.0.0.3"), addr("10.0.0.9")
	mesh := func(x netip.Addr, name string) PeerSpec {
		return PeerSpec{Address: x, ASN: 64512, Type: PeerMesh, Name: name}
	}
	as := func(p PeerSpec, typ PeerType) PeerSpec { p.Type = typ; return p }
	client := func(p PeerSpec) PeerSpec {
		p.Type, p.RRClient, p.ClusterID = PeerRRClient, true, "1.0.0.1"
		return p
	}
	tor := PeerSpec{Address: addr("10.0.0.254"), ASN: 65000, Type: PeerGlobal, Name: "tor", Password: "one", PasswordSecret: "k1"}
	withPW := func(p PeerSpec, pw, secret string) PeerSpec { p.Password, p.PasswordSecret = pw, secret; return p }
	all := map[netip.Addr]bool{a: true, b: true, r: true, tor.Address: true}
	for _, tc := range []struct {
		name    string
		current []PeerSpec
		want    []PeerSpec
		exists  map[netip.Addr]bool
		plan    peerPlan
	}{
		{"unchanged", []PeerSpec{mesh(a, "a")}, []PeerSpec{mesh(a, "a")}, all, peerPlan{}},
		{
			"mesh to reflectors on a client: the reflector's session stays, the others retire",
			[]PeerSpec{mesh(a, "a"), mesh(b, "b"), mesh(r, "r")}, []PeerSpec{as(mesh(r, "r"), PeerReflector)}, all,
			peerPlan{Relabel: []PeerSpec{as(mesh(r, "r"), PeerReflector)}, Retire: []netip.Addr{a, b}},
		},
		{
			"mesh to reflectors on the reflector: client sessions are re-created",
			[]PeerSpec{mesh(a, "a")}, []PeerSpec{client(mesh(a, "a"))}, all,
			peerPlan{Rekey: []PeerSpec{client(mesh(a, "a"))}},
		},
		{
			"reflectors to mesh on a client: new sessions added, none removed",
			[]PeerSpec{as(mesh(r, "r"), PeerReflector)}, []PeerSpec{mesh(a, "a"), mesh(r, "r")}, all,
			peerPlan{Add: []PeerSpec{mesh(a, "a")}, Relabel: []PeerSpec{mesh(r, "r")}},
		},
		{
			"node deleted: its session goes at once",
			[]PeerSpec{mesh(a, "a"), mesh(b, "b")}, []PeerSpec{mesh(b, "b")}, map[netip.Addr]bool{b: true},
			peerPlan{Remove: []netip.Addr{a}},
		},
		{"password rotated: re-created", []PeerSpec{tor}, []PeerSpec{withPW(tor, "two", "k1")}, all, peerPlan{Rekey: []PeerSpec{withPW(tor, "two", "k1")}}},
		{"secret renamed, same password: same session", []PeerSpec{tor}, []PeerSpec{withPW(tor, "one", "k2")}, all, peerPlan{Relabel: []PeerSpec{withPW(tor, "one", "k2")}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cur := map[netip.Addr]PeerSpec{}
			for _, p := range tc.current {
				cur[p.Address] = p
			}
			got := planPeers(cur, tc.want, tc.exists)
			if fmt.Sprint(got) != fmt.Sprint(tc.plan) {
				t.Errorf("plan\n got %+v\nwant %+v", got, tc.plan)
			}
		})
	}
}

// TestHandoverAdvance walks a retiring and a pending session through
// RIB snapshots, one step per row.
func TestHandoverAdvance(t *testing.T) {
	a, r, x := addr("10.0.0.2"), addr("10.0.0.9"), addr("10.0.0.7")
	blkA, bad := pfx("192.168.1.0/26"), pfx("10.99.0.0/24")
	from := func(peer, nh netip.Addr, p netip.Prefix) LearnedPath {
		return LearnedPath{Prefix: p, NextHop: nh, Peer: peer}
	}
	up := func(x netip.Addr, eor bool) PeerState {
		return PeerState{Address: x, State: "Established", EORReceived: eor}
	}
	accept := func(p LearnedPath) bool { return p.Prefix != bad }
	const timeout = 10 * time.Second
	t0 := time.Unix(1000, 0)
	for _, tc := range []struct {
		name  string
		steps []struct {
			at     time.Duration
			paths  []LearnedPath
			states []PeerState
			want   handoverStep
		}
	}{
		{"retired once the reflector carries the route", []struct {
			at     time.Duration
			paths  []LearnedPath
			states []PeerState
			want   handoverStep
		}{
			{0, []LearnedPath{from(a, a, blkA)}, nil, handoverStep{}},
			{time.Second, []LearnedPath{from(a, a, blkA), from(r, a, blkA)}, nil, handoverStep{Remove: []netip.Addr{a}}},
		}},
		{"the peer closing first does not cancel the debt", []struct {
			at     time.Duration
			paths  []LearnedPath
			states []PeerState
			want   handoverStep
		}{
			{0, []LearnedPath{from(a, a, blkA)}, nil, handoverStep{}},
			{time.Second, nil, nil, handoverStep{}},
			{2 * time.Second, []LearnedPath{from(r, a, blkA)}, nil, handoverStep{Remove: []netip.Addr{a}}},
		}},
		{"a rejected path is owed to nobody", []struct {
			at     time.Duration
			paths  []LearnedPath
			states []PeerState
			want   handoverStep
		}{
			{0, []LearnedPath{from(a, a, bad)}, nil, handoverStep{Remove: []netip.Addr{a}}},
		}},
		{"a route nobody else carries: given up after the timeout", []struct {
			at     time.Duration
			paths  []LearnedPath
			states []PeerState
			want   handoverStep
		}{
			{0, []LearnedPath{from(a, a, blkA)}, nil, handoverStep{}},
			{timeout + time.Second, []LearnedPath{from(a, a, blkA)}, nil, handoverStep{TimedOut: []netip.Addr{a}}},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHandover()
			h.retire(a, t0)
			for i, st := range tc.steps {
				got := h.advance(st.paths, accept, st.states, t0.Add(st.at), timeout)
				if fmt.Sprint(got) != fmt.Sprint(st.want) {
					t.Fatalf("step %d: got %+v, want %+v", i, got, st.want)
				}
			}
		})
	}

	t.Run("pending until Established with End-of-RIB, or the timeout", func(t *testing.T) {
		h := newHandover()
		h.pending[x] = t0
		h.pending[a] = t0
		for i, st := range []struct {
			at     time.Duration
			states []PeerState
			want   handoverStep
		}{
			{0, []PeerState{up(x, false), {Address: a, State: "Active"}}, handoverStep{}},
			{time.Second, []PeerState{up(x, true), {Address: a, State: "Active"}}, handoverStep{Synced: []netip.Addr{x}}},
			{timeout + time.Second, []PeerState{up(x, true), {Address: a, State: "Active"}}, handoverStep{TimedOut: []netip.Addr{a}, Synced: []netip.Addr{x}}},
		} {
			got := h.advance(nil, accept, st.states, t0.Add(st.at), timeout)
			if fmt.Sprint(got) != fmt.Sprint(st.want) {
				t.Fatalf("step %d: got %+v, want %+v", i, got, st.want)
			}
		}
	})
}

// TestAgentMakeBeforeBreak: node a in a mesh with b and r; the mesh is
// switched off with r as reflector, then on again. The session to b is
// removed only after r carries b's block, and the kernel route to b's
// block is never deleted on the way, in either direction.
func TestAgentMakeBeforeBreak(t *testing.T) {
	store, eng, ctx, cancel, log := followtest.Fixture(t)
	defer cancel()
	if _, err := eng.AddPool(ctx, ipam.Pool{CIDR: "192.168.0.0/16"}); err != nil {
		t.Fatal(err)
	}
	b, r := addr("10.0.0.2"), addr("10.0.0.9")
	putNode := func(n datastore.Node) {
		t.Helper()
		if err := store.Txn(ctx, datastore.Put(datastore.NodeKey(n.Name), datastore.MustJSON(n))); err != nil {
			t.Fatal(err)
		}
	}
	putNode(datastore.Node{Name: "b", IPv4: b.String()})
	putNode(datastore.Node{Name: "r", IPv4: r.String()})
	setMesh := func(on bool) {
		t.Helper()
		if err := store.Txn(ctx, datastore.Put(datastore.BGPConfigKey, datastore.MustJSON(datastore.BGPConfig{NodeToNodeMesh: &on}))); err != nil {
			t.Fatal(err)
		}
	}
	sp := newFakeSpeaker()
	rt := &syncTable{ft: fakeTable{learned: map[netip.Prefix][]netip.Addr{}}}
	agent := runAgent(t, ctx, cancel, Deps{
		Store: store, Blocks: eng, Speaker: sp, Routes: rt, NodeName: "a", Log: log,
		Config: Config{Enabled: true, NodeIP: "10.0.0.1", SyncTimeout: time.Hour},
	})
	blkB, blkR := pfx("192.168.1.0/26"), pfx("192.168.2.0/26")
	viaB, viaR := LearnedPath{Prefix: blkB, NextHop: b, Peer: b}, LearnedPath{Prefix: blkR, NextHop: r, Peer: r}
	reflected := LearnedPath{Prefix: blkB, NextHop: b, Peer: r} // b's block, from r
	synced := func(addrs ...netip.Addr) []PeerState {
		var out []PeerState
		for _, x := range addrs {
			out = append(out, PeerState{Address: x, State: "Established", EORReceived: true})
		}
		return out
	}
	// settle waits for two more reconcile passes (each asked for by a
	// speaker change signal): the second one started after whatever
	// changed before settle was seen.
	settle := func() {
		t.Helper()
		for range 2 {
			sp.afterPass(t, sp.poke)
		}
	}
	wantRoutes := func(what string) {
		t.Helper()
		eventually(t, what, func() error {
			got := rt.routes()
			if len(got) != 2 || !slices.Equal(got[blkB], []netip.Addr{b}) || !slices.Equal(got[blkR], []netip.Addr{r}) {
				return fmt.Errorf("kernel routes %v", got)
			}
			return nil
		})
	}
	// peersAre: the speaker has exactly these sessions, and the agent
	// reports them with these roles.
	peersAre := func(what string, want map[netip.Addr]PeerType) {
		t.Helper()
		eventually(t, what, func() error {
			got, _ := sp.snapshot()
			st := agent.Status(ctx)
			if len(got) != len(want) || len(st.Peers) != len(want) {
				return fmt.Errorf("speaker peers %v, status %+v, want %v", got, st.Peers, want)
			}
			for _, p := range st.Peers {
				if _, ok := got[addr(p.Address)]; !ok || want[addr(p.Address)] != p.Type {
					return fmt.Errorf("speaker peers %v, status %+v, want %v", got, st.Peers, want)
				}
			}
			return nil
		})
	}

	peersAre("mesh sessions", map[netip.Addr]PeerType{b: PeerMesh, r: PeerMesh})
	if got, _ := sp.snapshot(); got[b].Restarting || got[r].Restarting {
		t.Errorf("a first start announced a restart (gobgp would hold back our routes until every End-of-RIB): %v", got)
	}
	sp.set([]LearnedPath{viaB, viaR}, synced(b, r))
	wantRoutes("routes over the mesh")

	// Mesh off, r the reflector: b retires but stays while only it
	// carries b's block.
	putNode(datastore.Node{Name: "r", IPv4: r.String(), RouteReflector: true})
	setMesh(false)
	eventually(t, "r becomes our reflector", func() error {
		for _, p := range agent.Status(ctx).Peers {
			if p.Address == r.String() && p.Type == PeerReflector {
				return nil
			}
		}
		return fmt.Errorf("status %+v", agent.Status(ctx).Peers)
	})
	settle()
	if got, _ := sp.snapshot(); got[b].Address != b {
		t.Fatalf("the session to b was removed before another session carried b's block: %v", got)
	}
	// b closes its side first: its paths vanish before r reflects them.
	sp.set([]LearnedPath{viaR}, synced(r))
	settle()
	wantRoutes("b's block kept while nobody carries it")
	sp.set([]LearnedPath{viaR, reflected}, synced(r))
	peersAre("b removed once r carries its block", map[netip.Addr]PeerType{r: PeerReflector})
	wantRoutes("routes over the reflector")

	// Back to the mesh: b is added and pending; r (re-creating its side)
	// drops the reflected copy before b's session has synced.
	setMesh(true)
	peersAre("mesh again", map[netip.Addr]PeerType{b: PeerMesh, r: PeerMesh})
	sp.set([]LearnedPath{viaR}, append(synced(r), PeerState{Address: b, State: "Active"}))
	settle()
	wantRoutes("b's block kept while b's session comes up")
	sp.set([]LearnedPath{viaR, viaB}, synced(r, b))
	wantRoutes("routes over the mesh again")

	rt.mu.Lock()
	ops := slices.Clone(rt.ft.ops)
	rt.mu.Unlock()
	for _, op := range ops {
		if op == "delete "+blkB.String() {
			t.Errorf("b's block was deleted from the kernel during the switches: %v", ops)
		}
	}
	sp.mu.Lock()
	spOps := slices.Clone(sp.ops)
	sp.mu.Unlock()
	if want := []string{"add 10.0.0.2", "add 10.0.0.9", "delete 10.0.0.2", "add 10.0.0.2"}; !slices.Equal(sortedPrefix(spOps, 2), want) {
		t.Errorf("speaker operations %v, want %v (no session re-created on a, b removed once, re-added once)", spOps, want)
	}

	// A node that joins and never comes up is no topology change: r's
	// withdrawal meanwhile reaches the kernel at once.
	putNode(datastore.Node{Name: "c", IPv4: "10.0.0.3"})
	peersAre("c added", map[netip.Addr]PeerType{b: PeerMesh, r: PeerMesh, addr("10.0.0.3"): PeerMesh})
	sp.set([]LearnedPath{viaB}, append(synced(r, b), PeerState{Address: addr("10.0.0.3"), State: "Active"}))
	eventually(t, "r's withdrawn block deleted while c is still connecting", func() error {
		if got := rt.routes(); len(got) != 1 || got[blkR] != nil {
			return fmt.Errorf("kernel routes %v", got)
		}
		return nil
	})
}

// sortedPrefix sorts the first n entries (added together, in map order).
func sortedPrefix(ops []string, n int) []string {
	out := slices.Clone(ops)
	if len(out) >= n {
		slices.Sort(out[:n])
	}
	return out
}

// TestAgentRestoresRestartFlag: while the agent syncs after a restart, a
// session that gobgp took out of its restart state before it connected is
// re-created once with the restart flag; an established one is left alone.
func TestAgentRestoresRestartFlag(t *testing.T) {
	store, eng, ctx, cancel, log := followtest.Fixture(t)
	defer cancel()
	b, c := addr("10.0.0.2"), addr("10.0.0.3")
	// a's own record from its previous run: this start is a restart.
	for _, n := range []datastore.Node{{Name: "a", IPv4: "10.0.0.1"}, {Name: "b", IPv4: b.String()}, {Name: "c", IPv4: c.String()}} {
		if err := store.Txn(ctx, datastore.Put(datastore.NodeKey(n.Name), datastore.MustJSON(n))); err != nil {
			t.Fatal(err)
		}
	}
	sp := newFakeSpeaker()
	runAgent(t, ctx, cancel, Deps{
		Store: store, Blocks: eng, Speaker: sp, Routes: &syncTable{ft: fakeTable{learned: map[netip.Prefix][]netip.Addr{}}}, NodeName: "a", Log: log,
		Config: Config{Enabled: true, NodeIP: "10.0.0.1", SyncTimeout: time.Hour},
	})
	eventually(t, "both sessions added", func() error {
		if got, _ := sp.snapshot(); len(got) != 2 {
			return fmt.Errorf("peers %v", got)
		}
		return nil
	})
	// b is up and synced; c never connected, and gobgp ended the restart.
	states := []PeerState{{Address: b, State: "Established", EORReceived: true}, {Address: c, State: "Active"}}
	sp.set(nil, states)
	eventually(t, "c re-created", func() error {
		sp.mu.Lock()
		defer sp.mu.Unlock()
		if n := slices.Index(sp.ops, "delete 10.0.0.3"); n < 0 || !slices.Contains(sp.ops[n:], "add 10.0.0.3") {
			return fmt.Errorf("ops %v", sp.ops)
		}
		if p := sp.peers[c]; !p.Restarting {
			return fmt.Errorf("c re-added without the restart flag: %+v", p)
		}
		return nil
	})
	// Still not connected and still without the flag: not again.
	for range 3 {
		sp.afterPass(t, func() { sp.set(nil, states) })
	}
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if want := []string{"add 10.0.0.2", "add 10.0.0.3", "delete 10.0.0.3", "add 10.0.0.3"}; !slices.Equal(sortedPrefix(sp.ops, 2), want) {
		t.Errorf("speaker operations %v, want %v", sp.ops, want)
	}
}

// TestGoBGPPokeNeverBlocks: gobgp's event callback only signals the agent
// (a coalescing, non-blocking send): a burst of events while the agent is
// busy costs one reconcile and never stalls gobgp's watcher.
func TestGoBGPPokeNeverBlocks(t *testing.T) {
	g := &GoBGP{changes: make(chan struct{}, 1)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 100000 {
			g.poke()
		}
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("poke blocked with nobody reading Changes")
	}
	select {
	case <-g.Changes():
	default:
		t.Fatal("no change signalled")
	}
	select {
	case <-g.Changes():
		t.Fatal("the burst was not coalesced into one signal")
	default:
	}
}

// TestAgentCoalescesSpeakerBursts: a burst of speaker events (a route from
// every peer within a moment) costs a reconcile pass per minPassInterval,
// not one per event, and the last state still reaches the kernel.
func TestAgentCoalescesSpeakerBursts(t *testing.T) {
	store, eng, ctx, cancel, log, b := newAgentFixtureWithPeer(t)
	defer cancel()
	sp := newFakeSpeaker()
	rt := &syncTable{ft: fakeTable{learned: map[netip.Prefix][]netip.Addr{}}}
	runAgent(t, ctx, cancel, Deps{
		Store: store, Blocks: eng, Speaker: sp, Routes: rt, NodeName: "a", Log: log,
		Config: Config{Enabled: true, NodeIP: "10.0.0.1", SyncTimeout: time.Hour},
	})
	eventually(t, "session to b", func() error {
		if got, _ := sp.snapshot(); len(got) != 1 {
			return fmt.Errorf("peers %v", got)
		}
		return nil
	})
	sp.mu.Lock()
	before := sp.passes
	sp.mu.Unlock()
	const burst, events = 300 * time.Millisecond, 300
	start := time.Now()
	for i := range events {
		sp.poke()
		time.Sleep(burst / events)
		if i == events-1 {
			sp.set([]LearnedPath{{Prefix: pfx("192.168.1.0/26"), NextHop: b, Peer: b}}, []PeerState{{Address: b, State: "Established", EORReceived: true}})
		}
	}
	elapsed := time.Since(start)
	eventually(t, "the last state in the kernel", func() error {
		if r := rt.routes(); len(r[pfx("192.168.1.0/26")]) != 1 {
			return fmt.Errorf("routes %v", r)
		}
		return nil
	})
	sp.mu.Lock()
	passes := sp.passes - before
	sp.mu.Unlock()
	if limit := int(elapsed/minPassInterval) + 3; passes > limit {
		t.Errorf("%d events in %s cost %d reconcile passes, want at most %d", events, elapsed.Round(time.Millisecond), passes, limit)
	}
	t.Logf("%d events in %s: %d passes", events, elapsed.Round(time.Millisecond), passes)
}

// afterPass runs trigger (which must signal a change) and waits for a
// reconcile pass that started after it.
func (f *fakeSpeaker) afterPass(t *testing.T, trigger func()) {
	t.Helper()
	f.mu.Lock()
	start := f.passes
	f.mu.Unlock()
	trigger()
	eventually(t, "a reconcile pass", func() error {
		f.mu.Lock()
		defer f.mu.Unlock()
		if f.passes <= start {
			return fmt.Errorf("no pass yet")
		}
		return nil
	})
}

// TestGobgpLoggerQuietsHarmlessWarnings: the warning gobgp itself ignores
// goes to debug; other warnings stay warnings.
func TestGobgpLoggerQuietsHarmlessWarnings(t *testing.T) {
	for _, tc := range []struct {
		msg  string
		want logrus.Level
	}{
		{"restart flag is not set", logrus.DebugLevel},
		{"failed to set md5", logrus.WarnLevel},
	} {
		log, hook := test.NewNullLogger()
		log.SetLevel(logrus.DebugLevel)
		(&gobgpLogger{log: log}).Warn(tc.msg, nil)
		if e := hook.LastEntry(); e == nil || e.Level != tc.want || e.Message != tc.msg {
			t.Errorf("%q logged as %+v, want level %s", tc.msg, e, tc.want)
		}
	}
}

// TestAgentReadsSessionsBeforeRIB: a session whose routes and End-of-RIB
// arrive just after the agent read the RIB must not count as synced in
// that pass, or the pass withdraws the routes it is about to bring (the
// kernel route blinked on a reflector while its clients re-connected).
func TestAgentReadsSessionsBeforeRIB(t *testing.T) {
	store, eng, ctx, cancel, log, b := newAgentFixtureWithPeer(t)
	defer cancel()
	blkB := pfx("192.168.1.0/26")
	// A restart: the kernel still has b's block from the previous run.
	rt := &syncTable{ft: fakeTable{learned: map[netip.Prefix][]netip.Addr{blkB: {b}}}}
	sp := newFakeSpeaker()
	sp.states = []PeerState{{Address: b, State: "Active"}}
	sp.afterPathsRead = func() {
		sp.set([]LearnedPath{{Prefix: blkB, NextHop: b, Peer: b}}, []PeerState{{Address: b, State: "Established", EORReceived: true}})
	}
	agent := runAgent(t, ctx, cancel, Deps{
		Store: store, Blocks: eng, Speaker: sp, Routes: rt, NodeName: "a", Log: log,
		Config: Config{Enabled: true, NodeIP: "10.0.0.1", SyncTimeout: time.Hour},
	})
	eventually(t, "in sync with b's block installed", func() error {
		if !agent.Status(ctx).Synced {
			return fmt.Errorf("not synced yet")
		}
		if got := rt.routes(); !slices.Equal(got[blkB], []netip.Addr{b}) {
			return fmt.Errorf("kernel routes %v", got)
		}
		return nil
	})
	for range 2 {
		sp.afterPass(t, sp.poke)
	}
	rt.mu.Lock()
	ops := slices.Clone(rt.ft.ops)
	rt.mu.Unlock()
	if slices.Contains(ops, "delete "+blkB.String()) {
		t.Errorf("b's block was withdrawn from the kernel while b's routes arrived: %v", ops)
	}
}
