// Package driver holds the logic of calico-cnm's two libnetwork remote
// drivers: NetworkDriver (driver name "calico") and IPAMDriver ("calico-ipam").
//
// Nothing here speaks HTTP: package plugin decodes Docker's requests into the
// go-plugins-helpers request types, calls these methods and encodes the
// answers. Every error a method returns is meant to be shown to the user by
// `docker` as is: one sentence saying what went wrong, wrapping the cause so
// that errors.Is works (datastore.ErrUnavailable, ipam.ErrExhausted, ...).
package driver

import (
	"context"
	"errors"
	"fmt"
	"net"

	"github.com/calico-cnm/calico-cnm/dataplane"
	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/ipam"
)

// IPAM is what the drivers need of the address manager (*ipam.Engine).
type IPAM interface {
	// EnsureDefaultPool returns the default IPv4 pool, creating it if there
	// is no pool at all.
	EnsureDefaultPool(ctx context.Context) (ipam.Pool, error)
	// FindPool returns the pool equal to or containing subnet
	// (ipam.ErrPoolNotFound when there is none).
	FindPool(ctx context.Context, subnet *net.IPNet) (ipam.Pool, error)
	AddPool(ctx context.Context, p ipam.Pool) (ipam.Pool, error)
	// ListPools returns every pool, disabled ones too.
	ListPools(ctx context.Context) ([]ipam.Pool, error)
	AutoAssign(ctx context.Context, args ipam.AutoAssignArgs) (net.IPNet, error)
	AssignIP(ctx context.Context, args ipam.AssignIPArgs) error
	// ReleaseIP frees ip; releasing a free address is not an error.
	ReleaseIP(ctx context.Context, ip net.IP) error
	// AddressHolder is the assignment holding ip (found false: free),
	// read fresh from the datastore.
	AddressHolder(ctx context.Context, ip net.IP) (a ipam.Allocation, found bool, err error)
	// ReleaseIPUnless is ReleaseIP that leaves the address alone when keep
	// says so of its holder, decided inside the releasing transaction.
	ReleaseIPUnless(ctx context.Context, ip net.IP, keep func(ipam.Allocation) bool) error
	// UpdateHolder lets decide replace the attributes of the assignment
	// holding ip, or refuse (its error), in one guarded transaction.
	UpdateHolder(ctx context.Context, ip net.IP, decide func(ipam.Allocation) (map[string]string, error)) (a ipam.Allocation, found bool, err error)
	// ExpectRelease says that the coming ReleaseIP of ip is meant for the
	// assignment of one of handles: any other holder is left alone.
	ExpectRelease(ip net.IP, handles ...string)
}

// Dataplane is what the network driver needs of the host's kernel
// (*dataplane.Linux).
type Dataplane interface {
	// AddWorkload creates the endpoint's veth and host route; on failure it
	// leaves nothing behind.
	AddWorkload(ctx context.Context, w dataplane.Workload) error
	// RemoveWorkload undoes AddWorkload; removing what is not there is fine.
	RemoveWorkload(ctx context.Context, endpointID string, ips []net.IPNet) error
	// HostLinkLocalIPv6 is the host side's link-local address: the IPv6
	// gateway of the container.
	HostLinkLocalIPv6(ctx context.Context, hostIfName string) (net.IP, error)
}

