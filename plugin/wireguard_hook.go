package plugin

import (
	"context"
	"fmt"
	"path/filepath"

	"github.com/sirupsen/logrus"

	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/ipam"
	"github.com/calico-cnm/calico-cnm/wireguard"
)

// wgRunner is the WireGuard manager with its netlink handle, made early
// (the network driver asks it for MTUs) and started with startWireGuard.
type wgRunner struct {
	mgr    *wireguard.Manager
	kernel *wireguard.Netlink
}

// newWireGuard makes the WireGuard manager: it follows the cluster
// setting (`calico-cnm cluster set --wireguard on`), and while it is on
// keeps wireguard.cali, its peers and their routes.
func newWireGuard(cfg Config, store *datastore.Store, records datastore.Records, engine *ipam.Engine, log logrus.FieldLogger) (*wgRunner, error) {
	rc := cfg.BGP
	if err := rc.Finish(); err != nil {
		return nil, err
	}
	kernel, err := wireguard.NewNetlink()
	if err != nil {
		return nil, fmt.Errorf("opening netlink for WireGuard: %w", err)
	}
	mgr, err := wireguard.NewManager(wireguard.Deps{
		Store: store, Records: records, Blocks: engine, Kernel: kernel, NodeName: cfg.NodeName, StateDir: cfg.StateDir,
		NodeIP: rc.NodeIP, AutodetectMethod: rc.AutodetectMethod, Log: log, ResyncInterval: cfg.ResyncInterval,
	})
	if err != nil {
		kernel.Close()
		return nil, err
	}
	return &wgRunner{mgr: mgr, kernel: kernel}, nil
}

// startWireGuard runs the manager and serves <state-dir>/wireguard.sock
// (`node status`, `node rotate-key`) under sup, the socket as an optional
// service; the returned function releases the device (left in place) and
// the netlink handle once sup has stopped.
func startWireGuard(sup *supervisor, cfg Config, w *wgRunner) (release func()) {
	sup.Service("WireGuard", w.mgr.Run)
	sup.Optional("WireGuard socket", func(ctx context.Context) error {
		return w.mgr.Serve(ctx, filepath.Join(cfg.StateDir, wireguard.SocketName))
	})
	return func() {
		// The device, its routes and the rule stay: containers keep
		// their tunnels while the daemon restarts.
		w.mgr.Release()
		w.kernel.Close()
	}
}
