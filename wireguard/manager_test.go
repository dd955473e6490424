package wireguard

import (
	"context"
	"encoding/json"
	"errors"
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

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/sirupsen/logrus"
	"github.com/sirupsen/logrus/hooks/test"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/datastore/etcdtest"
	"github.com/calico-cnm/calico-cnm/ipam"
)

// fakeBlocks has the block owners and hands out 10.0.0.1, 10.0.0.2, ...
// by handle.
type fakeBlocks struct {
	owners  map[netip.Prefix]string
	handles map[string][]net.IP
	pools   []string
	next    byte
}

// blockRecords is the syncer's view of the store, with the pools and
// block owners of a fakeBlocks in place of the store's.
type blockRecords struct {
	datastore.Records
	b *fakeBlocks
}

func (r blockRecords) List(prefix string) ([]*datastore.Synced, int64) {
	var out []*datastore.Synced
	switch prefix {
	case ipam.AffinityWatchPrefix:
		for block, host := range r.b.owners {
			out = append(out, &datastore.Synced{Key: prefix + host + "/" + block.String(), Value: &ipam.BlockAffinity{Host: host, Block: block, Confirmed: true}})
		}
	case ipam.PoolsPrefix:
		for _, p := range r.b.pools {
			out = append(out, &datastore.Synced{Key: prefix + p, Value: &ipam.PoolInfo{Pool: ipam.Pool{CIDR: p}, Prefix: netip.MustParsePrefix(p)}})
		}
	default:
		return r.Records.List(prefix)
	}
	return out, 0
}
func (b *fakeBlocks) IPsByHandle(_ context.Context, h string) ([]net.IP, error) {
	return b.handles[h], nil
}
func (b *fakeBlocks) AutoAssign(_ context.Context, a ipam.AutoAssignArgs) (net.IPNet, error) {
	b.next++
	ip := net.IPv4(10, 0, 0, b.next).To4()
	b.handles[a.HandleID] = append(b.handles[a.HandleID], ip)
	return net.IPNet{IP: ip, Mask: net.CIDRMask(32, 32)}, nil
}
func (b *fakeBlocks) ReleaseByHandle(_ context.Context, h string) error {
	delete(b.handles, h)
	return nil
}

// fakeKernel is RouteTable, the rule and the uplink.
type fakeKernel struct {
	routes map[netip.Prefix]Route
	order  []netip.Prefix // SetRoute's destinations, in turn
	// delUnderRule counts routes deleted while the rule still sent
	// traffic to the table.
	delUnderRule int
	gone         bool // wireguard.cali was deleted behind the manager
	rule         bool
	removed      int
	addr         netip.Addr
}

func (k *fakeKernel) SetDeviceAddr(a netip.Addr) error { k.addr = a; return nil }

func (k *fakeKernel) UplinkMTU(netip.Addr) (int, error) { return 1500, nil }
func (k *fakeKernel) Routes() (map[netip.Prefix]Route, error) {
	out := map[netip.Prefix]Route{}
	for d, r := range k.routes {
		out[d] = r
	}
	return out, nil
}
func (k *fakeKernel) SetRoute(r Route) error {
	k.routes[r.Dst] = r
	k.order = append(k.order, r.Dst)
	return nil
}
func (k *fakeKernel) DelRoute(dst netip.Prefix) error {
	if k.rule {
		k.delUnderRule++
	}
	delete(k.routes, dst)
	return nil
}
func (k *fakeKernel) EnsureRule() error   { k.rule = true; return nil }
func (k *fakeKernel) RemoveRule() error   { k.rule = false; return nil }
func (k *fakeKernel) RemoveDevice() error { k.removed++; return nil }
func (k *fakeKernel) DeviceExists() (bool, error) {
	return !k.gone, nil
}

// fakeLink applies configurations like a device: peers by key.
type fakeLink struct {
	mu      sync.Mutex
	mtu     int
	priv    wgtypes.Key
	port    int
	peers   map[wgtypes.Key]PeerState
	touched []wgtypes.Key // peers added or changed, in order
	greeted []wgtypes.Key // peers asked for a handshake, in order
	// peersErr: the next configuration of peers fails (once).
	peersErr error
	closed   bool
	// detached: let go of, left in place (Release).
	detached bool
}

