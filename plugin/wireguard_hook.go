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
func newWireGuard(cfg Config, store *datastore.Store, engine *ipam.Engine, log logrus.FieldLogger) (*wgRunner, error) {
	rc := cfg.BGP
	if err := rc.Finish(); err != nil {
		return nil, err
	}
	kernel, err := wireguard.NewNetlink()
	if err != nil {
		return nil, fmt.Errorf("opening netlink for WireGuard: %w", err)
	}
	mgr, err := wireguard.NewManager(wireguard.Deps{
		Store: store, Blocks: engine, Kernel: kernel, NodeName: cfg.NodeName, StateDir: cfg.StateDir,
		NodeIP: rc.NodeIP, AutodetectMethod: rc.AutodetectMethod, Log: log, ResyncInterval: cfg.ResyncInterval,
	})
	if err != nil {
		kernel.Close()
		return nil, err
	}
	return &wgRunner{mgr: mgr, kernel: kernel}, nil
}

// startWireGuard runs the manager and serves <state-dir>/wireguard.sock
// (`node status`, `node rotate-key`) until the returned stop is called.
func startWireGuard(ctx context.Context, cfg Config, w *wgRunner, log logrus.FieldLogger) func() {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{}, 2)
	go func() {
		defer func() { done <- struct{}{} }()
		if err := w.mgr.Run(ctx); err != nil {
			log.WithError(err).Error("WireGuard stopped")
		}
	}()
	go func() {
		defer func() { done <- struct{}{} }()
		path := filepath.Join(cfg.StateDir, wireguard.SocketName)
		if err := w.mgr.Serve(ctx, path); err != nil {
			log.WithError(err).Warn("WireGuard socket failed; `node status` shows no WireGuard and `node rotate-key` will not work")
		}
	}()
	return func() {
		cancel()
		<-done
		<-done
		// The device, its routes and the rule stay: containers keep
		// their tunnels while the daemon restarts.
		if err := w.mgr.Release(); err != nil {
			log.WithError(err).Warn("WireGuard: releasing the device")
		}
		w.kernel.Close()
	}
}
