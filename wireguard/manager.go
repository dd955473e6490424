package wireguard

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/sirupsen/logrus"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/internal/follow"
	"github.com/calico-cnm/calico-cnm/internal/lastpass"
	"github.com/calico-cnm/calico-cnm/ipam"
	"github.com/calico-cnm/calico-cnm/routing"
)

// Blocks is the part of IPAM the manager uses (*ipam.Engine): the block
// owners, and the device's own address.
type Blocks interface {
	IPsByHandle(ctx context.Context, handleID string) ([]net.IP, error)
	AutoAssign(ctx context.Context, a ipam.AutoAssignArgs) (net.IPNet, error)
	ReleaseByHandle(ctx context.Context, handleID string) error
}

// AttrTypeTunnel marks the device's address in IPAM (ipam.AttrType),
// Calico's name.
const AttrTypeTunnel = "wireguardTunnelAddress"

// Deps wires a Manager; tests pass fakes for Blocks, Kernel and OpenLink.
type Deps struct {
	// Store is where the manager writes its node record; Records is the
	// datastore syncer it reads the cluster settings, nodes, pools, blocks
	// and endpoints from.
	Store    follow.Store
	Records  datastore.Records
	Blocks   Blocks
	Kernel   Kernel
	OpenLink func(mtu int, log logrus.FieldLogger, invalid InvalidHandshake) (Link, error)
	NodeName string
	StateDir string // holds KeyFile
	// NodeIP is the address peers send to; "" detects it with
	// AutodetectMethod (as BGP and VXLAN do).
	NodeIP           string
	AutodetectMethod string
	DetectAddress    func(method string) (netip.Addr, error)
	Log              logrus.FieldLogger
	// ResyncInterval re-checks everything even without events (default 10s).
	ResyncInterval time.Duration
}

// silentAfter is how long a peer may take traffic without completing a
// handshake before the log says so (WireGuard retries a handshake every
// 5 s: two retries).
const silentAfter = 12 * time.Second

// Manager keeps wireguard.cali, its peers, RouteTable and the rule equal
// to what the cluster setting, the node records and the block affinities
// ask for: desired state by Compute, diffed against the device and the
// kernel on every change and every ResyncInterval.
type Manager struct {
	d    Deps
	log  logrus.FieldLogger
	last *lastpass.Outcome

	// rotate takes key rotations to Run's goroutine, which owns the key.
	rotate chan func(ctx context.Context)

	// Owned by the pass (Run's goroutine).
	key       wgtypes.Key
	haveKey   bool
	addr      netip.Addr
	published bool // this node's key was written to its record since the key or the setting last changed
	// greet: the device was made by this process and its peers are not
	// greeted yet. A daemon before may have had sessions with them, which
	// they keep sending on (see Link.Greet).
	greet     bool
	foreign   string
	clean     bool                       // off, and everything removed
	silent    map[wgtypes.Key]time.Time  // peer -> when it was first seen sending without a handshake
	warned    map[wgtypes.Key]bool       // silent peers already logged
	invalidAt map[string]time.Time       // node (or notANode) -> last logged unverifiable handshake
	byAddr    map[netip.Addr]string      // peer address -> node, for those logs
	prevHS    map[wgtypes.Key]time.Time  // last handshake seen per peer (counting)
	hsCount   map[wgtypes.Key]uint64     // handshakes seen per peer
	peerNode  map[wgtypes.Key]string     // peer key -> node
	unenc     map[string]UnencryptedNode // node -> why it has no peer

	mu        sync.Mutex // guards what follows, and calls into link
	link      Link
	uplinkMTU int
	status    Status
}

type rotateResult struct {
	key string
	err error
}

