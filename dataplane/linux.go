package dataplane

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/vishvananda/netlink"

	"github.com/calico-cnm/calico-cnm/internal/nldump"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

const (
	// netlinkTimeout bounds every netlink request: a wedged kernel call must
	// surface as an error to Docker, not hang its Join (and its shutdown).
	netlinkTimeout = 10 * time.Second
	// linkLocalWait bounds HostLinkLocalIPv6 when ctx has no deadline.
	linkLocalWait = 2 * time.Second
)

// Steps of AddWorkload at which the failpoint hook is consulted.
const (
	stepVethCreated = "veth-created"
	stepSysctls     = "sysctls"
	stepIPv6Addr    = "ipv6-addr"
	stepLinkUp      = "link-up"
	stepRoutes      = "routes"
)

// Linux programs the kernel of one network namespace. It holds no state
// about workloads: the kernel is the state, so a restarted daemon can pick up
// where the last one stopped. Methods are safe for concurrent use, but callers
// must serialise operations on the same endpoint.
type Linux struct {
	ns  netns.NsHandle  // the target namespace, for sysctls (see inNetNS)
	nl  *netlink.Handle // rtnetlink sockets opened inside ns
	log logrus.FieldLogger
	// procSys is where sysctls are written: DefaultProcSys, or a writable
	// mount of a procfs' sys directory (see WithProcSys).
	procSys string

	// failpoint, when set, is called after each step of AddWorkload; a
	// non-nil error makes AddWorkload fail right there. Only tests set it,
	// to prove that a failure half way leaves nothing behind.
	failpoint func(step string) error
}

// DefaultProcSys is where sysctls live normally.
const DefaultProcSys = "/proc/sys"

// Option tunes a Linux dataplane.
type Option func(*Linux)

// WithProcSys makes the dataplane write its sysctls under dir instead of
// /proc/sys ("" keeps the default). A managed Docker plugin needs it: runc
// mounts the plugin's /proc/sys read-only, so the plugin gets the host's
// /proc/sys bind-mounted writable elsewhere (config.json). Any procfs mount
// will do, because /proc/sys/net shows the network namespace of the thread
// that opens the file, not that of the procfs instance.
func WithProcSys(dir string) Option {
	return func(l *Linux) {
		if dir != "" {
			l.procSys = dir
		}
	}
}

// NewLinux opens the network namespace at netnsPath (e.g. /var/run/netns/x or
// /proc/<pid>/ns/net) and returns a Linux that programs it. netnsPath ""
// means the namespace of the calling thread, i.e. the process's own unless
// the caller has deliberately switched its locked thread elsewhere.
func NewLinux(netnsPath string, log logrus.FieldLogger, opts ...Option) (*Linux, error) {
	if log == nil {
		log = logrus.StandardLogger()
	}
	probe := &Linux{procSys: DefaultProcSys}
	for _, o := range opts {
		o(probe)
	}
	if _, err := os.Stat(filepath.Join(probe.procSys, "net")); err != nil {
		return nil, fmt.Errorf("sysctl directory %s: %w", probe.procSys, err)
	}
	var (
		ns  netns.NsHandle
		err error
	)
	if netnsPath == "" {
		// Lock so that the namespace read is the calling thread's own and
		// not that of whatever thread the goroutine migrates to.
		runtime.LockOSThread()
		ns, err = netns.Get()
		runtime.UnlockOSThread()
	} else {
		ns, err = netns.GetFromPath(netnsPath)
	}
	if err != nil {
		return nil, fmt.Errorf("opening network namespace %q: %w", netnsPath, err)
	}
	// Only rtnetlink: the default set also opens xfrm/netfilter sockets that
	// we never use and that some kernels lack.
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		ns.Close()
		return nil, fmt.Errorf("opening netlink in network namespace %q: %w", netnsPath, err)
	}
	if err := h.SetSocketTimeout(netlinkTimeout); err != nil {
		h.Close()
		ns.Close()
		return nil, fmt.Errorf("setting netlink timeout: %w", err)
	}
	return &Linux{ns: ns, nl: h, log: log.WithField("netns", netnsPath), procSys: probe.procSys}, nil
}

