package routing

import (
	"context"
	"net/netip"
	"slices"
	"strings"

	"github.com/sirupsen/logrus"
)

// VXLANStatus is the VXLAN part of `node status`.
type VXLANStatus struct {
	Device string `json:"device,omitempty"` // "" while no pool uses VXLAN
	VTEP   string `json:"vtep,omitempty"`
	MAC    string `json:"mac,omitempty"`
	MTU    int    `json:"mtu,omitempty"`
	// Passes counts completed syncs (tests wait for one instead of
	// sleeping).
	Passes uint64            `json:"passes"`
	Nodes  []VXLANNodeStatus `json:"nodes"`
}

// VXLANNodeStatus is one remote node as this node reaches it.
type VXLANNodeStatus struct {
	Name   string    `json:"name"`
	NodeIP string    `json:"nodeIP,omitempty"`
	VTEP   string    `json:"vtep,omitempty"`
	MAC    string    `json:"mac,omitempty"`
	Routes RouteKind `json:"routes"`
	Blocks []string  `json:"blocks,omitempty"` // routed by VXLAN (via VTEP or directly)
}

// publish records the pass's result for Owns and Status.
func (m *VXLANManager) publish(want VXLANDesired, vtep netip.Addr) {
	st := VXLANStatus{Nodes: []VXLANNodeStatus{}}
	if want.Needed && vtep.IsValid() {
		st.Device, st.VTEP, st.MAC, st.MTU = VXLANDevice, vtep.String(), VTEPMAC(m.d.NodeName).String(), m.uplink.MTU-VXLANOverhead
	}
	byNode := map[string]*VXLANNodeStatus{}
	for name, kind := range want.Kinds {
		byNode[name] = &VXLANNodeStatus{Name: name, Routes: kind}
	}
	for _, v := range want.VTEPs {
		n, ok := byNode[v.Node]
		if !ok {
			n = &VXLANNodeStatus{Name: v.Node, Routes: RouteNone}
			byNode[v.Node] = n
		}
		n.NodeIP, n.VTEP, n.MAC = v.NodeIP.String(), v.Addr.String(), v.MAC.String()
	}
	owner := map[netip.Addr]string{}
	for _, v := range want.VTEPs {
		owner[v.Addr], owner[v.NodeIP] = v.Node, v.Node
	}
	for dst, r := range want.Routes {
		if n, ok := byNode[owner[r.Via]]; ok {
			n.Blocks = append(n.Blocks, dst.String())
		}
	}
	for _, n := range byNode {
		slices.Sort(n.Blocks)
		st.Nodes = append(st.Nodes, *n)
	}
	slices.SortFunc(st.Nodes, func(a, b VXLANNodeStatus) int { return strings.Compare(a.Name, b.Name) })
	m.mu.Lock()
	defer m.mu.Unlock()
	st.Passes = m.status.Passes + 1
	m.desired, m.status = want, st
}

// Status is the last pass's result.
func (m *VXLANManager) Status() VXLANStatus {
	m.mu.Lock()
	defer m.mu.Unlock()
	st := m.status
	st.Nodes = slices.Clone(st.Nodes)
	return st
}

// VXLANRouter is what the BGP agent asks the VXLAN manager.
type VXLANRouter interface {
	Owns(dst netip.Prefix) bool
	Status() VXLANStatus
}

// leaveToVXLAN drops the learned routes whose destinations VXLAN routes:
// for an Always pool (and a CrossSubnet pool's remote-subnet nodes) the
// encapsulated route must win over the path BGP learned.
func leaveToVXLAN(routes map[netip.Prefix][]netip.Addr, v VXLANRouter) {
	if v == nil {
		return
	}
	for dst := range routes {
		if v.Owns(dst) {
			delete(routes, dst)
		}
	}
}

func vxlanStatus(v VXLANRouter) *VXLANStatus {
	if v == nil {
		return nil
	}
	st := v.Status()
	return &st
}

// ServeVXLANStatus serves `node status` on the status socket when BGP is
// off (with BGP on the agent serves it, VXLAN included).
func ServeVXLANStatus(ctx context.Context, path, node string, m *VXLANManager, log logrus.FieldLogger) error {
	return serveStatus(ctx, path, func(context.Context) Status {
		st := m.Status()
		return Status{Node: node, BGPOff: true, Peers: []PeerStatus{}, Advertised: []string{}, Routes: []RouteStatus{}, VXLAN: &st}
	}, log)
}
