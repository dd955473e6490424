package bandwidth

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"regexp"

	"github.com/vishvananda/netlink"

	"github.com/calico-cnm/calico-cnm/internal/nldump"
	"golang.org/x/sys/unix"
)

// Netlink is the part of *netlink.Handle the shaper uses: unit tests give
// it a fake kernel.
type Netlink interface {
	LinkByName(name string) (netlink.Link, error)
	LinkList() ([]netlink.Link, error)
	LinkAdd(link netlink.Link) error
	LinkDel(link netlink.Link) error
	LinkSetUp(link netlink.Link) error
	// QdiscList(nil) lists the qdiscs of every link.
	QdiscList(link netlink.Link) ([]netlink.Qdisc, error)
	QdiscAdd(qdisc netlink.Qdisc) error
	QdiscReplace(qdisc netlink.Qdisc) error
	QdiscDel(qdisc netlink.Qdisc) error
	FilterList(link netlink.Link, parent uint32) ([]netlink.Filter, error)
	FilterAdd(filter netlink.Filter) error
}

const (
	// IfbPrefix names the ifb device of an endpoint's egress shaping:
	// IfbPrefix + the first 11 hex digits of the endpoint id, like the
	// cali veth (14 characters, within the kernel's 15).
	IfbPrefix = "cbw"
	idLen     = 11
	// queueLatency is how long a packet may wait in the bucket's queue
	// (tbf's limit), as the CNI bandwidth plugin chooses it.
	queueLatency = 0.025 // seconds
)

// Handles of the qdiscs the shaper owns: the root tbf of a cali veth or
// an ifb device, and the ingress qdisc of a cali veth (ffff:, the only
// handle the kernel allows there).
var (
	tbfHandle     = netlink.MakeHandle(1, 0)
	ingressHandle = netlink.MakeHandle(0xffff, 0)
)

var ifbName = regexp.MustCompile("^" + IfbPrefix + "[0-9a-f]{" + fmt.Sprint(idLen) + "}$")

// IfbName is the ifb device of an endpoint's egress shaping.
func IfbName(endpointID string) string {
	return IfbPrefix + endpointID[:min(idLen, len(endpointID))]
}

// ErrNoVeth: the endpoint's host-side veth does not exist (the endpoint
// left, or has not joined yet).
var ErrNoVeth = errors.New("workload veth not found")

// Shaper programs the qdiscs, filters and ifb devices of endpoints in one
// network namespace. It keeps no state: the kernel is the state. Callers
// serialise calls (Manager does).
type Shaper struct {
	nl Netlink
}

// NewShaper shapes through nl (a *netlink.Handle of the host namespace).
func NewShaper(nl Netlink) *Shaper { return &Shaper{nl: nl} }

// bucket is one direction's tbf, as the kernel reports it.
func bucket(linkIndex int, rate, burst uint64) *netlink.Tbf {
	rateB := rate / 8
	burst = Burst(rate, burst)
	limit := min(uint64(float64(rateB)*queueLatency)+burst, math.MaxUint32)
	return &netlink.Tbf{
		QdiscAttrs: netlink.QdiscAttrs{LinkIndex: linkIndex, Handle: tbfHandle, Parent: netlink.HANDLE_ROOT},
		Rate:       rateB,
		Limit:      uint32(limit),
		Buffer:     netlink.Xmittime(rateB, uint32(burst)),
	}
}

func sameBucket(a, b *netlink.Tbf) bool {
	return a.Rate == b.Rate && a.Limit == b.Limit && a.Buffer == b.Buffer && a.Peakrate == 0
}

// rootAndIngress are the root and ingress qdiscs of link.
func (s *Shaper) rootAndIngress(link netlink.Link) (root, ingress netlink.Qdisc, err error) {
	qs, err := nldump.Retry(func() ([]netlink.Qdisc, error) { return s.nl.QdiscList(link) })
	if err != nil {
		return nil, nil, fmt.Errorf("listing the qdiscs of %s: %w", link.Attrs().Name, err)
	}
	for _, q := range qs {
		if q.Attrs().LinkIndex != link.Attrs().Index {
			continue
		}
		switch q.Attrs().Parent {
		case netlink.HANDLE_ROOT:
			root = q
		case netlink.HANDLE_INGRESS:
			ingress = q
		}
	}
	return root, ingress, nil
}

