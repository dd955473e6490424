package wireguard

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"

	"github.com/calico-cnm/calico-cnm/internal/nldump"
	"golang.org/x/sys/unix"
)

// Protocol marks the routes of RouteTable ("proto 83"): after the
// dataplane's 80, BGP's 81 and VXLAN's 82, so that each owner's cleanup
// deletes only its own routes.
const Protocol netlink.RouteProtocol = 83

// Kernel is the routing side of the manager: RouteTable's routes, the
// rule that consults it, and the uplink. Unit tests use a fake.
type Kernel interface {
	// UplinkMTU is the MTU of the interface holding addr.
	UplinkMTU(addr netip.Addr) (int, error)
	Routes() (map[netip.Prefix]Route, error)
	SetRoute(r Route) error
	DelRoute(dst netip.Prefix) error
	// EnsureRule installs the rule (RulePriority: every packet not
	// marked FirewallMark looks up RouteTable); RemoveRule deletes it.
	EnsureRule() error
	RemoveRule() error
	// RemoveDevice deletes wireguard.cali if it is there (left by an
	// earlier run while WireGuard was turned off).
	RemoveDevice() error
	// DeviceExists says whether wireguard.cali is there.
	DeviceExists() (bool, error)
	// SetDeviceAddr makes addr (a /32; invalid: none) the only address
	// of wireguard.cali.
	SetDeviceAddr(addr netip.Addr) error
}

// Netlink is Kernel on rtnetlink in the current network namespace.
type Netlink struct{ h *netlink.Handle }

// NewNetlink opens rtnetlink.
func NewNetlink() (*Netlink, error) {
	h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("opening rtnetlink: %w", err)
	}
	return &Netlink{h: h}, nil
}

// Close releases the socket; routes and rule stay.
func (k *Netlink) Close() { k.h.Close() }

// UplinkMTU finds the interface that holds addr.
func (k *Netlink) UplinkMTU(addr netip.Addr) (int, error) {
	// Its own socket, not k.h: Docker's requests ask for MTUs while a
	// pass uses k.h.
	addrs, err := netlink.AddrList(nil, netlink.FAMILY_V4)
	if err != nil {
		return 0, fmt.Errorf("listing addresses: %w", err)
	}
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); ok && ip.Unmap() == addr {
			l, err := netlink.LinkByIndex(a.LinkIndex)
			if err != nil {
				return 0, fmt.Errorf("reading the interface of %s: %w", addr, err)
			}
			return l.Attrs().MTU, nil
		}
	}
	return 0, fmt.Errorf("no interface holds the node address %s", addr)
}

// RemoveDevice deletes wireguard.cali if it is there.
func (k *Netlink) RemoveDevice() error { return deleteLink() }

// SetDeviceAddr makes addr the only IPv4 address of wireguard.cali.
func (k *Netlink) SetDeviceAddr(addr netip.Addr) error {
	l, err := k.h.LinkByName(Device)
	if err != nil {
		return fmt.Errorf("reading %s: %w", Device, err)
	}
	have, err := k.h.AddrList(l, netlink.FAMILY_V4)
	if err != nil {
		return fmt.Errorf("listing the addresses of %s: %w", Device, err)
	}
	found := false
	for _, a := range have {
		ip, _ := netip.AddrFromSlice(a.IP)
		ones, _ := a.Mask.Size()
		if addr.IsValid() && ip.Unmap() == addr && ones == 32 {
			found = true
			continue
		}
		if err := k.h.AddrDel(l, &a); err != nil {
			return fmt.Errorf("removing %s from %s: %w", a.IPNet, Device, err)
		}
	}
	if found || !addr.IsValid() {
		return nil
	}
	a := &netlink.Addr{IPNet: &net.IPNet{IP: addr.AsSlice(), Mask: net.CIDRMask(32, 32)}}
	if err := k.h.AddrAdd(l, a); err != nil {
		return fmt.Errorf("adding %s to %s: %w", addr, Device, err)
	}
	return nil
}

// Routes lists RouteTable.
func (k *Netlink) Routes() (map[netip.Prefix]Route, error) {
	rs, err := nldump.Retry(func() ([]netlink.Route, error) {
		return k.h.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: RouteTable}, netlink.RT_FILTER_TABLE)
	})
	if err != nil {
		return nil, fmt.Errorf("listing table %d: %w", RouteTable, err)
	}
	idx := k.deviceIndex()
	out := map[netip.Prefix]Route{}
	for _, r := range rs {
		if r.Dst == nil {
			continue
		}
		dst, ok := prefixOf(r.Dst.IP, r.Dst.Mask)
		if !ok {
			continue
		}
		switch {
		case r.Type == unix.RTN_UNREACHABLE:
			out[dst] = Route{Dst: dst, Type: RouteUnreachable}
		case r.Type == unix.RTN_THROW:
			out[dst] = Route{Dst: dst, Type: RouteThrow}
		case r.LinkIndex == idx && idx != 0:
			out[dst] = Route{Dst: dst, Type: RouteTunnel}
		default:
			// Through a device that is gone or not ours: replaced.
			out[dst] = Route{Dst: dst}
		}
	}
	return out, nil
}

