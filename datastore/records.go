package datastore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// GetJSON reads key and decodes it into out, returning its ModRevision.
func (s *Store) GetJSON(ctx context.Context, key string, out any) (int64, error) {
	kv, err := s.Get(ctx, key)
	if err != nil {
		return 0, err
	}
	if err := json.Unmarshal(kv.Value, out); err != nil {
		return 0, fmt.Errorf("decoding %s: %w", key, err)
	}
	return kv.ModRevision, nil
}

// MustJSON encodes records that are plain structs; they cannot fail to
// marshal, so a failure is a programming error worth surfacing loudly.
func MustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("datastore: encoding %T: %v", v, err))
	}
	return b
}

// Key layout. Keys are relative to the store prefix.
const (
	NetworksPrefix  = "networks/"
	EndpointsPrefix = "endpoints/"
	NodesPrefix     = "nodes/"
	// BGPPrefix holds the BGP records (BGPConfigKey, BGPPeersPrefix).
	BGPPrefix      = "bgp/"
	BGPPeersPrefix = BGPPrefix + "peers/"
)

// NetworkKey is the record of one Docker network.
func NetworkKey(networkID string) string { return NetworksPrefix + networkID }

// EndpointKey is the record of one workload endpoint on a node.
func EndpointKey(node, endpointID string) string { return EndpointsPrefix + node + "/" + endpointID }

// NodeKey is the record of one host.
func NodeKey(node string) string { return NodesPrefix + node }

// Network is a Docker network served by the calico driver.
type Network struct {
	ID       string            `json:"id"`
	Name     string            `json:"name,omitempty"`
	Pools    []string          `json:"pools,omitempty"` // the calico pools (CIDRs) its subnets belong to
	Subnets  []string          `json:"subnets,omitempty"`
	Gateways []string          `json:"gateways,omitempty"`
	IPv6     bool              `json:"ipv6,omitempty"`
	Labels   map[string]string `json:"labels,omitempty"`
	Options  map[string]string `json:"options,omitempty"`
}

// Endpoint is one container interface on one node.
type Endpoint struct {
	ID         string `json:"id"`
	Network    string `json:"network"`
	Node       string `json:"node"`
	IPv4       string `json:"ipv4,omitempty"` // CIDR, /32
	IPv6       string `json:"ipv6,omitempty"` // CIDR, /128
	MAC        string `json:"mac"`
	HostIfName string `json:"hostIfName"`
	Container  string `json:"container,omitempty"` // sandbox key, set at Join
	Joined     bool   `json:"joined,omitempty"`
	// EngineID is the Docker engine ID of the host that wrote the record
	// (empty: unknown, or written before engine IDs were recorded).
	EngineID string `json:"engineID,omitempty"`
	// Handles are the IPAM handles holding the endpoint's addresses, as
	// CreateEndpoint found them: releases go by handle, so a stale record
	// can never free an address that was re-assigned since. Empty on
	// records written before handles were recorded.
	Handles []string `json:"handles,omitempty"`

	// Labels are the endpoint's policy labels (the container's
	// org.projectcalico.label.* labels and the implicit ones, see package
	// policy), written at Join before it returns. LabelsUnknown: they
	// could not be learnt; the endpoint then matches no selector.
	Labels        map[string]string `json:"labels,omitempty"`
	LabelsUnknown bool              `json:"labelsUnknown,omitempty"`
	// DriverLabels are the policy labels given as endpoint driver options
	// (docker network connect --driver-opt org.projectcalico.label.k=v),
	// recorded at CreateEndpoint; Join adds them to Labels.
	DriverLabels map[string]string `json:"driverLabels,omitempty"`
	// GatewayIndex numbers the endpoint's gateway among the calico
	// interfaces of its container (set at Join): 1 is 169.254.1.1 and
	// fe80::1, 2 is 169.254.1.2 and fe80::2, ... 0 (a record written
	// before several networks per container existed) means 1.
	GatewayIndex int `json:"gatewayIndex,omitempty"`
	// Routes are the destinations (CIDRs) the container routes through
	// this interface besides its gateway, set at Join: the network's
	// subnets (or pools) that no other calico interface of the same
	// container routes already.
	Routes []string `json:"routes,omitempty"`
	// Ports are the endpoint's published ports (docker run -p), set by
	// ProgramExternalConnectivity and cleared when revoked.
	Ports []PortBinding `json:"ports,omitempty"`
	// BandwidthOptions are the endpoint driver options that set its
	// bandwidth limits (package bandwidth), as CreateEndpoint got them:
	// the limits are rebuilt from them, the labels and the network's
	// options after a restart and whenever one of those changes.
	BandwidthOptions map[string]string `json:"bandwidthOptions,omitempty"`
}

// OfOtherEngine tells whether the record was written by another Docker
// engine than engineID, both being known: a host that shares this node
// name (a clone) wrote it, so this host must neither remove it nor act on
// it.
func (ep Endpoint) OfOtherEngine(engineID string) bool {
	return ep.EngineID != "" && engineID != "" && ep.EngineID != engineID
}