// Close releases the namespace and the netlink sockets. The kernel state it
// programmed stays.
func (l *Linux) Close() error {
	l.nl.Close()
	return l.ns.Close()
}

func (l *Linux) fail(step string) error {
	if l.failpoint == nil {
		return nil
	}
	return l.failpoint(step)
}

// AddWorkload creates the endpoint's veth pair, configures the host side as
// the container's router (proxy ARP, forwarding, IPv6 gateway address) and
// routes the workload's IPs to it. The container side is left down, named
// w.TempIfName, in the target namespace, for Docker to move into the
// container. A leftover veth of the same endpoint (e.g. from a crash) is
// replaced. On any error nothing of what this call created remains.
func (l *Linux) AddWorkload(ctx context.Context, w Workload) (retErr error) {
	w, err := w.normalize()
	if err != nil {
		return fmt.Errorf("adding workload: invalid input: %w", err)
	}
	var ips []net.IPNet
	for _, ip := range []*net.IPNet{w.IPv4, w.IPv6} {
		if ip != nil {
			ips = append(ips, *ip)
		}
	}
	log := l.log.WithFields(logrus.Fields{"endpoint": w.EndpointID, "interface": w.HostIfName, "ip": ipStrings(ips)})
	if err := ctx.Err(); err != nil {
		return addWorkloadError(w, "before start", err)
	}
	if err := l.freeWorkloadNames(w, log); err != nil {
		return err
	}

	// From here on every change registers its undo.
	var undo undoStack
	defer func() {
		if retErr != nil {
			retErr = undo.rollBack(retErr, log)
		}
	}()
	host, err := l.createWorkloadVeth(w, &undo)
	if err != nil {
		return err
	}
	if err := l.afterAddStep(ctx, w, stepVethCreated); err != nil {
		return err
	}
	if err := inNetNS(l.ns, l.log, func() error { return configureHostSide(l.procSys, w, log) }); err != nil {
		return addWorkloadError(w, "configuring "+w.HostIfName, err)
	}
	if err := l.afterAddStep(ctx, w, stepSysctls); err != nil {
		return err
	}
	if w.IPv6 != nil {
		if err := l.addGatewayIPv6(host, w); err != nil {
			return err
		}
		if err := l.afterAddStep(ctx, w, stepIPv6Addr); err != nil {
			return err
		}
	}
	if err := l.nl.LinkSetUp(host); err != nil {
		return addWorkloadError(w, "bringing up "+w.HostIfName, err)
	}
	if err := l.afterAddStep(ctx, w, stepLinkUp); err != nil {
		return err
	}
	if err := l.addHostRoutes(host, w, ips, &undo); err != nil {
		return err
	}
	if err := l.afterAddStep(ctx, w, stepRoutes); err != nil {
		return err
	}
	if err := l.addPermanentNeighbours(host, w, ips); err != nil {
		return err
	}
	// Best effort, checked on every Join because dockerd may have started
	// (and set its FORWARD policy to DROP) after this daemon did.
	if err := l.EnsureForwardAccept(ctx); err != nil {
		log.WithError(err).Warn("Could not open the FORWARD filter for cali+ interfaces; routed traffic may be dropped")
	}

	log.Info("Added workload")
	return nil
}

// addWorkloadError is the error of AddWorkload failing at what.
func addWorkloadError(w Workload, what string, err error) error {
	return fmt.Errorf("adding workload %s: %s: %w", w.EndpointID, what, err)
}

// undoStack holds the undo of each change AddWorkload made so far, so that
// a failure half way leaves nothing behind.
type undoStack []func() error

