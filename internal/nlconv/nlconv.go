// Package nlconv converts between netlink's net types and net/netip for
// the managers that program routes (routing, vxlan).
package nlconv

import (
	"cmp"
	"net"
	"net/netip"
)

// AddrFromIP converts a gateway; ok is false for none.
func AddrFromIP(ip net.IP) (netip.Addr, bool) {
	if ip == nil {
		return netip.Addr{}, false
	}
	a, ok := netip.AddrFromSlice(ip)
	return a.Unmap(), ok
}

// PrefixFromIPNet converts a netlink destination; ok is false for a
// malformed one.
func PrefixFromIPNet(n net.IPNet) (netip.Prefix, bool) {
	a, ok := netip.AddrFromSlice(n.IP)
	if !ok {
		return netip.Prefix{}, false
	}
	ones, _ := n.Mask.Size()
	return netip.PrefixFrom(a.Unmap(), ones).Masked(), true
}

// IPNetFromPrefix converts a destination for netlink.
func IPNetFromPrefix(p netip.Prefix) net.IPNet {
	bits := 32
	if p.Addr().Is6() {
		bits = 128
	}
	return net.IPNet{IP: net.IP(p.Masked().Addr().AsSlice()), Mask: net.CIDRMask(p.Bits(), bits)}
}

// ComparePrefix orders prefixes by address, then length (slices.SortFunc).
func ComparePrefix(a, b netip.Prefix) int {
	if c := a.Addr().Compare(b.Addr()); c != 0 {
		return c
	}
	return cmp.Compare(a.Bits(), b.Bits())
}
