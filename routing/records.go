package routing

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"github.com/calico-cnm/calico-cnm/datastore"
)

// The BGP records the operator manages (peers, the cluster settings, each
// node's AS and reflector role): what may be written and how. The agent
// reads the same records (agent.go).

var (
	// ErrInvalid: a record or setting is malformed; nothing was written.
	ErrInvalid = errors.New("invalid BGP setting")
	// ErrPeerExists: a peer of that name exists already.
	ErrPeerExists = errors.New("BGP peer already exists")
	// ErrPeerNotFound: no peer of that name.
	ErrPeerNotFound = errors.New("no such BGP peer")
)

func invalidf(format string, a ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, a...))
}

// ValidateName checks a record name used in a datastore key (a peer, a
// node, a secret file).
func ValidateName(kind, name string) error {
	if name == "" || strings.ContainsAny(name, "/ \t\n") {
		return invalidf("%s name %q: use letters, digits, '-', '.' or '_' (no '/' or spaces)", kind, name)
	}
	if kind == "secret" && (name == "." || name == "..") {
		return invalidf("secret name %q: name a file in the secrets directory", name)
	}
	return nil
}

// ValidatePeer checks a peer record before it is written.
func ValidatePeer(p datastore.BGPPeer) error {
	if err := ValidateName("peer", p.Name); err != nil {
		return err
	}
	if a, err := netip.ParseAddr(p.PeerIP); err != nil || !a.Is4() {
		return invalidf("peer %s: %q is not an IPv4 address", p.Name, p.PeerIP)
	}
	if p.ASN == 0 {
		return invalidf("peer %s has no AS number", p.Name)
	}
	if p.Node != "" {
		if err := ValidateName("node", p.Node); err != nil {
			return err
		}
	}
	if p.Password != "" && p.PasswordSecret != "" {
		return invalidf("peer %s: a password or a secret reference, not both", p.Name)
	}
	if len(p.Password) > MaxPasswordLen {
		return invalidf("the password is longer than %d characters, the TCP MD5 limit", MaxPasswordLen)
	}
	if p.PasswordSecret != "" {
		return ValidateName("secret", p.PasswordSecret)
	}
	return nil
}

// AddPeer creates a peer record; ErrPeerExists when the name is taken
// (delete it first to change it: the daemons re-peer on the change).
func AddPeer(ctx context.Context, store *datastore.Store, p datastore.BGPPeer) error {
	if err := ValidatePeer(p); err != nil {
		return err
	}
	err := store.Txn(ctx, datastore.Create(datastore.BGPPeerKey(p.Name), datastore.MustJSON(p)))
	if errors.Is(err, datastore.ErrConflict) {
		return fmt.Errorf("%w: %s (delete it first to change it)", ErrPeerExists, p.Name)
	}
	return err
}

// DeletePeer removes a peer record; ErrPeerNotFound when there is none.
func DeletePeer(ctx context.Context, store *datastore.Store, name string) error {
	if err := ValidateName("peer", name); err != nil {
		return err
	}
	found, err := store.DeleteExisting(ctx, datastore.BGPPeerKey(name))
	if err != nil {
		return err
	}
	if !found {
		return fmt.Errorf("%w: %s", ErrPeerNotFound, name)
	}
	return nil
}

// PeerInfo is a peer as listed: the password is never shown, only whether
// there is one.
type PeerInfo struct {
	Name     string `json:"name"`
	PeerIP   string `json:"peerIP"`
	ASN      uint32 `json:"asn"`
	Node     string `json:"node,omitempty"`
	Password bool   `json:"password"`
	// PasswordSecret is the secret's name (never its content).
	PasswordSecret string `json:"passwordSecret,omitempty"`
}

// ListPeers returns every peer record, passwords left out.
func ListPeers(ctx context.Context, store *datastore.Store) ([]PeerInfo, error) {
	kvs, err := store.List(ctx, datastore.BGPPeersPrefix)
	if err != nil {
		return nil, err
	}
	out := []PeerInfo{}
	for _, kv := range kvs {
		var p datastore.BGPPeer
		if json.Unmarshal(kv.Value, &p) != nil {
			continue
		}
		out = append(out, PeerInfo{Name: p.Name, PeerIP: p.PeerIP, ASN: p.ASN, Node: p.Node,
			Password: p.Password != "" || p.PasswordSecret != "", PasswordSecret: p.PasswordSecret})
	}
	return out, nil
}

