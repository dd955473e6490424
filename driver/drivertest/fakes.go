// Package drivertest has in-memory fakes of the driver's IPAM and Dataplane
// for tests of the driver and of what sits on top of it.
package drivertest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/big"
	"net"
	"slices"
	"sync"

	"github.com/calico-cnm/calico-cnm/dataplane"
	"github.com/calico-cnm/calico-cnm/driver"
	"github.com/calico-cnm/calico-cnm/ipam"
)

// IPAM is a fake address manager: pools, and one map of assigned addresses.
// Set the hook fields before use.
type IPAM struct {
	// DefaultPool is what EnsureDefaultPool adds when there is no pool
	// ("192.168.0.0/16" when empty).
	DefaultPool string
	// Err, when set, is returned by every method (e.g. a wrapped
	// datastore.ErrUnavailable).
	Err error
	// PanicIn makes the named method panic.
	PanicIn string

	mu       sync.Mutex
	pools    []ipam.Pool
	assigned map[string]Assignment // by IP string
	expected map[string][]string   // ExpectRelease, by IP string
	calls    []string
}

// Assignment is what the fake records per address.
type Assignment struct {
	Host, HandleID string
	Attrs          map[string]string
}

// The fakes stand in for what the driver needs of the real ones.
var (
	_ driver.IPAM      = (*IPAM)(nil)
	_ driver.Dataplane = (*Dataplane)(nil)
)

// NewIPAM returns a fake with the given pools.
func NewIPAM(pools ...ipam.Pool) *IPAM {
	f := &IPAM{assigned: map[string]Assignment{}}
	for _, p := range pools {
		if _, err := f.add(p); err != nil {
			panic(err)
		}
	}
	return f
}

func (f *IPAM) enter(name string) error {
	f.calls = append(f.calls, name)
	if f.PanicIn == name {
		panic("drivertest: " + name + " panics as asked")
	}
	return f.Err
}

// Calls lists the methods called so far, in order.
func (f *IPAM) Calls() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.calls...)
}

// ResetCalls forgets the calls so far.
func (f *IPAM) ResetCalls() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = nil
}

// Pools returns the pools.
func (f *IPAM) Pools() []ipam.Pool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]ipam.Pool(nil), f.pools...)
}

// SetDisabled disables or enables the pool with that CIDR.
func (f *IPAM) SetDisabled(cidr string, disabled bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i := range f.pools {
		if f.pools[i].CIDR == cidr {
			f.pools[i].Disabled = disabled
		}
	}
}

// Assigned returns the assignment of ip, if any.
func (f *IPAM) Assigned(ip string) (Assignment, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	a, ok := f.assigned[net.ParseIP(ip).String()]
	return a, ok
}

// AssignedIPs lists the assigned addresses, sorted.
func (f *IPAM) AssignedIPs() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Sorted(maps.Keys(f.assigned))
}

func contains(outer, inner *net.IPNet) bool {
	oo, ob := outer.Mask.Size()
	io, ib := inner.Mask.Size()
	return ob == ib && oo <= io && outer.Contains(inner.IP)
}

func overlaps(a, b *net.IPNet) bool { return a.Contains(b.IP) || b.Contains(a.IP) }

func (f *IPAM) add(p ipam.Pool) (ipam.Pool, error) {
	_, n, err := net.ParseCIDR(p.CIDR)
	if err != nil {
		return ipam.Pool{}, fmt.Errorf("pool %q: %w", p.CIDR, ipam.ErrInvalidCIDR)
	}
	p.CIDR = n.String()
	for _, q := range f.pools {
		_, qn, _ := net.ParseCIDR(q.CIDR)
		if overlaps(n, qn) {
			return ipam.Pool{}, fmt.Errorf("pool %s overlaps pool %s: %w", p.CIDR, q.CIDR, ipam.ErrPoolOverlap)
		}
	}
	if p.BlockSize == 0 {
		p.BlockSize = 26
		if n.IP.To4() == nil {
			p.BlockSize = 122
		}
	}
	f.pools = append(f.pools, p)
	return p, nil
}

// EnsureDefaultPool returns the first IPv4 pool, adding DefaultPool if there
// is none.
func (f *IPAM) EnsureDefaultPool(ctx context.Context) (ipam.Pool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter("EnsureDefaultPool"); err != nil {
		return ipam.Pool{}, err
	}
	for _, p := range f.pools {
		if ip, _, _ := net.ParseCIDR(p.CIDR); ip.To4() != nil {
			return p, nil
		}
	}
	def := f.DefaultPool
	if def == "" {
		def = "192.168.0.0/16"
	}
	return f.add(ipam.Pool{CIDR: def, NATOutgoing: true})
}

