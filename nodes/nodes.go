// Package nodes lists the hosts of a calico-cnm cluster and removes the
// datastore state of a host that is gone for good (`calico-cnm node list`,
// `calico-cnm node delete`).
package nodes

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/ipam"
)

// Errors callers test with errors.Is.
var (
	ErrUnknownNode = errors.New("node is not known to the datastore")
	ErrNodeAlive   = errors.New("node is running")
)

// Info is one node as `node list` shows it.
type Info struct {
	Name       string
	BGPAddress string `json:",omitempty"`
	// IPv6NextHop is where the node's IPv6 routes point ("" = none).
	IPv6NextHop string `json:",omitempty"`
	ASN         uint32 `json:",omitempty"`
	// Alive: the node's daemon holds its liveness lease.
	Alive      bool
	AliveSince *time.Time `json:",omitempty"`
	Blocks     int        // blocks affine to the node
	Addresses  int        // addresses its workloads hold (wherever the block)
	Endpoints  int        // endpoint records
	// VTEP and VTEPMAC are its VXLAN tunnel endpoint ("" = none).
	VTEP    string `json:",omitempty"`
	VTEPMAC string `json:",omitempty"`
	// Routes says how the local daemon reaches the node's workloads
	// (vxlan, direct, bgp; "" when the local daemon could not be asked).
	Routes string `json:",omitempty"`

	// From the node's heartbeat (absent for a node whose daemon never
	// sent one): its version, when it was last seen, and how it reached
	// the others then.
	Version  string                    `json:",omitempty"`
	LastSeen *time.Time                `json:",omitempty"`
	Routing  *datastore.RoutingSummary `json:",omitempty"`
	// Problems are what `node list -o wide` flags (see Diagnose).
	Problems []string `json:",omitempty"`
}

// state is everything the datastore says about nodes, read once.
type state struct {
	records   map[string]datastore.Node
	alive     map[string]datastore.Alive
	seen      map[string]datastore.NodeSeen
	endpoints map[string][]string // node -> endpoint keys
	allocs    []ipam.Allocation
	blocks    map[string]int // node -> affine blocks
	peers     []datastore.KV // BGP peer records
}

func read(ctx context.Context, store *datastore.Store, engine *ipam.Engine) (*state, error) {
	st := &state{records: map[string]datastore.Node{}, endpoints: map[string][]string{}, blocks: map[string]int{}}
	nodeKVs, err := store.List(ctx, datastore.NodesPrefix)
	if err != nil {
		return nil, fmt.Errorf("listing nodes: %w", err)
	}
	for _, kv := range nodeKVs {
		var n datastore.Node
		if json.Unmarshal(kv.Value, &n) == nil {
			st.records[strings.TrimPrefix(kv.Key, datastore.NodesPrefix)] = n
		}
	}
	if st.alive, err = store.AliveNodes(ctx); err != nil {
		return nil, fmt.Errorf("listing live nodes: %w", err)
	}
	if st.seen, err = store.SeenNodes(ctx); err != nil {
		return nil, fmt.Errorf("listing heartbeats: %w", err)
	}
	epKVs, err := store.List(ctx, datastore.EndpointsPrefix)
	if err != nil {
		return nil, fmt.Errorf("listing endpoints: %w", err)
	}
	for _, kv := range epKVs {
		if node, _, ok := datastore.EndpointNodeAndID(kv.Key); ok {
			st.endpoints[node] = append(st.endpoints[node], kv.Key)
		}
	}
	if st.allocs, err = engine.Allocations(ctx); err != nil {
		return nil, fmt.Errorf("listing addresses: %w", err)
	}
	usage, err := engine.Usage(ctx)
	if err != nil {
		return nil, fmt.Errorf("listing blocks: %w", err)
	}
	for _, u := range usage {
		if u.Host != "" {
			st.blocks[u.Host]++
		}
	}
	if st.peers, err = store.List(ctx, datastore.BGPPeersPrefix); err != nil {
		return nil, fmt.Errorf("listing BGP peers: %w", err)
	}
	return st, nil
}

// ownAllocations are the addresses node's workloads hold, swarm task
// addresses excepted: the swarm manager owns those, whichever node's
// daemon recorded them.
func (st *state) ownAllocations(node string) []ipam.Allocation {
	var out []ipam.Allocation
	for _, a := range st.allocs {
		if a.Attrs[ipam.AttrNode] == node && !ipam.IsSwarm(a.Attrs) {
			out = append(out, a)
		}
	}
	return out
}

