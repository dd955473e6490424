package driver

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"net"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	ipamapi "github.com/docker/go-plugins-helpers/ipam"
	"github.com/sirupsen/logrus"

	"github.com/calico-cnm/calico-cnm/dataplane"
	"github.com/calico-cnm/calico-cnm/ipam"
)

// IPAMDriver is the "calico-ipam" libnetwork IPAM driver.
type IPAMDriver struct {
	ipam IPAM
	host string
	log  logrus.FieldLogger
	// allocator names this instance as a swarm manager's allocator
	// (ipam.AttrAllocator).
	allocator string

	mu sync.Mutex
	// swarmPools is when this instance last answered a swarm RequestPool,
	// by PoolID: a swarm allocator (re)starting asks for its pools before
	// it restores its tasks' addresses.
	swarmPools map[string]time.Time
}

// NewIPAMDriver serves Docker's IPAM requests from ipam for this host.
func NewIPAMDriver(im IPAM, host string, log logrus.FieldLogger) *IPAMDriver {
	if log == nil {
		log = logrus.StandardLogger()
	}
	return &IPAMDriver{ipam: im, host: host, log: log.WithField("driver", "calico-ipam"),
		allocator: randomHex(), swarmPools: map[string]time.Time{}}
}

// GetCapabilities: calico-ipam does not need the endpoint's MAC.
func (d *IPAMDriver) GetCapabilities(ctx context.Context) (*ipamapi.CapabilitiesResponse, error) {
	return &ipamapi.CapabilitiesResponse{RequiresMACAddress: false}, nil
}

// GetDefaultAddressSpaces names calico's address spaces, by which the network
// driver recognises calico-ipam networks.
func (d *IPAMDriver) GetDefaultAddressSpaces(ctx context.Context) (*ipamapi.AddressSpacesResponse, error) {
	return &ipamapi.AddressSpacesResponse{
		LocalDefaultAddressSpace:  CalicoLocalAddressSpace,
		GlobalDefaultAddressSpace: CalicoGlobalAddressSpace,
	}, nil
}

// poolOptions are the --ipam-opt values calico-ipam understands.
type poolOptions struct {
	createPool  bool
	natOutgoing bool
}

func parsePoolOptions(opts map[string]string) (poolOptions, error) {
	var po poolOptions
	keys := make([]string, 0, len(opts))
	for k := range opts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		v := opts[k]
		var dst *bool
		switch k {
		case OptCreatePool:
			dst = &po.createPool
		case OptNATOutgoing:
			dst = &po.natOutgoing
		default:
			if strings.HasPrefix(k, "calico.") {
				return po, userError(fmt.Sprintf("unknown calico-ipam option --ipam-opt %s (known: %s, %s)", k, OptCreatePool, OptNATOutgoing), ErrInvalidRequest)
			}
			continue // not ours: Docker or another tool's business
		}
		b, err := strconv.ParseBool(v)
		if err != nil {
			return po, userError(fmt.Sprintf("calico-ipam option --ipam-opt %s=%s must be true or false", k, v), ErrInvalidRequest, err)
		}
		*dst = b
	}
	if po.natOutgoing && !po.createPool {
		return po, userError(fmt.Sprintf("--ipam-opt %s only applies together with %s=true (it sets up a new pool)", OptNATOutgoing, OptCreatePool), ErrInvalidRequest)
	}
	return po, nil
}

// RequestPool registers a network's address pool. Without --subnet an IPv4
// network draws from any enabled calico pool (PoolID PoolIDV4, Pool
// 0.0.0.0/0); with --subnet the subnet must be, or sit inside, an enabled
// calico pool (or becomes one with --ipam-opt calico.create-pool=true), and
// the canonical subnet is the PoolID. Data always carries a virtual gateway so
// that Docker does not ask for one. A request in the global address space
// comes from the swarm manager: its PoolID gets SwarmPoolIDPrefix.
func (d *IPAMDriver) RequestPool(ctx context.Context, req *ipamapi.RequestPoolRequest) (*ipamapi.RequestPoolResponse, error) {
	swarm := req.AddressSpace == CalicoGlobalAddressSpace
	idPrefix := ""
	if swarm {
		idPrefix = SwarmPoolIDPrefix
		defer d.swarmPoolRequested(idPrefix, req)
	}
	log := d.log.WithFields(logrus.Fields{"pool": req.Pool, "v6": req.V6, "swarm": swarm})
	if req.SubPool != "" {
		return nil, userError(fmt.Sprintf("calico-ipam does not support --ip-range (%s): addresses come from the calico pool's blocks, so use --subnet alone", req.SubPool), ErrNotSupported)
	}
	po, err := parsePoolOptions(req.Options)
	if err != nil {
		return nil, err
	}
	subnet, err := requestedSubnet(req)
	if err != nil {
		return nil, err
	}
	if subnet == nil {
		return d.requestDefaultPool(ctx, req.V6, po, idPrefix, log)
	}

	cidr := subnet.String()
	pool, err := d.calicoPoolOf(ctx, subnet, req.V6, po, log)
	if err != nil {
		return nil, err
	}
	if pool.Disabled {
		return nil, userError(fmt.Sprintf("calico pool %s, which holds subnet %s, is disabled", pool.CIDR, cidr), ipam.ErrPoolDisabled)
	}
	gw := VirtualGatewayIPv4
	if subnet.IP.To4() == nil {
		gw = VirtualGatewayIPv6
	}
	log.WithField("calicoPool", pool.CIDR).Debug("network subnet is in a calico pool")
	return &ipamapi.RequestPoolResponse{
		PoolID: idPrefix + cidr,
		Pool:   cidr,
		Data:   map[string]string{GatewayDataKey: gw},
	}, nil
}

