// Package api is the policy resource model: Calico's v3 GlobalNetworkPolicy,
// the subset that makes sense for Docker containers, with Calico's field
// names so that the same YAML works with both. It decodes strictly (unknown
// fields and invalid values are errors naming the field's path), validates,
// and defines where policies live in the datastore.
package api

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Resource identity, as calicoctl prints it.
const (
	APIVersion     = "projectcalico.org/v3"
	KindPolicy     = "GlobalNetworkPolicy"
	KindPolicyList = "GlobalNetworkPolicyList"
	KindList       = "List"

	KindHostEndpoint     = "HostEndpoint"
	KindHostEndpointList = "HostEndpointList"
	KindNetworkSet       = "GlobalNetworkSet"
	KindNetworkSetList   = "GlobalNetworkSetList"
)

// PoliciesPrefix is where the datastore keeps policies, one record per
// policy (the resource's JSON), keyed by name.
const PoliciesPrefix = Prefix + "globalnetworkpolicies/"

// Prefix holds every policy resource kind's records: one watch and one
// list of it see an apply -f of several kinds as the one transaction it
// is.
const Prefix = "policy/"

// PolicyKey is the datastore key of a policy.
func PolicyKey(name string) string { return PoliciesPrefix + name }

// GlobalNetworkPolicy is one policy resource.
type GlobalNetworkPolicy struct {
	APIVersion string     `json:"apiVersion"`
	Kind       string     `json:"kind"`
	Metadata   Metadata   `json:"metadata"`
	Spec       PolicySpec `json:"spec"`
}

// Metadata names a resource. Labels are for host endpoints and network
// sets, which rule selectors match as they match containers.
type Metadata struct {
	Name   string            `json:"name"`
	Labels map[string]string `json:"labels,omitempty"`
}

// PolicySpec is what a policy does.
type PolicySpec struct {
	// Order: lower first; unset after every set one; ties by name.
	Order    *float64     `json:"order,omitempty"`
	Selector string       `json:"selector,omitempty"`
	Types    []PolicyType `json:"types,omitempty"`
	Ingress  []Rule       `json:"ingress,omitempty"`
	Egress   []Rule       `json:"egress,omitempty"`
	// PreDNAT: the policy applies to host endpoints, to traffic arriving
	// at the host before its destination is translated (published
	// ports): ingress only, and it needs ApplyOnForward.
	PreDNAT bool `json:"preDNAT,omitempty"`
	// ApplyOnForward: for host endpoints, the policy also applies to
	// traffic the host forwards (to and from its containers), not only
	// to traffic to and from the host's own processes.
	ApplyOnForward bool `json:"applyOnForward,omitempty"`
}

// PolicyType is a direction a policy applies to.
type PolicyType string

// Directions.
const (
	Ingress PolicyType = "Ingress"
	Egress  PolicyType = "Egress"
)

// Action is what a matching rule does.
type Action string

// Actions. Log logs and goes on with the next rule; Pass skips the rest of
// the policies and goes to the network's own behaviour (the profile).
const (
	Allow Action = "Allow"
	Deny  Action = "Deny"
	Log   Action = "Log"
	Pass  Action = "Pass"
)

// Rule is one ingress or egress rule.
type Rule struct {
	Action      Action      `json:"action"`
	IPVersion   *int        `json:"ipVersion,omitempty"`
	Protocol    *Protocol   `json:"protocol,omitempty"`
	NotProtocol *Protocol   `json:"notProtocol,omitempty"`
	ICMP        *ICMPFields `json:"icmp,omitempty"`
	Source      EntityRule  `json:"source,omitzero"`
	Destination EntityRule  `json:"destination,omitzero"`
}

// ICMPFields match an ICMP type and, with it, a code.
type ICMPFields struct {
	Type *int `json:"type,omitempty"`
	Code *int `json:"code,omitempty"`
}

