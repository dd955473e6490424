package ipam

import "time"

// Attributes recorded with an assignment (Allocation.Attrs). They are
// defined here, where assignments live; the drivers write them, and the
// reconcile loop, `ipam check` and the node commands read them.
const (
	// AttrNode is the node whose daemon made the assignment.
	AttrNode = "node"
	// AttrPool is the Docker PoolID the address was requested from.
	AttrPool = "pool"
	// AttrSwarm ("true") marks an address the swarm manager assigned (for
	// a task, a service VIP or an attachable container) through a swarm
	// pool. The node that runs the task uses it without assigning it
	// again, and only the manager releases it.
	AttrSwarm = "swarm"
	// AttrAssigned is when the assignment was committed (RFC 3339, UTC).
	// The engine stamps every assignment with it, in the assignment's
	// handle record (older versions: in the block's attributes; both are
	// read, see withStamp), and Allocations report it among the
	// attributes. An address is only ever
	// a leak once it is older than the window in which Docker legitimately
	// holds an address no endpoint records yet (RequestAddress before
	// CreateEndpoint, plus dockerd's retries).
	AttrAssigned = "assigned"
	// AttrReserved marks an address that is reserved rather than used by
	// an endpoint: a network's --aux-address ("aux") or a real gateway
	// ("gateway"). Any non-empty value counts. Such an address has no
	// endpoint record for its whole life, so it is never a leak; it goes
	// with its network.
	AttrReserved = "reserved"
	// AttrAllocator identifies the swarm manager's allocator (one IPAM
	// driver instance) that made, or took over after a restart, a swarm
	// assignment: that allocator already knows the address, so a request
	// of it for the address again comes from a new attachment and is
	// refused, while another allocator's request is a restore.
	AttrAllocator = "allocator"
	// AttrType says what an address that belongs to no workload is for;
	// AttrTypeVXLANTunnel marks a node's VTEP address (Calico's "type":
	// "vxlanTunnelAddress"). Such addresses carry no AttrNode, so reconcile
	// (which releases a node's addresses without an endpoint record) leaves
	// them alone; they live as long as their node's record.
	AttrType            = "type"
	AttrTypeVXLANTunnel = "vxlanTunnelAddress"
	// AttrReclaimedFor marks an assignment the reconcile loop made again
	// for an address a running container used while the datastore had no
	// assignment for it (a restore of an older backup): the Docker
	// endpoint id.
	AttrReclaimedFor = "reclaimedFor"
)

// Reserved values of AttrReserved.
const (
	ReservedAux     = "aux"
	ReservedGateway = "gateway"
)

// IsReserved tells an aux-address or gateway reservation (AttrReserved).
func IsReserved(attrs map[string]string) bool { return attrs[AttrReserved] != "" }

// IsSwarm tells an assignment the swarm manager made (AttrSwarm).
func IsSwarm(attrs map[string]string) bool { return attrs[AttrSwarm] == "true" }

// AssignedAt is when the assignment was made; ok is false for assignments
// recorded before the engine stamped them (their age is unknown).
func AssignedAt(attrs map[string]string) (t time.Time, ok bool) {
	t, err := time.Parse(time.RFC3339Nano, attrs[AttrAssigned])
	return t, err == nil
}