// requestedSubnet is the --subnet of req, nil when there is none (or it is
// the 0.0.0.0/0 or ::/0 of a network created without one).
func requestedSubnet(req *ipamapi.RequestPoolRequest) (*net.IPNet, error) {
	if req.Pool == "" {
		return nil, nil
	}
	ip, n, err := net.ParseCIDR(req.Pool)
	if err != nil {
		return nil, userError(fmt.Sprintf("--subnet %q is not a valid CIDR", req.Pool), ErrInvalidRequest, ipam.ErrInvalidCIDR, err)
	}
	if isIPv4(ip) == req.V6 {
		want := "IPv4"
		if req.V6 {
			want = "IPv6"
		}
		return nil, userError(fmt.Sprintf("--subnet %s was given for the %s addresses of the network", req.Pool, want), ErrInvalidRequest)
	}
	// Docker passes 0.0.0.0/0 (::/0) back when it restores a network
	// that was created without --subnet: that is the default pool.
	if ones, _ := n.Mask.Size(); n.IP.IsUnspecified() && ones == 0 {
		return nil, nil
	}
	return n, nil
}

// requestDefaultPool answers a RequestPool without --subnet: the network
// draws from every enabled IPv4 calico pool, once the default one exists.
func (d *IPAMDriver) requestDefaultPool(ctx context.Context, v6 bool, po poolOptions, idPrefix string, log logrus.FieldLogger) (*ipamapi.RequestPoolResponse, error) {
	if v6 {
		return nil, userError("calico-ipam has no default IPv6 pool: pass --subnet with an IPv6 calico pool (or part of one; see `calico-cnm pool add <cidr>`) together with --ipv6", ErrInvalidRequest)
	}
	if po.createPool {
		return nil, userError(fmt.Sprintf("--ipam-opt %s=true needs --subnet: it adds that subnet as a calico pool", OptCreatePool), ErrInvalidRequest)
	}
	pool, err := d.ipam.EnsureDefaultPool(ctx)
	if err != nil {
		return nil, ipamErr("setting up the default calico pool", err)
	}
	if pool.Disabled {
		return nil, userError(fmt.Sprintf("the default calico pool %s is disabled: enable it or create the network with --subnet of an enabled pool", pool.CIDR), ipam.ErrPoolDisabled)
	}
	log.WithField("calicoPool", pool.CIDR).Debug("network uses all enabled IPv4 pools")
	return &ipamapi.RequestPoolResponse{
		PoolID: idPrefix + PoolIDV4,
		Pool:   VirtualGatewayIPv4, // 0.0.0.0/0: any calico pool
		Data:   map[string]string{GatewayDataKey: VirtualGatewayIPv4},
	}, nil
}

