package vxlan

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/calico-cnm/calico-cnm/internal/nlconv"
	"github.com/calico-cnm/calico-cnm/internal/nldump"
	"github.com/calico-cnm/calico-cnm/routing"
)

// Uplink is the interface holding the node's underlay address.
type Uplink struct {
	Index  int
	Name   string
	Subnet netip.Prefix
	MTU    int
}

// DeviceSpec is what vxlan.calico must look like.
type DeviceSpec struct {
	Local  netip.Addr // source of encapsulated packets: the node address
	Parent int        // the uplink's index
	MAC    net.HardwareAddr
	MTU    int
	Addr   netip.Addr // the VTEP address, as a /32
}

// Kernel is the netlink side of the VXLAN manager; unit tests use a
// fake. Neighbours, FDB entries and routes are only ever those of
// vxlan.calico and of Protocol.
type Kernel interface {
	Uplink(addr netip.Addr) (Uplink, error)
	EnsureDevice(spec DeviceSpec) error
	// RemoveDevice deletes vxlan.calico (its neighbours, FDB entries and
	// device routes go with it); nil when there is none.
	RemoveDevice() error
	Neighbors() (map[netip.Addr]string, error) // VTEP address -> MAC
	SetNeighbor(ip netip.Addr, mac net.HardwareAddr) error
	DelNeighbor(ip netip.Addr) error
	FDB() (map[string]netip.Addr, error) // MAC -> node address
	SetFDB(mac net.HardwareAddr, dst netip.Addr) error
	DelFDB(mac net.HardwareAddr, dst netip.Addr) error
	Routes() ([]Route, error)
	// SetRoute installs r with Protocol, replacing a BGP-learned
	// route (routing.LearnedProtocol) to the same destination: VXLAN takes
	// precedence for its pools. A route of any other owner is left alone
	// and routing.ErrRouteConflict returned.
	SetRoute(r Route) error
	DelRoute(dst netip.Prefix) error
}

// Netlink programs vxlan.calico in the process's network namespace.
type Netlink struct {
	h *netlink.Handle
}

// NewNetlink opens rtnetlink in the current network namespace.
func NewNetlink() (*Netlink, error) {
	h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("opening rtnetlink: %w", err)
	}
	return &Netlink{h: h}, nil
}

// Close releases the netlink socket; the device stays.
func (k *Netlink) Close() { k.h.Close() }

// Uplink finds the interface that holds addr.
func (k *Netlink) Uplink(addr netip.Addr) (Uplink, error) {
	addrs, err := k.h.AddrList(nil, netlink.FAMILY_V4)
	if err != nil {
		return Uplink{}, fmt.Errorf("listing addresses: %w", err)
	}
	for _, a := range addrs {
		ip, ok := nlconv.AddrFromIP(a.IP)
		if !ok || ip != addr {
			continue
		}
		link, err := k.h.LinkByIndex(a.LinkIndex)
		if err != nil {
			return Uplink{}, fmt.Errorf("reading the interface of %s: %w", addr, err)
		}
		ones, _ := a.Mask.Size()
		return Uplink{Index: a.LinkIndex, Name: link.Attrs().Name, Subnet: netip.PrefixFrom(ip, ones).Masked(), MTU: link.Attrs().MTU}, nil
	}
	return Uplink{}, fmt.Errorf("no interface holds the node address %s", addr)
}

func (k *Netlink) device() (*netlink.Vxlan, error) {
	l, err := k.h.LinkByName(Device)
	var nf netlink.LinkNotFoundError
	if errors.As(err, &nf) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	v, ok := l.(*netlink.Vxlan)
	if !ok {
		return nil, fmt.Errorf("%s exists but is a %s device, not vxlan", Device, l.Type())
	}
	return v, nil
}