// ClusterChange changes the cluster-wide settings; zero/nil fields stay.
type ClusterChange struct {
	ASN  uint32
	Mesh *bool
}

// NodeChange changes one node's BGP identity; zero/nil fields stay.
type NodeChange struct {
	ASN            uint32
	RouteReflector *bool
	ClusterID      string // an IPv4 address
}

// SetClusterConfig applies c to the cluster settings record, guarded by
// the revision it was read at.
func SetClusterConfig(ctx context.Context, store *datastore.Store, c ClusterChange) error {
	return store.Retry(ctx, func(ctx context.Context) error {
		var cfg datastore.BGPConfig
		rev, err := store.GetJSON(ctx, datastore.BGPConfigKey, &cfg)
		if err != nil && !errors.Is(err, datastore.ErrNotFound) {
			return err
		}
		if c.ASN != 0 {
			cfg.ASN = c.ASN
		}
		if c.Mesh != nil {
			cfg.NodeToNodeMesh = c.Mesh
		}
		return store.Txn(ctx, datastore.Write(datastore.BGPConfigKey, datastore.MustJSON(cfg), rev))
	})
}

// SetNodeConfig applies c to node's record, guarded by the revision it was
// read at. A node that has not started yet gets its record now; its daemon
// keeps these settings when it registers.
func SetNodeConfig(ctx context.Context, store *datastore.Store, node string, c NodeChange) error {
	if err := ValidateName("node", node); err != nil {
		return err
	}
	if c.ClusterID != "" {
		if a, err := netip.ParseAddr(c.ClusterID); err != nil || !a.Is4() {
			return invalidf("cluster id %q: use an IPv4 address, e.g. 1.0.0.1", c.ClusterID)
		}
	}
	return store.Retry(ctx, func(ctx context.Context) error {
		var n datastore.Node
		rev, err := store.GetJSON(ctx, datastore.NodeKey(node), &n)
		if err != nil && !errors.Is(err, datastore.ErrNotFound) {
			return err
		}
		n.Name = node
		if c.ASN != 0 {
			n.ASN = c.ASN
		}
		if c.RouteReflector != nil {
			n.RouteReflector = *c.RouteReflector
		}
		if c.ClusterID != "" {
			n.ClusterID = c.ClusterID
		}
		return store.Txn(ctx, datastore.Write(datastore.NodeKey(node), datastore.MustJSON(n), rev))
	})
}

// ConfigView is the effective BGP configuration: the cluster settings with
// their defaults applied, and each node's effective AS and role.
type ConfigView struct {
	ASN            uint32     `json:"asn"`
	NodeToNodeMesh bool       `json:"nodeToNodeMesh"`
	Nodes          []NodeView `json:"nodes"`
}

// NodeView is one node in a ConfigView.
type NodeView struct {
	Name           string `json:"name"`
	IPv4           string `json:"ipv4,omitempty"`
	ASN            uint32 `json:"asn"` // effective
	RouteReflector bool   `json:"routeReflector"`
	ClusterID      string `json:"clusterID,omitempty"`
}

// GetConfig reads the effective BGP configuration.
func GetConfig(ctx context.Context, store *datastore.Store) (ConfigView, error) {
	var cfg datastore.BGPConfig
	if _, err := store.GetJSON(ctx, datastore.BGPConfigKey, &cfg); err != nil && !errors.Is(err, datastore.ErrNotFound) {
		return ConfigView{}, err
	}
	view := ConfigView{ASN: EffectiveASN(datastore.Node{}, cfg), NodeToNodeMesh: cfg.MeshEnabled(), Nodes: []NodeView{}}
	kvs, err := store.List(ctx, datastore.NodesPrefix)
	if err != nil {
		return ConfigView{}, err
	}
	for _, kv := range kvs {
		var n datastore.Node
		if json.Unmarshal(kv.Value, &n) != nil {
			continue
		}
		view.Nodes = append(view.Nodes, NodeView{Name: n.Name, IPv4: n.IPv4, ASN: EffectiveASN(n, cfg), RouteReflector: n.RouteReflector, ClusterID: n.ClusterID})
	}
	return view, nil
}
