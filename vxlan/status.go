package vxlan

import (
	"net/netip"
	"slices"
	"strings"

	"github.com/calico-cnm/calico-cnm/routing"
)

// publish records the pass's result for Owns and Status.
func (m *Manager) publish(want Desired, vtep netip.Addr) {
	st := routing.VXLANStatus{Nodes: []routing.VXLANNodeStatus{}}
	if want.Needed && vtep.IsValid() {
		st.Device, st.VTEP, st.MAC, st.MTU = Device, vtep.String(), VTEPMAC(m.d.NodeName).String(), m.uplink.MTU-Overhead
	}
	byNode := map[string]*routing.VXLANNodeStatus{}
	for name, kind := range want.Kinds {
		byNode[name] = &routing.VXLANNodeStatus{Name: name, Routes: kind}
	}
	for _, v := range want.VTEPs {
		n, ok := byNode[v.Node]
		if !ok {
			n = &routing.VXLANNodeStatus{Name: v.Node, Routes: routing.RouteNone}
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
	slices.SortFunc(st.Nodes, func(a, b routing.VXLANNodeStatus) int { return strings.Compare(a.Name, b.Name) })
	m.mu.Lock()
	defer m.mu.Unlock()
	st.Passes = m.status.Passes + 1
	m.desired, m.status = want, st
}

// Status is the last pass's result.
func (m *Manager) Status() routing.VXLANStatus {
	m.mu.Lock()
	defer m.mu.Unlock()
	st := m.status
	st.Nodes = slices.Clone(st.Nodes)
	return st
}