// NewManager checks deps.
func NewManager(d Deps) (*Manager, error) {
	if d.Store == nil || d.Records == nil || d.Blocks == nil || d.Kernel == nil {
		return nil, errors.New("the WireGuard manager needs a datastore, its syncer, IPAM and a kernel")
	}
	if d.NodeName == "" || d.StateDir == "" {
		return nil, errors.New("the WireGuard manager needs the node name and the state directory")
	}
	if d.OpenLink == nil {
		d.OpenLink = OpenLink
	}
	if d.Log == nil {
		d.Log = logrus.StandardLogger()
	}
	if d.DetectAddress == nil {
		d.DetectAddress = routing.DetectAddress
	}
	if d.ResyncInterval <= 0 {
		d.ResyncInterval = 10 * time.Second
	}
	return &Manager{
		d: d, log: d.Log.WithField("component", "wireguard"), last: lastpass.New("WireGuard"),
		rotate: make(chan func(ctx context.Context)),
		silent: map[wgtypes.Key]time.Time{}, warned: map[wgtypes.Key]bool{}, invalidAt: map[string]time.Time{},
		byAddr: map[netip.Addr]string{}, prevHS: map[wgtypes.Key]time.Time{}, hsCount: map[wgtypes.Key]uint64{},
		peerNode: map[wgtypes.Key]string{}, unenc: map[string]UnencryptedNode{},
		status: Status{Peers: []PeerStatus{}},
	}, nil
}

// logger is the manager's logger as it is now (follow.Loop).
func (m *Manager) logger() logrus.FieldLogger { return m.log }

// Health is nil unless the last pass failed (/healthz).
func (m *Manager) Health() error { return m.last.Err() }

// Run works until ctx ends, and returns nil then. It gives up, with the
// error, when it can no longer follow the datastore (the revision or a
// watch refused for good): peers would go stale while the daemon looks
// fine. The device stays when it returns (a userspace device persists
// without its process: packets to it wait dropped, never in clear, until
// the next daemon attaches).
func (m *Manager) Run(ctx context.Context) error {
	return follow.Loop{
		Name: "wireguard", Records: m.d.Records,
		Prefixes: []string{datastore.ClusterConfigKey, datastore.NodesPrefix, ipam.PoolsPrefix, ipam.AffinityWatchPrefix, datastore.EndpointsPrefix},
		Resync:   m.d.ResyncInterval, Pass: m.Sync, Last: m.last, Log: m.logger,
		FailMsg: "WireGuard sync failed; retrying at the next change or resync",
		Calls:   m.rotate,
	}.Run(ctx)
}

// Release lets go of the device once Run has returned, leaving it and
// its routes in place for the next daemon (see Run); without it
// wireguard-go's goroutines and sockets outlive a stopped daemon in this
// process, and hold the TUN a new one would attach to. A failure is
// logged: the daemon is stopping, nobody else could act on it.
func (m *Manager) Release() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.link == nil {
		return
	}
	if err := m.link.Detach(); err != nil {
		m.log.WithError(err).WithField("device", Device).Warn("WireGuard: releasing the device")
	}
	m.link = nil
}

