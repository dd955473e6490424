// Package dataplane programs the Linux kernel of one host (one network
// namespace) for Calico's pure L3 model: one veth per container endpoint with
// proxy ARP on the host side, one /32 (/128) route per local workload IP, and
// one blackhole route per locally owned IPAM block.
//
// Nothing here is bridged or encapsulated: the host is the container's router.
// The container is given the virtual gateway 169.254.1.1 (IPv6: the host
// side's link-local address), which the host side answers for by proxy ARP, so
// every packet a container sends is routed by the host.
package dataplane

import (
	"errors"
	"fmt"
	"net"

	"github.com/vishvananda/netlink"
)

const (
	// tempIfPrefix names the container side while it is still in the host
	// namespace; Docker moves it into the container and renames it eth*.
	tempIfPrefix = "tmp"
	// idPrefixLen chars of the endpoint id: "cali" + 11 = 15 = IFNAMSIZ-1,
	// the longest interface name the kernel accepts.
	idPrefixLen = 11

	defaultMTU = 1500
	// minMTUv4 is the smallest MTU IPv4 requires of a link (RFC 791).
	minMTUv4 = 68
	// minMTUv6 is the smallest MTU IPv6 requires of a link (RFC 8200).
	minMTUv6 = 1280
	maxMTU   = 65535
)

// GatewayIPv4 is the virtual IPv4 gateway every container uses. No interface
// owns it: the host side of the veth answers ARP for it by proxy ARP (which
// requires the host to have a route covering it, normally its default route).
// Being link-local, it never collides with a workload or host address.
const GatewayIPv4 = "169.254.1.1"

// GatewayIPv6 is the link-local address AddWorkload assigns to the host side
// of an IPv6 workload's veth, and so the IPv6 gateway (via GatewayIPv6 dev
// eth0) of every container.
//
// Why a fixed address rather than the kernel's EUI-64 one: the kernel only
// generates a link-local address once the link has carrier, i.e. after Docker
// has moved the container side and brought it up, which is after Join must
// already have answered with the gateway. And with the host side's MAC being
// ee:ee:ee:ee:ee:ee, like the container side's, both EUI-64 addresses would be
// fe80::ecee:eeff:feee:eeee and the container's duplicate address detection
// would fail. So address generation is switched off on the host side and
// fe80::1 is added with IFA_F_NODAD: usable at once, the same on every veth
// (link-local addresses are per link, so that is fine), and it cannot be an
// EUI-64 address, which always has ff:fe in the middle of its interface id.
const GatewayIPv6 = "fe80::1"

// RouteProtocol marks every route this package (and the project) installs, so
// that they can be told apart from the kernel's, the admin's and other
// daemons', listed, and cleaned up after a restart without touching anything
// else. 80 is not reserved in the kernel's rtnetlink.h nor in iproute2's
// rt_protos (bird is 12, zebra 11, babel 42, openr 99, bgp/isis/ospf/rip
// 186..189, eigrp 192). Note that Calico's own Felix also marks the routes it
// programs (e.g. its IPAM blackholes) with 80, which shows up as "proto 80" in
// `ip route`: running calico-cnm next to calico-node on one host is not
// supported anyway, and the shared number keeps `ip route` familiar to Calico
// users.
const RouteProtocol netlink.RouteProtocol = 80

// Workload is one container endpoint's host-side plumbing.
type Workload struct {
	EndpointID string           // Docker endpoint id (64 hex)
	HostIfName string           // "cali" + first 11 chars of EndpointID (HostIfName(id)); "" = derived
	TempIfName string           // container-side name while still in the host ns: "tmp" + first 11 chars; "" = derived
	MAC        net.HardwareAddr // container-side MAC, normally ee:ee:ee:ee:ee:ee; nil = that
	IPv4       *net.IPNet       // nil or a /32
	IPv6       *net.IPNet       // nil or a /128
	MTU        int              // 0 = 1500
	// GatewayIPv6 is the link-local address of the host side: the
	// container's IPv6 gateway. nil = GatewayIPv6 (see Gateways).
	GatewayIPv6 net.IP
}

// HostIfName is the name of the host side of the endpoint's veth.
func HostIfName(endpointID string) string {
	return HostIfPrefix + idPrefix(endpointID)
}

// TempIfName is the name of the container side of the endpoint's veth while it
// is still in the host namespace.
func TempIfName(endpointID string) string {
	return tempIfPrefix + idPrefix(endpointID)
}

func idPrefix(endpointID string) string {
	if len(endpointID) > idPrefixLen {
		return endpointID[:idPrefixLen]
	}
	return endpointID
}

// hostSideMAC is the MAC of every host-side veth (what Calico uses): the
// container's neighbour entry for the gateway then never changes, even if the
// veth is re-created. It is also the default container-side MAC.
func hostSideMAC() net.HardwareAddr { return net.HardwareAddr{0xee, 0xee, 0xee, 0xee, 0xee, 0xee} }

