package bandwidth

import (
	"maps"
	"net"
	"slices"
	"sync"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// fakeKernel is Netlink in memory: links, qdiscs and filters, keyed the way
// the kernel keys them (a link's root and ingress qdiscs, the filters of a
// qdisc).
type fakeKernel struct {
	mu      sync.Mutex
	next    int
	links   map[string]netlink.Link
	qdiscs  []netlink.Qdisc
	filters []netlink.Filter
	calls   int // mutating calls
}

func newFakeKernel() *fakeKernel {
	return &fakeKernel{next: 10, links: map[string]netlink.Link{}}
}

// addVeth adds a workload veth's host side.
func (k *fakeKernel) addVeth(name string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.next++
	attrs := netlink.NewLinkAttrs()
	attrs.Name, attrs.Index, attrs.MTU, attrs.Flags = name, k.next, 1500, net.FlagUp
	k.links[name] = &netlink.Veth{LinkAttrs: attrs}
}

func (k *fakeKernel) LinkByName(name string) (netlink.Link, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if l, ok := k.links[name]; ok {
		return l, nil
	}
	return nil, unix.ENODEV
}

func (k *fakeKernel) LinkList() ([]netlink.Link, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return slices.Collect(maps.Values(k.links)), nil
}

func (k *fakeKernel) LinkAdd(link netlink.Link) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.calls++
	if _, ok := k.links[link.Attrs().Name]; ok {
		return unix.EEXIST
	}
	k.next++
	link.Attrs().Index = k.next
	k.links[link.Attrs().Name] = link
	return nil
}

func (k *fakeKernel) LinkDel(link netlink.Link) error {
	return k.changeLink(link, func(l netlink.Link) {
		delete(k.links, l.Attrs().Name)
		k.dropOf(l.Attrs().Index, 0)
	})
}

// changeLink counts a mutating call and applies change to the link
// named as link is, under the lock; ENODEV when there is none.
func (k *fakeKernel) changeLink(link netlink.Link, change func(l netlink.Link)) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.calls++
	l, ok := k.links[link.Attrs().Name]
	if !ok {
		return unix.ENODEV
	}
	change(l)
	return nil
}

// dropOf deletes the qdiscs of link index (parent 0: all) and their filters.
func (k *fakeKernel) dropOf(index int, parent uint32) {
	k.qdiscs = slices.DeleteFunc(k.qdiscs, func(q netlink.Qdisc) bool {
		return q.Attrs().LinkIndex == index && (parent == 0 || q.Attrs().Parent == parent)
	})
	k.filters = slices.DeleteFunc(k.filters, func(f netlink.Filter) bool {
		return f.Attrs().LinkIndex == index && (parent == 0 || parent == netlink.HANDLE_INGRESS)
	})
}

// matching are the xs keep takes, in a new slice: what a list call
// returns is the caller's.
func matching[T any](xs []T, keep func(T) bool) []T {
	var out []T
	for _, x := range xs {
		if keep(x) {
			out = append(out, x)
		}
	}
	return out
}

func (k *fakeKernel) LinkSetUp(link netlink.Link) error {
	return k.changeLink(link, func(l netlink.Link) { l.Attrs().Flags |= net.FlagUp })
}

func (k *fakeKernel) QdiscList(link netlink.Link) ([]netlink.Qdisc, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return matching(k.qdiscs, func(q netlink.Qdisc) bool {
		return link == nil || q.Attrs().LinkIndex == link.Attrs().Index
	}), nil
}

func (k *fakeKernel) find(q netlink.Qdisc) int {
	for i, have := range k.qdiscs {
		if have.Attrs().LinkIndex == q.Attrs().LinkIndex && have.Attrs().Parent == q.Attrs().Parent {
			return i
		}
	}
	return -1
}

func (k *fakeKernel) QdiscAdd(q netlink.Qdisc) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.calls++
	if k.find(q) >= 0 {
		return unix.EEXIST
	}
	k.qdiscs = append(k.qdiscs, q)
	return nil
}

func (k *fakeKernel) QdiscReplace(q netlink.Qdisc) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.calls++
	if i := k.find(q); i >= 0 {
		k.qdiscs[i] = q
		return nil
	}
	k.qdiscs = append(k.qdiscs, q)
	return nil
}

func (k *fakeKernel) QdiscDel(q netlink.Qdisc) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.calls++
	if k.find(q) < 0 {
		return unix.ENOENT
	}
	k.dropOf(q.Attrs().LinkIndex, q.Attrs().Parent)
	return nil
}

func (k *fakeKernel) FilterList(link netlink.Link, parent uint32) ([]netlink.Filter, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return matching(k.filters, func(f netlink.Filter) bool {
		return f.Attrs().LinkIndex == link.Attrs().Index && f.Attrs().Parent == parent
	}), nil
}

func (k *fakeKernel) FilterAdd(f netlink.Filter) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.calls++
	k.filters = append(k.filters, f)
	return nil
}

// shaping is what the fake kernel has of the endpoint: the rates of the
// veth's and the ifb device's tbf (0: none), and whether the veth
// redirects to the ifb device.
func (k *fakeKernel) shaping(id, host string) (in, out uint64, redirect bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	veth, ifb := k.links[host], k.links[IfbName(id)]
	for _, q := range k.qdiscs {
		tbf, ok := q.(*netlink.Tbf)
		switch {
		case ok && veth != nil && q.Attrs().LinkIndex == veth.Attrs().Index:
			in = tbf.Rate * 8
		case ok && ifb != nil && q.Attrs().LinkIndex == ifb.Attrs().Index:
			out = tbf.Rate * 8
		}
	}
	for _, f := range k.filters {
		if veth != nil && ifb != nil && f.Attrs().LinkIndex == veth.Attrs().Index && redirectsTo(f, ifb.Attrs().Index) {
			redirect = true
		}
	}
	return in, out, redirect
}

func (k *fakeKernel) mutations() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.calls
}