// RotateKey replaces this node's key pair and publishes the new public
// key; the peers follow at once, and sessions resume at the next
// handshake (one retry). It returns the new public key.
func (m *Manager) RotateKey(ctx context.Context) (string, error) {
	reply := make(chan rotateResult, 1)
	select {
	case m.rotate <- func(ctx context.Context) { reply <- m.rotateKey(ctx) }:
	case <-ctx.Done():
		return "", ctx.Err()
	}
	select {
	case r := <-reply:
		return r.key, r.err
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

func (m *Manager) rotateKey(ctx context.Context) rotateResult {
	cfg, err := m.readConfig(ctx)
	if err != nil {
		return rotateResult{err: err}
	}
	if !cfg.WireGuard {
		return rotateResult{err: errors.New("WireGuard is off in this cluster (calico-cnm cluster set --wireguard on)")}
	}
	key, err := NewKey(m.d.StateDir)
	if err != nil {
		return rotateResult{err: err}
	}
	old := m.key.PublicKey()
	m.key, m.haveKey, m.published = key, true, false
	m.log.WithFields(logrus.Fields{"old": old.String(), "new": key.PublicKey().String()}).Info("WireGuard key rotated")
	err = m.Sync(ctx)
	m.last.Record(err)
	return rotateResult{key: key.PublicKey().String(), err: err}
}

// readConfig is the cluster setting as the syncer holds it (defaults when
// there is none).
func (m *Manager) readConfig(context.Context) (datastore.ClusterConfig, error) {
	r, ok := m.d.Records.Get(datastore.ClusterConfigKey)
	if !ok {
		return datastore.ClusterConfig{}, nil
	}
	if r.Err != nil {
		return datastore.ClusterConfig{}, r.Err
	}
	return *r.Value.(*datastore.ClusterConfig), nil
}

// Sync reads the datastore and makes device, routes and record match it:
// one pass.
func (m *Manager) Sync(ctx context.Context) error {
	cfg, err := m.readConfig(ctx)
	if err != nil {
		return err
	}
	if !cfg.WireGuard {
		return m.syncOff(ctx)
	}
	mode, err := ParseMode(cfg.WireGuardMode)
	if err != nil {
		return err
	}
	m.clean = false
	port := cfg.WireGuardPort
	if port == 0 {
		port = DefaultPort
	}
	if err := m.prepare(port); err != nil {
		return err
	}
	ifAddr, err := m.ensureInterfaceAddr(ctx)
	if err != nil {
		return err
	}
	nodes := follow.Nodes(m.d.Records)
	// A greeting under a key the peers have not read yet (the first pass
	// with WireGuard on, a new key) is refused, and each peer logs it as a
	// handshake it could not verify; their traffic starts the handshake
	// once they know the key.
	greet := m.greet && recordedKey(nodes, m.d.NodeName) == m.key.PublicKey().String()
	if err := m.register(ctx, nodes, port, ifAddr); err != nil {
		return err
	}
	owners, endpoints, pools := follow.BlockOwners(m.d.Records), follow.Endpoints(m.d.Records), follow.PoolPrefixes(m.d.Records)
	want := Compute(Input{Self: m.d.NodeName, SelfKey: m.key.PublicKey(), Mode: mode, Nodes: nodes, Owners: owners, Endpoints: endpoints, Pools: pools})
	m.noteUnencrypted(want, mode)
	m.learnPeers(want)
	state, err := m.linkState()
	if err != nil {
		return err
	}
	// Peers go before the routes that use them, and after them.
	added := m.syncPeers(want, state, false, greet)
	if added == nil {
		// Greeted, or needing no greeting: peers added later have no
		// session to resume. A failed add leaves it for the next pass.
		m.greet = false
	}
	err = errors.Join(added, m.syncRoutes(want), m.syncPeers(want, state, true, false))
	m.publish(cfg, mode, port)
	// Counts handshakes and notes silent peers even when nobody asks.
	m.mu.Lock()
	m.peerStatesLocked()
	m.mu.Unlock()
	return err
}

// prepare finds the node address and the key and makes the device.
func (m *Manager) prepare(port int) error {
	if !m.addr.IsValid() {
		addr, err := m.nodeAddress()
		if err != nil {
			return err
		}
		mtu, err := m.d.Kernel.UplinkMTU(addr)
		if err != nil {
			return err
		}
		m.addr = addr
		m.mu.Lock()
		m.uplinkMTU = mtu
		m.mu.Unlock()
	}
	if !m.haveKey {
		key, err := LoadOrCreateKey(m.d.StateDir)
		if err != nil {
			return err
		}
		m.key, m.haveKey = key, true
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.link != nil {
		// Deleted under us (an operator, a script): its tunnel routes
		// went with it. Made again rather than left failing every pass.
		ok, err := m.d.Kernel.DeviceExists()
		if err != nil {
			return err
		}
		if !ok {
			m.log.WithField("device", Device).Warn("WireGuard device disappeared; creating it again")
			if err := m.link.Detach(); err != nil {
				m.log.WithError(err).WithField("device", Device).Debug("releasing the vanished device")
			}
			m.link = nil
		}
	}
	if m.link == nil {
		link, err := m.d.OpenLink(m.uplinkMTU-Overhead, m.log, m.invalidHandshake)
		if err != nil {
			return fmt.Errorf("creating %s: %w", Device, err)
		}
		m.link, m.greet = link, true
		m.log.WithFields(logrus.Fields{"device": Device, "implementation": link.Implementation(), "mtu": m.uplinkMTU - Overhead}).Info("WireGuard device ready")
	}
	st, err := m.link.State()
	if err != nil {
		return fmt.Errorf("reading %s: %w", Device, err)
	}
	if st.PublicKey == m.key.PublicKey() && st.ListenPort == port {
		return nil
	}
	mark := FirewallMark
	if err := m.link.Configure(wgtypes.Config{PrivateKey: &m.key, ListenPort: &port, FirewallMark: &mark}); err != nil {
		return fmt.Errorf("configuring %s: %w", Device, err)
	}
	return nil
}

func (m *Manager) nodeAddress() (netip.Addr, error) {
	if m.d.NodeIP != "" {
		a, err := netip.ParseAddr(m.d.NodeIP)
		if err != nil {
			return netip.Addr{}, fmt.Errorf("node address %q: %w", m.d.NodeIP, err)
		}
		return a, nil
	}
	a, err := m.d.DetectAddress(m.d.AutodetectMethod)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("detecting the node address: %w", err)
	}
	return a, nil
}

// register publishes this node's public key, address and port in its
// record. Once published, a different key found there is reported, not
// overwritten: something else wrote it (a clone of this host, an
// operator), and fighting it would hide that; `node rotate-key` and a
// restart publish again.
func (m *Manager) register(ctx context.Context, nodes []datastore.Node, port int, ifAddr netip.Addr) error {
	pub := m.key.PublicKey().String()
	if m.published {
		for _, n := range nodes {
			if n.Name != m.d.NodeName || n.WireGuardPublicKey == pub {
				continue
			}
			if n.WireGuardPublicKey != m.foreign {
				m.foreign = n.WireGuardPublicKey
				m.log.WithFields(logrus.Fields{"recorded": n.WireGuardPublicKey, "own": pub}).Error("this node's record carries a WireGuard public key that is not this node's: the other nodes encrypt to a key this node does not hold, so they cannot exchange traffic with its workloads; `calico-cnm node rotate-key` on this node publishes a fresh key")
			}
			return nil
		}
	}
	_, changed, rev, err := follow.UpdateNode(ctx, m.d.Store, m.d.NodeName, func(n *datastore.Node) {
		n.Name = m.d.NodeName
		n.WireGuardPublicKey, n.WireGuardAddr, n.WireGuardPort = pub, m.addr.String(), port
		n.WireGuardInterfaceAddr = ""
		if ifAddr.IsValid() {
			n.WireGuardInterfaceAddr = ifAddr.String()
		}
	})
	if err != nil {
		return fmt.Errorf("publishing the WireGuard key: %w", err)
	}
	// The next pass reads the record from the syncer's memory: it must
	// hold this write, or the old key would look like a foreign one.
	if err := m.d.Records.WaitRevision(ctx, rev); err != nil {
		return err
	}
	m.published, m.foreign = true, ""
	if changed {
		m.log.WithFields(logrus.Fields{"publicKey": pub, "port": port}).Info("WireGuard public key published")
	}
	return nil
}

// ensureInterfaceAddr gives wireguard.cali an address of this node (one
// IPAM assignment under its own handle): the source the kernel picks for
// this host's own packets to other nodes' workloads, which the peers'
// allowed IPs accept. Without an IPv4 pool there is none yet (a pool
// change starts a pass).
func (m *Manager) ensureInterfaceAddr(ctx context.Context) (netip.Addr, error) {
	handle := ipam.WireGuardTunnelHandle(m.d.NodeName)
	held, err := m.d.Blocks.IPsByHandle(ctx, handle)
	if err != nil {
		return netip.Addr{}, err
	}
	var addr netip.Addr
	if a, ok := netip.AddrFromSlice(held0(held)); ok && len(held) == 1 && a.Unmap().Is4() {
		addr = a.Unmap()
	} else {
		if len(held) > 0 {
			if err := m.d.Blocks.ReleaseByHandle(ctx, handle); err != nil {
				return netip.Addr{}, err
			}
		}
		n, err := m.d.Blocks.AutoAssign(ctx, ipam.AutoAssignArgs{Host: m.d.NodeName, HandleID: handle, Attrs: map[string]string{ipam.AttrType: AttrTypeTunnel}})
		if err != nil {
			m.log.WithError(err).Debug("no address for the WireGuard device yet")
			return netip.Addr{}, m.d.Kernel.SetDeviceAddr(netip.Addr{})
		}
		a, _ := netip.AddrFromSlice(n.IP)
		addr = a.Unmap()
		m.log.WithField("ip", addr.String()).Info("WireGuard device address assigned")
	}
	return addr, m.d.Kernel.SetDeviceAddr(addr)
}

func held0(ips []net.IP) net.IP {
	if len(ips) == 0 {
		return nil
	}
	return ips[0]
}

// noteUnencrypted logs each node that has no peer, when that changes.
func (m *Manager) noteUnencrypted(want Desired, mode string) {
	traffic := TrafficDropped
	if mode == ModePreferred {
		traffic = TrafficClear
	}
	now := map[string]UnencryptedNode{}
	for node, reason := range want.Unencrypted {
		u := UnencryptedNode{Node: node, Reason: reason, Traffic: traffic}
		now[node] = u
		if m.unenc[node] != u {
			m.log.WithFields(logrus.Fields{"peer": node, "reason": reason, "traffic": traffic}).Warn("node has no WireGuard peer: " + node + " " + reason + "; its workloads' traffic is " + traffic)
		}
	}
	m.unenc = now
}

// learnPeers records which node each peer key and address belongs to.
func (m *Manager) learnPeers(want Desired) {
	byAddr, byKey := map[netip.Addr]string{}, map[wgtypes.Key]string{}
	for _, p := range want.Peers {
		byAddr[p.Endpoint.Addr()], byKey[p.PublicKey] = p.Node, p.Node
	}
	m.mu.Lock()
	m.byAddr, m.peerNode = byAddr, byKey
	m.mu.Unlock()
}

// notANode names, in logs, a handshake sender that is no node's address.
const notANode = "(not a node)"

// invalidHandshake logs, at most every 30 s per node, a handshake the
// device could not verify (called by wireguard-go's goroutines). Senders
// that are no node share one entry: anyone can send initiations from
// any address and port, and must grow neither the map nor the log.
func (m *Manager) invalidHandshake(from string) {
	ap, err := netip.ParseAddrPort(from)
	if err != nil {
		return
	}
	m.mu.Lock()
	node := m.byAddr[ap.Addr().Unmap()]
	if node == "" {
		node = notANode
	}
	if time.Since(m.invalidAt[node]) < 30*time.Second {
		m.mu.Unlock()
		return
	}
	m.invalidAt[node] = time.Now()
	m.mu.Unlock()
	m.log.WithFields(logrus.Fields{"peer": node, "from": from}).Warn("WireGuard handshake from " + node + " could not be verified: the public key in one of the two nodes' records is not the key that node holds (see its log); traffic between them is dropped")
}

func (m *Manager) linkState() (DeviceState, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	st, err := m.link.State()
	if err != nil {
		return st, fmt.Errorf("reading %s: %w", Device, err)
	}
	return st, nil
}

// syncPeers removes the unwanted peers (removes) or adds and fixes the
// wanted ones (!removes); an unchanged peer is not touched, so its
// session goes on. With greet, it asks the device for a handshake with
// each peer it adds.
func (m *Manager) syncPeers(want Desired, have DeviceState, removes, greet bool) error {
	haveBy := map[wgtypes.Key]PeerState{}
	for _, p := range have.Peers {
		haveBy[p.PublicKey] = p
	}
	var cfg wgtypes.Config
	var toGreet []wgtypes.Key
	if removes {
		wanted := map[wgtypes.Key]bool{}
		for _, p := range want.Peers {
			wanted[p.PublicKey] = true
		}
		for k := range haveBy {
			if !wanted[k] {
				cfg.Peers = append(cfg.Peers, wgtypes.PeerConfig{PublicKey: k, Remove: true})
			}
		}
	} else {
		for _, p := range want.Peers {
			if h, ok := haveBy[p.PublicKey]; ok && h.Endpoint == p.Endpoint && slices.Equal(sortedPrefixes(h.AllowedIPs), p.AllowedIPs) {
				continue
			}
			ep := net.UDPAddrFromAddrPort(p.Endpoint)
			pc := wgtypes.PeerConfig{PublicKey: p.PublicKey, Endpoint: ep, ReplaceAllowedIPs: true}
			for _, a := range p.AllowedIPs {
				pc.AllowedIPs = append(pc.AllowedIPs, net.IPNet{IP: a.Addr().AsSlice(), Mask: net.CIDRMask(a.Bits(), a.Addr().BitLen())})
			}
			cfg.Peers = append(cfg.Peers, pc)
			if _, ok := haveBy[p.PublicKey]; !ok && greet {
				toGreet = append(toGreet, p.PublicKey)
			}
		}
	}
	if len(cfg.Peers) == 0 {
		return nil
	}
	m.mu.Lock()
	err := m.link.Configure(cfg)
	if err == nil && len(toGreet) > 0 {
		if gerr := m.link.Greet(toGreet); gerr != nil {
			m.log.WithError(gerr).WithField("device", Device).Info("WireGuard peers not greeted: they handshake at their first packet")
		}
	}
	m.mu.Unlock()
	if err != nil {
		return fmt.Errorf("configuring the peers of %s: %w", Device, err)
	}
	for _, pc := range cfg.Peers {
		f := logrus.Fields{"publicKey": pc.PublicKey.String()}
		if pc.Remove {
			m.log.WithFields(f).Info("WireGuard peer removed")
			continue
		}
		f["peer"], f["endpoint"], f["allowedIPs"] = m.peerNode[pc.PublicKey], pc.Endpoint.String(), len(pc.AllowedIPs)
		m.log.WithFields(f).Info("WireGuard peer programmed")
	}
	return nil
}

// recordedKey is the WireGuard public key node's record holds.
func recordedKey(nodes []datastore.Node, node string) string {
	for _, n := range nodes {
		if n.Name == node {
			return n.WireGuardPublicKey
		}
	}
	return ""
}

func sortedPrefixes(ps []netip.Prefix) []netip.Prefix {
	out := slices.Clone(ps)
	slices.SortFunc(out, comparePrefix)
	return out
}

// syncRoutes makes RouteTable equal to want.Routes (unchanged routes are
// not touched) and keeps the rule in place.
func (m *Manager) syncRoutes(want Desired) error {
	if err := m.d.Kernel.EnsureRule(); err != nil {
		return err
	}
	have, err := m.d.Kernel.Routes()
	if err != nil {
		return err
	}
	var errs []error
	// Unreachable routes last: a pool's goes in after the throw routes of
	// this node's blocks inside it, so local traffic is never dropped.
	for _, last := range []bool{false, true} {
		for dst, w := range want.Routes {
			if have[dst] == w || (w.Type == RouteUnreachable) != last {
				continue
			}
			if err := m.d.Kernel.SetRoute(w); err != nil {
				errs = append(errs, fmt.Errorf("routing %s: %w", dst, err))
				continue
			}
			m.log.WithFields(logrus.Fields{"block": dst.String(), "type": w.Type}).Debug("WireGuard route installed")
		}
	}
	for dst := range have {
		if _, ok := want.Routes[dst]; ok {
			continue
		}
		if err := m.d.Kernel.DelRoute(dst); err != nil {
			errs = append(errs, fmt.Errorf("deleting the route to %s: %w", dst, err))
		}
	}
	return errors.Join(errs...)
}

// syncOff removes what WireGuard left, once: routes, rule, device and the
// record's fields (the key file stays, for the next time it is on).
func (m *Manager) syncOff(ctx context.Context) error {
	if m.clean {
		m.publish(datastore.ClusterConfig{}, "", 0)
		return nil
	}
	// The rule first: with it gone table 99 is no longer consulted, so
	// deleting its routes one by one never leaves a pool's unreachable
	// route without the throw routes of this node's blocks under it.
	errs := []error{m.d.Kernel.RemoveRule()}
	if have, err := m.d.Kernel.Routes(); err != nil {
		errs = append(errs, err)
	} else {
		for dst := range have {
			if err := m.d.Kernel.DelRoute(dst); err != nil {
				errs = append(errs, fmt.Errorf("deleting the route to %s: %w", dst, err))
			}
		}
	}
	m.mu.Lock()
	if m.link != nil {
		errs = append(errs, m.link.Close())
		m.link = nil
		m.log.WithField("device", Device).Info("WireGuard off: device, routes and rule removed")
	} else {
		errs = append(errs, m.d.Kernel.RemoveDevice())
	}
	m.mu.Unlock()
	errs = append(errs, m.d.Blocks.ReleaseByHandle(ctx, ipam.WireGuardTunnelHandle(m.d.NodeName)))
	_, _, _, err := follow.UpdateNode(ctx, m.d.Store, m.d.NodeName, func(n *datastore.Node) {
		n.WireGuardPublicKey, n.WireGuardAddr, n.WireGuardPort, n.WireGuardInterfaceAddr = "", "", 0, ""
	})
	errs = append(errs, err)
	m.published, m.foreign = false, ""
	m.unenc = map[string]UnencryptedNode{}
	err = errors.Join(errs...)
	m.clean = err == nil
	m.publish(datastore.ClusterConfig{}, "", 0)
	return err
}