// calicoPoolOf is the calico pool equal to or holding subnet; with
// calico.create-pool, subnet becomes one when there is none.
func (d *IPAMDriver) calicoPoolOf(ctx context.Context, subnet *net.IPNet, v6 bool, po poolOptions, log logrus.FieldLogger) (ipam.Pool, error) {
	cidr := subnet.String()
	pool, err := d.ipam.FindPool(ctx, subnet)
	if errors.Is(err, ipam.ErrPoolNotFound) && !v6 {
		// The default pool is created on first use: a fresh datastore
		// must accept --subnet 192.168.0.0/16 (or a part of it) as is.
		if _, derr := d.ipam.EnsureDefaultPool(ctx); derr != nil {
			return ipam.Pool{}, ipamErr("setting up the default calico pool", derr)
		}
		pool, err = d.ipam.FindPool(ctx, subnet)
	}
	switch {
	case errors.Is(err, ipam.ErrPoolNotFound) && po.createPool:
		pool, err = d.addPool(ctx, subnet, po)
		if err != nil {
			return ipam.Pool{}, err
		}
		log.WithField("calicoPool", pool.CIDR).Info("added the network's subnet as a calico pool")
	case errors.Is(err, ipam.ErrPoolNotFound):
		return ipam.Pool{}, userError(fmt.Sprintf("subnet %s is not inside any calico pool: add one with `calico-cnm pool add %s`, or pass --ipam-opt %s=true", cidr, cidr, OptCreatePool), err)
	case err != nil:
		return ipam.Pool{}, ipamErr("looking up the calico pool of subnet "+cidr, err)
	}
	return pool, nil
}

// addPool adds subnet as a pool; if another host added it (or a pool holding
// it) meanwhile, that pool is used.
func (d *IPAMDriver) addPool(ctx context.Context, subnet *net.IPNet, po poolOptions) (ipam.Pool, error) {
	ones, bits := subnet.Mask.Size()
	block := 26
	if bits == 128 {
		block = 122
	}
	if ones > block {
		block = ones
	}
	pool, err := d.ipam.AddPool(ctx, ipam.Pool{CIDR: subnet.String(), BlockSize: block, NATOutgoing: po.natOutgoing})
	if err == nil {
		return pool, nil
	}
	if errors.Is(err, ipam.ErrPoolOverlap) {
		if p, ferr := d.ipam.FindPool(ctx, subnet); ferr == nil {
			return p, nil // lost a race to an identical request
		}
		return ipam.Pool{}, fmt.Errorf("cannot add subnet %s as a calico pool: %w", subnet, err)
	}
	return ipam.Pool{}, ipamErr("adding subnet "+subnet.String()+" as a calico pool", err)
}

// ReleasePool: pools outlive networks (they are the administrator's), so there
// is nothing to do.
func (d *IPAMDriver) ReleasePool(ctx context.Context, req *ipamapi.ReleasePoolRequest) error {
	d.log.WithField("pool", req.PoolID).Debug("pool released by Docker")
	return nil
}

// parsePoolID returns the subnet addresses must come from (nil: any pool),
// the family, and whether the pool is the swarm manager's.
func parsePoolID(id string) (within *net.IPNet, v6, swarm bool, err error) {
	rest, swarm := strings.CutPrefix(id, SwarmPoolIDPrefix)
	switch rest {
	case PoolIDV4:
		return nil, false, swarm, nil
	case PoolIDV6:
		return nil, true, swarm, nil
	}
	_, n, err := net.ParseCIDR(rest)
	if err != nil {
		return nil, false, false, userError(fmt.Sprintf("pool id %q was not issued by calico-ipam (recreate the network with --ipam-driver calico-ipam)", id), ErrInvalidRequest, err)
	}
	return n, n.IP.To4() == nil, swarm, nil
}

// swarmPoolRequested notes when the swarm allocator asked for the pool it
// got (the PoolID RequestPool answers).
func (d *IPAMDriver) swarmPoolRequested(prefix string, req *ipamapi.RequestPoolRequest) {
	id := prefix + PoolIDV4
	if req.V6 {
		id = prefix + PoolIDV6
	}
	if _, n, err := net.ParseCIDR(req.Pool); err == nil {
		if ones, _ := n.Mask.Size(); !(n.IP.IsUnspecified() && ones == 0) {
			id = prefix + n.String()
		}
	}
	d.mu.Lock()
	d.swarmPools[id] = time.Now()
	d.mu.Unlock()
}

// samePool tells whether two PoolIDs name the same calico pool, whichever
// side (manager or node) issued them.
func samePool(a, b string) bool {
	return strings.TrimPrefix(a, SwarmPoolIDPrefix) == strings.TrimPrefix(b, SwarmPoolIDPrefix)
}

// errNotShared: the address is held, and not by an assignment the request
// may share.
var errNotShared = errors.New("not a swarm assignment this request may share")