// FindPool returns the pool equal to or containing subnet.
func (f *IPAM) FindPool(ctx context.Context, subnet *net.IPNet) (ipam.Pool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter("FindPool"); err != nil {
		return ipam.Pool{}, err
	}
	for _, p := range f.pools {
		_, n, _ := net.ParseCIDR(p.CIDR)
		if contains(n, subnet) {
			return p, nil
		}
	}
	return ipam.Pool{}, fmt.Errorf("no pool holds %s: %w", subnet, ipam.ErrPoolNotFound)
}

// AddPool adds a pool unless it overlaps one.
func (f *IPAM) AddPool(ctx context.Context, p ipam.Pool) (ipam.Pool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter("AddPool"); err != nil {
		return ipam.Pool{}, err
	}
	return f.add(p)
}

// ListPools returns every pool.
func (f *IPAM) ListPools(ctx context.Context) ([]ipam.Pool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter("ListPools"); err != nil {
		return nil, err
	}
	return append([]ipam.Pool(nil), f.pools...), nil
}

func nextIP(ip net.IP) net.IP {
	n := new(big.Int).SetBytes(ip)
	n.Add(n, big.NewInt(1))
	b := n.Bytes()
	out := make(net.IP, len(ip))
	copy(out[len(out)-len(b):], b)
	return out
}

func hostNet(ip net.IP) net.IPNet {
	if v4 := ip.To4(); v4 != nil {
		return net.IPNet{IP: v4, Mask: net.CIDRMask(32, 32)}
	}
	return net.IPNet{IP: ip, Mask: net.CIDRMask(128, 128)}
}

// AutoAssign takes the lowest free address of the first enabled pool of the
// family that overlaps Within (any pool when nil). The handle is
// args.HandleID, or the address itself when that is empty.
func (f *IPAM) AutoAssign(ctx context.Context, args ipam.AutoAssignArgs) (net.IPNet, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter("AutoAssign"); err != nil {
		return net.IPNet{}, err
	}
	sawDisabled := false
	for _, p := range f.pools {
		_, n, _ := net.ParseCIDR(p.CIDR)
		if (n.IP.To4() == nil) != args.IPv6 {
			continue
		}
		span := n
		if args.Within != nil {
			if !overlaps(n, args.Within) {
				continue
			}
			if contains(n, args.Within) {
				span = args.Within
			}
		}
		if p.Disabled {
			sawDisabled = true
			continue
		}
		ip := span.IP.Mask(span.Mask)
		if v4 := ip.To4(); v4 != nil {
			ip = v4
		}
		for ; span.Contains(ip); ip = nextIP(ip) {
			if _, used := f.assigned[ip.String()]; !used {
				f.assigned[ip.String()] = Assignment{Host: args.Host, HandleID: args.HandleID, Attrs: args.Attrs}
				return hostNet(ip), nil
			}
		}
	}
	if sawDisabled {
		return net.IPNet{}, fmt.Errorf("the pool is disabled: %w", ipam.ErrPoolDisabled)
	}
	return net.IPNet{}, fmt.Errorf("no free address: %w", ipam.ErrExhausted)
}

// AssignIP takes a specific address of an enabled pool.
func (f *IPAM) AssignIP(ctx context.Context, args ipam.AssignIPArgs) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter("AssignIP"); err != nil {
		return err
	}
	for _, p := range f.pools {
		_, n, _ := net.ParseCIDR(p.CIDR)
		if !n.Contains(args.IP) {
			continue
		}
		if p.Disabled {
			return fmt.Errorf("pool %s is disabled: %w", p.CIDR, ipam.ErrPoolDisabled)
		}
		if _, used := f.assigned[args.IP.String()]; used {
			return fmt.Errorf("%s is taken: %w", args.IP, ipam.ErrAddressInUse)
		}
		f.assigned[args.IP.String()] = Assignment{Host: args.Host, HandleID: args.HandleID, Attrs: args.Attrs}
		return nil
	}
	return fmt.Errorf("%s is in no pool: %w", args.IP, ipam.ErrNotInPool)
}

// ReleaseIP frees ip; a free address is fine, one outside every pool is
// ErrNotInPool (as the engine does).
func (f *IPAM) ReleaseIP(ctx context.Context, ip net.IP) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter("ReleaseIP"); err != nil {
		return err
	}
	return f.release(ip, nil)
}

// ReleaseIPUnless is ReleaseIP that spares a holder keep says to keep.
func (f *IPAM) ReleaseIPUnless(ctx context.Context, ip net.IP, keep func(ipam.Allocation) bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter("ReleaseIP"); err != nil {
		return err
	}
	return f.release(ip, keep)
}

