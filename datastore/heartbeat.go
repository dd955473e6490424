package datastore

import (
	"context"
	"time"
)

// NodesSeenPrefix holds one heartbeat record per node, rewritten by its
// daemon every HeartbeatInterval. Unlike the liveness key it outlives the
// daemon: `node list -o wide` tells from it how long a node has been
// unseen, which version it ran and how it reached the others.
const NodesSeenPrefix = "nodes-seen/"

// NodeSeenKey is node's heartbeat record.
func NodeSeenKey(node string) string { return NodesSeenPrefix + node }

// HeartbeatInterval is how often a daemon rewrites its heartbeat: often
// enough that "unseen" means minutes, rarely enough that a large cluster's
// heartbeats stay a trickle of writes.
const HeartbeatInterval = 30 * time.Second

// NodeSeen is a daemon's heartbeat.
type NodeSeen struct {
	Node    string `json:"node"`
	Version string `json:"version"` // the calico-cnm version it runs
	// Format is the datastore format version the daemon reads and writes.
	Format int       `json:"format"`
	Since  time.Time `json:"since"` // when the daemon started
	Seen   time.Time `json:"seen"`  // the last heartbeat
	// Routing is how the daemon reached the other nodes at Seen (nil:
	// its status could not be read).
	Routing *RoutingSummary `json:"routing,omitempty"`
}

// RoutingSummary is a node's BGP sessions and VXLAN reachability, counted.
type RoutingSummary struct {
	BGP         bool `json:"bgp"`
	Peers       int  `json:"peers,omitempty"`
	Established int  `json:"established,omitempty"`
	// VXLAN: a pool uses VXLAN and the node has its VTEP.
	VXLAN bool `json:"vxlan,omitempty"`
	// Unreached are the nodes to which the node has no route of any kind
	// (neither VXLAN, direct nor BGP) while VXLAN is in use.
	Unreached []string `json:"unreached,omitempty"`
}

// PutSeen writes a heartbeat. Unguarded: only the node's daemon writes it.
func (s *Store) PutSeen(ctx context.Context, n NodeSeen) error {
	return s.Txn(ctx, Put(NodeSeenKey(n.Node), MustJSON(n)))
}

// SeenNodes lists the heartbeats, by node name; unreadable ones are
// skipped.
func (s *Store) SeenNodes(ctx context.Context) (map[string]NodeSeen, error) {
	return listByName[NodeSeen](ctx, s, NodesSeenPrefix)
}
