package routing

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sort"

	"github.com/sirupsen/logrus"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/calico-cnm/calico-cnm/internal/nlconv"
	"github.com/calico-cnm/calico-cnm/internal/nldump"
)

// KernelRoute is one learned route: a prefix via one or more gateways.
type KernelRoute struct {
	Dst      netip.Prefix
	Gateways []netip.Addr // sorted; more than one = ECMP
}

// RouteDiff is what to change in the kernel.
type RouteDiff struct {
	Add     []KernelRoute  // prefix not in the kernel yet
	Replace []KernelRoute  // prefix present with other gateways
	Delete  []netip.Prefix // learned routes no longer wanted
	Kept    []netip.Prefix // unwanted but kept (deletes not allowed yet)
}

// Empty is true when nothing needs doing.
func (d RouteDiff) Empty() bool { return len(d.Add)+len(d.Replace)+len(d.Delete) == 0 }

// DiffRoutes compares the desired learned routes with the kernel's learned
// routes (only those with LearnedProtocol: nothing else is ours to change).
// While allowDelete is false (right after a start, before every peer has
// re-sent its routes) unwanted routes are kept rather than deleted, so a
// restart never drops forwarding for routes that are about to come back.
func DiffRoutes(desired map[netip.Prefix][]netip.Addr, kernel []KernelRoute, allowDelete bool) RouteDiff {
	var d RouteDiff
	have := make(map[netip.Prefix][]netip.Addr, len(kernel))
	for _, r := range kernel {
		gws := slices.Clone(r.Gateways)
		slices.SortFunc(gws, netip.Addr.Compare)
		have[r.Dst.Masked()] = gws
	}
	for dst, gws := range desired {
		if len(gws) == 0 {
			continue
		}
		want := slices.Clone(gws)
		slices.SortFunc(want, netip.Addr.Compare)
		want = slices.Compact(want)
		cur, ok := have[dst]
		switch {
		case !ok:
			d.Add = append(d.Add, KernelRoute{Dst: dst, Gateways: want})
		case !slices.Equal(cur, want):
			d.Replace = append(d.Replace, KernelRoute{Dst: dst, Gateways: want})
		}
	}
	for dst := range have {
		if gws, ok := desired[dst]; ok && len(gws) > 0 {
			continue
		}
		if allowDelete {
			d.Delete = append(d.Delete, dst)
		} else {
			d.Kept = append(d.Kept, dst)
		}
	}
	byDst := func(a, b KernelRoute) int { return nlconv.ComparePrefix(a.Dst, b.Dst) }
	slices.SortFunc(d.Add, byDst)
	slices.SortFunc(d.Replace, byDst)
	slices.SortFunc(d.Delete, nlconv.ComparePrefix)
	slices.SortFunc(d.Kept, nlconv.ComparePrefix)
	return d
}

// RouteTable is the kernel side: list and change learned routes.
type RouteTable interface {
	ListLearned(ctx context.Context) ([]KernelRoute, error)
	// Add must not replace a route of another protocol (a blackhole or a
	// workload route with the same destination): ErrRouteConflict then.
	Add(ctx context.Context, r KernelRoute) error
	Replace(ctx context.Context, r KernelRoute) error
	Delete(ctx context.Context, dst netip.Prefix) error
}

// ErrRouteConflict: the destination already has a route that is not ours.
var ErrRouteConflict = errors.New("a route that routing does not own exists for this destination")