// UpdateHolder lets decide relabel the holder of ip.
func (f *IPAM) UpdateHolder(ctx context.Context, ip net.IP, decide func(ipam.Allocation) (map[string]string, error)) (ipam.Allocation, bool, error) {
	a, found, err := f.AddressHolder(ctx, ip)
	if err != nil || !found {
		return a, found, err
	}
	attrs, err := decide(a)
	if err != nil || attrs == nil {
		return a, true, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	as := f.assigned[ip.String()]
	as.Attrs = maps.Clone(attrs)
	f.assigned[ip.String()] = as
	a.Attrs = maps.Clone(attrs)
	return a, true, nil
}

func (f *IPAM) release(ip net.IP, keep func(ipam.Allocation) bool) error {
	for _, p := range f.pools {
		if _, n, _ := net.ParseCIDR(p.CIDR); n.Contains(ip) {
			want, expected := f.expected[ip.String()]
			a, ok := f.assigned[ip.String()]
			if ok && expected && !slices.Contains(want, a.HandleID) {
				return nil
			}
			if ok && keep != nil && keep(ipam.Allocation{IP: ip, HandleID: a.HandleID, Attrs: maps.Clone(a.Attrs), Host: a.Host}) {
				return nil
			}
			delete(f.assigned, ip.String())
			return nil
		}
	}
	return fmt.Errorf("cannot release %s: in no pool: %w", ip, ipam.ErrNotInPool)
}

// AddressHolder returns the assignment of ip; one outside every pool is
// ErrNotInPool (as the engine does).
func (f *IPAM) AddressHolder(ctx context.Context, ip net.IP) (ipam.Allocation, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter("AddressHolder"); err != nil {
		return ipam.Allocation{}, false, err
	}
	for _, p := range f.pools {
		if _, n, _ := net.ParseCIDR(p.CIDR); n.Contains(ip) {
			a, ok := f.assigned[ip.String()]
			if !ok {
				return ipam.Allocation{}, false, nil
			}
			return ipam.Allocation{IP: ip, HandleID: a.HandleID, Attrs: maps.Clone(a.Attrs), Host: a.Host}, true, nil
		}
	}
	return ipam.Allocation{}, false, fmt.Errorf("%s is in no pool: %w", ip, ipam.ErrNotInPool)
}

// ExpectRelease records the handles a release of ip is meant for; the
// fake's ReleaseIP then spares any other holder, as the engine does.
func (f *IPAM) ExpectRelease(ip net.IP, handles ...string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, "ExpectRelease")
	if f.expected == nil {
		f.expected = map[string][]string{}
	}
	f.expected[ip.String()] = slices.Clone(handles)
}

// Dataplane is a fake kernel: a map of workloads.
type Dataplane struct {
	// AddErr fails AddWorkload (which then leaves nothing, like the real one).
	AddErr error
	// RemoveErr fails RemoveWorkload.
	RemoveErr error
	// AfterAdd runs after a successful AddWorkload (e.g. to break the
	// datastore record the driver writes next).
	AfterAdd func(w dataplane.Workload)
	// LinkLocal is what HostLinkLocalIPv6 answers (fe80::1 when nil);
	// LinkLocalErr fails it.
	LinkLocal    net.IP
	LinkLocalErr error

	mu        sync.Mutex
	workloads map[string]dataplane.Workload
	removed   []Removal
	adds      int
}

// Removal is one RemoveWorkload call.
type Removal struct {
	EndpointID string
	IPs        []net.IPNet
}

// NewDataplane returns an empty fake dataplane.
func NewDataplane() *Dataplane {
	return &Dataplane{workloads: map[string]dataplane.Workload{}}
}

// AddWorkload records w.
func (f *Dataplane) AddWorkload(ctx context.Context, w dataplane.Workload) error {
	f.mu.Lock()
	f.adds++
	if f.AddErr != nil {
		f.mu.Unlock()
		return f.AddErr
	}
	if _, ok := f.workloads[w.EndpointID]; ok {
		f.mu.Unlock()
		return errors.New("drivertest: workload exists")
	}
	f.workloads[w.EndpointID] = w
	hook := f.AfterAdd
	f.mu.Unlock()
	if hook != nil {
		hook(w)
	}
	return nil
}

// RemoveWorkload forgets the workload; a missing one is fine.
func (f *Dataplane) RemoveWorkload(ctx context.Context, endpointID string, ips []net.IPNet) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.removed = append(f.removed, Removal{EndpointID: endpointID, IPs: ips})
	if f.RemoveErr != nil {
		return f.RemoveErr
	}
	delete(f.workloads, endpointID)
	return nil
}

// HostLinkLocalIPv6 answers LinkLocal.
func (f *Dataplane) HostLinkLocalIPv6(ctx context.Context, hostIfName string) (net.IP, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.LinkLocalErr != nil {
		return nil, f.LinkLocalErr
	}
	if f.LinkLocal != nil {
		return f.LinkLocal, nil
	}
	return net.ParseIP(dataplane.GatewayIPv6), nil
}

// Workload returns the workload of an endpoint, if present.
func (f *Dataplane) Workload(endpointID string) (dataplane.Workload, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	w, ok := f.workloads[endpointID]
	return w, ok
}

// Removals lists the RemoveWorkload calls.
func (f *Dataplane) Removals() []Removal {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]Removal(nil), f.removed...)
}

// Adds counts AddWorkload calls.
func (f *Dataplane) Adds() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.adds
}
