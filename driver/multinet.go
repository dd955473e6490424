package driver

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"sync"

	"github.com/docker/go-plugins-helpers/network"
	"github.com/sirupsen/logrus"

	"github.com/calico-cnm/calico-cnm/dataplane"
	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/ipam"
	"github.com/calico-cnm/calico-cnm/ports"
)

// IsInternal reports whether a network was created with --internal: its
// containers get no default route and reach nothing outside the pools.
func IsInternal(nw datastore.Network) bool { return nw.Options[ports.OptInternal] == "true" }

// joinPlan is what Join hands to Docker for one calico interface of a
// container that may have others (docker network connect, compose
// services on several networks, a calico network next to a bridge one).
//
// How Docker uses it (libnetwork sandbox.populateNetworkResources and
// updateGateway): the on-link (RouteTypeConnected) routes are added with
// the interface, the routes via a next hop after it, and the sandbox's
// default route goes through the Gateway of exactly one endpoint, the
// first of its endpoints in libnetwork's order (internal networks last,
// then by network name) that has one; when that endpoint leaves, the next
// one's gateway takes over. So every interface gets a gateway of its own
// (dataplane.Gateways: 169.254.1.n, fe80::n, n unused by the container's
// other calico interfaces, so the on-link routes never collide) plus
// routes via that gateway to its network's own subnets, which keep its
// peers reachable through it whichever interface holds the default route
// (another calico network, or Docker's bridge). A destination another
// interface of the container already routes is left out: the kernel
// refuses a second route to the same prefix ("file exists").
type joinPlan struct {
	index    int
	gw4, gw6 net.IP
	routes   []string // destinations, both families
	internal bool
	// netOptions are the network record's options (its bandwidth
	// defaults).
	netOptions map[string]string
}

// sandboxOf reads the joining endpoint's record (with its revision) and
// those of the other endpoints joined to the same sandbox. The first Join
// of the driver reads all of this host's endpoint records (endpoints an
// earlier run joined); later ones read only the endpoint and the
// candidates the sandbox index names, so that Join does not take longer
// as the host fills up.
func (d *NetworkDriver) sandboxOf(ctx context.Context, endpointID, sandboxKey string) (self datastore.Endpoint, rev int64, peers []datastore.Endpoint, err error) {
	if !d.sandboxes.isBuilt() {
		return d.sandboxOfAll(ctx, endpointID, sandboxKey)
	}
	self, rev, err = d.getEndpoint(ctx, endpointID)
	if err != nil {
		return self, 0, nil, err
	}
	if sandboxKey == "" {
		return self, rev, nil, nil
	}
	for _, id := range d.sandboxes.candidates(sandboxKey) {
		if id == endpointID {
			continue
		}
		var ep datastore.Endpoint
		_, err := d.store.GetJSON(ctx, datastore.EndpointKey(d.host, id), &ep)
		switch {
		case errors.Is(err, datastore.ErrNotFound):
			d.sandboxes.forget(id)
		case err != nil:
			return self, 0, nil, storeErr("reading endpoint "+short(id)+" of the same container", err)
		case ep.Joined && ep.Container == sandboxKey:
			peers = append(peers, ep)
		default:
			d.sandboxes.forget(id)
		}
	}
	return self, rev, peers, nil
}

// sandboxOfAll is sandboxOf from all of this host's endpoint records, read
// once; it fills the sandbox index.
func (d *NetworkDriver) sandboxOfAll(ctx context.Context, endpointID, sandboxKey string) (self datastore.Endpoint, rev int64, peers []datastore.Endpoint, err error) {
	kvs, err := d.store.List(ctx, datastore.EndpointKey(d.host, ""))
	if err != nil {
		return self, 0, nil, storeErr("reading endpoint "+short(endpointID), err)
	}
	found := false
	joined := map[string]string{}
	for _, kv := range kvs {
		w, err := datastore.ParseEndpoint(kv.Key, kv.Value)
		if err != nil {
			continue // not ours to judge here; reconcile reports it
		}
		ep := w.Endpoint
		if ep.Joined && ep.Container != "" {
			joined[ep.ID] = ep.Container
		}
		switch {
		case ep.ID == endpointID:
			self, rev, found = ep, kv.ModRevision, true
		case ep.Joined && sandboxKey != "" && ep.Container == sandboxKey:
			peers = append(peers, ep)
		}
	}
	d.sandboxes.fill(joined)
	if !found {
		return self, 0, nil, userError(fmt.Sprintf("endpoint %s is not known on host %s", short(endpointID), d.host), ErrEndpointNotFound, datastore.ErrNotFound)
	}
	return self, rev, peers, nil
}

