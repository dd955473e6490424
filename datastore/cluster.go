package datastore

// ClusterConfigKey holds the cluster-wide settings every daemon follows at
// once (ClusterConfig), written by `calico-cnm cluster set`.
const ClusterConfigKey = "cluster/config"

// ClusterConfig is the cluster-wide configuration. Zero values mean the
// defaults (WireGuard off). Additive: older daemons ignore it.
type ClusterConfig struct {
	// WireGuard encrypts container traffic between hosts.
	WireGuard bool `json:"wireguard,omitempty"`
	// WireGuardMode is "required" ("" means required: no clear text to a
	// node without a valid key) or "preferred" (clear text to such nodes).
	WireGuardMode string `json:"wireguardMode,omitempty"`
	// WireGuardPort is the UDP port every node listens on (0: 51820).
	WireGuardPort int `json:"wireguardPort,omitempty"`
}
