package routing

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sort"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// DetectAddress finds this node's BGP address in the current network
// namespace with the given method (see ParseAutodetect).
func DetectAddress(method string) (netip.Addr, error) {
	m, err := ParseAutodetect(method)
	if err != nil {
		return netip.Addr{}, err
	}
	switch {
	case m.Interface != nil:
		links, err := netlink.LinkList()
		if err != nil {
			return netip.Addr{}, fmt.Errorf("listing interfaces: %w", err)
		}
		sort.Slice(links, func(i, j int) bool { return links[i].Attrs().Index < links[j].Attrs().Index })
		for _, l := range links {
			if !m.Interface.MatchString(l.Attrs().Name) {
				continue
			}
			if a, ok := firstGlobalIPv4(l); ok {
				return a, nil
			}
		}
		return netip.Addr{}, fmt.Errorf("no interface matching %q has an IPv4 address", m.Interface.String())
	case m.CanReach.IsValid():
		routes, err := netlink.RouteGet(net.IP(m.CanReach.AsSlice()))
		if err != nil {
			return netip.Addr{}, fmt.Errorf("no route to %s: %w", m.CanReach, err)
		}
		for _, r := range routes {
			if a, ok := netip.AddrFromSlice(r.Src.To4()); ok && r.Src != nil && !a.IsLoopback() {
				return a, nil
			}
		}
		return netip.Addr{}, fmt.Errorf("the route to %s has no usable source address", m.CanReach)
	}
	// first-found: the interface holding the default route.
	routes, err := netlink.RouteList(nil, netlink.FAMILY_V4)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("listing routes: %w", err)
	}
	for _, r := range routes {
		if r.Dst != nil {
			if ones, _ := r.Dst.Mask.Size(); ones != 0 {
				continue
			}
		}
		l, err := netlink.LinkByIndex(r.LinkIndex)
		if err != nil {
			continue
		}
		if a, ok := firstGlobalIPv4(l); ok {
			return a, nil
		}
	}
	return netip.Addr{}, errors.New("no default route: set the node address with --bgp-node-ip (env IP) or --ip-autodetection-method")
}

// DetectIPv6 finds the IPv6 next hop for this node: the first global IPv6
// address of the interface that holds v4 (the BGP address), so IPv6 traffic
// takes the same path as the sessions. ok is false when it has none.
func DetectIPv6(v4 netip.Addr) (netip.Addr, bool, error) {
	links, err := netlink.LinkList()
	if err != nil {
		return netip.Addr{}, false, fmt.Errorf("listing interfaces: %w", err)
	}
	for _, l := range links {
		addrs, err := netlink.AddrList(l, netlink.FAMILY_V4)
		if err != nil {
			continue
		}
		for _, a := range addrs {
			if ip, ok := netip.AddrFromSlice(a.IP.To4()); ok && ip == v4 {
				v6, found := firstGlobalIPv6(l)
				return v6, found, nil
			}
		}
	}
	return netip.Addr{}, false, nil
}

func firstGlobalIPv6(l netlink.Link) (netip.Addr, bool) {
	addrs, err := netlink.AddrList(l, netlink.FAMILY_V6)
	if err != nil {
		return netip.Addr{}, false
	}
	for _, a := range addrs {
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok || a.IP.To4() != nil || ip.IsLoopback() || ip.IsLinkLocalUnicast() || a.Flags&(unix.IFA_F_TENTATIVE|unix.IFA_F_DADFAILED|unix.IFA_F_DEPRECATED) != 0 {
			continue
		}
		return ip, true
	}
	return netip.Addr{}, false
}

func firstGlobalIPv4(l netlink.Link) (netip.Addr, bool) {
	addrs, err := netlink.AddrList(l, netlink.FAMILY_V4)
	if err != nil {
		return netip.Addr{}, false
	}
	for _, a := range addrs {
		ip, ok := netip.AddrFromSlice(a.IP.To4())
		if ok && !ip.IsLoopback() && !ip.IsLinkLocalUnicast() {
			return ip, true
		}
	}
	return netip.Addr{}, false
}
