package vxlan

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/internal/follow"
	"github.com/calico-cnm/calico-cnm/internal/lastpass"
	"github.com/calico-cnm/calico-cnm/ipam"
	"github.com/calico-cnm/calico-cnm/routing"
)

// Blocks is the part of IPAM the VXLAN manager uses (*ipam.Engine).
type Blocks interface {
	EnsureTunnelAddress(ctx context.Context, node string, pools []netip.Prefix) (netip.Addr, error)
	ReleaseTunnelAddress(ctx context.Context, node string) error
}

// Config is the node's VXLAN settings.
type Config struct {
	// NodeIP is the node's address, the outer source of its tunnels; ""
	// detects it with AutodetectMethod (routing.DetectAddress).
	NodeIP           string
	AutodetectMethod string
	// BGP: a BGP speaker runs on this node, so same-subnet CrossSubnet
	// routes are left to the routes it learns.
	BGP bool
}

// Deps wires a Manager; tests pass fakes for Blocks and Kernel.
type Deps struct {
	// Store is where the manager writes its node record; Records is the
	// datastore syncer it reads pools, nodes, blocks and endpoints from.
	Store         follow.Store
	Records       datastore.Records
	Blocks        Blocks
	Kernel        Kernel
	NodeName      string
	Config        Config
	Log           logrus.FieldLogger
	DetectAddress func(method string) (netip.Addr, error)
	// ResyncInterval re-checks everything even without events (default 10s).
	ResyncInterval time.Duration
}

// Manager keeps vxlan.calico, its neighbours, FDB entries and routes
// equal to what the datastore's pools, node records and block affinities
// ask for (Felix's vxlan_mgr, without a BGP speaker needed): desired state
// computed by ComputeDesired, diffed against the kernel on every change and
// every ResyncInterval.
type Manager struct {
	d   Deps
	log logrus.FieldLogger

	addr   netip.Addr
	uplink Uplink
	// clean: the last pass found no VXLAN pool and removed everything;
	// passes stay read-only until a pool uses VXLAN again.
	clean bool

	// last is the outcome of the last pass (Health).
	last *lastpass.Outcome

	mu        sync.Mutex
	uplinkMTU int // for WorkloadMTU; 0 until located
	desired   Desired
	status    routing.VXLANStatus
}

// NewManager checks deps.
func NewManager(d Deps) (*Manager, error) {
	if d.Store == nil || d.Records == nil || d.Blocks == nil || d.Kernel == nil {
		return nil, errors.New("the VXLAN manager needs a datastore, its syncer, IPAM and a kernel")
	}
	if d.NodeName == "" {
		return nil, errors.New("the VXLAN manager needs the node name")
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
	return &Manager{d: d, log: d.Log.WithField("component", "vxlan"), last: lastpass.New("VXLAN")}, nil
}

// logger is the manager's logger as it is now (follow.Loop).
func (m *Manager) logger() logrus.FieldLogger { return m.log }

// Health is nil unless the last pass failed (/healthz).
func (m *Manager) Health() error { return m.last.Err() }

// Owns says whether dst is routed by VXLAN now; the BGP agent leaves such
// destinations alone.
func (m *Manager) Owns(dst netip.Prefix) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.desired.Owns(dst)
}

// Run works until ctx ends, and returns nil then. It gives up, with the
// error, when it can no longer follow the datastore (the revision or a
// watch refused for good): VXLAN would go on unmanaged while the daemon
// looks fine.
func (m *Manager) Run(ctx context.Context) error {
	return m.loop().Run(ctx)
}

// loop is Run's loop: a pass after every change that matters (see
// matters) and every ResyncInterval.
func (m *Manager) loop() follow.Loop {
	return follow.Loop{
		Name: "vxlan", Records: m.d.Records,
		Prefixes: []string{datastore.NodesPrefix, ipam.PoolsPrefix, ipam.AffinityWatchPrefix, datastore.EndpointsPrefix},
		Resync:   m.d.ResyncInterval, Pass: m.Sync, Last: m.last, Log: m.logger,
		FailMsg: "VXLAN sync failed; retrying at the next change or resync",
		Matters: m.matters, PassMsg: "VXLAN pass",
	}
}