func (u *undoStack) push(undo func() error) { *u = append(*u, undo) }

// rollBack undoes the changes, last first, and returns err joined with
// what could not be undone.
func (u undoStack) rollBack(err error, log logrus.FieldLogger) error {
	for i := len(u) - 1; i >= 0; i-- {
		if undoErr := u[i](); undoErr != nil {
			log.WithError(undoErr).Error("Failed to roll back a partially added workload")
			err = errors.Join(err, fmt.Errorf("rolling back: %w", undoErr))
		}
	}
	log.WithError(err).Warn("Adding workload failed; rolled back")
	return err
}

// afterAddStep consults the failpoint after AddWorkload's step name, and
// stops there if ctx is done.
func (l *Linux) afterAddStep(ctx context.Context, w Workload, name string) error {
	if err := l.fail(name); err != nil {
		return addWorkloadError(w, name, err)
	}
	if err := ctx.Err(); err != nil {
		return addWorkloadError(w, "interrupted after "+name, err)
	}
	return nil
}

// freeWorkloadNames removes a leftover veth of the endpoint and makes sure
// nothing else holds the container side's temporary name.
func (l *Linux) freeWorkloadNames(w Workload, log logrus.FieldLogger) error {
	if err := l.removeStaleVeth(w.HostIfName, log); err != nil {
		return addWorkloadError(w, "removing leftover interface", err)
	}
	if tmp, err := l.nl.LinkByName(w.TempIfName); err == nil {
		// Not ours to delete: after the step above a veth of this endpoint
		// cannot hold the name any more.
		return addWorkloadError(w, "creating veth", fmt.Errorf("interface name %s is already used by a %s link", w.TempIfName, tmp.Type()))
	} else if !isNotFound(err) {
		return addWorkloadError(w, "looking up "+w.TempIfName, err)
	}
	return nil
}

// createWorkloadVeth creates the endpoint's veth pair and returns its host
// side.
func (l *Linux) createWorkloadVeth(w Workload, undo *undoStack) (netlink.Link, error) {
	veth := &netlink.Veth{
		LinkAttrs: netlink.LinkAttrs{
			Name:         w.HostIfName,
			MTU:          w.MTU,
			HardwareAddr: hostSideMAC(),
		},
		PeerName:         w.TempIfName,
		PeerHardwareAddr: w.MAC,
	}
	if err := l.nl.LinkAdd(veth); err != nil {
		return nil, addWorkloadError(w, fmt.Sprintf("creating veth %s<->%s", w.HostIfName, w.TempIfName), err)
	}
	// Deleting one end deletes both, and with them their addresses and
	// routes.
	undo.push(func() error { return l.deleteLinkByName(w.HostIfName) })
	host, err := l.nl.LinkByName(w.HostIfName)
	if err != nil {
		return nil, addWorkloadError(w, "looking up new veth "+w.HostIfName, err)
	}
	return host, nil
}

// addGatewayIPv6 gives the host side the workload's IPv6 gateway address.
func (l *Linux) addGatewayIPv6(host netlink.Link, w Workload) error {
	gw := &netlink.Addr{
		IPNet: &net.IPNet{IP: w.GatewayIPv6, Mask: net.CIDRMask(64, 128)},
		// No DAD: nothing else on this point-to-point link can own it,
		// and it must work before the container side even exists.
		Flags: unix.IFA_F_NODAD,
	}
	if err := l.nl.AddrAdd(host, gw); err != nil {
		return addWorkloadError(w, fmt.Sprintf("adding gateway address %s to %s", gw.IPNet, w.HostIfName), err)
	}
	return nil
}