// sandboxIndex remembers which of this host's endpoints are (or were)
// joined to each sandbox: candidates, always checked against their
// records, so a stale entry costs one read and is dropped. Only Join
// joins endpoints, so after one full read it misses none of this
// driver's host.
type sandboxIndex struct {
	mu        sync.Mutex
	built     bool
	bySandbox map[string][]string // sandbox key -> endpoint ids (sorted; mostly one)
	sandbox   map[string]string   // endpoint id -> sandbox key
}

func (x *sandboxIndex) isBuilt() bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.built
}

// fill adds the joined endpoints (id -> sandbox key) of a full read and
// marks the index built.
func (x *sandboxIndex) fill(joined map[string]string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	for id, sb := range joined {
		x.addLocked(sb, id)
	}
	x.built = true
}

// add notes that endpoint id joins sandbox sb.
func (x *sandboxIndex) add(sb, id string) {
	if sb == "" {
		return
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	x.addLocked(sb, id)
}

func (x *sandboxIndex) addLocked(sb, id string) {
	if x.bySandbox == nil {
		x.bySandbox, x.sandbox = map[string][]string{}, map[string]string{}
	}
	if old, ok := x.sandbox[id]; ok && old != sb {
		x.forgetLocked(id)
	}
	ids := x.bySandbox[sb]
	if i, found := slices.BinarySearch(ids, id); !found {
		x.bySandbox[sb] = slices.Insert(ids, i, id)
	}
	x.sandbox[id] = sb
}

// forget drops endpoint id (it left, or was deleted).
func (x *sandboxIndex) forget(id string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.forgetLocked(id)
}

func (x *sandboxIndex) forgetLocked(id string) {
	sb, ok := x.sandbox[id]
	if !ok {
		return
	}
	delete(x.sandbox, id)
	ids := x.bySandbox[sb]
	if i, found := slices.BinarySearch(ids, id); found {
		ids = slices.Delete(ids, i, i+1)
	}
	if len(ids) == 0 {
		delete(x.bySandbox, sb)
	} else {
		x.bySandbox[sb] = ids
	}
}

// candidates are the endpoints noted for sandbox sb, sorted.
func (x *sandboxIndex) candidates(sb string) []string {
	x.mu.Lock()
	defer x.mu.Unlock()
	return slices.Clone(x.bySandbox[sb])
}

// planJoin picks the interface's gateway and routes, given the container's
// other calico interfaces.
func (d *NetworkDriver) planJoin(ctx context.Context, networkID string, peers []datastore.Endpoint) (joinPlan, error) {
	var p joinPlan
	used := map[int]bool{}
	routed := map[string]bool{}
	for _, peer := range peers {
		used[max(peer.GatewayIndex, 1)] = true
		for _, r := range peer.Routes {
			routed[r] = true
		}
	}
	for p.index = 1; used[p.index]; p.index++ {
	}
	var err error
	if p.gw4, p.gw6, err = dataplane.Gateways(p.index); err != nil {
		return p, userError(fmt.Sprintf("cannot join network %s: %v", short(networkID), err), ErrNotSupported, err)
	}
	var nw datastore.Network
	if _, err := d.store.GetJSON(ctx, datastore.NetworkKey(networkID), &nw); err != nil {
		if !errors.Is(err, datastore.ErrNotFound) {
			return p, storeErr("reading network "+short(networkID), err)
		}
		// CreateEndpoint checked the record; without it there is
		// nothing to route but the gateway.
		d.log.WithField("network", short(networkID)).Warn("Join: network record missing; the interface gets only its gateway")
		return p, nil
	}
	p.internal = IsInternal(nw)
	p.netOptions = nw.Options
	dsts, err := d.networkDestinations(ctx, nw)
	if err != nil {
		return p, err
	}
	for _, dst := range dsts {
		if !routed[dst] {
			p.routes = append(p.routes, dst)
		}
	}
	if len(dsts) > 0 && len(p.routes) == 0 {
		// The container answers this network's peers from another
		// interface's address, which an isolated network drops.
		d.log.WithFields(logrus.Fields{"network": nw.Name, "destinations": dsts}).Warn("Join: another interface of the container already routes all of this network's subnets; its peers see that interface's address, and isolation drops it: give each network its own --subnet, or set calico.isolation=off on both")
	}
	return p, nil
}

// networkDestinations are the prefixes holding a network's addresses: its
// subnets, or for a network created without --subnet (0.0.0.0/0, any
// pool) every calico pool of that family.
func (d *NetworkDriver) networkDestinations(ctx context.Context, nw datastore.Network) ([]string, error) {
	var out []string
	anyPool := map[bool]bool{} // by "is IPv4"
	for _, s := range nw.Subnets {
		_, n, err := net.ParseCIDR(s)
		if err != nil {
			continue
		}
		if ones, _ := n.Mask.Size(); ones == 0 {
			anyPool[n.IP.To4() != nil] = true
			continue
		}
		out = append(out, n.String())
	}
	if len(anyPool) > 0 && d.ipam != nil {
		pools, err := d.ipam.ListPools(ctx)
		if err != nil {
			return nil, storeErr("listing the calico pools for network "+short(nw.ID), err)
		}
		for _, p := range pools {
			if _, n, err := net.ParseCIDR(p.CIDR); err == nil && anyPool[n.IP.To4() != nil] && !slices.Contains(out, n.String()) {
				out = append(out, n.String())
			}
		}
	}
	return out, nil
}

// joinResponse is Docker's answer for the plan: interface names, gateways
// (none for an internal network) and routes. gw6 is the IPv6 gateway the
// dataplane confirmed (nil: no IPv6).
func (p joinPlan) joinResponse(tempIfName string, v4 bool, gw6 net.IP) *network.JoinResponse {
	resp := &network.JoinResponse{
		InterfaceName:         network.InterfaceName{SrcName: tempIfName, DstPrefix: "eth"},
		DisableGatewayService: true,
	}
	families := []struct {
		on    bool
		gw    net.IP
		bits  int
		setGW *string
	}{
		{v4, p.gw4, 32, &resp.Gateway},
		{gw6 != nil, gw6, 128, &resp.GatewayIPv6},
	}
	for _, f := range families {
		if !f.on {
			continue
		}
		if !p.internal {
			*f.setGW = f.gw.String()
		}
		resp.StaticRoutes = append(resp.StaticRoutes, &network.StaticRoute{
			Destination: fmt.Sprintf("%s/%d", f.gw, f.bits),
			RouteType:   RouteTypeConnected,
		})
		for _, r := range p.routes {
			if _, n, err := net.ParseCIDR(r); err == nil && (n.IP.To4() != nil) == (f.bits == 32) {
				resp.StaticRoutes = append(resp.StaticRoutes, &network.StaticRoute{
					Destination: r,
					RouteType:   RouteTypeNextHop,
					NextHop:     f.gw.String(),
				})
			}
		}
	}
	return resp
}

// RouteTypeNextHop is libnetwork's route type of a route via NextHop
// (types.NEXTHOP).
const RouteTypeNextHop = 0

// markAuxAddresses labels the reservations of a network's --aux-address
// entries (libnetwork requested them from calico-ipam before CreateNetwork,
// with nothing telling them from a container's --ip) with
// ipam.AttrReserved=aux, so that reconcile and `ipam check` never take
// them for leaks; `docker network rm` releases them. An aux address
// outside the network's pool was never reserved: nothing to mark.
func (d *NetworkDriver) markAuxAddresses(ctx context.Context, data []*network.IPAMData) error {
	if d.ipam == nil {
		return nil
	}
	for _, dt := range data {
		if dt == nil {
			continue
		}
		for name, v := range dt.AuxAddresses {
			s, _ := v.(string)
			ip, _, err := net.ParseCIDR(s)
			if err != nil {
				if ip = net.ParseIP(s); ip == nil {
					return userError(fmt.Sprintf("aux address %s=%v is not an address", name, v), ErrInvalidRequest)
				}
			}
			_, _, err = d.ipam.UpdateHolder(ctx, ip, func(a ipam.Allocation) (map[string]string, error) {
				if a.Attrs[ipam.AttrReserved] == ipam.ReservedAux {
					return nil, nil
				}
				attrs := maps.Clone(a.Attrs)
				if attrs == nil {
					attrs = map[string]string{}
				}
				attrs[ipam.AttrReserved] = ipam.ReservedAux
				return attrs, nil
			})
			if err != nil && !errors.Is(err, ipam.ErrPoolNotFound) && !errors.Is(err, ipam.ErrNotInPool) {
				return storeErr(fmt.Sprintf("marking aux address %s (%s) as reserved", name, ip), err)
			}
		}
	}
	return nil
}