func (l *fakeLink) Implementation() string { return ImplUserspace }
func (l *fakeLink) Configure(c wgtypes.Config) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if c.PrivateKey != nil {
		l.priv = *c.PrivateKey
	}
	if c.ListenPort != nil {
		l.port = *c.ListenPort
	}
	if err := l.peersErr; err != nil && len(c.Peers) > 0 {
		l.peersErr = nil
		return err
	}
	for _, p := range c.Peers {
		if p.Remove {
			delete(l.peers, p.PublicKey)
			continue
		}
		ps := PeerState{PublicKey: p.PublicKey, Endpoint: p.Endpoint.AddrPort()}
		for _, n := range p.AllowedIPs {
			pfx, _ := prefixOf(n.IP, n.Mask)
			ps.AllowedIPs = append(ps.AllowedIPs, pfx)
		}
		l.peers[p.PublicKey] = ps
		l.touched = append(l.touched, p.PublicKey)
	}
	return nil
}
func (l *fakeLink) State() (DeviceState, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	st := DeviceState{ListenPort: l.port}
	if l.priv != (wgtypes.Key{}) {
		st.PublicKey = l.priv.PublicKey()
	}
	for _, p := range l.peers {
		st.Peers = append(st.Peers, p)
	}
	return st, nil
}
func (l *fakeLink) Greet(peers []wgtypes.Key) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, k := range peers {
		if _, ok := l.peers[k]; !ok {
			return fmt.Errorf("greeting %s: not a peer", k)
		}
	}
	l.greeted = append(l.greeted, peers...)
	return nil
}
func (l *fakeLink) Close() error  { l.closed = true; return nil }
func (l *fakeLink) Detach() error { l.detached = true; return nil }

type managerFixture struct {
	store  *datastore.Store
	blocks *fakeBlocks
	kernel *fakeKernel
	link   *fakeLink
	opened int
	m      *Manager
	logs   *test.Hook
	dir    string
}

func newManagerFixture(t *testing.T) *managerFixture {
	t.Helper()
	f := &managerFixture{
		store:  etcdtest.Start(t).Client(t),
		blocks: &fakeBlocks{owners: map[netip.Prefix]string{}, handles: map[string][]net.IP{}},
		kernel: &fakeKernel{routes: map[netip.Prefix]Route{}},
		dir:    t.TempDir(),
	}
	f.startManager(t)
	return f
}