// addHostRoutes routes each of ips to the host side.
func (l *Linux) addHostRoutes(host netlink.Link, w Workload, ips []net.IPNet, undo *undoStack) error {
	for _, ip := range ips {
		r := hostRoute(host.Attrs().Index, ip.IP)
		// Replace, not add: the local veth is the truth for a local
		// workload's IP (as in Felix), e.g. over a stale route learned for
		// an address this host has just been given.
		if err := l.nl.RouteReplace(r); err != nil {
			return addWorkloadError(w, fmt.Sprintf("adding route %s dev %s", r.Dst, w.HostIfName), err)
		}
		undo.push(func() error { return ignoreESRCH(l.nl.RouteDel(r)) })
	}
	return nil
}

// addPermanentNeighbours gives each workload address a permanent neighbour
// entry on the host side (as Felix programs them): the host and routed
// traffic reach the container from its first instruction, without ARP/NDP,
// whenever Docker brings its side up. Without it, a packet that arrives
// before (a peer's first reply, a health check) leaves the entry FAILED and
// traffic to the new container is dropped until the kernel probes again.
func (l *Linux) addPermanentNeighbours(host netlink.Link, w Workload, ips []net.IPNet) error {
	for _, ip := range ips {
		n := &netlink.Neigh{LinkIndex: host.Attrs().Index, IP: ip.IP, HardwareAddr: w.MAC, State: netlink.NUD_PERMANENT, Family: unix.AF_INET}
		if ip.IP.To4() == nil {
			n.Family = unix.AF_INET6
		}
		if err := l.nl.NeighSet(n); err != nil {
			return addWorkloadError(w, fmt.Sprintf("adding neighbour %s lladdr %s dev %s", ip.IP, w.MAC, w.HostIfName), err)
		}
	}
	return nil
}

// configureHostSide sets the host side's sysctls under procSys. It runs
// inside the target namespace.
func configureHostSide(procSys string, w Workload, log logrus.FieldLogger) error {
	ifc := w.HostIfName
	var settings []sysctl
	if w.IPv4 != nil {
		settings = append(settings,
			// The namespace must route at all; per-interface forwarding
			// follows from it but is set explicitly below too.
			sysctl{key: "net/ipv4/ip_forward", value: "1", onlyIfDifferent: true},
			sysctl{key: "net/ipv4/conf/" + ifc + "/forwarding", value: "1"},
			// The container ARPs for 169.254.1.1, which no one owns: the host
			// side answers with its own MAC because it has a route to it
			// elsewhere (the default route).
			sysctl{key: "net/ipv4/conf/" + ifc + "/proxy_arp", value: "1"},
			// Answer at once instead of after a random delay of up to 0.8s,
			// which would slow down every container's first packet.
			sysctl{key: "net/ipv4/neigh/" + ifc + "/proxy_delay", value: "0"},
		)
	}
	v6conf := "net/ipv6/conf/" + ifc + "/"
	if w.IPv6 != nil {
		if _, err := os.Stat(filepath.Join(procSys, v6conf)); err != nil {
			return fmt.Errorf("IPv6 is not available in this network namespace: %w", err)
		}
		settings = append(settings,
			// A namespace default of disable_ipv6=1 would leave the interface
			// without IPv6; this workload needs it.
			sysctl{key: v6conf + "disable_ipv6", value: "0", onlyIfDifferent: true},
			// 1 = none: no kernel-generated link-local, see GatewayIPv6.
			sysctl{key: v6conf + "addr_gen_mode", value: "1"},
			// The host side is a router port: never autoconfigure from it.
			sysctl{key: v6conf + "accept_ra", value: "0"},
			// all/forwarding makes the whole namespace an IPv6 router (as
			// Calico does); note that hosts then ignore RAs on interfaces
			// with accept_ra<2.
			sysctl{key: "net/ipv6/conf/all/forwarding", value: "1", onlyIfDifferent: true},
			sysctl{key: v6conf + "forwarding", value: "1"},
			sysctl{key: v6conf + "proxy_ndp", value: "1"},
		)
	}
	if err := writeSysctls(procSys, settings); err != nil {
		return err
	}
	if w.IPv6 == nil {
		// An IPv4-only veth would still get the kernel's EUI-64 link-local
		// from the ee:ee:ee:ee:ee:ee MAC, which equals the container side's
		// and makes its duplicate address detection fail (a kernel warning
		// per container). Best effort: IPv6 may be off altogether.
		if err := writeSysctls(procSys, []sysctl{{key: v6conf + "addr_gen_mode", value: "1"}}); err != nil {
			log.WithError(err).Debug("Could not disable IPv6 address generation on host side")
		}
	}
	return nil
}