// EntityRule matches one end of a connection. Every set field must match.
type EntityRule struct {
	Nets        []string `json:"nets,omitempty"`
	NotNets     []string `json:"notNets,omitempty"`
	Selector    string   `json:"selector,omitempty"`
	NotSelector string   `json:"notSelector,omitempty"`
	Ports       []Port   `json:"ports,omitempty"`
	NotPorts    []Port   `json:"notPorts,omitempty"`
}

// IsZero: an empty entity rule matches everything and is not printed.
func (e EntityRule) IsZero() bool {
	return len(e.Nets) == 0 && len(e.NotNets) == 0 && e.Selector == "" && e.NotSelector == "" && len(e.Ports) == 0 && len(e.NotPorts) == 0
}

// Protocol is an IP protocol by Calico's name or by number (1-255).
type Protocol struct {
	Name string // canonical name; "" when given by number only
	Num  uint8
}

// Calico's protocol names and their numbers.
var protocolNames = []struct {
	name string
	num  uint8
}{{"TCP", 6}, {"UDP", 17}, {"ICMP", 1}, {"ICMPv6", 58}, {"SCTP", 132}, {"UDPLite", 136}}

// ProtocolFromName accepts Calico's names in any case.
func ProtocolFromName(s string) (Protocol, bool) {
	for _, p := range protocolNames {
		if strings.EqualFold(s, p.name) {
			return Protocol{Name: p.name, Num: p.num}, true
		}
	}
	return Protocol{}, false
}

// ProtocolFromNumber names well-known numbers, so that 6 and TCP are the same.
func ProtocolFromNumber(n uint8) Protocol {
	for _, p := range protocolNames {
		if p.num == n {
			return Protocol{Name: p.name, Num: n}
		}
	}
	return Protocol{Num: n}
}

func (p Protocol) String() string {
	if p.Name != "" {
		return p.Name
	}
	return strconv.Itoa(int(p.Num))
}

// HasPorts: protocols whose header has ports (Calico allows ports only
// with these).
func (p Protocol) HasPorts() bool { return p.Num == 6 || p.Num == 17 || p.Num == 132 || p.Num == 136 }

// MarshalJSON writes the name, or the number.
func (p Protocol) MarshalJSON() ([]byte, error) {
	if p.Name != "" {
		return json.Marshal(p.Name)
	}
	return json.Marshal(p.Num)
}

// Port is a port or an inclusive range of ports.
type Port struct {
	Min, Max uint16
}

func (p Port) String() string {
	if p.Min == p.Max {
		return strconv.Itoa(int(p.Min))
	}
	return fmt.Sprintf("%d:%d", p.Min, p.Max)
}

// MarshalJSON writes a single port as a number, a range as "a:b".
func (p Port) MarshalJSON() ([]byte, error) {
	if p.Min == p.Max {
		return json.Marshal(p.Min)
	}
	return json.Marshal(p.String())
}

// AppliesTo says whether the policy has direction t.
func (p GlobalNetworkPolicy) AppliesTo(t PolicyType) bool { return slices.Contains(p.Spec.Types, t) }

// DefaultTypes is Calico's default for an unset spec.types: Ingress when
// there are ingress rules or no egress rules, Egress when there are egress
// rules.
func DefaultTypes(s PolicySpec) []PolicyType {
	var out []PolicyType
	if len(s.Ingress) > 0 || len(s.Egress) == 0 {
		out = append(out, Ingress)
	}
	if len(s.Egress) > 0 {
		out = append(out, Egress)
	}
	return out
}

// Less orders policies: by order, unset after set, then by name.
func Less(a, b GlobalNetworkPolicy) bool {
	ao, bo := a.Spec.Order, b.Spec.Order
	switch {
	case ao != nil && bo == nil:
		return true
	case ao == nil && bo != nil:
		return false
	case ao != nil && bo != nil && *ao != *bo:
		return *ao < *bo
	}
	return a.Metadata.Name < b.Metadata.Name
}

// Sort puts policies in evaluation order.
func Sort(ps []GlobalNetworkPolicy) {
	slices.SortStableFunc(ps, func(a, b GlobalNetworkPolicy) int {
		switch {
		case Less(a, b):
			return -1
		case Less(b, a):
			return 1
		}
		return 0
	})
}