// startManager makes f's manager, as a daemon's start (again) does: same
// datastore, state dir and kernel.
func (f *managerFixture) startManager(t *testing.T) {
	t.Helper()
	log, hook := test.NewNullLogger()
	f.logs = hook
	m, err := NewManager(Deps{
		Store: f.store, Records: blockRecords{Records: etcdtest.Records(t, f.store), b: f.blocks}, Blocks: f.blocks, Kernel: f.kernel, NodeName: "a", StateDir: f.dir, NodeIP: "172.16.0.1", Log: log,
		OpenLink: func(mtu int, _ logrus.FieldLogger, _ InvalidHandshake) (Link, error) {
			f.opened++
			f.kernel.gone = false
			f.link = &fakeLink{mtu: mtu, peers: map[wgtypes.Key]PeerState{}}
			return f.link, nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	f.m = m
}

// onWithPeerB turns WireGuard on with node b (block 10.0.1.0/26, tunnel
// address 172.16.0.2) as the peer, after one pass; b's key is returned.
func (f *managerFixture) onWithPeerB(t *testing.T) wgtypes.Key {
	t.Helper()
	kb := mustKey(t)
	f.blocks.owners = map[netip.Prefix]string{netip.MustParsePrefix("10.0.1.0/26"): "b"}
	f.putNode(t, datastore.Node{Name: "b", WireGuardPublicKey: kb.String(), WireGuardAddr: "172.16.0.2"})
	f.set(t, Change{Enabled: on()})
	f.sync(t)
	return kb
}

func (f *managerFixture) sync(t *testing.T) {
	t.Helper()
	if err := f.m.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func (f *managerFixture) set(t *testing.T, c Change) {
	t.Helper()
	if _, err := Configure(context.Background(), f.store, c); err != nil {
		t.Fatal(err)
	}
}

func (f *managerFixture) putNode(t *testing.T, n datastore.Node) {
	t.Helper()
	if err := f.store.Txn(context.Background(), datastore.Put(datastore.NodeKey(n.Name), datastore.MustJSON(n))); err != nil {
		t.Fatal(err)
	}
}

func (f *managerFixture) node(t *testing.T, name string) datastore.Node {
	t.Helper()
	var n datastore.Node
	if _, err := f.store.GetJSON(context.Background(), datastore.NodeKey(name), &n); err != nil {
		t.Fatal(err)
	}
	return n
}

func (f *managerFixture) logged(s string) bool {
	for _, e := range f.logs.AllEntries() {
		if strings.Contains(e.Message, s) {
			return true
		}
	}
	return false
}

func on() *bool  { b := true; return &b }
func off() *bool { b := false; return &b }

// TestManagerLifecycle: off does nothing; on makes the key (0600, only
// its public half in the record), the device, peers and routes; a changed
// block touches only its peer; rotation publishes a new key; a foreign key
// in the record is reported, not overwritten; off removes everything.
func TestManagerLifecycle(t *testing.T) {
	f := newManagerFixture(t)
	p := netip.MustParsePrefix
	f.blocks.owners = map[netip.Prefix]string{p("10.0.0.0/26"): "a", p("10.0.1.0/26"): "b", p("10.0.2.0/26"): "c"}
	f.blocks.pools = []string{"10.0.0.0/16"}
	kb, kc := mustKey(t), mustKey(t)
	f.putNode(t, datastore.Node{Name: "b", WireGuardPublicKey: kb.String(), WireGuardAddr: "172.16.0.2", WireGuardPort: 51820})
	f.putNode(t, datastore.Node{Name: "c", WireGuardPublicKey: kc.String(), WireGuardAddr: "172.16.1.3", WireGuardPort: 51820})

	f.sync(t)
	if f.opened != 0 || f.kernel.rule || len(f.kernel.routes) != 0 {
		t.Fatalf("WireGuard off, yet device %d, rule %v, routes %v", f.opened, f.kernel.rule, f.kernel.routes)
	}
	if _, err := os.Stat(filepath.Join(f.dir, KeyFile)); !os.IsNotExist(err) {
		t.Errorf("a key was made while WireGuard is off: %v", err)
	}

	f.set(t, Change{Enabled: on()})
	f.sync(t)
	if f.opened != 1 || f.link.mtu != 1440 || f.link.port != DefaultPort {
		t.Fatalf("device opened %d times, MTU %d, port %d; want once, 1440, %d", f.opened, f.link.mtu, f.link.port, DefaultPort)
	}
	b, err := os.ReadFile(filepath.Join(f.dir, KeyFile))
	if err != nil {
		t.Fatal(err)
	}
	fi, _ := os.Stat(filepath.Join(f.dir, KeyFile))
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("key file mode %v, want 0600", fi.Mode().Perm())
	}
	priv, err := wgtypes.ParseKey(strings.TrimSpace(string(b)))
	if err != nil || priv != f.link.priv {
		t.Fatalf("the device holds %v, the key file %v (%v)", f.link.priv, priv, err)
	}
	rec := f.node(t, "a")
	if rec.WireGuardPublicKey != priv.PublicKey().String() || rec.WireGuardAddr != "172.16.0.1" || rec.WireGuardPort != DefaultPort ||
		rec.WireGuardInterfaceAddr != "10.0.0.1" || f.kernel.addr.String() != "10.0.0.1" {
		t.Errorf("record %+v, device address %s; want the key, 172.16.0.1:%d and device address 10.0.0.1", rec, f.kernel.addr, DefaultPort)
	}
	raw, _ := json.Marshal(rec)
	if strings.Contains(string(raw), priv.String()) {
		t.Error("the private key is in the node record")
	}
	// Required: the pool is closed (a block not seen yet is dropped, not
	// routed in clear), a's own block thrown to the main table.
	if !f.kernel.rule || f.kernel.routes[p("10.0.1.0/26")].Type != RouteTunnel || f.kernel.routes[p("10.0.2.0/26")].Type != RouteTunnel ||
		f.kernel.routes[p("10.0.0.0/16")].Type != RouteUnreachable || f.kernel.routes[p("10.0.0.0/26")].Type != RouteThrow || len(f.kernel.routes) != 4 {
		t.Errorf("rule %v, routes %v", f.kernel.rule, f.kernel.routes)
	}
	if f.kernel.order[len(f.kernel.order)-1] != p("10.0.0.0/16") {
		t.Errorf("routes installed in the order %v: the pool's unreachable route must come after a's own block's throw", f.kernel.order)
	}
	if len(f.link.peers) != 2 || f.link.peers[kb].Endpoint.String() != "172.16.0.2:51820" {
		t.Errorf("peers %+v", f.link.peers)
	}

	// c gets a second block: only c's peer is reconfigured.
	f.blocks.owners[p("10.0.3.0/26")] = "c"
	f.link.touched = nil
	f.sync(t)
	if len(f.link.touched) != 1 || f.link.touched[0] != kc || len(f.link.peers[kc].AllowedIPs) != 2 {
		t.Errorf("reconfigured %v (c's allowed IPs %v); want only c with two blocks", f.link.touched, f.link.peers[kc].AllowedIPs)
	}

	// c loses its key: its peer goes and, required, its blocks are
	// unreachable rather than routed in clear.
	f.putNode(t, datastore.Node{Name: "c"})
	f.sync(t)
	if _, ok := f.link.peers[kc]; ok || f.kernel.routes[p("10.0.3.0/26")].Type != RouteUnreachable {
		t.Errorf("c without a key: peers %v, routes %v", f.link.peers, f.kernel.routes)
	}
	if st := f.m.Status(); len(st.Unencrypted) != 1 || st.Unencrypted[0].Traffic != TrafficDropped {
		t.Errorf("status %+v", st)
	}
	f.set(t, Change{Mode: strPtr(ModePreferred)})
	f.sync(t)
	if r := f.kernel.routes[p("10.0.3.0/26")]; r.Type != RouteThrow {
		t.Errorf("preferred: c's blocks not thrown to the main table in table %d: %v", RouteTable, f.kernel.routes)
	}

	// Rotation: a new key on the device and in the record.
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = f.m.Run(ctx) }()
	pub, err := f.m.RotateKey(context.Background())
	cancel()
	<-done
	if err != nil || pub == priv.PublicKey().String() || pub != f.link.priv.PublicKey().String() || f.node(t, "a").WireGuardPublicKey != pub {
		t.Fatalf("rotate: %s, %v; device %s, record %s", pub, err, f.link.priv.PublicKey(), f.node(t, "a").WireGuardPublicKey)
	}

	// Someone else writes a's key: reported, kept.
	wrong := mustKey(t).String()
	rec = f.node(t, "a")
	rec.WireGuardPublicKey = wrong
	f.putNode(t, rec)
	f.sync(t)
	if f.node(t, "a").WireGuardPublicKey != wrong || !f.logged("record carries a WireGuard public key that is not this node's") {
		t.Errorf("a foreign key in the record was overwritten or not reported")
	}

	f.set(t, Change{Enabled: off()})
	f.kernel.delUnderRule = 0
	f.sync(t)
	if f.kernel.delUnderRule != 0 {
		t.Errorf("off: %d routes deleted while the rule still consulted table %d (local traffic dropped meanwhile)", f.kernel.delUnderRule, RouteTable)
	}
	rec = f.node(t, "a")
	if _, held := f.blocks.handles[ipam.WireGuardTunnelHandle("a")]; held {
		t.Error("off: the device address is still assigned")
	}
	if !f.link.closed || f.kernel.rule || len(f.kernel.routes) != 0 || rec.WireGuardPublicKey != "" || rec.WireGuardAddr != "" || rec.WireGuardPort != 0 || rec.WireGuardInterfaceAddr != "" {
		t.Errorf("off: closed %v, rule %v, routes %v, record %+v", f.link.closed, f.kernel.rule, f.kernel.routes, rec)
	}
	if st := f.m.Status(); st.Enabled || st.Device != "" {
		t.Errorf("off: status %+v", st)
	}
}

func strPtr(s string) *string { return &s }

func TestWorkloadMTU(t *testing.T) {
	f := newManagerFixture(t)
	ctx := context.Background()
	vxlan := func(mtu int) func(context.Context, net.IP) (int, error) {
		return func(context.Context, net.IP) (int, error) { return mtu, nil }
	}
	ip := net.IPv4(10, 0, 0, 1)
	cases := []struct {
		name    string
		enabled bool
		next    int
		want    int
	}{
		{"off, plain pool", false, 0, 0},
		{"off, VXLAN pool", false, 1450, 1450},
		{"on, plain pool", true, 0, 1440},
		{"on, VXLAN pool", true, 1450, 1390},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f.set(t, Change{Enabled: &tc.enabled})
			got, err := f.m.WorkloadMTU(vxlan(tc.next))(ctx, ip)
			if err != nil || got != tc.want {
				t.Errorf("MTU %d, %v; want %d", got, err, tc.want)
			}
		})
	}
}