// Names and values Docker sees.
const (
	// CalicoLocalAddressSpace and CalicoGlobalAddressSpace are the address
	// spaces calico-ipam reports; CreateNetwork recognises calico-ipam
	// networks by them.
	CalicoLocalAddressSpace  = "CalicoLocalAddressSpace"
	CalicoGlobalAddressSpace = "CalicoGlobalAddressSpace"

	// PoolIDV4 is the PoolID of a network created without --subnet: its
	// addresses come from any enabled IPv4 calico pool. A network created
	// with --subnet has the canonical subnet itself as PoolID
	// (e.g. "192.168.0.0/24"), which is what Calico's libnetwork-plugin
	// used too, so RequestAddress knows where to allocate from.
	PoolIDV4 = "CalicoPoolIPv4"
	// PoolIDV6 is never handed out (an IPv6 network needs --subnet); it is
	// accepted for networks created by Calico's old libnetwork-plugin.
	PoolIDV6 = "CalicoPoolIPv6"

	// OptCreatePool (docker network create --ipam-opt calico.create-pool=true)
	// makes RequestPool add the --subnet as a new calico pool when no pool
	// contains it.
	OptCreatePool = "calico.create-pool"
	// OptNATOutgoing (with calico.create-pool) sets natOutgoing on the new pool.
	OptNATOutgoing = "calico.nat-outgoing"

	// GatewayDataKey is the key of RequestPool's Data whose value Docker
	// takes as the network's gateway instead of asking RequestAddress for
	// one (libnetwork's netlabel.Gateway).
	GatewayDataKey = "com.docker.network.gateway"
	// RequestAddressTypeKey / RequestAddressTypeGateway mark RequestAddress
	// calls asking for the network's gateway (libnetwork's
	// ipamapi.RequestAddressType and netlabel.Gateway).
	RequestAddressTypeKey     = "RequestAddressType"
	RequestAddressTypeGateway = "com.docker.network.gateway"

	// VirtualGatewayIPv4 / VirtualGatewayIPv6 are what calico-ipam answers
	// for a network's gateway, both in RequestPool's Data and to a gateway
	// RequestAddress: no address is reserved. Containers really route via
	// 169.254.1.1 (IPv6: the host side's link-local address), which the
	// network driver hands out at Join.
	VirtualGatewayIPv4 = "0.0.0.0/0"
	VirtualGatewayIPv6 = "::/0"

	// FixedMAC is the MAC of every container interface (unless docker run
	// --mac-address chose one): the host routes, so it never matters.
	FixedMAC = "ee:ee:ee:ee:ee:ee"

	// HandlePrefix starts every IPAM handle the IPAM driver creates:
	// HandlePrefix + 16 random hex digits, one handle per assigned address.
	// Handles are unique per request, never a function of the address: the
	// engine treats AssignIP of an address to the handle already holding it
	// as a successful retry, so a per-address handle would let a second
	// `docker run --ip X` share X with the first container. (And AutoAssign
	// takes the handle before it picks the address.)
	HandlePrefix = "cnm."

	// SwarmPoolIDPrefix starts the PoolID of a pool requested in the
	// global address space. Only the swarm manager's allocator asks
	// there: a node's libnetwork gives a swarm network local data scope,
	// hence asks in the local space (libnetwork network.DataScope). So the
	// PoolID tells the manager's RequestAddress/ReleaseAddress from the
	// nodes'.
	SwarmPoolIDPrefix = "swarm:"

	// OptSwarm ("true") is the network option AllocateNetwork adds to the
	// options the swarm manager hands to every node's CreateNetwork: the
	// network record belongs to the manager (AllocateNetwork writes it,
	// FreeNetwork deletes it) and the nodes share it.
	OptSwarm = "calico.swarm"
)

// Sentinel errors, wrapped by the errors the drivers return.
var (
	// ErrInvalidRequest: Docker (or the user through it) asked for something
	// malformed or contradictory.
	ErrInvalidRequest = errors.New("invalid request")
	// ErrNotSupported: a feature calico-cnm does not offer.
	ErrNotSupported = errors.New("not supported by calico-cnm")
	// ErrNetworkNotFound: no calico network record with that id.
	ErrNetworkNotFound = errors.New("network not found")
	// ErrEndpointNotFound: no endpoint record with that id on this host.
	ErrEndpointNotFound = errors.New("endpoint not found")
	// ErrAlreadyExists: a network or endpoint with that id is already recorded.
	ErrAlreadyExists = errors.New("already exists")
	// ErrForeignIPAM: the network's addresses do not come from calico-ipam.
	ErrForeignIPAM = errors.New("network does not use calico-ipam")
)

// userError is msg, wrapping causes (nil ones are skipped): the same
// one-line, multi-cause error the address manager returns.
func userError(msg string, causes ...error) error {
	return ipam.NewUserError(msg, causes...)
}

// storeErr words a datastore failure for the user; doing says what we were
// doing ("recording network 0123456789ab").
func storeErr(doing string, err error) error {
	if datastore.IsUnreachable(err) {
		return fmt.Errorf("calico datastore (etcd) unreachable while %s: %w", doing, datastore.Unreachable(err))
	}
	if errors.Is(err, context.Canceled) {
		return fmt.Errorf("gave up %s (the request was cancelled): %w", doing, err)
	}
	return fmt.Errorf("failed %s: %w", doing, err)
}

// isStoreFailure tells transport trouble (etcd down or too slow, request
// cancelled) from a logical refusal.
func isStoreFailure(err error) bool {
	return datastore.IsUnreachable(err) || errors.Is(err, context.Canceled)
}

// short abbreviates a Docker id for messages, as docker does.
func short(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

// hostMask is the /32 or /128 of ip.
func hostNet(ip net.IP) net.IPNet {
	if ip4 := ip.To4(); ip4 != nil {
		return net.IPNet{IP: ip4, Mask: net.CIDRMask(32, 32)}
	}
	return net.IPNet{IP: ip.To16(), Mask: net.CIDRMask(128, 128)}
}

func isIPv4(ip net.IP) bool { return ip.To4() != nil }
