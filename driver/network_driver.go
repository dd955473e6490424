package driver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/docker/go-plugins-helpers/network"
	"github.com/sirupsen/logrus"

	"github.com/calico-cnm/calico-cnm/bandwidth"
	"github.com/calico-cnm/calico-cnm/dataplane"
	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/ipam"
	"github.com/calico-cnm/calico-cnm/policy"
	"github.com/calico-cnm/calico-cnm/ports"
)

// Docker's option keys in CreateNetwork.
const (
	optGeneric    = "com.docker.network.generic"
	optEnableIPv6 = "com.docker.network.enable_ipv6"
)

// Scopes a driver can report (GetCapabilities).
const (
	ScopeLocal  = "local"
	ScopeGlobal = "global"
)

// cleanupTimeout bounds undoing a half-done Join after its request failed.
const cleanupTimeout = 30 * time.Second

// Options tune the network driver.
type Options struct {
	// Scope reported to Docker: "local" (default) or "global".
	Scope string
	// MTU of the workload veths; 0 lets the dataplane choose (1500).
	MTU int
	// IPAM, when set, lets CreateNetwork record which calico pool holds each
	// --subnet (Network.Pools). Without it Pools records the subnets.
	IPAM IPAM
	// Labels, when set, gives each joining endpoint its policy labels
	// before Join returns.
	Labels Labeller
	// Policy, when set, makes Join wait (at most PolicyWait) until the
	// endpoint's rules are in the kernel: the container's first packet
	// meets its policy.
	Policy     PolicyWaiter
	PolicyWait time.Duration
	// EngineID, when set, gives the host's Docker engine ID for endpoint
	// records ("" while unknown), so reconcile on a host that shares this
	// node name leaves them alone.
	EngineID func() string
	// WorkloadMTU, when set and MTU is 0, picks the MTU of an endpoint from
	// its IPv4 address (0: the dataplane's default): room for the VXLAN
	// header on pools that may encapsulate.
	WorkloadMTU func(ctx context.Context, ip net.IP) (int, error)
	// Ports, when set, publishes container ports (*ports.Manager).
	Ports Ports
	// Shaper, when set, applies the endpoints' bandwidth limits
	// (*bandwidth.Manager); without it limits are checked but not applied.
	Shaper Shaper
}

// Shaper applies bandwidth limits to a joined endpoint's veth.
type Shaper interface {
	Apply(ctx context.Context, endpointID, hostIfName string, l bandwidth.Limits) error
	// Remove deletes the endpoint's shaping; removing none is fine.
	Remove(ctx context.Context, endpointID, hostIfName string) error
}

// Ports is what the network driver needs to publish container ports.
type Ports interface {
	Publish(ctx context.Context, endpointID string, reqs []ports.Request) ([]datastore.PortBinding, error)
	Unpublish(ctx context.Context, endpointID string) error
	// Sync reprograms the tables from the datastore (the guard of an
	// --internal network's new endpoint).
	Sync(ctx context.Context) error
}

// Labeller learns the policy labels of the container joining an endpoint.
type Labeller interface {
	EndpointLabels(ctx context.Context, req LabelRequest) (map[string]string, error)
}

// LabelRequest is what Join knows of the joining endpoint.
type LabelRequest struct {
	NetworkID, EndpointID, SandboxKey string
	// Options are Join's: the sandbox's port map and exposed ports.
	Options map[string]interface{}
	// DriverLabels are the labels given as endpoint driver options
	// (recorded at CreateEndpoint, datastore.Endpoint.DriverLabels).
	DriverLabels map[string]string
}

// PolicyWaiter is the policy syncer (*policy.Syncer).
type PolicyWaiter interface {
	// WaitProgrammed returns once the kernel's rules include every
	// endpoint change up to datastore revision rev.
	WaitProgrammed(ctx context.Context, rev int64) error
}

// Bounds of the policy steps of a Join. Docker gives a plugin call about
// 30 s; a Join that cannot get its rules in fails well before.
const (
	labelsTimeout     = 3 * time.Second
	defaultPolicyWait = 10 * time.Second
)

// NetworkDriver is the "calico" libnetwork network driver.
type NetworkDriver struct {
	store *datastore.Store
	dp    Dataplane
	ipam  IPAM
	opts  Options
	host  string
	log   logrus.FieldLogger
	scope string
	mtu   int
	// engineID: see Options.EngineID.
	engineID func() string
	// mtuFor: see Options.WorkloadMTU.
	mtuFor func(ctx context.Context, ip net.IP) (int, error)
	ports  Ports
	// sandboxes finds the endpoints joined to a sandbox (see sandboxOf).
	sandboxes sandboxIndex
}

// NewNetworkDriver records networks and endpoints in store and plumbs
// endpoints on this host (host is the node name) through dp.
func NewNetworkDriver(store *datastore.Store, dp Dataplane, host string, log logrus.FieldLogger, opts Options) *NetworkDriver {
	if log == nil {
		log = logrus.StandardLogger()
	}
	log = log.WithField("driver", "calico")
	scope := opts.Scope
	switch scope {
	case ScopeLocal, ScopeGlobal:
	case "":
		scope = ScopeLocal
	default:
		log.Warnf("unknown driver scope %q: using %q", scope, ScopeLocal)
		scope = ScopeLocal
	}
	if opts.PolicyWait <= 0 {
		opts.PolicyWait = defaultPolicyWait
	}
	return &NetworkDriver{store: store, dp: dp, ipam: opts.IPAM, opts: opts, host: host, log: log, scope: scope, mtu: opts.MTU, engineID: opts.EngineID, mtuFor: opts.WorkloadMTU, ports: opts.Ports}
}