func TestConfigureRejects(t *testing.T) {
	store := etcdtest.Start(t).Client(t)
	bad, port := "sometimes", 70000
	for _, c := range []Change{{Mode: &bad}, {Port: &port}} {
		if _, err := Configure(context.Background(), store, c); !errors.Is(err, ErrInvalid) {
			t.Errorf("Configure(%+v) = %v, want an invalid-setting error", c, err)
		}
	}
}

// TestStatusAndMetrics: node status and /metrics show each peer's last
// handshake and bytes, and count the handshakes seen.
func TestStatusAndMetrics(t *testing.T) {
	f := newManagerFixture(t)
	kb := f.onWithPeerB(t)
	hs := func(at time.Time, rx, tx int64) {
		f.link.mu.Lock()
		p := f.link.peers[kb]
		p.LastHandshake, p.RxBytes, p.TxBytes = at, rx, tx
		f.link.peers[kb] = p
		f.link.mu.Unlock()
	}
	t0 := time.Unix(1_800_000_000, 0)
	hs(t0, 100, 200)
	f.m.Status()
	hs(t0.Add(2*time.Minute), 1000, 2000)
	st := f.m.Status()
	if !st.Enabled || st.Device != Device || st.Implementation != ImplUserspace || st.MTU != 1440 || st.Address != "172.16.0.1:51820" || len(st.Peers) != 1 {
		t.Fatalf("status %+v", st)
	}
	if p := st.Peers[0]; p.Node != "b" || p.Handshakes != 2 || !p.LastHandshake.Equal(t0.Add(2*time.Minute)) || p.RxBytes != 1000 || p.TxBytes != 2000 || p.AllowedIPs[0] != "10.0.1.0/26" {
		t.Errorf("peer %+v", p)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(f.m.Collector())
	want := fmt.Sprintf(`
# HELP %[1]s WireGuard handshakes completed with a peer, as seen by this daemon.
# TYPE %[1]s counter
%[1]s{peer="b",public_key="%[3]s"} 2
# HELP %[2]s Bytes received from a WireGuard peer.
# TYPE %[2]s counter
%[2]s{peer="b",public_key="%[3]s"} 1000
`, MetricHandshakes, MetricRxBytes, kb)
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), MetricHandshakes, MetricRxBytes); err != nil {
		t.Error(err)
	}
}