// DeviceExists says whether wireguard.cali is there.
func (k *Netlink) DeviceExists() (bool, error) {
	_, err := k.h.LinkByName(Device)
	var nf netlink.LinkNotFoundError
	switch {
	case err == nil:
		return true, nil
	case errors.As(err, &nf):
		return false, nil
	}
	return false, fmt.Errorf("reading %s: %w", Device, err)
}

func (k *Netlink) deviceIndex() int {
	l, err := k.h.LinkByName(Device)
	if err != nil {
		return 0
	}
	return l.Attrs().Index
}

// SetRoute adds or replaces r in RouteTable.
func (k *Netlink) SetRoute(r Route) error {
	dst := net.IPNet{IP: r.Dst.Addr().AsSlice(), Mask: net.CIDRMask(r.Dst.Bits(), r.Dst.Addr().BitLen())}
	nr := &netlink.Route{Dst: &dst, Table: RouteTable, Protocol: Protocol}
	switch r.Type {
	case RouteTunnel:
		idx := k.deviceIndex()
		if idx == 0 {
			return fmt.Errorf("%s does not exist", Device)
		}
		nr.LinkIndex, nr.Scope = idx, netlink.SCOPE_LINK
	case RouteUnreachable:
		nr.Type = unix.RTN_UNREACHABLE
	case RouteThrow:
		nr.Type = unix.RTN_THROW
	default:
		return fmt.Errorf("route to %s: unknown type %q", r.Dst, r.Type)
	}
	return k.h.RouteReplace(nr)
}

// DelRoute deletes the route to dst from RouteTable.
func (k *Netlink) DelRoute(dst netip.Prefix) error {
	d := net.IPNet{IP: dst.Addr().AsSlice(), Mask: net.CIDRMask(dst.Bits(), dst.Addr().BitLen())}
	err := k.h.RouteDel(&netlink.Route{Dst: &d, Table: RouteTable})
	if errors.Is(err, unix.ESRCH) {
		return nil
	}
	return err
}

// families are those RouteTable serves: IPv6 blocks are routed between
// the hosts as IPv4 ones are, and must not bypass the tunnel.
var families = [...]int{netlink.FAMILY_V4, netlink.FAMILY_V6}

func rule(family int) *netlink.Rule {
	r := netlink.NewRule()
	r.Family = family
	r.Priority, r.Table = RulePriority, RouteTable
	mask := uint32(FirewallMark)
	r.Mark, r.Mask, r.Invert = FirewallMark, &mask, true
	return r
}

// noIPv6 is a kernel without IPv6 (nothing to route, nothing to leak).
func noIPv6(family int, err error) bool {
	return family == netlink.FAMILY_V6 && errors.Is(err, unix.EAFNOSUPPORT)
}

// EnsureRule: `not fwmark 0x100000/0x100000 lookup 99`, priority 99, for
// IPv4 and IPv6.
func (k *Netlink) EnsureRule() error {
	var errs []error
	for _, family := range families {
		if err := k.ensureRule(family); err != nil && !noIPv6(family, err) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (k *Netlink) ensureRule(family int) error {
	rules, err := nldump.Retry(func() ([]netlink.Rule, error) { return k.h.RuleList(family) })
	if err != nil {
		return fmt.Errorf("listing rules: %w", err)
	}
	for _, r := range rules {
		if r.Priority == RulePriority && r.Table == RouteTable && r.Invert && r.Mark == FirewallMark {
			return nil
		}
	}
	if err := k.h.RuleAdd(rule(family)); err != nil {
		return fmt.Errorf("adding the rule to table %d: %w", RouteTable, err)
	}
	return nil
}

// RemoveRule deletes the rules if they are there.
func (k *Netlink) RemoveRule() error {
	var errs []error
	for _, family := range families {
		err := k.h.RuleDel(rule(family))
		if err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.ESRCH) && !noIPv6(family, err) {
			errs = append(errs, fmt.Errorf("removing the rule to table %d: %w", RouteTable, err))
		}
	}
	return errors.Join(errs...)
}