// ApplyDiff applies d; it goes on after a failure. Destinations held by a
// route routing does not own are returned as conflicts, other failures as
// the error.
func ApplyDiff(ctx context.Context, rt RouteTable, d RouteDiff, log logrus.FieldLogger) (conflicts []netip.Prefix, err error) {
	var errs []error
	for _, r := range d.Add {
		if err := rt.Add(ctx, r); err != nil {
			if errors.Is(err, ErrRouteConflict) {
				conflicts = append(conflicts, r.Dst)
				continue
			}
			errs = append(errs, fmt.Errorf("adding %s: %w", r.Dst, err))
			continue
		}
		log.WithFields(logrus.Fields{"dst": r.Dst.String(), "via": addrStrings(r.Gateways)}).Info("learned route installed")
	}
	for _, r := range d.Replace {
		if err := rt.Replace(ctx, r); err != nil {
			if errors.Is(err, ErrRouteConflict) {
				conflicts = append(conflicts, r.Dst)
				continue
			}
			errs = append(errs, fmt.Errorf("replacing %s: %w", r.Dst, err))
			continue
		}
		log.WithFields(logrus.Fields{"dst": r.Dst.String(), "via": addrStrings(r.Gateways)}).Info("learned route updated")
	}
	for _, dst := range d.Delete {
		if err := rt.Delete(ctx, dst); err != nil {
			errs = append(errs, fmt.Errorf("deleting %s: %w", dst, err))
			continue
		}
		log.WithField("dst", dst.String()).Info("learned route withdrawn")
	}
	return conflicts, errors.Join(errs...)
}

func addrStrings(as []netip.Addr) []string {
	out := make([]string, len(as))
	for i, a := range as {
		out[i] = a.String()
	}
	return out
}

// NetlinkTable programs the main table of the process's network namespace.
type NetlinkTable struct {
	h *netlink.Handle
}

// NewNetlinkTable opens rtnetlink in the current network namespace.
func NewNetlinkTable() (*NetlinkTable, error) {
	h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("opening rtnetlink: %w", err)
	}
	return &NetlinkTable{h: h}, nil
}

// Close releases the netlink socket; the routes stay.
func (t *NetlinkTable) Close() { t.h.Close() }

// ListLearned returns the IPv4 and IPv6 routes of the main table with
// LearnedProtocol.
func (t *NetlinkTable) ListLearned(ctx context.Context) ([]KernelRoute, error) {
	var routes []netlink.Route
	for _, family := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		var (
			rs  []netlink.Route
			err error
		)
		rs, err = nldump.Retry(func() ([]netlink.Route, error) {
			return t.h.RouteListFiltered(family,
				&netlink.Route{Table: unix.RT_TABLE_MAIN, Protocol: LearnedProtocol},
				netlink.RT_FILTER_TABLE|netlink.RT_FILTER_PROTOCOL)
		})
		if err != nil {
			return nil, fmt.Errorf("listing learned routes: %w", err)
		}
		routes = append(routes, rs...)
	}
	out := make([]KernelRoute, 0, len(routes))
	for _, r := range routes {
		if r.Dst == nil {
			continue
		}
		dst, ok := nlconv.PrefixFromIPNet(*r.Dst)
		if !ok {
			continue
		}
		kr := KernelRoute{Dst: dst}
		if a, ok := nlconv.AddrFromIP(r.Gw); ok {
			kr.Gateways = append(kr.Gateways, a)
		}
		for _, nh := range r.MultiPath {
			if a, ok := nlconv.AddrFromIP(nh.Gw); ok {
				kr.Gateways = append(kr.Gateways, a)
			}
		}
		sort.Slice(kr.Gateways, func(i, j int) bool { return kr.Gateways[i].Less(kr.Gateways[j]) })
		out = append(out, kr)
	}
	return out, nil
}

func (t *NetlinkTable) route(r KernelRoute) *netlink.Route {
	dst := nlconv.IPNetFromPrefix(r.Dst)
	nr := &netlink.Route{Dst: &dst, Table: unix.RT_TABLE_MAIN, Protocol: LearnedProtocol, Scope: netlink.SCOPE_UNIVERSE}
	if len(r.Gateways) == 1 {
		nr.Gw = net.IP(r.Gateways[0].AsSlice())
		return nr
	}
	for _, g := range r.Gateways {
		nr.MultiPath = append(nr.MultiPath, &netlink.NexthopInfo{Gw: net.IP(g.AsSlice())})
	}
	return nr
}

// Add creates the route; EEXIST means some other route (a blackhole of a
// block we own, a workload /32, the admin's) holds the destination, which
// routing must leave alone.
func (t *NetlinkTable) Add(ctx context.Context, r KernelRoute) error {
	err := t.h.RouteAdd(t.route(r))
	if errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("%w: %s", ErrRouteConflict, r.Dst)
	}
	return err
}