// TestInvalidHandshakeLog: an unverifiable handshake is logged once per
// 30 s per node, naming it; senders that are no node (any address and
// port anyone can forge) share one entry, so a spray of them costs one
// log line and one map entry.
func TestInvalidHandshakeLog(t *testing.T) {
	f := newManagerFixture(t)
	f.m.learnPeers(Desired{Peers: []Peer{{Node: "b", PublicKey: mustKey(t), Endpoint: netip.MustParseAddrPort("172.16.0.2:51820")}}})
	for i := range 1000 {
		f.m.invalidHandshake(fmt.Sprintf("198.51.100.%d:%d", i%250, 1024+i))
		f.m.invalidHandshake(fmt.Sprintf("172.16.0.2:%d", 1024+i))
	}
	byPeer := map[string]int{}
	for _, e := range f.logs.AllEntries() {
		if strings.Contains(e.Message, "could not be verified") {
			byPeer[fmt.Sprint(e.Data["peer"])]++
		}
	}
	if len(byPeer) != 2 || byPeer["b"] != 1 || byPeer[notANode] != 1 {
		t.Errorf("warnings per peer %v, want one for b and one for %s", byPeer, notANode)
	}
	f.m.mu.Lock()
	defer f.m.mu.Unlock()
	if len(f.m.invalidAt) != 2 {
		t.Errorf("%d senders remembered, want 2", len(f.m.invalidAt))
	}
}

// TestRelease: a stopping daemon lets go of the device without removing
// it, its routes or the rule (containers keep their tunnels), and the next
// pass, as a restarted daemon's, attaches again.
func TestRelease(t *testing.T) {
	f := newManagerFixture(t)
	f.onWithPeerB(t)
	first := f.link
	f.m.Release()
	if !first.detached || first.closed || !f.kernel.rule || len(f.kernel.routes) != 1 {
		t.Fatalf("released: detached %v, removed %v, rule %v, routes %v; want detached, not removed, rule and route kept", first.detached, first.closed, f.kernel.rule, f.kernel.routes)
	}
	f.m.Release() // a second time: nothing to release
	f.sync(t)
	if f.opened != 2 || f.link == first {
		t.Errorf("after Release the device was opened %d times, want again by the next pass", f.opened)
	}
}

