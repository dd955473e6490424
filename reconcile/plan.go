// Package reconcile brings the datastore, IPAM and the kernel in line with
// what Docker really has attached on this node: MakePlan decides from one
// picture of the three, a Reconciler reads that picture, repairs and runs
// the passes. The daemon (plugin) wires it.
package reconcile

import (
	"fmt"
	"maps"
	"net"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/calico-cnm/calico-cnm/dataplane"
	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/ipam"
)

// DefaultGrace is how long something must look stale (an endpoint
// record Docker does not have, an address no endpoint holds) before the
// reconcile loop removes it. Docker legitimately holds such states for a
// moment: an address exists between RequestAddress and CreateEndpoint, an
// endpoint record between our CreateEndpoint and Docker storing it, and
// Docker deletes its endpoint before calling DeleteEndpoint/ReleaseAddress.
// dockerd 20.10 retries a call to an unreachable plugin for 15 s (backoff
// 1+2+4+8 s), so such a window can last that long around a daemon restart.
const DefaultGrace = 20 * time.Second

// DockerEndpoint is one endpoint as Docker reports it (network inspect).
type DockerEndpoint struct {
	ID      string
	Network string
	IPs     []netip.Addr
	MAC     string // "" when Docker did not say
}

// DockerView is everything Docker has attached, on every network: the
// endpoints of our networks tell which records are live, and the addresses
// of all networks guard against releasing one that some container uses
// (calico-ipam can serve a network of another driver).
type DockerView struct {
	Endpoints map[string]DockerEndpoint // by endpoint id
	// AuxAddresses are the --aux-address reservations of every network
	// (address -> network name): calico-ipam cannot tell them from other
	// requests, and only the calico driver marks its own (ipam.AttrReserved).
	AuxAddresses map[netip.Addr]string
	// EngineID is this Docker's engine ID ("" = unknown).
	EngineID string
}

// Uses is every address Docker holds: its endpoints' and the networks'
// --aux-address reservations.
func (v *DockerView) Uses() map[netip.Addr]bool {
	used := map[netip.Addr]bool{}
	for _, de := range v.Endpoints {
		for _, ip := range de.IPs {
			used[ip.Unmap()] = true
		}
	}
	for ip := range v.AuxAddresses {
		used[ip.Unmap()] = true
	}
	return used
}

// StoredEndpoint is an endpoint record with the revision a delete must
// compare against.
type StoredEndpoint struct {
	Endpoint datastore.Endpoint
	Rev      int64
}

// Input is one consistent-enough picture of the three sources of
// truth. The datastore side must be read before Docker's: whatever Docker
// creates after its view was taken is then absent from the records too,
// never a record without its Docker endpoint.
type Input struct {
	Node  string
	Now   time.Time
	Grace time.Duration
	// Endpoints are the endpoint records of every node (addresses of other
	// nodes' endpoints are in use too).
	Endpoints   []StoredEndpoint
	Allocations []ipam.Allocation
	// Networks are the ids of the network records (the calico networks).
	Networks map[string]bool
	// Detached are this host's workload veth pairs with both ends in the
	// host namespace (dataplane ListDetachedWorkloads): no container holds
	// them.
	Detached []string
	// Docker is nil when Docker's view is unknown (unreachable): then
	// nothing is released or removed.
	Docker *DockerView
	// FirstSeen is when each pending candidate (Plan.Pending of the
	// previous pass) was first seen stale.
	FirstSeen map[string]time.Time
	// ReleaseOrphans allows releasing this node's addresses that no
	// endpoint holds. The swarm manager's assignments (other nodes' tasks,
	// service VIPs) and aux/gateway reservations are never orphans, so the
	// daemon sweeps in global scope too.
	ReleaseOrphans bool
}

// AddressRelease frees one assignment. Releases go by handle, not by
// address: handles are unique per assignment, so a release decided on a
// snapshot can never free the address after it was re-assigned to someone
// else in the meantime.
type AddressRelease struct {
	IP     netip.Addr
	Handle string
	Block  string
}