// setBucket gives link, whose root qdisc is root, the root tbf want (nil:
// none of ours); changed says whether the kernel had to change.
func (s *Shaper) setBucket(link netlink.Link, root netlink.Qdisc, want *netlink.Tbf) (changed bool, err error) {
	have, ours := root.(*netlink.Tbf)
	if want == nil {
		if !ours {
			return false, nil
		}
		if err := s.nl.QdiscDel(have); err != nil && !errors.Is(err, unix.ENOENT) {
			return false, fmt.Errorf("removing the tbf of %s: %w", link.Attrs().Name, err)
		}
		return true, nil
	}
	if ours && sameBucket(have, want) {
		return false, nil
	}
	if err := s.nl.QdiscReplace(want); err != nil {
		return false, fmt.Errorf("setting tbf rate %s on %s: %w", FormatRate(want.Rate*8), link.Attrs().Name, err)
	}
	return true, nil
}

// Apply makes the shaping of the endpoint whose host-side veth is
// hostIfName match l: the directions l leaves unlimited lose theirs.
// changed says whether the kernel had to change. ErrNoVeth: the veth is
// gone, nothing was done. The veth's qdiscs are listed once and a new ifb
// device is made up and without a lookup: Join waits for every round trip.
func (s *Shaper) Apply(ctx context.Context, endpointID, hostIfName string, l Limits) (changed bool, err error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	veth, err := s.nl.LinkByName(hostIfName)
	if err != nil {
		if isNotFound(err) {
			return false, fmt.Errorf("%w: %s", ErrNoVeth, hostIfName)
		}
		return false, fmt.Errorf("looking up %s: %w", hostIfName, err)
	}
	root, ingress, err := s.rootAndIngress(veth)
	if err != nil {
		return false, err
	}
	var want *netlink.Tbf
	if l.IngressRate != 0 {
		want = bucket(veth.Attrs().Index, l.IngressRate, l.IngressBurst)
	}
	in, err := s.setBucket(veth, root, want)
	if err != nil {
		return false, err
	}
	out, err := s.applyEgress(veth, ingress, endpointID, l)
	return in || out, err
}

// applyEgress redirects what the container sends to its ifb device and
// shapes it there, or removes both when l.EgressRate is 0. ingress is the
// veth's ingress qdisc (nil: none).
func (s *Shaper) applyEgress(veth netlink.Link, ingress netlink.Qdisc, endpointID string, l Limits) (changed bool, err error) {
	name := IfbName(endpointID)
	if l.EgressRate == 0 {
		changed, err := s.removeRedirect(veth, ingress)
		if err != nil {
			return changed, err
		}
		gone, err := s.removeIfb(name)
		return changed || gone, err
	}
	// Without an ingress qdisc the veth was never redirected: at Join the
	// ifb device is new, at a resync its lookup comes first.
	ifb, created, err := s.ensureIfb(name, veth.Attrs().MTU, ingress == nil)
	if err != nil {
		return false, err
	}
	var root netlink.Qdisc
	if !created {
		if root, _, err = s.rootAndIngress(ifb); err != nil {
			return false, err
		}
	}
	c, err := s.setBucket(ifb, root, bucket(ifb.Attrs().Index, l.EgressRate, l.EgressBurst))
	changed = created || c
	if err != nil {
		return changed, err
	}
	c, err = s.ensureRedirect(veth, ingress, ifb)
	return changed || c, err
}

// ensureIfb finds or creates the ifb device name, up; likelyNew tries
// creating it first (made up, its index filled in: no lookup after).
func (s *Shaper) ensureIfb(name string, mtu int, likelyNew bool) (link netlink.Link, created bool, err error) {
	if likelyNew {
		if link, err := s.addIfb(name, mtu); err == nil {
			return link, true, nil
		} else if !errors.Is(err, unix.EEXIST) {
			return nil, false, err
		}
	}
	link, err = s.nl.LinkByName(name)
	if isNotFound(err) {
		if link, err = s.addIfb(name, mtu); err != nil {
			return nil, false, err
		}
		return link, true, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("looking up %s: %w", name, err)
	}
	if link.Type() != "ifb" {
		return nil, false, fmt.Errorf("%s exists and is a %s device, not an ifb device", name, link.Type())
	}
	if link.Attrs().Flags&unix.IFF_UP == 0 {
		if err := s.nl.LinkSetUp(link); err != nil {
			return nil, false, fmt.Errorf("setting %s up: %w", name, err)
		}
	}
	return link, false, nil
}