// matters says whether a change under prefix is worth a pass. Without a
// VXLAN pool (once cleaned up) a pass reads only the pools, so only a
// pool change starts one: block claims, endpoints and nodes anywhere in
// the cluster are not worth a pass on every node (at 64 nodes claiming at
// once, those passes' datastore reads slowed the claims themselves).
func (m *Manager) matters(prefix string) bool {
	return !m.clean || prefix == ipam.PoolsPrefix
}

// locate finds this node's underlay address and its interface, once: only
// a node that needs VXLAN needs them.
func (m *Manager) locate() error {
	if m.uplink.Index != 0 {
		return nil
	}
	addr, err := netip.Addr{}, error(nil)
	if m.d.Config.NodeIP != "" {
		addr, err = netip.ParseAddr(m.d.Config.NodeIP)
	} else {
		addr, err = m.d.DetectAddress(m.d.Config.AutodetectMethod)
	}
	if err != nil {
		return fmt.Errorf("detecting the node address: %w", err)
	}
	up, err := m.d.Kernel.Uplink(addr)
	if err != nil {
		return err
	}
	m.addr, m.uplink = addr, up
	m.mu.Lock()
	m.uplinkMTU = up.MTU
	m.mu.Unlock()
	m.log = m.log.WithFields(logrus.Fields{"address": addr.String(), "uplink": up.Name})
	return nil
}

// Sync reads the datastore and makes the kernel match it: one pass.
func (m *Manager) Sync(ctx context.Context) error {
	pools := follow.Pools(m.d.Records)
	if len(vxlanPools(pools)) == 0 {
		return m.syncWithoutVXLAN(ctx)
	}
	m.clean = false // every change matters again, even if this pass fails
	in := Input{Self: m.d.NodeName, BGP: m.d.Config.BGP, Nodes: follow.Nodes(m.d.Records), Pools: pools,
		Owners: follow.BlockOwners(m.d.Records), Endpoints: follow.Endpoints(m.d.Records)}
	if err := m.locate(); err != nil {
		return err
	}
	in.SelfIP, in.SelfSubnet = m.addr, m.uplink.Subnet
	want := ComputeDesired(in)
	vtep, err := m.d.Blocks.EnsureTunnelAddress(ctx, m.d.NodeName, want.Pools)
	if err != nil {
		return err
	}
	if err := m.register(ctx, vtep); err != nil {
		return err
	}
	spec := DeviceSpec{Local: m.addr, Parent: m.uplink.Index, MAC: VTEPMAC(m.d.NodeName), MTU: m.uplink.MTU - Overhead, Addr: vtep}
	if err := m.d.Kernel.EnsureDevice(spec); err != nil {
		return err
	}
	// Routes go before the entries they use, and come after them.
	err = errors.Join(m.syncRoutes(want, true), m.syncNeighbors(want), m.syncFDB(want), m.syncRoutes(want, false))
	m.publish(want, vtep)
	return err
}

// syncWithoutVXLAN removes what VXLAN left once no pool uses it; later
// passes stay read-only until one does again.
func (m *Manager) syncWithoutVXLAN(ctx context.Context) error {
	var err error
	if !m.clean {
		err = errors.Join(m.syncRoutes(Desired{}, true), m.teardown(ctx))
		m.clean = err == nil
	}
	m.publish(Desired{}, netip.Addr{})
	return err
}

// teardown removes what VXLAN left: the device (with its neighbours and
// FDB), the VTEP address and its record fields.
func (m *Manager) teardown(ctx context.Context) error {
	if err := m.d.Kernel.RemoveDevice(); err != nil {
		return fmt.Errorf("removing %s: %w", Device, err)
	}
	if err := m.d.Blocks.ReleaseTunnelAddress(ctx, m.d.NodeName); err != nil {
		return err
	}
	return m.register(ctx, netip.Addr{})
}