// AddressReclaim re-assigns an address a live Docker endpoint uses.
type AddressReclaim struct {
	IP       netip.Addr
	Endpoint string // Docker endpoint id
	Network  string
}

// EndpointRemoval undoes an endpoint Docker no longer has.
type EndpointRemoval struct {
	Endpoint datastore.Endpoint
	Rev      int64
	// RemoveVeth is false when one of Docker's live endpoints would have
	// the same host interface name (a shared 11-hex-digit id prefix): that
	// veth is a running container's.
	RemoveVeth bool
	// Release are the assignments still holding the endpoint's addresses,
	// except those Docker shows in use by another endpoint.
	Release []AddressRelease
	// Kept explains addresses that are not released.
	Kept []string
}

// Plan is what one reconcile pass does.
type Plan struct {
	RemoveEndpoints []EndpointRemoval
	// ReleaseOrphans are this node's assignments that belong to no
	// endpoint record and no Docker endpoint.
	ReleaseOrphans []AddressRelease
	// RemoveDetached are detached veth pairs (host-side names) that belong
	// to no endpoint record of this node and no Docker endpoint.
	RemoveDetached []string
	// EnsureRoutes are this node's joined endpoints whose /32 (/128) host
	// routes must exist: those Docker has, or all when Docker's view is
	// unknown (restoring a route through an existing veth is always right;
	// the executor skips endpoints whose veth is gone).
	EnsureRoutes []datastore.Endpoint
	// Unknown are endpoints of our networks that Docker has but the
	// datastore does not record (a restored backup older than them, or a
	// changed NODENAME); sorted ids. Their records cannot be rebuilt (we
	// lack their context), but their addresses are re-assigned: Reclaim.
	Unknown []string
	// Reclaim are addresses Docker's endpoints on our networks use that
	// no assignment holds: the datastore lost them (restored from a backup
	// taken before the container started, or wiped). They are assigned
	// again to this node so that nobody else is handed a live address.
	Reclaim []AddressReclaim
	// Rebuild are the records of Unknown endpoints whose addresses no
	// assignment held either (the datastore lost them, rather than the
	// node being renamed), or only a reclaim for that very endpoint (an
	// earlier pass's, which could not rebuild): written once their
	// addresses are reclaimed, with the reclaimed handles (Handles holds
	// the earlier passes'), labels to be learnt (LabelsUnknown, see the
	// policy's relearn loop).
	Rebuild []datastore.Endpoint
	// Pending are the stale candidates still inside their grace period,
	// with when they were first seen: the next pass's FirstSeen.
	Pending map[string]time.Time
	// NextDue is when the earliest pending candidate matures (zero: none).
	NextDue time.Time
}

// Actions counts the repairs the plan makes.
func (p Plan) Actions() int {
	return len(p.RemoveEndpoints) + len(p.ReleaseOrphans) + len(p.RemoveDetached) + len(p.Reclaim)
}

func endpointCandidate(se StoredEndpoint) string {
	return fmt.Sprintf("endpoint/%s/%s@%d", se.Endpoint.Node, se.Endpoint.ID, se.Rev)
}

func orphanCandidate(a ipam.Allocation) string {
	return fmt.Sprintf("address/%s/%s", a.IP, a.HandleID)
}

// endpointAddrs are the endpoint record's addresses (unparsable ones are
// skipped: nothing can hold them).
func endpointAddrs(ep datastore.Endpoint) []netip.Addr {
	var out []netip.Addr
	v4, v6 := ep.Addrs()
	for _, a := range []netip.Addr{v4, v6} {
		if a.IsValid() {
			out = append(out, a)
		}
	}
	return out
}

// endpointNets are the endpoint's addresses as host routes' destinations.
func endpointNets(ep datastore.Endpoint) []net.IPNet {
	var out []net.IPNet
	for _, a := range endpointAddrs(ep) {
		out = append(out, net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(a.BitLen(), a.BitLen())})
	}
	return out
}