// validateEndpointID refuses ids that cannot give unique, valid interface
// names. The id must be at least 11 characters of [0-9a-zA-Z] at its start;
// Docker's are 64 lowercase hex.
func validateEndpointID(id string) error {
	if id == "" {
		return errors.New("empty endpoint id")
	}
	if len(id) < idPrefixLen {
		return fmt.Errorf("endpoint id %q is shorter than %d characters", id, idPrefixLen)
	}
	for _, c := range id[:idPrefixLen] {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z') {
			return fmt.Errorf("endpoint id %q: character %q is not allowed in an interface name", id, c)
		}
	}
	return nil
}

// normalize validates w and fills in the defaults, returning the workload that
// AddWorkload will program.
func (w Workload) normalize() (Workload, error) {
	if err := validateEndpointID(w.EndpointID); err != nil {
		return w, err
	}
	if w.HostIfName == "" {
		w.HostIfName = HostIfName(w.EndpointID)
	} else if w.HostIfName != HostIfName(w.EndpointID) {
		// RemoveWorkload finds the veth by the endpoint id alone, so any other
		// name would leak the veth.
		return w, fmt.Errorf("host interface name %q does not match endpoint id (want %q)", w.HostIfName, HostIfName(w.EndpointID))
	}
	if w.TempIfName == "" {
		w.TempIfName = TempIfName(w.EndpointID)
	} else if w.TempIfName != TempIfName(w.EndpointID) {
		return w, fmt.Errorf("temporary interface name %q does not match endpoint id (want %q)", w.TempIfName, TempIfName(w.EndpointID))
	}
	if w.MAC == nil {
		w.MAC = hostSideMAC()
	}
	if len(w.MAC) != 6 {
		return w, fmt.Errorf("container MAC %q is not a 48-bit Ethernet address", w.MAC)
	}
	if w.MAC[0]&1 != 0 {
		return w, fmt.Errorf("container MAC %s is a multicast address", w.MAC)
	}
	if w.IPv4 == nil && w.IPv6 == nil {
		return w, errors.New("workload has no IP address")
	}
	var err error
	if w.IPv4, err = ipv4Family.hostAddress(w.IPv4); err != nil {
		return w, err
	}
	if w.IPv6, err = ipv6Family.hostAddress(w.IPv6); err != nil {
		return w, err
	}
	if w.IPv6 != nil {
		if w.GatewayIPv6 == nil {
			w.GatewayIPv6 = net.ParseIP(GatewayIPv6)
		}
		if !w.GatewayIPv6.IsLinkLocalUnicast() || w.GatewayIPv6.To4() != nil {
			return w, fmt.Errorf("IPv6 gateway %s is not an IPv6 link-local address", w.GatewayIPv6)
		}
	}
	if w.MTU == 0 {
		w.MTU = defaultMTU
	}
	minMTU := minMTUv4
	if w.IPv6 != nil {
		minMTU = minMTUv6
	}
	if w.MTU < minMTU || w.MTU > maxMTU {
		return w, fmt.Errorf("MTU %d is outside [%d, %d]", w.MTU, minMTU, maxMTU)
	}
	return w, nil
}

// hostRouteDst is the /32 or /128 of ip, whatever mask the caller passed.
func hostRouteDst(ip net.IP) (*net.IPNet, error) {
	if ip4 := ip.To4(); ip4 != nil {
		return &net.IPNet{IP: ip4, Mask: net.CIDRMask(32, 32)}, nil
	}
	if ip16 := ip.To16(); ip16 != nil {
		return &net.IPNet{IP: ip16, Mask: net.CIDRMask(128, 128)}, nil
	}
	return nil, fmt.Errorf("invalid IP address %v", ip)
}

// addrFamily is what normalize checks a workload address against.
type addrFamily struct {
	name string // "IPv4", "IPv6"
	bits int
	// of is ip in the family's form, or nil when ip is not of the family.
	of func(ip net.IP) net.IP
	// unicast says what the address must be, as the error puts it.
	unicast string
}

var (
	ipv4Family = addrFamily{name: "IPv4", bits: 32, of: net.IP.To4, unicast: "a unicast address"}
	ipv6Family = addrFamily{name: "IPv6", bits: 128, of: to16Only, unicast: "a global unicast address"}
)

// to16Only is ip in 16-byte form, or nil for an IPv4 address (which To16
// would map).
func to16Only(ip net.IP) net.IP {
	if ip.To4() != nil {
		return nil
	}
	return ip.To16()
}

// hostAddress checks that ipn is a single unicast address of the family
// and returns it in the family's form with a full mask; nil (no address of
// this family) stays nil.
func (f addrFamily) hostAddress(ipn *net.IPNet) (*net.IPNet, error) {
	if ipn == nil {
		return nil, nil
	}
	ip := f.of(ipn.IP)
	if ip == nil {
		return nil, fmt.Errorf("%s address %s is not an %s address", f.name, ipn, f.name)
	}
	if ones, bits := ipn.Mask.Size(); ones != f.bits || bits != f.bits {
		return nil, fmt.Errorf("%s address %s is not a /%d", f.name, ipn, f.bits)
	}
	if !ip.IsGlobalUnicast() {
		return nil, fmt.Errorf("%s address %s is not %s", f.name, ipn, f.unicast)
	}
	return &net.IPNet{IP: ip, Mask: net.CIDRMask(f.bits, f.bits)}, nil
}