// shareSwarmAddress decides the swarm shortcut for ip, which a request in
// poolID found held. A node shares it when the swarm manager assigned it
// through the same pool (the node's container of that task). The manager
// shares it only as a restore: when the assignment is not its current
// allocator's (another manager, or this one before a restart), or predates
// its allocator's last request for the pool; it then takes the assignment
// over, in one guarded transaction, so that a later request of the same
// address is refused. Any other request for a held address is refused:
// that is a second attachment asking for a task's address.
func (d *IPAMDriver) shareSwarmAddress(ctx context.Context, ip net.IP, poolID string, swarm bool) (bool, error) {
	if !swarm {
		a, found, err := d.ipam.AddressHolder(ctx, ip)
		if err != nil {
			return false, err
		}
		return found && ipam.IsSwarm(a.Attrs) && samePool(a.Attrs[ipam.AttrPool], poolID), nil
	}
	d.mu.Lock()
	poolAsked, asked := d.swarmPools[poolID]
	d.mu.Unlock()
	_, found, err := d.ipam.UpdateHolder(ctx, ip, func(a ipam.Allocation) (map[string]string, error) {
		if !ipam.IsSwarm(a.Attrs) || !samePool(a.Attrs[ipam.AttrPool], poolID) {
			return nil, errNotShared
		}
		if a.Attrs[ipam.AttrAllocator] == d.allocator {
			at, stamped := ipam.AssignedAt(a.Attrs)
			if !asked || !stamped || !at.Before(poolAsked) {
				return nil, errNotShared
			}
		}
		attrs := maps.Clone(a.Attrs)
		attrs[ipam.AttrAllocator] = d.allocator
		attrs[ipam.AttrPool] = poolID
		attrs[ipam.AttrNode] = d.host
		return attrs, nil
	})
	if errors.Is(err, errNotShared) {
		return false, nil
	}
	return found && err == nil, err
}

// RequestAddress assigns a container address (AssignIP for docker run --ip,
// otherwise AutoAssign from this host's blocks) and answers it as a /32
// (/128), so that all the container's traffic goes through its gateway. A
// request for the network's gateway is answered with the virtual gateway
// 0.0.0.0/0 (::/0) and reserves nothing: see VirtualGatewayIPv4.
//
// Swarm: the manager's requests (swarm pool) assign with AttrSwarm, under
// the manager's node name. A node then asks, in its local pool, for the
// very address the manager assigned to the task it runs: an address held
// by a swarm assignment of the same pool is answered as is, without a
// second assignment. So is a manager's request for an address a swarm
// assignment already holds, when it is a restore: after a restart or a
// leader change the manager re-requests every task's address (its own
// allocator state is in memory, ours in etcd). See shareSwarmAddress.
func (d *IPAMDriver) RequestAddress(ctx context.Context, req *ipamapi.RequestAddressRequest) (*ipamapi.RequestAddressResponse, error) {
	within, v6, swarm, err := parsePoolID(req.PoolID)
	if err != nil {
		return nil, err
	}
	log := d.log.WithField("pool", req.PoolID)

	if req.Options[RequestAddressTypeKey] == RequestAddressTypeGateway {
		gw := VirtualGatewayIPv4
		if v6 {
			gw = VirtualGatewayIPv6
		}
		if ip := net.ParseIP(req.Address); ip != nil && !ip.IsUnspecified() {
			log.WithField("ip", req.Address).Warnf("ignoring --gateway %s: containers on calico networks always route via %s, and no address is reserved for a gateway", req.Address, dataplane.GatewayIPv4)
		} else {
			log.Debug("gateway request answered with the virtual gateway")
		}
		return &ipamapi.RequestAddressResponse{Address: gw}, nil
	}

	attrs := map[string]string{ipam.AttrNode: d.host, ipam.AttrPool: req.PoolID}
	if swarm {
		attrs[ipam.AttrSwarm] = "true"
		attrs[ipam.AttrAllocator] = d.allocator
	}
	var ip net.IP
	if req.Address != "" {
		ip = net.ParseIP(req.Address)
		if ip == nil {
			if cip, _, cerr := net.ParseCIDR(req.Address); cerr == nil {
				ip = cip
			}
		}
		if ip == nil {
			return nil, userError(fmt.Sprintf("requested address %q is not an IP address", req.Address), ErrInvalidRequest)
		}
		if isIPv4(ip) == v6 {
			return nil, userError(fmt.Sprintf("requested address %s is not of the pool's IP family (pool %s)", ip, req.PoolID), ErrInvalidRequest)
		}
		if within != nil && !within.Contains(ip) {
			return nil, userError(fmt.Sprintf("requested address %s is outside the network's subnet %s", ip, within), ErrInvalidRequest, ipam.ErrNotInPool)
		}
		log = log.WithField("ip", ip.String())
		err := d.ipam.AssignIP(ctx, ipam.AssignIPArgs{IP: ip, Host: d.host, HandleID: newHandleID(), Attrs: attrs})
		if errors.Is(err, ipam.ErrAddressInUse) {
			shared, serr := d.shareSwarmAddress(ctx, ip, req.PoolID, swarm)
			if serr != nil {
				return nil, assignErr("address "+ip.String(), serr)
			}
			if shared {
				if swarm {
					log.Info("the swarm manager asks again for an address it assigned (restart or leader change): keeping the assignment")
				} else {
					log.Info("address assigned by the swarm manager to a task of this node: used as is (the manager releases it)")
				}
				hn := hostNet(ip)
				return &ipamapi.RequestAddressResponse{Address: hn.String()}, nil
			}
		}
		if err != nil {
			return nil, assignErr("address "+ip.String(), err)
		}
		log.Debug("assigned the requested address")
	} else {
		n, err := d.ipam.AutoAssign(ctx, ipam.AutoAssignArgs{Host: d.host, HandleID: newHandleID(), Attrs: attrs, IPv6: v6, Within: within})
		if err != nil {
			fam := "IPv4"
			if v6 {
				fam = "IPv6"
			}
			return nil, assignErr("an "+fam+" address from "+poolDesc(within), err)
		}
		ip = n.IP
		log.WithField("ip", ip.String()).Debug("assigned an address")
	}
	hn := hostNet(ip)
	return &ipamapi.RequestAddressResponse{Address: hn.String()}, nil
}

