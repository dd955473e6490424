package plugin

import (
	"context"
	"fmt"
	"path/filepath"

	"github.com/sirupsen/logrus"

	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/ipam"
	"github.com/calico-cnm/calico-cnm/routing"
	"github.com/calico-cnm/calico-cnm/vxlan"
	"github.com/calico-cnm/calico-cnm/wireguard"
)

// tunnel is one of the managers that carry workload traffic between hosts
// (VXLAN, WireGuard), made early because the network driver asks it for
// MTUs, and started by start once the plugin APIs are served.
type tunnel[M any] struct {
	name string
	mgr  M
	run  func(ctx context.Context) error
	// socket, when set, serves the manager's socket: an optional service,
	// as the daemon does its work without it.
	socketName string
	socket     func(ctx context.Context) error
	// release frees what the manager holds, once the supervisor stopped.
	release func()
}

// start runs the manager (and its socket) under sup and returns what
// releases its resources after sup has stopped. Like startRouting it only
// spawns.
func (t *tunnel[M]) start(sup *supervisor) (release func()) {
	sup.Service(t.name, t.run)
	if t.socket != nil {
		sup.Optional(t.socketName, t.socket)
	}
	return t.release
}

// openTunnel makes a tunnel manager: the node's address settings (they
// come with the BGP settings, as Calico's node resource has them), its
// netlink handle from open, then the manager from build; the handle is
// closed again when build fails.
func openTunnel[K interface{ Close() }, M any](cfg Config, name string, open func() (K, error), build func(node routing.Config, kernel K) (M, error)) (node routing.Config, kernel K, mgr M, err error) {
	node = cfg.BGP
	if err = node.Finish(); err != nil {
		return node, kernel, mgr, err
	}
	if kernel, err = open(); err != nil {
		return node, kernel, mgr, fmt.Errorf("opening netlink for %s: %w", name, err)
	}
	if mgr, err = build(node, kernel); err != nil {
		kernel.Close()
	}
	return node, kernel, mgr, err
}

// newVXLAN makes the VXLAN manager: it follows the pools, and while one of
// them uses VXLAN it keeps vxlan.calico and the routes to the other hosts'
// blocks, with or without BGP. Without BGP it also serves `node status`
// (the BGP agent does otherwise, VXLAN included).
func newVXLAN(cfg Config, store *datastore.Store, records datastore.Records, engine *ipam.Engine, log logrus.FieldLogger) (*tunnel[*vxlan.Manager], error) {
	node, kernel, mgr, err := openTunnel(cfg, "VXLAN", vxlan.NewNetlink, func(node routing.Config, kernel *vxlan.Netlink) (*vxlan.Manager, error) {
		return vxlan.NewManager(vxlan.Deps{
			Store: store, Records: records, Blocks: engine, Kernel: kernel, NodeName: cfg.NodeName,
			Config: vxlan.Config{NodeIP: node.NodeIP, AutodetectMethod: node.AutodetectMethod, BGP: node.Enabled},
			Log:    log, ResyncInterval: cfg.ResyncInterval,
		})
	})
	if err != nil {
		return nil, err
	}
	t := &tunnel[*vxlan.Manager]{name: "VXLAN", mgr: mgr, run: mgr.Run, release: kernel.Close}
	if !node.Enabled {
		path := node.StatusSocket
		if path == "" {
			path = filepath.Join(cfg.StateDir, routing.StatusSocketName)
		}
		t.socketName = "VXLAN status socket"
		t.socket = func(ctx context.Context) error {
			return routing.ServeVXLANStatus(ctx, path, cfg.NodeName, mgr, log)
		}
	}
	return t, nil
}

// newWireGuard makes the WireGuard manager: it follows the cluster
// setting (`calico-cnm cluster set --wireguard on`), and while it is on
// keeps wireguard.cali, its peers and their routes. It serves
// <state-dir>/wireguard.sock (`node status`, `node rotate-key`).
func newWireGuard(cfg Config, store *datastore.Store, records datastore.Records, engine *ipam.Engine, log logrus.FieldLogger) (*tunnel[*wireguard.Manager], error) {
	_, kernel, mgr, err := openTunnel(cfg, "WireGuard", wireguard.NewNetlink, func(node routing.Config, kernel *wireguard.Netlink) (*wireguard.Manager, error) {
		return wireguard.NewManager(wireguard.Deps{
			Store: store, Records: records, Blocks: engine, Kernel: kernel, NodeName: cfg.NodeName, StateDir: cfg.StateDir,
			NodeIP: node.NodeIP, AutodetectMethod: node.AutodetectMethod, Log: log, ResyncInterval: cfg.ResyncInterval,
		})
	})
	if err != nil {
		return nil, err
	}
	return &tunnel[*wireguard.Manager]{
		name: "WireGuard", mgr: mgr, run: mgr.Run,
		socketName: "WireGuard socket",
		socket: func(ctx context.Context) error {
			return mgr.Serve(ctx, filepath.Join(cfg.StateDir, wireguard.SocketName))
		},
		release: func() {
			// The device, its routes and the rule stay: containers keep
			// their tunnels while the daemon restarts.
			mgr.Release()
			kernel.Close()
		},
	}, nil
}