// hostRoute is "<ip>/32 (or /128) dev <ifindex> scope link proto RouteProtocol".
func hostRoute(linkIndex int, ip net.IP) *netlink.Route {
	dst, _ := hostRouteDst(ip) // ip comes validated
	r := &netlink.Route{
		LinkIndex: linkIndex,
		Dst:       dst,
		Scope:     netlink.SCOPE_LINK,
		Protocol:  RouteProtocol,
		Table:     unix.RT_TABLE_MAIN,
		Type:      unix.RTN_UNICAST,
	}
	if dst.IP.To4() == nil {
		// IPv6 routes have no scope; the kernel reports them as universe.
		r.Scope = netlink.SCOPE_UNIVERSE
	}
	return r
}

// removeStaleVeth deletes a veth called name, left over by an earlier attempt
// for the same endpoint (the name embeds the endpoint id). Deleting it takes
// its peer, addresses and routes with it. Anything other than a veth with
// that name is not ours: refuse rather than delete it.
func (l *Linux) removeStaleVeth(name string, log logrus.FieldLogger) error {
	link, err := l.nl.LinkByName(name)
	if isNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("looking up %s: %w", name, err)
	}
	if link.Type() != "veth" {
		return fmt.Errorf("interface %s exists and is a %s, not a veth", name, link.Type())
	}
	log.Warn("Deleting leftover workload interface")
	if err := l.nl.LinkDel(link); err != nil && !isNotFound(err) {
		return fmt.Errorf("deleting %s: %w", name, err)
	}
	return nil
}

func (l *Linux) deleteLinkByName(name string) error {
	link, err := l.nl.LinkByName(name)
	if isNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("looking up %s: %w", name, err)
	}
	if err := l.nl.LinkDel(link); err != nil && !isNotFound(err) {
		return fmt.Errorf("deleting %s: %w", name, err)
	}
	return nil
}

