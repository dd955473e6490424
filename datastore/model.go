package datastore

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"strings"
	"unique"
)

// The typed model: each record kind this package owns is parsed here and
// nowhere else. The syncer decodes a record once per revision with these
// decoders and every subscriber shares the result.

// WorkloadEndpoint is an endpoint record with its addresses parsed.
type WorkloadEndpoint struct {
	Endpoint
	// Addr4 and Addr6 are the endpoint's addresses (invalid when it has
	// none of that family or the field does not parse).
	Addr4, Addr6 netip.Addr
	// shared keeps the one copy of Network and EngineID alive (see
	// ParseEndpoint): the runtime drops a value no handle holds.
	shared [2]unique.Handle[string]
}

// Addrs are the endpoint's valid addresses, IPv4 first.
func (w *WorkloadEndpoint) Addrs() []netip.Addr {
	out := make([]netip.Addr, 0, 2)
	for _, a := range []netip.Addr{w.Addr4, w.Addr6} {
		if a.IsValid() {
			out = append(out, a)
		}
	}
	return out
}

// Addrs parses the record's address fields: the one parser of an
// endpoint's addresses. A field holds a host prefix ("10.0.0.5/32"); a
// bare address is accepted as older records may hold one. A field that
// parses to the wrong family counts as absent.
func (ep Endpoint) Addrs() (v4, v6 netip.Addr) {
	if a, ok := ParseEndpointAddr(ep.IPv4); ok && a.Is4() {
		v4 = a
	}
	if a, ok := ParseEndpointAddr(ep.IPv6); ok && a.Is6() {
		v6 = a
	}
	return v4, v6
}

// ParseEndpointAddr parses one address field of an endpoint record.
func ParseEndpointAddr(s string) (netip.Addr, bool) {
	if s == "" {
		return netip.Addr{}, false
	}
	if p, err := netip.ParsePrefix(s); err == nil {
		return p.Addr().Unmap(), true
	}
	if a, err := netip.ParseAddr(s); err == nil {
		return a.Unmap(), true
	}
	return netip.Addr{}, false
}

// ParseEndpoint decodes an endpoint record. The key says which node the
// endpoint is on and its id, whatever the record says: it is what a
// delete must name.
func ParseEndpoint(key string, raw []byte) (*WorkloadEndpoint, error) {
	var w WorkloadEndpoint
	if err := json.Unmarshal(raw, &w.Endpoint); err != nil {
		return nil, fmt.Errorf("decoding endpoint %s: %w", key, err)
	}
	node, id, ok := EndpointNodeAndID(key)
	if !ok {
		return nil, fmt.Errorf("endpoint record %s: not an %s<node>/<id> key", key, EndpointsPrefix)
	}
	w.Node, w.ID = node, id
	// The network and the engine are the same for most of a host's
	// endpoints: the records share one copy of each, for as long as one
	// of them holds its handle.
	w.shared = [2]unique.Handle[string]{unique.Make(w.Network), unique.Make(w.EngineID)}
	w.Network, w.EngineID = w.shared[0].Value(), w.shared[1].Value()
	w.Addr4, w.Addr6 = w.Endpoint.Addrs()
	return &w, nil
}

// ParseNetwork decodes a network record; the key fills in a missing id.
func ParseNetwork(key string, raw []byte) (*Network, error) {
	var n Network
	if err := json.Unmarshal(raw, &n); err != nil {
		return nil, fmt.Errorf("decoding network %s: %w", key, err)
	}
	if n.ID == "" {
		n.ID = strings.TrimPrefix(key, NetworksPrefix)
	}
	return &n, nil
}

// ParseNode decodes a node record; a record without a name is refused
// (nothing can route to it).
func ParseNode(key string, raw []byte) (*Node, error) {
	var n Node
	if err := json.Unmarshal(raw, &n); err != nil {
		return nil, fmt.Errorf("decoding node %s: %w", key, err)
	}
	if n.Name == "" {
		return nil, fmt.Errorf("node record %s has no name", key)
	}
	return &n, nil
}

// ParseBGP decodes a record under BGPPrefix: *BGPConfig or *BGPPeer.
func ParseBGP(key string, raw []byte) (any, error) {
	if key == BGPConfigKey {
		var c BGPConfig
		if err := json.Unmarshal(raw, &c); err != nil {
			return nil, fmt.Errorf("decoding the BGP configuration: %w", err)
		}
		return &c, nil
	}
	if strings.HasPrefix(key, BGPPeersPrefix) {
		var p BGPPeer
		if err := json.Unmarshal(raw, &p); err != nil {
			return nil, fmt.Errorf("decoding BGP peer %s: %w", key, err)
		}
		return &p, nil
	}
	return nil, fmt.Errorf("unknown BGP record %s", key)
}

// ParseFormat decodes the format record.
func ParseFormat(_ string, raw []byte) (any, error) {
	var f Format
	if err := json.Unmarshal(raw, &f); err != nil {
		return nil, fmt.Errorf("decoding %s: %w", FormatKey, err)
	}
	return &f, nil
}

// ParseClusterConfig decodes the cluster-wide settings record.
func ParseClusterConfig(_ string, raw []byte) (any, error) {
	var c ClusterConfig
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, fmt.Errorf("decoding %s: %w", ClusterConfigKey, err)
	}
	return &c, nil
}

// Kinds are the record kinds this package owns, for the syncer.
func Kinds() []Kind {
	return []Kind{
		{Prefix: NetworksPrefix, Decode: func(k string, v []byte) (any, error) { return ParseNetwork(k, v) }},
		{Prefix: EndpointsPrefix, Decode: func(k string, v []byte) (any, error) { return ParseEndpoint(k, v) }},
		{Prefix: NodesPrefix, Decode: func(k string, v []byte) (any, error) { return ParseNode(k, v) }},
		{Prefix: BGPPrefix, Decode: ParseBGP},
		{Prefix: FormatKey, Decode: ParseFormat},
		{Prefix: ClusterConfigKey, Decode: ParseClusterConfig},
	}
}

// Values are the decoded values of records of type T (records that could
// not be decoded are left out).
func Values[T any](recs []*Synced) []*T {
	out := make([]*T, 0, len(recs))
	for _, r := range recs {
		if v, ok := r.Value.(*T); ok {
			out = append(out, v)
		}
	}
	return out
}