// newHandleID names the handle of one assignment: HandlePrefix + 16 random
// hex digits (see HandlePrefix for why it is not derived from the address).
func newHandleID() string { return HandlePrefix + randomHex() }

// NewHandleID is a fresh handle for an assignment made outside a Docker
// request (the reconcile loop's reclaims).
func NewHandleID() string { return newHandleID() }

// randomHex is 16 random hex digits.
func randomHex() string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read does not fail on Linux
	return hex.EncodeToString(b[:])
}

func poolDesc(within *net.IPNet) string {
	if within == nil {
		return "the calico pools"
	}
	return "subnet " + within.String()
}

// ReleaseAddress frees a container address; the virtual gateway and
// addresses that are already free need nothing.
func (d *IPAMDriver) ReleaseAddress(ctx context.Context, req *ipamapi.ReleaseAddressRequest) error {
	ip := net.ParseIP(req.Address)
	if ip == nil {
		if cip, _, err := net.ParseCIDR(req.Address); err == nil {
			ip = cip
		}
	}
	if ip == nil {
		return userError(fmt.Sprintf("cannot release %q: not an IP address", req.Address), ErrInvalidRequest)
	}
	log := d.log.WithFields(logrus.Fields{"pool": req.PoolID, "ip": ip.String()})
	// The virtual gateway (0.0.0.0, ::) and link-local addresses (the real
	// gateways) were never assigned.
	if ip.IsUnspecified() || ip.IsLinkLocalUnicast() {
		log.Debug("virtual gateway: nothing to release")
		return nil
	}
	// Who holds the address is decided inside the releasing transaction.
	// A node's release (local pool) never frees the swarm manager's
	// assignment: the manager releases it when it frees the task. The
	// manager's release frees only a swarm assignment of its pool, so a
	// late or repeated release cannot free whoever got the address next.
	// A release naming no known pool goes by address.
	var keep func(ipam.Allocation) bool
	if _, _, swarm, err := parsePoolID(req.PoolID); err == nil && swarm {
		keep = func(a ipam.Allocation) bool {
			return !ipam.IsSwarm(a.Attrs) || !samePool(a.Attrs[ipam.AttrPool], req.PoolID)
		}
	} else if err == nil {
		keep = func(a ipam.Allocation) bool { return ipam.IsSwarm(a.Attrs) }
	}
	if err := d.ipam.ReleaseIPUnless(ctx, ip, keep); err != nil {
		if errors.Is(err, ipam.ErrNotInPool) {
			// Outside every pool, so never (or no longer) assigned.
			log.WithError(err).Debug("address in no pool: nothing to release")
			return nil
		}
		return ipamErr("releasing address "+ip.String(), err)
	}
	log.Debug("released address")
	return nil
}

// ipamErr words an IPAM engine failure. The engine's own errors are already
// sentences for the user (what failed, what to do): they only get context.
func ipamErr(doing string, err error) error {
	if isStoreFailure(err) {
		return storeErr(doing, err)
	}
	return fmt.Errorf("calico-ipam failed %s: %w", doing, err)
}

// assignErr words a failed assignment of what ("10.0.0.5", "an IPv4
// address from subnet 10.0.0.0/24").
func assignErr(what string, err error) error {
	if isStoreFailure(err) {
		return storeErr("assigning "+what, err)
	}
	return fmt.Errorf("calico-ipam cannot assign %s: %w", what, err)
}