// addIfb creates the ifb device name, up.
func (s *Shaper) addIfb(name string, mtu int) (netlink.Link, error) {
	attrs := netlink.NewLinkAttrs()
	attrs.Name, attrs.MTU, attrs.TxQLen, attrs.Flags = name, mtu, 1000, net.FlagUp
	ifb := &netlink.Ifb{LinkAttrs: attrs}
	if err := s.nl.LinkAdd(ifb); err != nil {
		return nil, fmt.Errorf("creating ifb device %s: %w", name, err)
	}
	if ifb.Index != 0 {
		return ifb, nil
	}
	// netlink looks the index up after creating; that lookup failed.
	link, err := s.nl.LinkByName(name)
	if err != nil {
		return nil, fmt.Errorf("looking up the new ifb device %s: %w", name, err)
	}
	return link, nil
}

// redirectsTo tells whether f is the match-all filter that redirects to
// ifindex.
func redirectsTo(f netlink.Filter, ifindex int) bool {
	u, ok := f.(*netlink.U32)
	if !ok {
		return false
	}
	for _, a := range u.Actions {
		if m, ok := a.(*netlink.MirredAction); ok && m.Ifindex == ifindex && m.MirredAction == netlink.TCA_EGRESS_REDIR {
			return true
		}
	}
	return false
}

// ensureRedirect gives veth an ingress qdisc whose only filter sends
// every packet (u32 matching all, mirred redirect) to ifb; ingress is the
// one it has (nil: none).
func (s *Shaper) ensureRedirect(veth netlink.Link, ingress netlink.Qdisc, ifb netlink.Link) (changed bool, err error) {
	if ingress != nil {
		fs, err := nldump.Retry(func() ([]netlink.Filter, error) { return s.nl.FilterList(veth, ingressHandle) })
		if err != nil {
			return false, fmt.Errorf("listing the filters of %s: %w", veth.Attrs().Name, err)
		}
		if len(fs) == 1 && redirectsTo(fs[0], ifb.Attrs().Index) {
			return false, nil
		}
		// Stale (an ifb device since re-created) or foreign: start over.
		if _, err := s.removeRedirect(veth, ingress); err != nil {
			return false, err
		}
	}
	q := &netlink.Ingress{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: veth.Attrs().Index, Handle: ingressHandle, Parent: netlink.HANDLE_INGRESS}}
	if err := s.nl.QdiscAdd(q); err != nil {
		return false, fmt.Errorf("adding the ingress qdisc of %s: %w", veth.Attrs().Name, err)
	}
	f := &netlink.U32{
		FilterAttrs: netlink.FilterAttrs{LinkIndex: veth.Attrs().Index, Parent: ingressHandle, Priority: 1, Protocol: unix.ETH_P_ALL},
		// No selector: netlink's u32 then matches every packet.
		Actions: []netlink.Action{netlink.NewMirredAction(ifb.Attrs().Index)},
	}
	if err := s.nl.FilterAdd(f); err != nil {
		_ = s.nl.QdiscDel(q)
		return false, fmt.Errorf("adding the redirect of %s to %s: %w", veth.Attrs().Name, ifb.Attrs().Name, err)
	}
	return true, nil
}

// removeRedirect deletes veth's ingress qdisc (nil: none), and with it its
// filters.
func (s *Shaper) removeRedirect(veth netlink.Link, ingress netlink.Qdisc) (bool, error) {
	if ingress == nil {
		return false, nil
	}
	if err := s.nl.QdiscDel(ingress); err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.EINVAL) {
		return false, fmt.Errorf("removing the ingress qdisc of %s: %w", veth.Attrs().Name, err)
	}
	return true, nil
}

func (s *Shaper) removeIfb(name string) (bool, error) {
	link, err := s.nl.LinkByName(name)
	if isNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("looking up %s: %w", name, err)
	}
	if link.Type() != "ifb" {
		return false, nil
	}
	if err := s.nl.LinkDel(link); err != nil && !isNotFound(err) {
		return false, fmt.Errorf("deleting ifb device %s: %w", name, err)
	}
	return true, nil
}