// EnsureDevice creates vxlan.calico or brings it in line with spec. A
// device whose identity (VNI, port, source, parent, learning) differs is
// recreated; MTU and MAC are changed in place. Checksum offload is left as
// the kernel sets it (on): turning it off costs most of the throughput.
func (k *Netlink) EnsureDevice(spec DeviceSpec) error {
	cur, err := k.device()
	if err != nil {
		return err
	}
	local := net.IP(spec.Local.AsSlice())
	if cur != nil && (cur.VxlanId != VNI || cur.Port != Port || !cur.SrcAddr.Equal(local) || cur.VtepDevIndex != spec.Parent || cur.Learning) {
		if err := k.h.LinkDel(cur); err != nil {
			return fmt.Errorf("removing the outdated %s: %w", Device, err)
		}
		cur = nil
	}
	if cur == nil {
		dev := &netlink.Vxlan{
			LinkAttrs: netlink.LinkAttrs{Name: Device, HardwareAddr: spec.MAC, MTU: spec.MTU},
			VxlanId:   VNI, VtepDevIndex: spec.Parent, SrcAddr: local, Port: Port, Learning: false,
		}
		if err := k.h.LinkAdd(dev); err != nil {
			return fmt.Errorf("creating %s: %w", Device, err)
		}
		if cur, err = k.device(); err != nil || cur == nil {
			return fmt.Errorf("reading back %s: %v", Device, err)
		}
	}
	if cur.MTU != spec.MTU {
		if err := k.h.LinkSetMTU(cur, spec.MTU); err != nil {
			return fmt.Errorf("setting the MTU of %s: %w", Device, err)
		}
	}
	if cur.HardwareAddr.String() != spec.MAC.String() {
		if err := k.h.LinkSetHardwareAddr(cur, spec.MAC); err != nil {
			return fmt.Errorf("setting the MAC of %s: %w", Device, err)
		}
	}
	if err := k.ensureAddr(cur, spec.Addr); err != nil {
		return err
	}
	if cur.Attrs().Flags&net.FlagUp == 0 {
		if err := k.h.LinkSetUp(cur); err != nil {
			return fmt.Errorf("bringing %s up: %w", Device, err)
		}
	}
	return nil
}

// ensureAddr leaves exactly addr/32 on the device.
func (k *Netlink) ensureAddr(dev netlink.Link, addr netip.Addr) error {
	have, err := k.h.AddrList(dev, netlink.FAMILY_V4)
	if err != nil {
		return fmt.Errorf("listing the addresses of %s: %w", Device, err)
	}
	found := false
	for _, a := range have {
		ones, _ := a.Mask.Size()
		if ip, ok := nlconv.AddrFromIP(a.IP); ok && ip == addr && ones == 32 {
			found = true
			continue
		}
		if err := k.h.AddrDel(dev, &a); err != nil {
			return fmt.Errorf("removing %s from %s: %w", a.IPNet, Device, err)
		}
	}
	if found {
		return nil
	}
	n := nlconv.IPNetFromPrefix(netip.PrefixFrom(addr, 32))
	if err := k.h.AddrAdd(dev, &netlink.Addr{IPNet: &n}); err != nil {
		return fmt.Errorf("adding %s to %s: %w", addr, Device, err)
	}
	return nil
}

// RemoveDevice deletes vxlan.calico.
func (k *Netlink) RemoveDevice() error {
	cur, err := k.device()
	if err != nil || cur == nil {
		return err
	}
	return k.h.LinkDel(cur)
}

func (k *Netlink) index() (int, error) {
	cur, err := k.device()
	if err != nil {
		return 0, err
	}
	if cur == nil {
		return 0, fmt.Errorf("%s does not exist", Device)
	}
	return cur.Index, nil
}

// Neighbors lists the permanent IPv4 neighbours of the device.
func (k *Netlink) Neighbors() (map[netip.Addr]string, error) {
	out := map[netip.Addr]string{}
	idx, err := k.index()
	if err != nil {
		return out, nil
	}
	ns, err := k.h.NeighList(idx, netlink.FAMILY_V4)
	if err != nil {
		return nil, fmt.Errorf("listing neighbours of %s: %w", Device, err)
	}
	for _, n := range ns {
		if ip, ok := nlconv.AddrFromIP(n.IP); ok && n.State&netlink.NUD_PERMANENT != 0 {
			out[ip] = n.HardwareAddr.String()
		}
	}
	return out, nil
}

// SetNeighbor adds or replaces the permanent entry VTEP address -> MAC.
func (k *Netlink) SetNeighbor(ip netip.Addr, mac net.HardwareAddr) error {
	idx, err := k.index()
	if err != nil {
		return err
	}
	return k.h.NeighSet(&netlink.Neigh{LinkIndex: idx, Family: netlink.FAMILY_V4, State: netlink.NUD_PERMANENT, IP: net.IP(ip.AsSlice()), HardwareAddr: mac})
}

// DelNeighbor removes the entry for ip.
func (k *Netlink) DelNeighbor(ip netip.Addr) error {
	idx, err := k.index()
	if err != nil {
		return err
	}
	err = k.h.NeighDel(&netlink.Neigh{LinkIndex: idx, Family: netlink.FAMILY_V4, IP: net.IP(ip.AsSlice())})
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	return err
}

