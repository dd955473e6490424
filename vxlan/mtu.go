package vxlan

import (
	"context"
	"fmt"
	"net"
	"net/netip"

	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/ipam"
)

// WorkloadMTU is the MTU for a container interface with address ip: the
// uplink's MTU minus Overhead when ip is in a pool that may
// encapsulate (Always or CrossSubnet: one MTU for every destination, so
// that no path needs fragmentation), 0 (the default) otherwise.
func (m *Manager) WorkloadMTU(ctx context.Context, ip net.IP) (int, error) {
	a, ok := netip.AddrFromSlice(ip)
	if !ok {
		return 0, nil
	}
	a = a.Unmap()
	recs, _ := m.d.Records.List(ipam.PoolsPrefix)
	encap := false
	for _, p := range datastore.Values[ipam.PoolInfo](recs) {
		if p.Prefix.Contains(a) {
			encap = p.Encapsulates()
		}
	}
	if !encap {
		return 0, nil
	}
	m.mu.Lock()
	mtu := m.uplinkMTU
	m.mu.Unlock()
	if mtu == 0 {
		var err error
		if mtu, err = m.detectUplinkMTU(); err != nil {
			return 0, err
		}
	}
	return mtu - Overhead, nil
}

// detectUplinkMTU finds the MTU of the interface holding the node address
// without the manager's netlink handle, which belongs to its own goroutine.
func (m *Manager) detectUplinkMTU() (int, error) {
	var addr netip.Addr
	var err error
	if m.d.Config.NodeIP != "" {
		addr, err = netip.ParseAddr(m.d.Config.NodeIP)
	} else {
		addr, err = m.d.DetectAddress(m.d.Config.AutodetectMethod)
	}
	if err != nil {
		return 0, fmt.Errorf("detecting the node address for the MTU: %w", err)
	}
	ifs, err := net.Interfaces()
	if err != nil {
		return 0, err
	}
	for _, ifc := range ifs {
		addrs, err := ifc.Addrs()
		if err != nil {
			continue
		}
		for _, x := range addrs {
			if n, ok := x.(*net.IPNet); ok && n.IP.Equal(net.IP(addr.AsSlice())) {
				return ifc.MTU, nil
			}
		}
	}
	return 0, fmt.Errorf("no interface holds the node address %s", addr)
}
