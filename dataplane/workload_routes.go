package dataplane

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sort"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// ErrNoInterface is returned (wrapped) when a workload's host interface does
// not exist: its container is gone, or never got that far.
var ErrNoInterface = errors.New("workload interface not found")

// MissingWorkloadRoutes returns those of ips that have no host route through
// hostIfName in the main table, without changing anything: the reconcile loop
// uses it to log and count each repair before EnsureWorkloadRoutes makes it.
// A missing interface is ErrNoInterface.
func (l *Linux) MissingWorkloadRoutes(ctx context.Context, hostIfName string, ips []net.IPNet) ([]net.IPNet, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("checking routes to %s: %w", hostIfName, err)
	}
	link, err := l.nl.LinkByName(hostIfName)
	if isNotFound(err) {
		return nil, fmt.Errorf("checking routes to %s: %w", hostIfName, ErrNoInterface)
	}
	if err != nil {
		return nil, fmt.Errorf("checking routes to %s: %w", hostIfName, err)
	}
	var missing []net.IPNet
	for _, ip := range ips {
		dst, err := hostRouteDst(ip.IP)
		if err != nil {
			return nil, fmt.Errorf("checking routes to %s: %w", hostIfName, err)
		}
		routes, err := l.listRoutes(netlink.FAMILY_ALL, &netlink.Route{Dst: dst, Table: unix.RT_TABLE_MAIN, LinkIndex: link.Attrs().Index},
			netlink.RT_FILTER_DST|netlink.RT_FILTER_TABLE|netlink.RT_FILTER_OIF)
		if err != nil {
			return nil, fmt.Errorf("listing routes to %s: %w", dst, err)
		}
		if len(routes) == 0 {
			missing = append(missing, *dst)
		}
	}
	return missing, nil
}

// detachedPairs maps the host-side name of every detached workload veth
// pair to its link: "cali<X>" whose peer is "tmp<X>" in this namespace too.
func (l *Linux) detachedPairs() (map[string]netlink.Link, error) {
	links, err := l.listLinks()
	if err != nil {
		return nil, err
	}
	byIndex := make(map[int]netlink.Link, len(links))
	for _, link := range links {
		byIndex[link.Attrs().Index] = link
	}
	out := map[string]netlink.Link{}
	for _, link := range links {
		a := link.Attrs()
		suffix, ok := strings.CutPrefix(a.Name, HostIfPrefix)
		if !ok || link.Type() != "veth" || a.NetNsID >= 0 {
			continue // not ours, or the peer lives in another namespace
		}
		peer, ok := byIndex[a.ParentIndex]
		if ok && peer.Type() == "veth" && peer.Attrs().Name == tempIfPrefix+suffix && peer.Attrs().ParentIndex == a.Index {
			out[a.Name] = link
		}
	}
	return out, nil
}

// ListDetachedWorkloads returns, sorted, the host-side names of the
// workload veth pairs whose both ends are in this namespace ("cali<X>" with
// its peer "tmp<X>"). No container holds such a pair: AddWorkload leaves it
// so only until Docker moves the tmp end into the sandbox, and dockerd moves
// it back when it destroys a sandbox without a successful Leave (the plugin
// was down). Another product's cali* veths (Calico CNI) have their peer in a
// pod, so they never show here.
func (l *Linux) ListDetachedWorkloads(ctx context.Context) ([]string, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("listing detached workloads: %w", err)
	}
	pairs, err := l.detachedPairs()
	if err != nil {
		return nil, fmt.Errorf("listing detached workloads: %w", err)
	}
	names := make([]string, 0, len(pairs))
	for n := range pairs {
		names = append(names, n)
	}
	sort.Strings(names)
	return names, nil
}

// RemoveDetachedWorkload deletes the detached pair whose host side is
// hostIfName (its routes go with it). A pair that is no longer detached
// (Docker moved the tmp end into a container meanwhile) or gone is left
// alone: nil.
func (l *Linux) RemoveDetachedWorkload(ctx context.Context, hostIfName string) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("removing detached workload %s: %w", hostIfName, err)
	}
	pairs, err := l.detachedPairs()
	if err != nil {
		return fmt.Errorf("removing detached workload %s: %w", hostIfName, err)
	}
	link, ok := pairs[hostIfName]
	if !ok {
		return nil
	}
	if err := l.nl.LinkDel(link); err != nil && !isNotFound(err) {
		return fmt.Errorf("removing detached workload %s: %w", hostIfName, err)
	}
	l.log.WithField("interface", hostIfName).Info("Removed detached workload veth pair")
	return nil
}