// Remove deletes all shaping of an endpoint: its ifb device and, while its
// veth exists, the veth's tbf and ingress qdisc. Removing what is not
// there is fine.
func (s *Shaper) Remove(ctx context.Context, endpointID, hostIfName string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	var errs []error
	if veth, err := s.nl.LinkByName(hostIfName); err == nil {
		root, ingress, err := s.rootAndIngress(veth)
		if err != nil {
			errs = append(errs, err)
		} else {
			if _, err := s.setBucket(veth, root, nil); err != nil {
				errs = append(errs, err)
			}
			if _, err := s.removeRedirect(veth, ingress); err != nil {
				errs = append(errs, err)
			}
		}
	} else if !isNotFound(err) {
		errs = append(errs, fmt.Errorf("looking up %s: %w", hostIfName, err))
	}
	if _, err := s.removeIfb(IfbName(endpointID)); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Sweep removes what endpoints that are gone, or no longer limited, left
// behind (a crash between a Leave and its cleanup): every ifb device of
// ours (IfbPrefix) and the root tbf and ingress qdisc of every veth in
// owned (this node's endpoints) whose name keep does not hold. The
// qdiscs of other cali veths are not ours to remove: another Calico on
// the host (a CNI bandwidth plugin) shapes its veths the same way.
// removed counts the devices and qdiscs deleted.
func (s *Shaper) Sweep(ctx context.Context, keep, owned map[string]bool) (removed int, err error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	links, err := nldump.Retry(s.nl.LinkList)
	if err != nil {
		return 0, fmt.Errorf("listing links: %w", err)
	}
	qs, err := nldump.Retry(func() ([]netlink.Qdisc, error) { return s.nl.QdiscList(nil) })
	if err != nil {
		return 0, fmt.Errorf("listing qdiscs: %w", err)
	}
	byIndex := map[int]netlink.Link{}
	for _, l := range links {
		byIndex[l.Attrs().Index] = l
	}
	var errs []error
	for _, l := range links {
		name := l.Attrs().Name
		if ifbName.MatchString(name) && l.Type() == "ifb" && !keep[name] {
			if err := s.nl.LinkDel(l); err != nil && !isNotFound(err) {
				errs = append(errs, fmt.Errorf("deleting orphaned ifb device %s: %w", name, err))
				continue
			}
			removed++
		}
	}
	for _, q := range qs {
		l := byIndex[q.Attrs().LinkIndex]
		if l == nil || !owned[l.Attrs().Name] || keep[l.Attrs().Name] {
			continue
		}
		_, tbf := q.(*netlink.Tbf)
		_, ingress := q.(*netlink.Ingress)
		if (tbf && q.Attrs().Parent == netlink.HANDLE_ROOT) || ingress {
			if err := s.nl.QdiscDel(q); err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.EINVAL) {
				errs = append(errs, fmt.Errorf("deleting an orphaned qdisc of %s: %w", l.Attrs().Name, err))
				continue
			}
			removed++
		}
	}
	return removed, errors.Join(errs...)
}

// Counters are one direction's shaping counters of one endpoint.
type Counters struct {
	Bytes, Packets, Drops, Overlimits uint64
}

// Stats reads the counters of the tbf on each link in names (the host-side
// veth: traffic into the container; the ifb device: out of it), by link
// name.
func (s *Shaper) Stats(ctx context.Context, names map[string]bool) (map[string]Counters, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	links, err := nldump.Retry(s.nl.LinkList)
	if err != nil {
		return nil, fmt.Errorf("listing links: %w", err)
	}
	qs, err := nldump.Retry(func() ([]netlink.Qdisc, error) { return s.nl.QdiscList(nil) })
	if err != nil {
		return nil, fmt.Errorf("listing qdiscs: %w", err)
	}
	byIndex := map[int]string{}
	for _, l := range links {
		if names[l.Attrs().Name] {
			byIndex[l.Attrs().Index] = l.Attrs().Name
		}
	}
	out := map[string]Counters{}
	for _, q := range qs {
		name, ok := byIndex[q.Attrs().LinkIndex]
		if _, tbf := q.(*netlink.Tbf); !ok || !tbf || q.Attrs().Parent != netlink.HANDLE_ROOT {
			continue
		}
		var c Counters
		if st := q.Attrs().Statistics; st != nil {
			if st.Basic != nil {
				c.Bytes, c.Packets = st.Basic.Bytes, uint64(st.Basic.Packets)
			}
			if st.Queue != nil {
				c.Drops, c.Overlimits = uint64(st.Queue.Drops), uint64(st.Queue.Overlimits)
			}
		}
		out[name] = c
	}
	return out, nil
}

func isNotFound(err error) bool {
	var nf netlink.LinkNotFoundError
	return errors.As(err, &nf) || errors.Is(err, unix.ENODEV) || errors.Is(err, unix.ENOENT)
}