// register writes this node's underlay address and VTEP (none: vtep
// invalid) into its record, keeping every other field.
func (m *Manager) register(ctx context.Context, vtep netip.Addr) error {
	want, changed, _, err := follow.UpdateNode(ctx, m.d.Store, m.d.NodeName, func(n *datastore.Node) {
		n.VXLANTunnelAddr, n.VXLANTunnelMAC = "", ""
		if vtep.IsValid() {
			n.Name, n.IPv4 = m.d.NodeName, m.addr.String()
			n.VXLANTunnelAddr, n.VXLANTunnelMAC = vtep.String(), VTEPMAC(m.d.NodeName).String()
		}
	})
	if err == nil && changed {
		m.log.WithFields(logrus.Fields{"vtep": want.VXLANTunnelAddr, "mac": want.VXLANTunnelMAC}).Info("VXLAN tunnel endpoint registered")
	}
	return err
}

// syncRoutes deletes unwanted VXLAN routes (deletes) or adds and fixes
// the wanted ones (!deletes).
func (m *Manager) syncRoutes(want Desired, deletes bool) error {
	have, err := m.d.Kernel.Routes()
	if err != nil {
		return err
	}
	haveBy := map[netip.Prefix]Route{}
	for _, r := range have {
		haveBy[r.Dst] = r
	}
	var errs []error
	if deletes {
		for dst, r := range haveBy {
			if w, ok := want.Routes[dst]; ok && w == r {
				continue
			}
			if _, ok := want.Routes[dst]; ok {
				continue // replaced below
			}
			if err := m.d.Kernel.DelRoute(dst); err != nil {
				errs = append(errs, fmt.Errorf("deleting the route to %s: %w", dst, err))
				continue
			}
			m.log.WithField("block", dst.String()).Info("VXLAN route removed")
		}
		return errors.Join(errs...)
	}
	for dst, w := range want.Routes {
		if r, ok := haveBy[dst]; ok && r == w {
			continue
		}
		if err := m.d.Kernel.SetRoute(w); err != nil {
			errs = append(errs, fmt.Errorf("routing %s: %w", dst, err))
			continue
		}
		m.log.WithFields(logrus.Fields{"block": dst.String(), "via": w.Via.String(), "encap": w.Encap}).Info("VXLAN route installed")
	}
	return errors.Join(errs...)
}

func (m *Manager) syncNeighbors(want Desired) error {
	have, err := m.d.Kernel.Neighbors()
	if err != nil {
		return err
	}
	var errs []error
	wanted := map[netip.Addr]bool{}
	for _, v := range want.VTEPs {
		wanted[v.Addr] = true
		if have[v.Addr] == v.MAC.String() {
			continue
		}
		if err := m.d.Kernel.SetNeighbor(v.Addr, v.MAC); err != nil {
			errs = append(errs, fmt.Errorf("neighbour %s of node %s: %w", v.Addr, v.Node, err))
		}
	}
	for ip := range have {
		if !wanted[ip] {
			if err := m.d.Kernel.DelNeighbor(ip); err != nil {
				errs = append(errs, fmt.Errorf("removing neighbour %s: %w", ip, err))
			}
		}
	}
	return errors.Join(errs...)
}

func (m *Manager) syncFDB(want Desired) error {
	have, err := m.d.Kernel.FDB()
	if err != nil {
		return err
	}
	var errs []error
	wanted := map[string]bool{}
	for _, v := range want.VTEPs {
		mac := v.MAC.String()
		wanted[mac] = true
		if dst, ok := have[mac]; ok && dst == v.NodeIP {
			continue
		}
		if err := m.d.Kernel.SetFDB(v.MAC, v.NodeIP); err != nil {
			errs = append(errs, fmt.Errorf("FDB entry of node %s: %w", v.Node, err))
			continue
		}
		m.log.WithFields(logrus.Fields{"node": v.Node, "vtep": v.Addr.String(), "nodeIP": v.NodeIP.String()}).Info("VXLAN peer programmed")
	}
	for mac, dst := range have {
		if wanted[mac] {
			continue
		}
		hw, err := net.ParseMAC(mac)
		if err != nil {
			continue
		}
		if err := m.d.Kernel.DelFDB(hw, dst); err != nil {
			errs = append(errs, fmt.Errorf("removing FDB entry %s: %w", mac, err))
			continue
		}
		m.log.WithFields(logrus.Fields{"mac": mac, "nodeIP": dst.String()}).Info("VXLAN peer removed")
	}
	return errors.Join(errs...)
}