// GetCapabilities reports the scope; connectivity has the same scope.
//
// Global scope is what makes Docker treat calico networks as multi-host
// (swarm) networks: the swarm manager allocates them (AllocateNetwork, and
// the addresses through calico-ipam in the global address space) and every
// node creates the same network id. It needs the shared etcd: the
// manager's assignments must be visible to the nodes that run the tasks.
// With global scope dockerd refuses local networks of the driver ("cannot
// downgrade network scope"), and outside swarm mode it cannot create any
// (it would need a cluster store): so one host with the embedded
// datastore stays local.
func (d *NetworkDriver) GetCapabilities(ctx context.Context) (*network.CapabilitiesResponse, error) {
	return &network.CapabilitiesResponse{Scope: d.scope, ConnectivityScope: d.scope}, nil
}

func ourAddressSpace(s string) bool {
	return s == CalicoLocalAddressSpace || s == CalicoGlobalAddressSpace
}

// flattenOptions turns Docker's network options into strings: the generic
// (-o key=value) options by their own keys, the others (e.g.
// com.docker.network.enable_ipv6) by theirs.
func flattenOptions(in map[string]interface{}) map[string]string {
	out := map[string]string{}
	for k, v := range in {
		if k == optGeneric {
			if m, ok := v.(map[string]interface{}); ok {
				for gk, gv := range m {
					out[gk] = optString(gv)
				}
				continue
			}
		}
		out[k] = optString(v)
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

func optString(v interface{}) string {
	switch t := v.(type) {
	case string:
		return t
	case nil:
		return ""
	case bool, float64, int:
		return fmt.Sprint(t)
	}
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(b)
}

// CreateNetwork records a network whose addresses come from calico-ipam.
func (d *NetworkDriver) CreateNetwork(ctx context.Context, req *network.CreateNetworkRequest) error {
	log := d.log.WithField("network", short(req.NetworkID))
	if req.NetworkID == "" {
		return userError("CreateNetwork without a network id", ErrInvalidRequest)
	}
	if len(req.IPv4Data) == 0 {
		return userError(fmt.Sprintf("network %s has no IPv4 address pool: calico networks need IPv4 addresses from --ipam-driver calico-ipam", short(req.NetworkID)), ErrInvalidRequest)
	}
	nw := datastore.Network{ID: req.NetworkID, Options: flattenOptions(req.Options), IPv6: len(req.IPv6Data) > 0}
	if b, ok := req.Options[optEnableIPv6].(bool); ok && b {
		nw.IPv6 = true
	}
	if _, err := bandwidth.ParseNetworkOptions(nw.Options); err != nil {
		return userError(fmt.Sprintf("network %s: %v", short(req.NetworkID), err), ErrInvalidRequest, err)
	}
	// A swarm network: the manager's AllocateNetwork recorded it, and
	// every node running one of its tasks creates it too.
	swarm := nw.Options[OptSwarm] == "true"
	if swarm && d.scope != ScopeGlobal {
		return userError(fmt.Sprintf("network %s carries the option %s, which only the swarm manager sets (AllocateNetwork) for a driver in global scope: remove the option", short(req.NetworkID), OptSwarm), ErrInvalidRequest)
	}
	for _, data := range append(append([]*network.IPAMData{}, req.IPv4Data...), req.IPv6Data...) {
		// Docker always names the address space of a network's pools.
		if data != nil && !ourAddressSpace(data.AddressSpace) {
			return userError(fmt.Sprintf("network driver calico needs --ipam-driver calico-ipam (with the managed plugin: the plugin's name, e.g. calico:latest); the network's addresses come from address space %q", data.AddressSpace), ErrForeignIPAM)
		}
	}
	if err := d.networkFromIPAMData(ctx, &nw, req.IPv4Data, req.IPv6Data); err != nil {
		return err
	}
	if err := d.markAuxAddresses(ctx, append(append([]*network.IPAMData{}, req.IPv4Data...), req.IPv6Data...)); err != nil {
		return err
	}

	key := datastore.NetworkKey(req.NetworkID)
	shared := false
	err := d.store.Retry(ctx, func(ctx context.Context) error {
		shared = false
		var old datastore.Network
		if _, err := d.store.GetJSON(ctx, key, &old); err == nil {
			if swarm && old.Options[OptSwarm] == "true" {
				shared = true
				return nil
			}
			return userError(fmt.Sprintf("network %s already exists in the calico datastore", short(req.NetworkID)), ErrAlreadyExists)
		} else if !errors.Is(err, datastore.ErrNotFound) {
			return err
		}
		return d.store.Txn(ctx, datastore.Create(key, datastore.MustJSON(nw)))
	})
	if errors.Is(err, ErrAlreadyExists) {
		return err
	}
	if err != nil {
		return storeErr("recording network "+short(req.NetworkID), err)
	}
	if shared {
		log.Debug("swarm network already recorded by the manager (or another node): using the record")
		return nil
	}
	log.WithFields(logrus.Fields{"subnets": nw.Subnets, "pools": nw.Pools, "swarm": swarm}).Info("network created")
	return nil
}

// networkFromIPAMData fills nw's subnets, gateways and pools from Docker's
// IPAM data, which must come from calico-ipam.
func (d *NetworkDriver) networkFromIPAMData(ctx context.Context, nw *datastore.Network, v4, v6 []*network.IPAMData) error {
	seenPools := map[string]bool{}
	for _, data := range append(append([]*network.IPAMData{}, v4...), v6...) {
		if data == nil {
			continue
		}
		// The swarm manager sends no address space (swarmkit's
		// driverapi.IPAMData for AllocateNetwork has none): then the pool
		// check below is what catches another IPAM driver.
		if data.AddressSpace != "" && !ourAddressSpace(data.AddressSpace) {
			return userError(fmt.Sprintf("network driver calico needs --ipam-driver calico-ipam (with the managed plugin: the plugin's name, e.g. calico:latest); the network's addresses come from address space %q", data.AddressSpace), ErrForeignIPAM)
		}
		_, subnet, err := net.ParseCIDR(data.Pool)
		if err != nil {
			return userError(fmt.Sprintf("network %s has an invalid address pool %q", short(nw.ID), data.Pool), ErrInvalidRequest, err)
		}
		nw.Subnets = append(nw.Subnets, subnet.String())
		if data.Gateway != "" {
			nw.Gateways = append(nw.Gateways, data.Gateway)
		}
		pool, err := d.poolOf(ctx, subnet)
		if err != nil {
			return err
		}
		if pool != "" && !seenPools[pool] {
			seenPools[pool] = true
			nw.Pools = append(nw.Pools, pool)
		}
	}
	return nil
}

// poolOf is the calico pool holding subnet ("" for the any-pool network).
func (d *NetworkDriver) poolOf(ctx context.Context, subnet *net.IPNet) (string, error) {
	if ones, _ := subnet.Mask.Size(); ones == 0 {
		return "", nil // 0.0.0.0/0: any enabled pool
	}
	if d.ipam == nil {
		return subnet.String(), nil
	}
	p, err := d.ipam.FindPool(ctx, subnet)
	if errors.Is(err, ipam.ErrPoolNotFound) {
		return "", userError(fmt.Sprintf("subnet %s is not inside any calico pool (was the pool deleted?)", subnet), err)
	}
	if err != nil {
		return "", storeErr("looking up the calico pool of subnet "+subnet.String(), err)
	}
	return p.CIDR, nil
}

// DeleteNetwork forgets a network. Docker may retry, so an unknown network is
// fine.
func (d *NetworkDriver) DeleteNetwork(ctx context.Context, req *network.DeleteNetworkRequest) error {
	log := d.log.WithField("network", short(req.NetworkID))
	if req.NetworkID == "" {
		return userError("DeleteNetwork without a network id", ErrInvalidRequest)
	}
	key := datastore.NetworkKey(req.NetworkID)
	found, kept := true, false
	err := d.store.Retry(ctx, func(ctx context.Context) error {
		found, kept = true, false
		kv, err := d.store.Get(ctx, key)
		if errors.Is(err, datastore.ErrNotFound) {
			found = false
			return nil
		}
		if err != nil {
			return err
		}
		// A node drops a swarm network when its last task of it is
		// gone; the other nodes' tasks still use the shared record,
		// which FreeNetwork deletes. (An undecodable record goes.)
		var nw datastore.Network
		if json.Unmarshal(kv.Value, &nw) == nil && nw.Options[OptSwarm] == "true" {
			kept = true
			return nil
		}
		return d.store.Txn(ctx, datastore.Delete(key, kv.ModRevision))
	})
	if err != nil {
		return storeErr("deleting network "+short(req.NetworkID), err)
	}
	switch {
	case !found:
		log.Debug("DeleteNetwork of a network not in the datastore: nothing to do")
	case kept:
		log.Debug("swarm network left this node: its record stays until the manager frees the network")
	default:
		log.Info("network deleted")
	}
	return nil
}

// AllocateNetwork is the swarm manager's call, once per network of a
// global-scope driver (and again for each network when a manager restarts
// or a new leader takes over), after it got the network's pools from
// calico-ipam and before any node creates the network. It checks that the
// pools are calico's, records the network, and returns the options the
// manager passes to every node's CreateNetwork: the network's own (-o)
// options, which reach the nodes only this way, plus OptSwarm.
func (d *NetworkDriver) AllocateNetwork(ctx context.Context, req *network.AllocateNetworkRequest) (*network.AllocateNetworkResponse, error) {
	log := d.log.WithField("network", short(req.NetworkID))
	if req.NetworkID == "" {
		return nil, userError("AllocateNetwork without a network id", ErrInvalidRequest)
	}
	if len(req.IPv4Data) == 0 {
		return nil, userError(fmt.Sprintf("swarm network %s has no IPv4 address pool: calico networks need --ipam-driver calico-ipam (with the managed plugin: the plugin's name, e.g. calico:latest)", short(req.NetworkID)), ErrInvalidRequest)
	}
	opts := make(map[string]string, len(req.Options)+1)
	for k, v := range req.Options {
		opts[k] = v
	}
	opts[OptSwarm] = "true"
	nw := datastore.Network{ID: req.NetworkID, Options: opts, IPv6: len(req.IPv6Data) > 0}
	v4 := make([]*network.IPAMData, 0, len(req.IPv4Data))
	for i := range req.IPv4Data {
		v4 = append(v4, &req.IPv4Data[i])
	}
	v6 := make([]*network.IPAMData, 0, len(req.IPv6Data))
	for i := range req.IPv6Data {
		v6 = append(v6, &req.IPv6Data[i])
	}
	// Without an address space to check, a subnet outside the calico
	// pools is the sign of another IPAM driver (swarm's default one hands
	// out 10.0.0.0/8 subnets).
	for _, data := range append(append([]*network.IPAMData{}, v4...), v6...) {
		_, subnet, err := net.ParseCIDR(data.Pool)
		if err != nil || d.ipam == nil {
			continue // networkFromIPAMData words it
		}
		if ones, _ := subnet.Mask.Size(); ones == 0 {
			continue
		}
		if _, err := d.ipam.FindPool(ctx, subnet); errors.Is(err, ipam.ErrPoolNotFound) {
			return nil, userError(fmt.Sprintf("swarm network %s has subnet %s, which is in no calico pool: its addresses come from another IPAM driver; create the network with --ipam-driver calico-ipam (with the managed plugin: the plugin's name, e.g. calico:latest)", short(req.NetworkID), subnet), err)
		}
	}
	if err := d.networkFromIPAMData(ctx, &nw, v4, v6); err != nil {
		return nil, err
	}

	key := datastore.NetworkKey(req.NetworkID)
	existed := false
	err := d.store.Retry(ctx, func(ctx context.Context) error {
		existed = false
		var old datastore.Network
		if _, err := d.store.GetJSON(ctx, key, &old); err == nil {
			if old.Options[OptSwarm] != "true" {
				return userError(fmt.Sprintf("network %s already exists in the calico datastore as a network of one host", short(req.NetworkID)), ErrAlreadyExists)
			}
			existed = true
			return nil
		} else if !errors.Is(err, datastore.ErrNotFound) {
			return err
		}
		return d.store.Txn(ctx, datastore.Create(key, datastore.MustJSON(nw)))
	})
	if errors.Is(err, ErrAlreadyExists) {
		return nil, err
	}
	if err != nil {
		return nil, storeErr("recording swarm network "+short(req.NetworkID), err)
	}
	if existed {
		log.Info("swarm network allocated again (manager restart or leader change): keeping its record")
	} else {
		log.WithFields(logrus.Fields{"subnets": nw.Subnets, "pools": nw.Pools}).Info("swarm network allocated")
	}
	return &network.AllocateNetworkResponse{Options: opts}, nil
}

// FreeNetwork is the swarm manager's counterpart of AllocateNetwork, when
// the network is removed: the shared record goes. An unknown network is
// fine (Docker may retry).
func (d *NetworkDriver) FreeNetwork(ctx context.Context, req *network.FreeNetworkRequest) error {
	log := d.log.WithField("network", short(req.NetworkID))
	if req.NetworkID == "" {
		return userError("FreeNetwork without a network id", ErrInvalidRequest)
	}
	key := datastore.NetworkKey(req.NetworkID)
	found, err := d.store.DeleteExisting(ctx, key)
	if err != nil {
		return storeErr("freeing swarm network "+short(req.NetworkID), err)
	}
	if !found {
		log.Debug("FreeNetwork of a network not in the datastore: nothing to do")
		return nil
	}
	log.Info("swarm network freed")
	return nil
}

// endpointAddrs parses the addresses Docker got from calico-ipam; whatever
// mask Docker sends, the endpoint gets a /32 (/128).
func endpointAddrs(iface *network.EndpointInterface, endpointID string) (v4, v6 *net.IPNet, err error) {
	if iface == nil || (iface.Address == "" && iface.AddressIPv6 == "") {
		return nil, nil, userError(fmt.Sprintf("endpoint %s has no IP address: calico networks need addresses from --ipam-driver calico-ipam", short(endpointID)), ErrInvalidRequest)
	}
	if iface.Address != "" {
		ip, _, err := net.ParseCIDR(iface.Address)
		if err != nil || !isIPv4(ip) {
			return nil, nil, userError(fmt.Sprintf("endpoint %s has an invalid IPv4 address %q", short(endpointID), iface.Address), ErrInvalidRequest, err)
		}
		n := hostNet(ip)
		v4 = &n
	}
	if iface.AddressIPv6 != "" {
		ip, _, err := net.ParseCIDR(iface.AddressIPv6)
		if err != nil || isIPv4(ip) {
			return nil, nil, userError(fmt.Sprintf("endpoint %s has an invalid IPv6 address %q", short(endpointID), iface.AddressIPv6), ErrInvalidRequest, err)
		}
		n := hostNet(ip)
		v6 = &n
	}
	return v4, v6, nil
}

// CreateEndpoint records an endpoint of a calico network on this host. The
// veth only comes at Join. The reply carries the fixed MAC unless Docker
// chose one, and never the addresses (Docker set them: echoing them back
// makes Docker roll back).
func (d *NetworkDriver) CreateEndpoint(ctx context.Context, req *network.CreateEndpointRequest) (*network.CreateEndpointResponse, error) {
	log := d.log.WithFields(logrus.Fields{"network": short(req.NetworkID), "endpoint": short(req.EndpointID)})
	if req.NetworkID == "" || req.EndpointID == "" {
		return nil, userError("CreateEndpoint needs a network id and an endpoint id", ErrInvalidRequest)
	}
	v4, v6, err := endpointAddrs(req.Interface, req.EndpointID)
	if err != nil {
		return nil, err
	}
	epOpts := flattenOptions(req.Options)
	if _, err := bandwidth.ParseDriverOptions(epOpts); err != nil {
		return nil, userError(fmt.Sprintf("endpoint %s: %v", short(req.EndpointID), err), ErrInvalidRequest, err)
	}
	mac := FixedMAC
	dockerMAC := req.Interface.MacAddress != ""
	if dockerMAC {
		hw, err := net.ParseMAC(req.Interface.MacAddress)
		if err != nil {
			return nil, userError(fmt.Sprintf("endpoint %s has an invalid MAC address %q", short(req.EndpointID), req.Interface.MacAddress), ErrInvalidRequest, err)
		}
		mac = hw.String()
	}
	ep := datastore.Endpoint{
		ID:         req.EndpointID,
		Network:    req.NetworkID,
		Node:       d.host,
		MAC:        mac,
		HostIfName: dataplane.HostIfName(req.EndpointID),
		// Checked above; the limits follow at Join, with the labels.
		BandwidthOptions: bandwidth.DriverOptions(epOpts),
	}
	if d.engineID != nil {
		ep.EngineID = d.engineID()
	}
	if ep.DriverLabels, err = policy.DriverOptLabels(req.Options); err != nil {
		return nil, userError(fmt.Sprintf("endpoint %s: %v", short(req.EndpointID), err), ErrInvalidRequest, err)
	}
	if v4 != nil {
		ep.IPv4 = v4.String()
		log = log.WithField("ip", v4.IP.String())
	}
	if v6 != nil {
		ep.IPv6 = v6.String()
		log = log.WithField("ipv6", v6.IP.String())
	}

	if ep.Handles, err = d.addressHandles(ctx, v4, v6); err != nil {
		return nil, err
	}

	netKey := datastore.NetworkKey(req.NetworkID)
	epKey := datastore.EndpointKey(d.host, req.EndpointID)
	err = d.store.Retry(ctx, func(ctx context.Context) error {
		netKV, err := d.store.Get(ctx, netKey)
		if errors.Is(err, datastore.ErrNotFound) {
			return userError(fmt.Sprintf("network %s is not a calico network in the datastore (was it created while calico-cnm used another datastore?)", short(req.NetworkID)), ErrNetworkNotFound, err)
		}
		if err != nil {
			return err
		}
		if _, err := d.store.Get(ctx, epKey); err == nil {
			return userError(fmt.Sprintf("endpoint %s already exists on host %s", short(req.EndpointID), d.host), ErrAlreadyExists)
		} else if !errors.Is(err, datastore.ErrNotFound) {
			return err
		}
		// The network must still be there when the endpoint is written.
		return d.store.Txn(ctx,
			datastore.Check(netKey, netKV.ModRevision),
			datastore.Create(epKey, datastore.MustJSON(ep)))
	})
	if errors.Is(err, ErrNetworkNotFound) || errors.Is(err, ErrAlreadyExists) {
		return nil, err
	}
	if err != nil {
		return nil, storeErr("recording endpoint "+short(req.EndpointID), err)
	}
	log.Info("endpoint created")

	resp := &network.CreateEndpointResponse{}
	if !dockerMAC {
		resp.Interface = &network.EndpointInterface{MacAddress: FixedMAC}
	}
	return resp, nil
}

// addressHandles are the IPAM handles holding the endpoint's addresses,
// for the endpoint record: releases then go by handle (reconcile) or are
// checked against it (ReleaseAddress after DeleteEndpoint), never "whoever
// holds the address now". An address calico-ipam did not assign (another
// IPAM) has none.
func (d *NetworkDriver) addressHandles(ctx context.Context, nets ...*net.IPNet) ([]string, error) {
	if d.ipam == nil {
		return nil, nil
	}
	var out []string
	for _, n := range nets {
		if n == nil {
			continue
		}
		a, found, err := d.ipam.AddressHolder(ctx, n.IP)
		if errors.Is(err, ipam.ErrNotInPool) {
			continue
		}
		if err != nil {
			return nil, ipamErr("looking up the assignment of address "+n.IP.String(), err)
		}
		if found && !slices.Contains(out, a.HandleID) {
			out = append(out, a.HandleID)
		}
	}
	return out, nil
}

// getEndpoint reads this host's record of an endpoint.
func (d *NetworkDriver) getEndpoint(ctx context.Context, endpointID string) (datastore.Endpoint, int64, error) {
	var ep datastore.Endpoint
	rev, err := d.store.GetJSON(ctx, datastore.EndpointKey(d.host, endpointID), &ep)
	if errors.Is(err, datastore.ErrNotFound) {
		return ep, 0, userError(fmt.Sprintf("endpoint %s is not known on host %s", short(endpointID), d.host), ErrEndpointNotFound, err)
	}
	if err != nil {
		return ep, 0, storeErr("reading endpoint "+short(endpointID), err)
	}
	return ep, rev, nil
}

// EndpointInfo tells `docker inspect` about the endpoint's plumbing.
func (d *NetworkDriver) EndpointInfo(ctx context.Context, req *network.InfoRequest) (*network.InfoResponse, error) {
	ep, _, err := d.getEndpoint(ctx, req.EndpointID)
	if err != nil {
		return nil, err
	}
	var ips []string
	for _, s := range []string{ep.IPv4, ep.IPv6} {
		if s != "" {
			ips = append(ips, s)
		}
	}
	v := map[string]string{
		"hostIfName": ep.HostIfName,
		"ips":        strings.Join(ips, ","),
		"mac":        ep.MAC,
		"node":       ep.Node,
	}
	if ep.Container != "" {
		v["sandbox"] = ep.Container
	}
	return &network.InfoResponse{Value: v}, nil
}

// epIPs are the endpoint's addresses as /32 and /128.
func epIPs(ep datastore.Endpoint) (v4, v6 *net.IPNet, all []net.IPNet) {
	a4, a6 := ep.Addrs()
	if a4.IsValid() {
		h := hostNet(a4.AsSlice())
		v4 = &h
		all = append(all, h)
	}
	if a6.IsValid() {
		h := hostNet(a6.AsSlice())
		v6 = &h
		all = append(all, h)
	}
	return v4, v6, all
}

// DeleteEndpoint forgets an endpoint; Docker may retry, so an unknown one is
// fine. A veth that a failed Leave left behind goes too.
func (d *NetworkDriver) DeleteEndpoint(ctx context.Context, req *network.DeleteEndpointRequest) error {
	log := d.log.WithFields(logrus.Fields{"network": short(req.NetworkID), "endpoint": short(req.EndpointID)})
	ep, _, err := d.getEndpoint(ctx, req.EndpointID)
	if errors.Is(err, ErrEndpointNotFound) {
		log.Debug("DeleteEndpoint of an endpoint not in the datastore: nothing to do")
		return nil
	}
	if err != nil {
		return err
	}
	log = log.WithField("ip", ep.IPv4)
	if len(ep.Ports) > 0 && d.ports != nil {
		// Docker skipped RevokeExternalConnectivity (a crash between the
		// calls): the DNAT rules must not outlive the endpoint.
		if err := d.ports.Unpublish(ctx, req.EndpointID); err != nil {
			return fmt.Errorf("withdrawing the published ports of endpoint %s failed: %w", short(req.EndpointID), err)
		}
	}
	if ep.Joined {
		_, _, ips := epIPs(ep)
		if err := d.dp.RemoveWorkload(ctx, req.EndpointID, ips); err != nil {
			return fmt.Errorf("removing the veth %s of endpoint %s failed: %w", ep.HostIfName, short(req.EndpointID), err)
		}
		d.unshape(ctx, req.EndpointID, ep.HostIfName, log)
		log.Warn("endpoint was still joined at DeleteEndpoint: removed its veth")
	}
	key := datastore.EndpointKey(d.host, req.EndpointID)
	if _, err := d.store.DeleteExisting(ctx, key); err != nil {
		return storeErr("deleting endpoint "+short(req.EndpointID), err)
	}
	d.sandboxes.forget(req.EndpointID)
	// Docker's ReleaseAddress, which comes next, names only the address.
	if d.ipam != nil && len(ep.Handles) > 0 {
		_, _, ips := epIPs(ep)
		for _, n := range ips {
			d.ipam.ExpectRelease(n.IP, ep.Handles...)
		}
	}
	log.Info("endpoint deleted")
	return nil
}

// Join plumbs the endpoint into a container: the dataplane creates the veth
// (the container side, TempIfName, goes to Docker, which moves it into the
// sandbox as eth*) and the host route; the container routes via a virtual
// link-local gateway reachable through an on-link route, one per calico
// interface of the container (see joinPlan). A failed Join leaves nothing
// behind.
func (d *NetworkDriver) Join(ctx context.Context, req *network.JoinRequest) (*network.JoinResponse, error) {
	log := d.log.WithFields(logrus.Fields{"network": short(req.NetworkID), "endpoint": short(req.EndpointID)})
	ep, epRev, peers, err := d.sandboxOf(ctx, req.EndpointID, req.SandboxKey)
	if err != nil {
		return nil, err
	}
	if ep.Network != req.NetworkID {
		return nil, userError(fmt.Sprintf("endpoint %s belongs to network %s, not %s", short(req.EndpointID), short(ep.Network), short(req.NetworkID)), ErrInvalidRequest)
	}
	plan, err := d.planJoin(ctx, req.NetworkID, peers)
	if err != nil {
		return nil, err
	}
	v4, _, ips := epIPs(ep)
	if v4 != nil {
		log = log.WithField("ip", v4.IP.String())
	}
	w, err := d.joiningWorkload(ctx, req.EndpointID, ep, plan)
	if err != nil {
		return nil, err
	}
	if err := d.dp.AddWorkload(ctx, w); err != nil {
		return nil, fmt.Errorf("setting up the veth %s of endpoint %s failed: %w", w.HostIfName, short(req.EndpointID), err)
	}
	// From here on, any failure must remove the workload again.
	undo := func(cause error) error {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		if rerr := d.dp.RemoveWorkload(cctx, req.EndpointID, ips); rerr != nil {
			log.WithError(rerr).Error("removing the veth of a failed Join")
		}
		d.unshape(cctx, req.EndpointID, w.HostIfName, log)
		return cause
	}

	resp, err := d.joinResponseFor(ctx, req.EndpointID, w, plan)
	if err != nil {
		return nil, undo(err)
	}
	routes := nextHopRoutes(resp)
	labels, unknown := d.endpointLabels(ctx, req, ep.DriverLabels, log)
	limits, err := d.joinLimits(ep, labels, plan)
	if err != nil {
		return nil, undo(err)
	}
	key := datastore.EndpointKey(d.host, req.EndpointID)
	// Before the record: a concurrent Join into the same sandbox finds
	// this endpoint as a candidate and checks its record.
	d.sandboxes.add(req.SandboxKey, req.EndpointID)
	written, err := d.recordJoin(ctx, key, req.EndpointID, ep, epRev, func(cur *datastore.Endpoint) {
		cur.Joined = true
		cur.Container = req.SandboxKey
		cur.Labels, cur.LabelsUnknown = labels, unknown
		cur.GatewayIndex = plan.index
		cur.Routes = routes
	})
	if errors.Is(err, ErrEndpointNotFound) {
		return nil, undo(err)
	}
	if err != nil {
		return nil, undo(storeErr("recording the join of endpoint "+short(req.EndpointID), err))
	}
	// Shaping runs while the policy is programmed: Join waits for the
	// longer of the two, not for both.
	shaped := d.shapeAsync(ctx, req.EndpointID, w.HostIfName, limits)
	werr := d.waitProgrammed(ctx, written)
	if err := <-shaped; err != nil {
		d.unjoin(context.WithoutCancel(ctx), key, log)
		return nil, undo(err)
	}
	if werr != nil {
		d.unjoin(context.WithoutCancel(ctx), key, log)
		return nil, undo(fmt.Errorf("endpoint %s: %w", short(req.EndpointID), werr))
	}
	if plan.internal && d.ports != nil {
		// Fail closed: the endpoint of an --internal network is not
		// handed to Docker before its guard is in the kernel.
		if err := d.ports.Sync(ctx); err != nil {
			d.unjoin(context.WithoutCancel(ctx), key, log)
			return nil, undo(fmt.Errorf("programming the --internal guard of endpoint %s failed: %w", short(req.EndpointID), err))
		}
	}
	log.WithFields(logrus.Fields{"sandbox": req.SandboxKey, "gateway": plan.gw4.String(), "routes": routes, "internal": plan.internal, "bandwidth": limits.String()}).Info("endpoint joined")
	return resp, nil
}

// joiningWorkload is the veth Join asks the dataplane for: the recorded MAC
// (FixedMAC when it does not parse) and the MTU configured or, failing that,
// chosen for the IPv4 address.
func (d *NetworkDriver) joiningWorkload(ctx context.Context, endpointID string, ep datastore.Endpoint, plan joinPlan) (dataplane.Workload, error) {
	v4, v6, _ := epIPs(ep)
	mac, err := net.ParseMAC(ep.MAC)
	if err != nil {
		mac, _ = net.ParseMAC(FixedMAC)
	}
	w := dataplane.Workload{
		EndpointID: endpointID,
		HostIfName: dataplane.HostIfName(endpointID),
		TempIfName: dataplane.TempIfName(endpointID),
		MAC:        mac,
		IPv4:       v4,
		IPv6:       v6,
		MTU:        d.mtu,
	}
	if w.MTU == 0 && d.mtuFor != nil && v4 != nil {
		if w.MTU, err = d.mtuFor(ctx, v4.IP); err != nil {
			return w, fmt.Errorf("choosing the MTU of endpoint %s: %w", short(endpointID), err)
		}
	}
	if v6 != nil && plan.index > 1 {
		w.GatewayIPv6 = plan.gw6
	}
	return w, nil
}

// joinResponseFor is Join's answer once w is plumbed: the container's IPv6
// gateway is the link-local address the kernel gave w's host side.
func (d *NetworkDriver) joinResponseFor(ctx context.Context, endpointID string, w dataplane.Workload, plan joinPlan) (*network.JoinResponse, error) {
	var gw6 net.IP
	if w.IPv6 != nil {
		ll, err := d.dp.HostLinkLocalIPv6(ctx, w.HostIfName)
		if err != nil {
			return nil, fmt.Errorf("finding the IPv6 gateway (link-local address of %s) for endpoint %s failed: %w", w.HostIfName, short(endpointID), err)
		}
		gw6 = ll
	}
	return plan.joinResponse(w.TempIfName, w.IPv4 != nil, gw6), nil
}

// nextHopRoutes are the destinations resp routes via the gateway: what the
// endpoint record keeps so that a later Join into the same sandbox does not
// add them twice.
func nextHopRoutes(resp *network.JoinResponse) []string {
	var routes []string
	for _, r := range resp.StaticRoutes {
		if r.RouteType == RouteTypeNextHop {
			routes = append(routes, r.Destination)
		}
	}
	return routes
}

// recordJoin applies markJoined to the endpoint record at key and returns
// the revision written. The record Join read (ep at rev) is almost always
// still current: the first attempt writes against its revision, a conflict
// re-reads.
func (d *NetworkDriver) recordJoin(ctx context.Context, key, endpointID string, ep datastore.Endpoint, rev int64, markJoined func(*datastore.Endpoint)) (int64, error) {
	cur := ep
	var written int64
	err := d.store.Retry(ctx, func(ctx context.Context) error {
		if rev == 0 {
			cur = datastore.Endpoint{}
			var err error
			rev, err = d.store.GetJSON(ctx, key, &cur)
			if errors.Is(err, datastore.ErrNotFound) {
				return userError(fmt.Sprintf("endpoint %s was deleted while joining", short(endpointID)), ErrEndpointNotFound, err)
			}
			if err != nil {
				return err
			}
		}
		defer func() { rev = 0 }() // a retry starts from a fresh read
		markJoined(&cur)
		var err error
		written, err = d.store.TxnRev(ctx, datastore.Update(key, datastore.MustJSON(cur), rev))
		return err
	})
	return written, err
}

// RouteTypeConnected is libnetwork's route type of an on-link route
// (types.CONNECTED); 0 is a route via NextHop.
const RouteTypeConnected = 1

// Leave removes the endpoint's veth and host route. An unknown endpoint is
// fine (Docker may retry).
func (d *NetworkDriver) Leave(ctx context.Context, req *network.LeaveRequest) error {
	log := d.log.WithFields(logrus.Fields{"network": short(req.NetworkID), "endpoint": short(req.EndpointID)})
	ep, _, err := d.getEndpoint(ctx, req.EndpointID)
	if errors.Is(err, ErrEndpointNotFound) {
		log.Debug("Leave of an endpoint not in the datastore: removing any leftover veth")
		if rerr := d.dp.RemoveWorkload(ctx, req.EndpointID, nil); rerr != nil {
			log.WithError(rerr).Debug("no leftover veth removed")
		}
		d.unshape(ctx, req.EndpointID, dataplane.HostIfName(req.EndpointID), log)
		return nil
	}
	if err != nil {
		return err
	}
	if d.ports != nil && len(ep.Ports) > 0 {
		// Docker revokes before it leaves; this catches a revoke that
		// never came. The resync removes the rules if this fails.
		if err := d.ports.Unpublish(ctx, req.EndpointID); err != nil {
			log.WithError(err).Warn("withdrawing the published ports at Leave")
		}
	}
	_, _, ips := epIPs(ep)
	if err := d.dp.RemoveWorkload(ctx, req.EndpointID, ips); err != nil {
		return fmt.Errorf("removing the veth %s of endpoint %s failed: %w", ep.HostIfName, short(req.EndpointID), err)
	}
	// After the veth (its qdiscs went with it), so that a resync running
	// meanwhile cannot shape it again.
	d.unshape(ctx, req.EndpointID, ep.HostIfName, log)
	err = d.recordLeft(ctx, datastore.EndpointKey(d.host, req.EndpointID))
	if err != nil {
		return storeErr("recording the leave of endpoint "+short(req.EndpointID), err)
	}
	d.sandboxes.forget(req.EndpointID)
	log.WithField("ip", ep.IPv4).Info("endpoint left")
	return nil
}

// DiscoverNew: calico learns about other hosts through its datastore and BGP.
func (d *NetworkDriver) DiscoverNew(ctx context.Context, req *network.DiscoveryNotification) error {
	return nil
}

// DiscoverDelete: see DiscoverNew.
func (d *NetworkDriver) DiscoverDelete(ctx context.Context, req *network.DiscoveryNotification) error {
	return nil
}

// ProgramExternalConnectivity publishes the endpoint's ports (docker run
// -p/-P). Docker calls it for the container's gateway endpoint only, and
// again when that changes; its port mapper serves only its bridge driver.
// Without a Ports publisher (tests) there is nothing to do.
func (d *NetworkDriver) ProgramExternalConnectivity(ctx context.Context, req *network.ProgramExternalConnectivityRequest) error {
	if d.ports == nil {
		return nil
	}
	reqs, err := ports.ParseOptions(req.Options)
	if err != nil {
		return userError(fmt.Sprintf("endpoint %s: %v", short(req.EndpointID), err), ErrInvalidRequest, err)
	}
	if len(reqs) == 0 {
		return nil
	}
	bs, err := d.ports.Publish(ctx, req.EndpointID, reqs)
	if errors.Is(err, ports.ErrPortInUse) {
		return userError(err.Error(), err)
	}
	if err != nil {
		return fmt.Errorf("publishing the ports of endpoint %s failed: %w", short(req.EndpointID), err)
	}
	d.log.WithFields(logrus.Fields{"network": short(req.NetworkID), "endpoint": short(req.EndpointID), "ports": ports.Summary(bs)}).Debug("external connectivity programmed")
	return nil
}

// RevokeExternalConnectivity withdraws what ProgramExternalConnectivity
// published.
func (d *NetworkDriver) RevokeExternalConnectivity(ctx context.Context, req *network.RevokeExternalConnectivityRequest) error {
	if d.ports == nil {
		return nil
	}
	if err := d.ports.Unpublish(ctx, req.EndpointID); err != nil {
		return fmt.Errorf("withdrawing the published ports of endpoint %s failed: %w", short(req.EndpointID), err)
	}
	return nil
}

// endpointLabels asks the Labeller (bounded); unknown is true when it
// cannot say, and the endpoint then matches no policy selector.
func (d *NetworkDriver) endpointLabels(ctx context.Context, req *network.JoinRequest, driverLabels map[string]string, log logrus.FieldLogger) (map[string]string, bool) {
	if d.opts.Labels == nil {
		return nil, false
	}
	lctx, cancel := context.WithTimeout(ctx, labelsTimeout)
	defer cancel()
	labels, err := d.opts.Labels.EndpointLabels(lctx, LabelRequest{
		NetworkID: req.NetworkID, EndpointID: req.EndpointID, SandboxKey: req.SandboxKey,
		Options: req.Options, DriverLabels: driverLabels,
	})
	if err != nil {
		log.WithError(err).Warn("cannot learn the container's labels: the endpoint matches no policy selector (denied where policies apply)")
		return nil, true
	}
	return labels, false
}

// waitProgrammed waits (bounded) until the policy has the endpoint's rules
// in the kernel.
func (d *NetworkDriver) waitProgrammed(ctx context.Context, rev int64) error {
	if d.opts.Policy == nil {
		return nil
	}
	wctx, cancel := context.WithTimeout(ctx, d.opts.PolicyWait)
	defer cancel()
	return d.opts.Policy.WaitProgrammed(wctx, rev)
}

// unjoin reverts the record of a Join that fails after writing it.
func (d *NetworkDriver) unjoin(ctx context.Context, key string, log logrus.FieldLogger) {
	ctx, cancel := context.WithTimeout(ctx, cleanupTimeout)
	defer cancel()
	if err := d.recordLeft(ctx, key); err != nil {
		log.WithError(err).Error("reverting the record of a failed Join")
	}
}

// recordLeft marks the endpoint record not joined (Leave, a failed Join);
// a record already gone or not joined is fine.
func (d *NetworkDriver) recordLeft(ctx context.Context, key string) error {
	return d.store.Retry(ctx, func(ctx context.Context) error {
		var cur datastore.Endpoint
		rev, err := d.store.GetJSON(ctx, key, &cur)
		if errors.Is(err, datastore.ErrNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		if !cur.Joined && cur.Container == "" && cur.Labels == nil && !cur.LabelsUnknown && cur.GatewayIndex == 0 && cur.Routes == nil && cur.Ports == nil {
			return nil
		}
		cur.Joined, cur.Container, cur.Labels, cur.LabelsUnknown = false, "", nil, false
		cur.GatewayIndex, cur.Routes, cur.Ports = 0, nil, nil
		return d.store.Txn(ctx, datastore.Update(key, datastore.MustJSON(cur), rev))
	})
}