// FDB lists the device's forwarding entries that have a destination.
func (k *Netlink) FDB() (map[string]netip.Addr, error) {
	out := map[string]netip.Addr{}
	idx, err := k.index()
	if err != nil {
		return out, nil
	}
	ns, err := k.h.NeighList(idx, unix.AF_BRIDGE)
	if err != nil {
		return nil, fmt.Errorf("listing the FDB of %s: %w", Device, err)
	}
	for _, n := range ns {
		if ip, ok := nlconv.AddrFromIP(n.IP); ok && len(n.HardwareAddr) == 6 {
			out[n.HardwareAddr.String()] = ip
		}
	}
	return out, nil
}

func (k *Netlink) fdbEntry(mac net.HardwareAddr, dst netip.Addr) (*netlink.Neigh, error) {
	idx, err := k.index()
	if err != nil {
		return nil, err
	}
	return &netlink.Neigh{LinkIndex: idx, Family: unix.AF_BRIDGE, Flags: netlink.NTF_SELF, State: netlink.NUD_PERMANENT, IP: net.IP(dst.AsSlice()), HardwareAddr: mac}, nil
}

// SetFDB sends frames for mac to dst.
func (k *Netlink) SetFDB(mac net.HardwareAddr, dst netip.Addr) error {
	n, err := k.fdbEntry(mac, dst)
	if err != nil {
		return err
	}
	return k.h.NeighSet(n)
}

// DelFDB removes the entry mac -> dst.
func (k *Netlink) DelFDB(mac net.HardwareAddr, dst netip.Addr) error {
	n, err := k.fdbEntry(mac, dst)
	if err != nil {
		return err
	}
	err = k.h.NeighDel(n)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	return err
}

// Routes lists the main table's IPv4 routes with Protocol.
func (k *Netlink) Routes() ([]Route, error) {
	var rs []netlink.Route
	var err error
	rs, err = nldump.Retry(func() ([]netlink.Route, error) {
		return k.h.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: unix.RT_TABLE_MAIN, Protocol: Protocol},
			netlink.RT_FILTER_TABLE|netlink.RT_FILTER_PROTOCOL)
	})
	if err != nil {
		return nil, fmt.Errorf("listing VXLAN routes: %w", err)
	}
	idx, _ := k.index()
	var out []Route
	for _, r := range rs {
		if r.Dst == nil {
			continue
		}
		dst, ok := nlconv.PrefixFromIPNet(*r.Dst)
		gw, ok2 := nlconv.AddrFromIP(r.Gw)
		if !ok || !ok2 {
			continue
		}
		out = append(out, Route{Dst: dst, Via: gw, Encap: idx != 0 && r.LinkIndex == idx})
	}
	slices.SortFunc(out, func(a, b Route) int { return nlconv.ComparePrefix(a.Dst, b.Dst) })
	return out, nil
}

// SetRoute installs r (see Kernel).
func (k *Netlink) SetRoute(r Route) error {
	dst := nlconv.IPNetFromPrefix(r.Dst)
	existing, err := k.h.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Dst: &dst, Table: unix.RT_TABLE_MAIN},
		netlink.RT_FILTER_DST|netlink.RT_FILTER_TABLE)
	if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
		return err
	}
	for _, e := range existing {
		if e.Priority == 0 && e.Protocol != Protocol && e.Protocol != routing.LearnedProtocol {
			return fmt.Errorf("%w: %s", routing.ErrRouteConflict, r.Dst)
		}
	}
	nr := &netlink.Route{Dst: &dst, Table: unix.RT_TABLE_MAIN, Protocol: Protocol, Scope: netlink.SCOPE_UNIVERSE, Gw: net.IP(r.Via.AsSlice())}
	if r.Encap {
		idx, err := k.index()
		if err != nil {
			return err
		}
		nr.LinkIndex = idx
		nr.Flags = int(netlink.FLAG_ONLINK)
	}
	return k.h.RouteReplace(nr)
}

// DelRoute removes our route to dst.
func (k *Netlink) DelRoute(dst netip.Prefix) error {
	d := nlconv.IPNetFromPrefix(dst)
	err := k.h.RouteDel(&netlink.Route{Dst: &d, Table: unix.RT_TABLE_MAIN, Protocol: Protocol})
	if errors.Is(err, unix.ESRCH) {
		return nil
	}
	return err
}