func allocAddr(a ipam.Allocation) (netip.Addr, bool) {
	ip, ok := netip.AddrFromSlice(a.IP)
	return ip.Unmap(), ok
}

// MakePlan decides, without side effects, what a reconcile pass does.
// The rules:
//
//   - Docker's view unknown: only ensure the routes of this node's joined
//     endpoints; remove and release nothing; pending candidates keep their
//     first-seen time.
//   - An endpoint record of this node that Docker does not have is a
//     candidate; once it was seen stale for Grace (same record revision), it
//     is removed: veth and routes (unless a live Docker endpoint maps to the
//     same interface name), the assignments of its addresses (by handle, and
//     only the record's own: see ownsAssignment; never while Docker shows the
//     address on another endpoint), then the record itself.
//   - An endpoint record Docker has: its routes are ensured if it is joined.
//   - A detached veth pair (both ends in the host namespace, so no container
//     holds it) whose name is no endpoint record's of this node and no
//     Docker endpoint's is a candidate; seen so for Grace, it is deleted.
//     (A record's own pair goes with the record, above.)
//   - With ReleaseOrphans, an assignment whose "node" attribute is this node,
//     that is neither the swarm manager's nor an aux/gateway reservation,
//     whose address is in no endpoint record (any node) and on no Docker
//     endpoint (any network) is a candidate; seen so for Grace (same
//     handle), it is released by that handle.
//   - An address of a Docker endpoint on one of our networks that no
//     assignment holds is re-assigned to this node at once (no grace:
//     claiming an address a container uses is always right, and every
//     moment it stays free it may be handed out again). This is what
//     brings IPAM back in line after a restore.
func MakePlan(in Input) Plan {
	plan := Plan{Pending: map[string]time.Time{}}
	mature := func(key string) bool {
		first, ok := in.FirstSeen[key]
		if !ok {
			first = in.Now
		}
		if in.Now.Sub(first) >= in.Grace {
			return true
		}
		plan.Pending[key] = first
		return false
	}

	if in.Docker == nil {
		for _, se := range in.Endpoints {
			if se.Endpoint.Node == in.Node && se.Endpoint.Joined {
				plan.EnsureRoutes = append(plan.EnsureRoutes, se.Endpoint)
			}
		}
		maps.Copy(plan.Pending, in.FirstSeen)
		plan.NextDue = nextDue(plan.Pending, in.Grace)
		return plan
	}

	idx := indexInput(in)
	for _, se := range in.Endpoints {
		ep := se.Endpoint
		if ep.Node != in.Node || otherEngine(ep, in.Docker) {
			continue
		}
		if _, live := in.Docker.Endpoints[ep.ID]; live {
			if ep.Joined {
				plan.EnsureRoutes = append(plan.EnsureRoutes, ep)
			}
			continue
		}
		if mature(endpointCandidate(se)) {
			plan.RemoveEndpoints = append(plan.RemoveEndpoints, idx.endpointRemoval(se))
		}
	}

	for _, name := range in.Detached {
		if idx.recordIfNames[name] || idx.liveIfNames[name] {
			continue
		}
		if mature("interface/" + name) {
			plan.RemoveDetached = append(plan.RemoveDetached, name)
		}
	}

	if in.ReleaseOrphans {
		plan.ReleaseOrphans = idx.orphanReleases(in.Allocations, in.Node, mature)
	}

	for id, de := range in.Docker.Endpoints {
		if !in.Networks[de.Network] {
			continue
		}
		if !idx.known[id] {
			plan.Unknown = append(plan.Unknown, id)
		}
		lost := len(de.IPs) > 0
		var reclaimed []string // handles an earlier pass's reclaim made for it
		for _, ip := range de.IPs {
			if a, held := idx.holders[ip]; held {
				if reclaimedFor(a, in.Node, id) {
					// Lost, and re-assigned by an earlier pass that could
					// not rebuild the record: its view of the records
					// was older than the loss (the syncer had not
					// re-listed a restored datastore yet), or the daemon
					// stopped in between.
					reclaimed = append(reclaimed, a.HandleID)
					continue
				}
				lost = false
				continue
			}
			plan.Reclaim = append(plan.Reclaim, AddressReclaim{IP: ip, Endpoint: id, Network: de.Network})
		}
		if lost && !idx.known[id] {
			ep := rebuiltEndpoint(in.Node, in.Docker.EngineID, de)
			ep.Handles = reclaimed
			plan.Rebuild = append(plan.Rebuild, ep)
		}
	}
	slices.SortFunc(plan.Rebuild, func(a, b datastore.Endpoint) int { return strings.Compare(a.ID, b.ID) })
	sort.Strings(plan.Unknown)
	slices.SortFunc(plan.Reclaim, func(a, b AddressReclaim) int { return a.IP.Compare(b.IP) })
	plan.NextDue = nextDue(plan.Pending, in.Grace)
	return plan
}