// PortBinding is one published port of an endpoint: traffic to
// HostIP:HostPort (any of this host's addresses when HostIP is empty) is
// forwarded to the endpoint's address at Port.
type PortBinding struct {
	Proto    string `json:"proto"` // "tcp" or "udp"
	HostIP   string `json:"hostIP,omitempty"`
	HostPort int    `json:"hostPort"`
	Port     int    `json:"port"`
}

// Node is one host running the daemon.
type Node struct {
	Name string `json:"name"`
	IPv4 string `json:"ipv4,omitempty"` // BGP address
	// IPv6 is the next hop of this node's IPv6 routes (advertised over the
	// IPv4 session); empty: the node routes no IPv6.
	IPv6           string `json:"ipv6,omitempty"`
	ASN            uint32 `json:"asn,omitempty"`
	RouteReflector bool   `json:"routeReflector,omitempty"`
	ClusterID      string `json:"clusterID,omitempty"`
	// VXLANTunnelAddr and VXLANTunnelMAC are the node's VTEP (its address
	// on vxlan.calico, from one of its own blocks, and the device's MAC);
	// empty while no pool uses VXLAN.
	VXLANTunnelAddr string `json:"vxlanTunnelAddr,omitempty"`
	VXLANTunnelMAC  string `json:"vxlanTunnelMAC,omitempty"`
	// WireGuardPublicKey (base64), WireGuardAddr and WireGuardPort are
	// where and with which key the node's WireGuard device takes
	// encrypted traffic; empty while WireGuard is off. The private key
	// never leaves the node's state directory.
	WireGuardPublicKey string `json:"wireguardPublicKey,omitempty"`
	WireGuardAddr      string `json:"wireguardAddr,omitempty"`
	WireGuardPort      int    `json:"wireguardPort,omitempty"`
	// WireGuardInterfaceAddr is the node's address on wireguard.cali (from
	// one of its blocks): the source of its own packets to other nodes'
	// workloads, so that they pass the peers' allowed IPs.
	WireGuardInterfaceAddr string `json:"wireguardInterfaceAddr,omitempty"`
}

// EndpointNodeAndID splits an endpoint key into node and endpoint id.
func EndpointNodeAndID(key string) (node, id string, ok bool) {
	rest, found := strings.CutPrefix(key, EndpointsPrefix)
	if !found {
		return "", "", false
	}
	node, id, ok = strings.Cut(rest, "/")
	return node, id, ok && node != "" && id != ""
}

// BGP records (routing/ and the `bgp` CLI). Additive: older daemons ignore them.

// BGPConfigKey holds the cluster-wide BGP settings (BGPConfig).
const BGPConfigKey = BGPPrefix + "config"

// BGPPeerKey is the record of one explicit BGP peer (a ToR router, an
// external reflector).
func BGPPeerKey(name string) string { return BGPPeersPrefix + name }

// BGPConfig is the cluster-wide BGP configuration. Zero values mean the
// defaults (ASN 64512, node-to-node mesh on).
type BGPConfig struct {
	ASN uint32 `json:"asn,omitempty"`
	// NodeToNodeMesh nil means on: every node peers with every other node.
	// Off, nodes peer only with route reflectors and explicit peers.
	NodeToNodeMesh *bool `json:"nodeToNodeMesh,omitempty"`
}

// MeshEnabled applies the default (on) to an unset NodeToNodeMesh.
func (c BGPConfig) MeshEnabled() bool { return c.NodeToNodeMesh == nil || *c.NodeToNodeMesh }

// BGPPeer is an explicit BGP peer: global (Node "") or of one node only.
type BGPPeer struct {
	Name   string `json:"name"`
	PeerIP string `json:"peerIP"`
	ASN    uint32 `json:"asn"`
	Node   string `json:"node,omitempty"` // "" = every node
	// Password is the TCP MD5 (RFC 2385) key. It is stored in the datastore,
	// so protect etcd access accordingly; the CLI never prints it.
	Password string `json:"password,omitempty"`
	// PasswordSecret names a file in each node's BGP secrets directory
	// (--bgp-secrets-dir) holding the key instead: the key itself never
	// enters the datastore.
	PasswordSecret string `json:"passwordSecret,omitempty"`
}

// DeleteExisting deletes key guarded by the revision it was read at,
// retrying on conflicts; found is false when there was nothing to delete
// (deletes are idempotent because Docker retries them).
func (s *Store) DeleteExisting(ctx context.Context, key string) (found bool, err error) {
	err = s.Retry(ctx, func(ctx context.Context) error {
		kv, err := s.Get(ctx, key)
		if errors.Is(err, ErrNotFound) {
			found = false
			return nil
		}
		if err != nil {
			return err
		}
		found = true
		return s.Txn(ctx, Delete(key, kv.ModRevision))
	})
	return found, err
}