// TestDeviceDeletedBehindTheManager: a wireguard.cali deleted by someone
// else is made again at the next pass, with its key and peers, instead of
// every pass failing on it.
func TestDeviceDeletedBehindTheManager(t *testing.T) {
	f := newManagerFixture(t)
	kb := f.onWithPeerB(t)
	first := f.link
	f.kernel.gone = true
	f.sync(t)
	if f.opened != 2 || !first.detached {
		t.Fatalf("device opened %d times (old one released: %v), want made again", f.opened, first.detached)
	}
	if _, ok := f.link.peers[kb]; !ok || f.link.priv != first.priv {
		t.Errorf("the new device has peers %v and key %v, want b and the node's key", f.link.peers, f.link.priv.PublicKey())
	}
	if !f.logged("WireGuard device disappeared") {
		t.Error("the log does not say the device disappeared")
	}
}

// TestPeersGreetedAfterARestart: a device made by this process (a
// daemon's restart, a device deleted behind it) asks for a handshake with
// every peer at its first pass, when the peers already know this node's
// key; never on the first pass with WireGuard on, whose key the peers have
// not read yet (they would log a handshake they cannot verify), nor for a
// peer only changed or added later, which has no old session to resume.
func TestPeersGreetedAfterARestart(t *testing.T) {
	f := newManagerFixture(t)
	p := netip.MustParsePrefix
	sortKeys := func(ks []wgtypes.Key) []wgtypes.Key {
		out := slices.Clone(ks)
		slices.SortFunc(out, func(x, y wgtypes.Key) int { return strings.Compare(x.String(), y.String()) })
		return out
	}
	kb := f.onWithPeerB(t)
	if len(f.link.peers) != 1 || len(f.link.greeted) != 0 {
		t.Fatalf("first pass with WireGuard on: peers %v, greeted %v; want b, nobody greeted", f.link.peers, f.link.greeted)
	}

	f.blocks.owners[p("10.0.4.0/26")] = "b"
	kc := mustKey(t)
	f.blocks.owners[p("10.0.2.0/26")] = "c"
	f.putNode(t, datastore.Node{Name: "c", WireGuardPublicKey: kc.String(), WireGuardAddr: "172.16.1.3"})
	f.link.touched = nil
	f.sync(t)
	if len(f.link.touched) != 2 || len(f.link.greeted) != 0 {
		t.Errorf("b changed, c joined: touched %v, greeted %v; want both touched, nobody greeted", f.link.touched, f.link.greeted)
	}

	// The daemon restarts: a new manager, the same key, a new device.
	f.startManager(t)
	f.sync(t)
	if got, want := sortKeys(f.link.greeted), sortKeys([]wgtypes.Key{kb, kc}); f.opened != 2 || !slices.Equal(got, want) {
		t.Errorf("after a restart (device opened %d times): greeted %v, want b and c", f.opened, got)
	}
	f.link.greeted = nil
	f.sync(t)
	if len(f.link.greeted) != 0 {
		t.Errorf("the pass after: greeted %v, want nobody", f.link.greeted)
	}

	// A device deleted behind the manager and made again.
	f.kernel.gone = true
	f.sync(t)
	if got, want := sortKeys(f.link.greeted), sortKeys([]wgtypes.Key{kb, kc}); f.opened != 3 || !slices.Equal(got, want) {
		t.Errorf("device made again (opened %d times): greeted %v, want b and c", f.opened, got)
	}

	// A restart whose first adding of the peers fails greets them at the
	// pass that adds them.
	f.startManager(t)
	prevOpen := f.opened
	openLink := f.m.d.OpenLink
	f.m.d.OpenLink = func(mtu int, log logrus.FieldLogger, inv InvalidHandshake) (Link, error) {
		l, err := openLink(mtu, log, inv)
		f.link.peersErr = errors.New("device busy")
		return l, err
	}
	if err := f.m.Sync(context.Background()); err == nil || f.opened != prevOpen+1 || len(f.link.greeted) != 0 {
		t.Fatalf("a failing peer configuration: %v, opened %d, greeted %v; want the error, a new device, nobody greeted", err, f.opened-prevOpen, f.link.greeted)
	}
	f.sync(t)
	if got, want := sortKeys(f.link.greeted), sortKeys([]wgtypes.Key{kb, kc}); !slices.Equal(got, want) {
		t.Errorf("the pass after a failed add: greeted %v, want b and c", got)
	}
}