// RemoveWorkload deletes the endpoint's veth (both ends, wherever the
// container side is) and the host routes to ips through it. Routes to those
// IPs through any other interface belong to someone else (e.g. the IP is
// already reused) and are left alone. Removing what is not there is not an
// error, so it can be retried and used for cleanup.
func (l *Linux) RemoveWorkload(ctx context.Context, endpointID string, ips []net.IPNet) error {
	if err := validateEndpointID(endpointID); err != nil {
		return fmt.Errorf("removing workload: invalid input: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("removing workload %s: %w", endpointID, err)
	}
	name := HostIfName(endpointID)
	log := l.log.WithFields(logrus.Fields{"endpoint": endpointID, "interface": name, "ip": ipStrings(ips)})
	wrap := func(what string, err error) error {
		return fmt.Errorf("removing workload %s: %s: %w", endpointID, what, err)
	}

	link, err := l.nl.LinkByName(name)
	switch {
	case isNotFound(err):
		link = nil
	case err != nil:
		return wrap("looking up "+name, err)
	}
	if link != nil {
		// The kernel drops these routes with the link anyway; deleting them
		// first just keeps the order of events tidy for route watchers.
		// Each goes by destination and link, not by a dump of the table:
		// that would cost Leave more with every endpoint on the host. The
		// kernel matches the link, so a route to the IP through another
		// interface stays; one that is not there is already gone.
		for _, ip := range ips {
			dst, err := hostRouteDst(ip.IP)
			if err != nil {
				return wrap("route", err)
			}
			del := &netlink.Route{LinkIndex: link.Attrs().Index, Dst: dst, Table: unix.RT_TABLE_MAIN, Scope: netlink.SCOPE_NOWHERE}
			if err := l.nl.RouteDel(del); err != nil && !errors.Is(err, unix.ESRCH) && !errors.Is(err, unix.ENOENT) {
				return wrap(fmt.Sprintf("deleting route %s dev %s", dst, name), err)
			}
		}
		if err := l.nl.LinkDel(link); err != nil && !isNotFound(err) {
			return wrap("deleting "+name, err)
		}
	}
	// A crash between creating the veth and Docker moving its container side
	// leaves nothing extra (the peer went with the host side), but a temp
	// veth alone in this namespace would be a leftover of ours too.
	tmpName := TempIfName(endpointID)
	if tmp, err := l.nl.LinkByName(tmpName); err == nil && tmp.Type() == "veth" {
		if err := l.nl.LinkDel(tmp); err != nil && !isNotFound(err) {
			return wrap("deleting "+tmpName, err)
		}
	} else if err != nil && !isNotFound(err) {
		return wrap("looking up "+tmpName, err)
	}
	if link != nil {
		log.Info("Removed workload")
	} else {
		log.Debug("Workload already removed")
	}
	return nil
}

// HostLinkLocalIPv6 returns the usable IPv6 link-local address of the host
// side hostIfName: the container's IPv6 gateway. For veths made by
// AddWorkload that is GatewayIPv6, there at once; for others it waits until
// the kernel's address has passed duplicate address detection, up to ctx's
// deadline or 2s.
func (l *Linux) HostLinkLocalIPv6(ctx context.Context, hostIfName string) (net.IP, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, linkLocalWait)
		defer cancel()
	}
	link, err := l.nl.LinkByName(hostIfName)
	if err != nil {
		return nil, fmt.Errorf("finding link-local address of %s: %w", hostIfName, err)
	}
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		addrs, err := l.nl.AddrList(link, netlink.FAMILY_V6)
		if err != nil {
			return nil, fmt.Errorf("listing addresses of %s: %w", hostIfName, err)
		}
		var found net.IP
		for _, a := range addrs {
			if !a.IP.IsLinkLocalUnicast() {
				continue
			}
			if a.Flags&unix.IFA_F_DADFAILED != 0 {
				return nil, fmt.Errorf("link-local address %s of %s failed duplicate address detection", a.IP, hostIfName)
			}
			if a.Flags&unix.IFA_F_TENTATIVE != 0 {
				continue
			}
			if found == nil || a.IP.Equal(net.ParseIP(GatewayIPv6)) {
				found = a.IP
			}
		}
		if found != nil {
			return found, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for a link-local address on %s: %w", hostIfName, ctx.Err())
		case <-tick.C:
		}
	}
}