// reclaimedFor: a is the assignment a reclaim made on node for the Docker
// endpoint id.
func reclaimedFor(a ipam.Allocation, node, id string) bool {
	return a.Attrs[ipam.AttrReclaimedFor] == id && a.Attrs[ipam.AttrNode] == node
}

// rebuiltEndpoint is the record of a joined endpoint as far as Docker's
// view tells it: what the kernel has (veth name, addresses) and what
// Docker says (network, MAC). Labels are learnt later; the gateway index
// and extra routes are the single-network defaults.
func rebuiltEndpoint(node, engineID string, de DockerEndpoint) datastore.Endpoint {
	ep := datastore.Endpoint{ID: de.ID, Network: de.Network, Node: node, MAC: de.MAC, HostIfName: dataplane.HostIfName(de.ID),
		Joined: true, EngineID: engineID, LabelsUnknown: true}
	for _, ip := range de.IPs {
		p := netip.PrefixFrom(ip, ip.BitLen()).String()
		if ip.Is4() {
			ep.IPv4 = p
		} else {
			ep.IPv6 = p
		}
	}
	return ep
}

// reconcileIndex is what MakePlan looks up while Docker's view is
// known.
type reconcileIndex struct {
	dockerIPs   map[netip.Addr]string // address -> Docker endpoint id
	auxIPs      map[netip.Addr]string // address -> network of its --aux-address
	liveIfNames map[string]bool       // host interface names of Docker's endpoints
	// holders maps each address to the assignment holding it.
	holders map[netip.Addr]ipam.Allocation
	// recorded are the addresses of the endpoint records of every node.
	recorded map[netip.Addr]bool
	// known are the ids of this node's endpoint records, and recordIfNames
	// their host interface names (recorded and derived from the id).
	known         map[string]bool
	recordIfNames map[string]bool
}

// indexReconcileInput indexes in, whose Docker view must be known.
func indexInput(in Input) reconcileIndex {
	idx := reconcileIndex{
		dockerIPs:     map[netip.Addr]string{},
		auxIPs:        in.Docker.AuxAddresses,
		liveIfNames:   map[string]bool{},
		holders:       map[netip.Addr]ipam.Allocation{},
		recorded:      map[netip.Addr]bool{},
		known:         map[string]bool{},
		recordIfNames: map[string]bool{},
	}
	for id, de := range in.Docker.Endpoints {
		for _, ip := range de.IPs {
			idx.dockerIPs[ip.Unmap()] = id
		}
		idx.liveIfNames[dataplane.HostIfName(id)] = true
	}
	for _, a := range in.Allocations {
		if ip, ok := allocAddr(a); ok {
			idx.holders[ip] = a
		}
	}
	for _, se := range in.Endpoints {
		for _, ip := range endpointAddrs(se.Endpoint) {
			idx.recorded[ip] = true
		}
		if se.Endpoint.Node == in.Node {
			idx.known[se.Endpoint.ID] = true
			idx.recordIfNames[se.Endpoint.HostIfName] = true
			idx.recordIfNames[dataplane.HostIfName(se.Endpoint.ID)] = true
		}
	}
	return idx
}

