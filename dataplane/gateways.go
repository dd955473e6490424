package dataplane

import (
	"fmt"
	"net"
)

// MaxGatewayIndex bounds the calico interfaces of one container: the
// gateways are 169.254.1.1 .. 169.254.1.254.
const MaxGatewayIndex = 254

// Gateways returns the virtual gateways of a container's calico interface
// number index (1 = the first: GatewayIPv4 and GatewayIPv6).
//
// Why one per interface: Docker adds every interface's on-link route to its
// gateway to the container, and two interfaces with the same 169.254.1.1/32
// (or fe80::1/128) collide ("file exists", Calico's calicoctl#1031). The
// addresses of interface n are 169.254.1.n and fe80::n: link-local, so they
// never meet a workload or host address, and deterministic, so Join can
// hand them out knowing only which indexes the container's other calico
// interfaces hold. IPv4 needs nothing on the host side: proxy ARP answers
// for any address the host routes out of another interface, and the whole
// 169.254.1.0/24 is routed the same way as 169.254.1.1 (the host's default
// route). IPv6 has no proxy for its gateway: AddWorkload puts the address
// on the host side (Workload.GatewayIPv6).
func Gateways(index int) (v4, v6 net.IP, err error) {
	if index < 1 || index > MaxGatewayIndex {
		return nil, nil, fmt.Errorf("gateway index %d is outside [1, %d]: a container has at most %d calico interfaces", index, MaxGatewayIndex, MaxGatewayIndex)
	}
	v4 = net.IPv4(169, 254, 1, byte(index)).To4()
	v6 = make(net.IP, net.IPv6len)
	copy(v6, net.ParseIP(GatewayIPv6))
	v6[15] = byte(index)
	return v4, v6, nil
}