// EnsureBlackhole installs "blackhole <block> proto RouteProtocol" unless it
// is there already. The blackhole makes the host drop, rather than send back
// out of its default route, traffic to addresses of its own blocks that no
// local workload has; the /32 workload routes are more specific and win.
func (l *Linux) EnsureBlackhole(ctx context.Context, block net.IPNet) error {
	if err := checkBlock(block); err != nil {
		return fmt.Errorf("ensuring blackhole: invalid input: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("ensuring blackhole %s: %w", block.String(), err)
	}
	log := l.log.WithField("block", block.String())
	existing, err := l.listRoutes(netlink.FAMILY_ALL, &netlink.Route{Dst: &block, Table: unix.RT_TABLE_MAIN},
		netlink.RT_FILTER_DST|netlink.RT_FILTER_TABLE)
	if err != nil {
		return fmt.Errorf("ensuring blackhole %s: listing routes: %w", block.String(), err)
	}
	for _, r := range existing {
		if r.Type == unix.RTN_BLACKHOLE && r.Protocol == RouteProtocol {
			return nil
		}
	}
	if len(existing) > 0 {
		// E.g. the route to another host learnt by BGP before this host
		// claimed the block: the claim is the newer truth.
		log.WithField("replaced", existing[0].String()).Warn("Replacing existing route with block blackhole")
	}
	if err := l.nl.RouteReplace(blackholeRoute(block)); err != nil {
		return fmt.Errorf("ensuring blackhole %s: %w", block.String(), err)
	}
	log.Info("Added block blackhole route")
	return nil
}

// RemoveBlackhole deletes our blackhole for block, if there is one. Routes to
// block of any other type or protocol are not ours and stay.
func (l *Linux) RemoveBlackhole(ctx context.Context, block net.IPNet) error {
	if err := checkBlock(block); err != nil {
		return fmt.Errorf("removing blackhole: invalid input: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("removing blackhole %s: %w", block.String(), err)
	}
	routes, err := l.listRoutes(netlink.FAMILY_ALL, &netlink.Route{Dst: &block, Table: unix.RT_TABLE_MAIN, Protocol: RouteProtocol, Type: unix.RTN_BLACKHOLE},
		netlink.RT_FILTER_DST|netlink.RT_FILTER_TABLE|netlink.RT_FILTER_PROTOCOL|netlink.RT_FILTER_TYPE)
	if err != nil {
		return fmt.Errorf("removing blackhole %s: listing routes: %w", block.String(), err)
	}
	for i := range routes {
		if err := ignoreESRCH(l.nl.RouteDel(&routes[i])); err != nil {
			return fmt.Errorf("removing blackhole %s: %w", block.String(), err)
		}
	}
	if len(routes) > 0 {
		l.log.WithField("block", block.String()).Info("Removed block blackhole route")
	}
	return nil
}

// ListBlackholes returns the blocks of our blackhole routes (IPv4 first),
// e.g. to find the ones left behind by a previous run.
func (l *Linux) ListBlackholes(ctx context.Context) ([]net.IPNet, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("listing blackholes: %w", err)
	}
	var blocks []net.IPNet
	for _, family := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		routes, err := l.listRoutes(family, &netlink.Route{Table: unix.RT_TABLE_MAIN, Protocol: RouteProtocol, Type: unix.RTN_BLACKHOLE},
			netlink.RT_FILTER_TABLE|netlink.RT_FILTER_PROTOCOL|netlink.RT_FILTER_TYPE)
		if err != nil {
			return nil, fmt.Errorf("listing blackholes: %w", err)
		}
		for _, r := range routes {
			if r.Dst == nil { // a default route: dst 0/0 is not sent
				bits := 32
				if family == netlink.FAMILY_V6 {
					bits = 128
				}
				r.Dst = &net.IPNet{IP: make(net.IP, bits/8), Mask: net.CIDRMask(0, bits)}
			}
			blocks = append(blocks, *r.Dst)
		}
	}
	return blocks, nil
}

// ListWorkloadInterfaces returns the names of the cali* veths in the
// namespace, sorted: the host sides of workloads, ours or left over. Other
// link types that happen to match the prefix are not workload interfaces and
// are left out, so that a reconcile that deletes stale ones cannot hit them.
func (l *Linux) ListWorkloadInterfaces(ctx context.Context) ([]string, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("listing workload interfaces: %w", err)
	}
	links, err := l.listLinks()
	if err != nil {
		return nil, fmt.Errorf("listing workload interfaces: %w", err)
	}
	var names []string
	for _, link := range links {
		if strings.HasPrefix(link.Attrs().Name, HostIfPrefix) && link.Type() == "veth" {
			names = append(names, link.Attrs().Name)
		}
	}
	sort.Strings(names)
	return names, nil
}

