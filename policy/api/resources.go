package api

// HostEndpoint is one of a host's own interfaces (or all of them, "*"),
// which policies select by its labels: Calico's resource of that name.
type HostEndpoint struct {
	APIVersion string           `json:"apiVersion"`
	Kind       string           `json:"kind"`
	Metadata   Metadata         `json:"metadata"`
	Spec       HostEndpointSpec `json:"spec"`
}

// HostEndpointSpec says which host and interface.
type HostEndpointSpec struct {
	// Node is the host's node name (calico-cnm serve --node).
	Node string `json:"node"`
	// InterfaceName is the interface, or "*" for every interface of the
	// host that is not a container's. Empty: the endpoint is known only
	// by its ExpectedIPs (rule selectors match them; no policy applies
	// to an interface).
	InterfaceName string `json:"interfaceName,omitempty"`
	// ExpectedIPs are the interface's addresses: rule selectors that
	// pick the endpoint match them.
	ExpectedIPs []string `json:"expectedIPs,omitempty"`
}

// AllInterfaces is the InterfaceName of a host endpoint for every
// interface of the host but its containers'.
const AllInterfaces = "*"

// GlobalNetworkSet is a named list of networks with labels: rule
// selectors match its nets as they match containers' addresses.
type GlobalNetworkSet struct {
	APIVersion string         `json:"apiVersion"`
	Kind       string         `json:"kind"`
	Metadata   Metadata       `json:"metadata"`
	Spec       NetworkSetSpec `json:"spec"`
}

// NetworkSetSpec lists the networks.
type NetworkSetSpec struct {
	Nets []string `json:"nets,omitempty"`
}

// Resources is everything one apply -f file holds, by kind, each in
// input order.
type Resources struct {
	Policies      []GlobalNetworkPolicy
	HostEndpoints []HostEndpoint
	NetworkSets   []GlobalNetworkSet
}

// Len is the number of resources.
func (r Resources) Len() int { return len(r.Policies) + len(r.HostEndpoints) + len(r.NetworkSets) }

// Where the datastore keeps host endpoints and network sets, one record
// per resource (its JSON), keyed by name.
const (
	HostEndpointsPrefix = Prefix + "hostendpoints/"
	NetworkSetsPrefix   = Prefix + "globalnetworksets/"
)

// HostEndpointKey is the datastore key of a host endpoint.
func HostEndpointKey(name string) string { return HostEndpointsPrefix + name }

// NetworkSetKey is the datastore key of a network set.
func NetworkSetKey(name string) string { return NetworkSetsPrefix + name }