func (st *state) names() []string {
	set := map[string]bool{}
	for n := range st.records {
		set[n] = true
	}
	for n := range st.alive {
		set[n] = true
	}
	for n := range st.seen {
		set[n] = true
	}
	for n := range st.endpoints {
		set[n] = true
	}
	for n := range st.blocks {
		set[n] = true
	}
	for _, a := range st.allocs {
		if n := a.Attrs[ipam.AttrNode]; n != "" {
			set[n] = true
		}
	}
	out := make([]string, 0, len(set))
	for n := range set {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

func (st *state) info(name string) Info {
	in := Info{Name: name, Blocks: st.blocks[name], Addresses: len(st.ownAllocations(name)), Endpoints: len(st.endpoints[name])}
	if r, ok := st.records[name]; ok {
		in.BGPAddress, in.IPv6NextHop, in.ASN = r.IPv4, r.IPv6, r.ASN
		in.VTEP, in.VTEPMAC = r.VXLANTunnelAddr, r.VXLANTunnelMAC
	}
	if a, ok := st.alive[name]; ok {
		in.Alive = true
		since := a.Since
		in.AliveSince = &since
	}
	if h, ok := st.seen[name]; ok {
		seen := h.Seen
		in.Version, in.LastSeen, in.Routing = h.Version, &seen, h.Routing
	}
	return in
}

// List returns every node the datastore knows of (a node record, a
// liveness key, blocks, endpoints or addresses), by name.
func List(ctx context.Context, store *datastore.Store, engine *ipam.Engine) ([]Info, error) {
	st, err := read(ctx, store, engine)
	if err != nil {
		return nil, err
	}
	var out []Info
	for _, n := range st.names() {
		out = append(out, st.info(n))
	}
	return out, nil
}

// DeleteReport is what Delete removed.
type DeleteReport struct {
	Node       string
	NodeRecord bool     // the node record (its BGP identity) was removed
	Endpoints  int      // endpoint records removed
	Addresses  []string // addresses released
	Blocks     ipam.HostBlocks
	BGPPeers   []string // BGP peers configured for this node only, removed
}

// Delete removes a node that is gone for good: its endpoint records, the
// addresses its workloads held, its blocks (given back to the pool, or
// kept without affinity while other hosts' workloads still borrow from
// them), its node-scoped BGP peers and its node record, so the other nodes
// stop peering with it. A node whose daemon is running is refused unless
// force: that daemon would keep using what is removed under it.
func Delete(ctx context.Context, store *datastore.Store, engine *ipam.Engine, name string, force bool, log logrus.FieldLogger) (DeleteReport, error) {
	rep := DeleteReport{Node: name}
	st, err := read(ctx, store, engine)
	if err != nil {
		return rep, err
	}
	if !slices.Contains(st.names(), name) {
		return rep, fmt.Errorf("%w: %q (see `calico-cnm node list`)", ErrUnknownNode, name)
	}
	if a, alive := st.alive[name]; alive && !force {
		return rep, fmt.Errorf("%w: node %s's daemon (pid %d on %s, up since %s) holds its liveness lease; stop it first (or pass --force if that host is gone and the lease has not expired yet)",
			ErrNodeAlive, name, a.PID, a.Hostname, a.Since.Format(time.RFC3339))
	}
	log = log.WithField("node", name)

	for _, key := range st.endpoints[name] {
		found, err := store.DeleteExisting(ctx, key)
		if err != nil {
			return rep, fmt.Errorf("removing endpoint record %s: %w", key, err)
		}
		if found {
			rep.Endpoints++
		}
	}
	for _, a := range st.ownAllocations(name) {
		// By handle: the address may have been freed and re-assigned to
		// another host since the snapshot; its handle has not.
		if err := engine.ReleaseByHandle(ctx, a.HandleID); err != nil {
			return rep, fmt.Errorf("releasing %s: %w", a.IP, err)
		}
		rep.Addresses = append(rep.Addresses, a.IP.String())
		log.WithFields(logrus.Fields{"ip": a.IP.String(), "block": a.Block}).Info("released an address of a deleted node")
	}
	// The VTEP address has no endpoint: it goes by its handle, before the
	// blocks, so that its block is not kept for it.
	if err := engine.ReleaseTunnelAddress(ctx, name); err != nil {
		return rep, fmt.Errorf("releasing the VXLAN tunnel address: %w", err)
	}
	if rep.Blocks, err = engine.ReleaseHostBlocks(ctx, name); err != nil {
		return rep, err
	}
	for _, kv := range st.peers {
		var p datastore.BGPPeer
		if json.Unmarshal(kv.Value, &p) != nil || p.Node != name {
			continue
		}
		if _, err := store.DeleteExisting(ctx, kv.Key); err != nil {
			return rep, fmt.Errorf("removing BGP peer %s: %w", p.Name, err)
		}
		rep.BGPPeers = append(rep.BGPPeers, p.Name)
	}
	if rep.NodeRecord, err = store.DeleteExisting(ctx, datastore.NodeKey(name)); err != nil {
		return rep, fmt.Errorf("removing the node record: %w", err)
	}
	if _, err := store.DeleteExisting(ctx, datastore.NodeSeenKey(name)); err != nil {
		return rep, fmt.Errorf("removing the heartbeat record: %w", err)
	}
	// A restore holding new addresses back until this node reconciles
	// would wait for it in vain.
	if f, rev, err := store.ReadFormat(ctx); err != nil {
		return rep, fmt.Errorf("reading the format record: %w", err)
	} else if err := store.ReleaseRestoreHold(ctx, name, f, rev); err != nil {
		return rep, fmt.Errorf("taking the node off the restore's hold: %w", err)
	}
	if force {
		if _, err := store.DeleteExisting(ctx, datastore.NodeAliveKey(name)); err != nil {
			return rep, fmt.Errorf("removing the liveness key: %w", err)
		}
	}
	log.WithFields(logrus.Fields{"endpoints": rep.Endpoints, "addresses": len(rep.Addresses),
		"blocksReleased": len(rep.Blocks.Released), "blocksOrphaned": len(rep.Blocks.Orphaned)}).Info("node deleted")
	return rep, nil
}