// EnsureWorkloadRoutes makes sure each of ips has its host route through
// hostIfName, re-creating the missing ones (after a restart, or if someone
// deleted them) and bringing the interface up if it is down, since the kernel
// refuses routes through a down interface. Routes already in place are not
// touched. All IPs are tried; the errors are joined.
func (l *Linux) EnsureWorkloadRoutes(ctx context.Context, hostIfName string, ips []net.IPNet) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("ensuring routes to %s: %w", hostIfName, err)
	}
	link, err := l.nl.LinkByName(hostIfName)
	if err != nil {
		return fmt.Errorf("ensuring routes to %s: %w", hostIfName, err)
	}
	if link.Attrs().Flags&net.FlagUp == 0 {
		if err := l.nl.LinkSetUp(link); err != nil {
			return fmt.Errorf("ensuring routes to %s: bringing it up: %w", hostIfName, err)
		}
	}
	var errs []error
	for _, ip := range ips {
		dst, err := hostRouteDst(ip.IP)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		log := l.log.WithFields(logrus.Fields{"interface": hostIfName, "ip": dst.String()})
		existing, err := l.listRoutes(netlink.FAMILY_ALL, &netlink.Route{Dst: dst, Table: unix.RT_TABLE_MAIN, LinkIndex: link.Attrs().Index},
			netlink.RT_FILTER_DST|netlink.RT_FILTER_TABLE|netlink.RT_FILTER_OIF)
		if err != nil {
			errs = append(errs, fmt.Errorf("listing routes to %s: %w", dst, err))
			continue
		}
		if len(existing) > 0 {
			continue
		}
		if err := l.nl.RouteReplace(hostRoute(link.Attrs().Index, dst.IP)); err != nil {
			errs = append(errs, fmt.Errorf("adding route %s dev %s: %w", dst, hostIfName, err))
			continue
		}
		log.Info("Restored missing workload route")
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("ensuring routes to %s: %w", hostIfName, err)
	}
	return nil
}

// listRoutes is RouteListFiltered, re-read while the dump is interrupted by
// concurrent changes (the kernel then flags it as possibly inconsistent).
func (l *Linux) listRoutes(family int, filter *netlink.Route, mask uint64) ([]netlink.Route, error) {
	return nldump.Retry(func() ([]netlink.Route, error) { return l.nl.RouteListFiltered(family, filter, mask) })
}

// listLinks lists the links of the namespace (see nldump.Retry).
func (l *Linux) listLinks() ([]netlink.Link, error) {
	return nldump.Retry(l.nl.LinkList)
}

func blackholeRoute(block net.IPNet) *netlink.Route {
	return &netlink.Route{
		Dst:      &block,
		Type:     unix.RTN_BLACKHOLE,
		Protocol: RouteProtocol,
		Table:    unix.RT_TABLE_MAIN,
	}
}

// checkBlock refuses what the kernel would refuse anyway (host bits set), with
// a clearer message.
func checkBlock(block net.IPNet) error {
	ones, bits := block.Mask.Size()
	if bits == 0 || block.IP == nil {
		return fmt.Errorf("invalid block %v", block)
	}
	if (bits == 32) != (block.IP.To4() != nil) {
		return fmt.Errorf("block %s: address and mask families differ", block.String())
	}
	if !block.IP.Equal(block.IP.Mask(block.Mask)) {
		return fmt.Errorf("block %s has host bits set (want %s/%d)", block.String(), block.IP.Mask(block.Mask), ones)
	}
	return nil
}

func isNotFound(err error) bool {
	var nf netlink.LinkNotFoundError
	return errors.As(err, &nf) || errors.Is(err, unix.ENODEV)
}

func ignoreESRCH(err error) error {
	if errors.Is(err, unix.ESRCH) {
		return nil
	}
	return err
}

func ipStrings(ips []net.IPNet) []string {
	s := make([]string, 0, len(ips))
	for _, ip := range ips {
		s = append(s, ip.IP.String())
	}
	return s
}