// endpointRemoval is the removal of a stale endpoint record: which of its
// addresses to release, and why the others are kept.
func (idx reconcileIndex) endpointRemoval(se StoredEndpoint) EndpointRemoval {
	ep := se.Endpoint
	// RemoveWorkload deletes the interface named after the id.
	rm := EndpointRemoval{Endpoint: ep, Rev: se.Rev, RemoveVeth: !idx.liveIfNames[dataplane.HostIfName(ep.ID)]}
	for _, ip := range endpointAddrs(ep) {
		if other, used := idx.dockerIPs[ip]; used {
			rm.Kept = append(rm.Kept, fmt.Sprintf("%s is in use by Docker endpoint %s", ip, dataplane.ShortID(other)))
			continue
		}
		a, held := idx.holders[ip]
		if !held {
			continue // already free (Docker's ReleaseAddress got through)
		}
		if ipam.IsSwarm(a.Attrs) {
			// The swarm manager assigned it to a task and releases it
			// when it frees the task (see ipam.AttrSwarm).
			rm.Kept = append(rm.Kept, fmt.Sprintf("%s was assigned by the swarm manager, which releases it", ip))
			continue
		}
		if !ownsAssignment(ep, a) {
			rm.Kept = append(rm.Kept, fmt.Sprintf("%s is now held by handle %s, which is not this endpoint's (re-assigned since)", ip, a.HandleID))
			continue
		}
		rm.Release = append(rm.Release, AddressRelease{IP: ip, Handle: a.HandleID, Block: a.Block})
	}
	return rm
}

// orphanReleases are node's assignments that no endpoint record and no
// Docker endpoint holds and that have been so for the grace period.
func (idx reconcileIndex) orphanReleases(allocs []ipam.Allocation, node string, mature func(key string) bool) []AddressRelease {
	var out []AddressRelease
	for _, a := range allocs {
		ip, ok := allocAddr(a)
		if !ok || a.Attrs[ipam.AttrNode] != node || idx.recorded[ip] {
			continue
		}
		// The swarm manager's assignments (tasks of other nodes,
		// service VIPs) and aux/gateway reservations never have an
		// endpoint record: not orphans.
		if ipam.IsSwarm(a.Attrs) || ipam.IsReserved(a.Attrs) {
			continue
		}
		if _, used := idx.dockerIPs[ip]; used {
			continue
		}
		if _, aux := idx.auxIPs[ip]; aux {
			continue
		}
		if mature(orphanCandidate(a)) {
			out = append(out, AddressRelease{IP: ip, Handle: a.HandleID, Block: a.Block})
		}
	}
	return out
}

// otherEngine: the record was written by the daemon of another Docker
// engine that uses this node name too (a cloned host): this Docker's view
// says nothing about it, so reconcile leaves it alone.
func otherEngine(ep datastore.Endpoint, docker *DockerView) bool {
	return ep.OfOtherEngine(docker.EngineID)
}

// ownsAssignment tells whether assignment a, which holds one of ep's
// addresses, is ep's own. A record names its handles; one written before
// handles were recorded owns only assignments that predate the engine's
// timestamps: a stamped assignment (its time in its block or, since then,
// in its handle record; Allocations report both) was made by a daemon that
// records handles, so it belongs to a newer endpoint.
func ownsAssignment(ep datastore.Endpoint, a ipam.Allocation) bool {
	if len(ep.Handles) > 0 {
		return slices.Contains(ep.Handles, a.HandleID)
	}
	_, stamped := ipam.AssignedAt(a.Attrs)
	return !stamped
}

func nextDue(pending map[string]time.Time, grace time.Duration) time.Time {
	var due time.Time
	for _, first := range pending {
		if t := first.Add(grace); due.IsZero() || t.Before(due) {
			due = t
		}
	}
	return due
}