// Replace changes the gateways of a learned route. It first checks that the
// route at that destination is ours: a kernel replace would otherwise
// overwrite any route with the same destination and metric.
func (t *NetlinkTable) Replace(ctx context.Context, r KernelRoute) error {
	dst := nlconv.IPNetFromPrefix(r.Dst)
	family := netlink.FAMILY_V4
	if r.Dst.Addr().Is6() {
		family = netlink.FAMILY_V6
	}
	existing, err := t.h.RouteListFiltered(family, &netlink.Route{Dst: &dst, Table: unix.RT_TABLE_MAIN},
		netlink.RT_FILTER_DST|netlink.RT_FILTER_TABLE)
	if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
		return err
	}
	for _, e := range existing {
		// Same metric as ours (the kernel's default: 0 for IPv4, 1024
		// for IPv6): a replace would overwrite it.
		if e.Protocol != LearnedProtocol && (e.Priority == 0 || (family == netlink.FAMILY_V6 && e.Priority == 1024)) {
			return fmt.Errorf("%w: %s", ErrRouteConflict, r.Dst)
		}
	}
	return t.h.RouteReplace(t.route(r))
}

// Delete removes our route for dst (only ours: the filter names the protocol).
func (t *NetlinkTable) Delete(ctx context.Context, dst netip.Prefix) error {
	d := nlconv.IPNetFromPrefix(dst)
	err := t.h.RouteDel(&netlink.Route{Dst: &d, Table: unix.RT_TABLE_MAIN, Protocol: LearnedProtocol})
	if errors.Is(err, unix.ESRCH) {
		return nil
	}
	return err
}

// knownRoutes is a RouteTable that remembers the learned routes it listed
// and changed. A pass diffs against that instead of dumping the kernel's
// tables: at 64 nodes a burst of updates runs a pass every 50 ms on every
// node, and the dumps were a large part of the CPU the burst took. The
// kernel is listed again after forget (the agent's periodic resync, which
// also repairs routes removed behind our back, and every pass while
// deletes wait) and after any failed change.
type knownRoutes struct {
	RouteTable
	known map[netip.Prefix][]netip.Addr // nil: list the kernel next time
}

func newKnownRoutes(rt RouteTable) *knownRoutes { return &knownRoutes{RouteTable: rt} }

// forget makes the next ListLearned read the kernel.
func (k *knownRoutes) forget() { k.known = nil }

func (k *knownRoutes) ListLearned(ctx context.Context) ([]KernelRoute, error) {
	if k.known == nil {
		routes, err := k.RouteTable.ListLearned(ctx)
		if err != nil {
			return nil, err
		}
		k.known = make(map[netip.Prefix][]netip.Addr, len(routes))
		for _, r := range routes {
			k.known[r.Dst.Masked()] = slices.Clone(r.Gateways)
		}
	}
	out := make([]KernelRoute, 0, len(k.known))
	for dst, gws := range k.known {
		out = append(out, KernelRoute{Dst: dst, Gateways: slices.Clone(gws)})
	}
	return out, nil
}

// changed records the outcome of a change: a conflict changed nothing of
// ours, any other failure leaves the kernel's state unknown.
func (k *knownRoutes) changed(dst netip.Prefix, gws []netip.Addr, deleted bool, err error) error {
	switch {
	case err == nil && k.known != nil && deleted:
		delete(k.known, dst.Masked())
	case err == nil && k.known != nil:
		k.known[dst.Masked()] = slices.Clone(gws)
	case err != nil && !errors.Is(err, ErrRouteConflict):
		k.known = nil
	}
	return err
}

func (k *knownRoutes) Add(ctx context.Context, r KernelRoute) error {
	return k.changed(r.Dst, r.Gateways, false, k.RouteTable.Add(ctx, r))
}

func (k *knownRoutes) Replace(ctx context.Context, r KernelRoute) error {
	return k.changed(r.Dst, r.Gateways, false, k.RouteTable.Replace(ctx, r))
}

func (k *knownRoutes) Delete(ctx context.Context, dst netip.Prefix) error {
	return k.changed(dst, nil, true, k.RouteTable.Delete(ctx, dst))
}
