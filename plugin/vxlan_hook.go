package plugin

import (
	"context"
	"fmt"
	"path/filepath"

	"github.com/sirupsen/logrus"

	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/ipam"
	"github.com/calico-cnm/calico-cnm/routing"
)

// vxlanRunner is the VXLAN manager with its netlink handle, made early (the
// network driver asks it for MTUs) and started with startVXLAN.
type vxlanRunner struct {
	mgr    *routing.VXLANManager
	kernel *routing.NetlinkVXLAN
	bgp    routing.Config
}

// newVXLAN makes the VXLAN manager: it follows the pools, and while one of
// them uses VXLAN it keeps vxlan.calico and the routes to the other hosts'
// blocks, with or without BGP.
func newVXLAN(cfg Config, store *datastore.Store, engine *ipam.Engine, log logrus.FieldLogger) (*vxlanRunner, error) {
	rc := cfg.BGP
	if err := rc.Finish(); err != nil {
		return nil, err
	}
	kernel, err := routing.NewNetlinkVXLAN()
	if err != nil {
		return nil, fmt.Errorf("opening netlink for VXLAN: %w", err)
	}
	mgr, err := routing.NewVXLANManager(routing.VXLANDeps{
		Store: store, Blocks: engine, Kernel: kernel, NodeName: cfg.NodeName,
		Config: rc, Log: log, ResyncInterval: cfg.ResyncInterval,
	})
	if err != nil {
		kernel.Close()
		return nil, err
	}
	return &vxlanRunner{mgr: mgr, kernel: kernel, bgp: rc}, nil
}

// startVXLAN runs the manager until the returned stop is called. Like
// startRouting it only spawns. Without BGP it also serves `node status`
// (the BGP agent does otherwise, VXLAN included).
func startVXLAN(ctx context.Context, cfg Config, v *vxlanRunner, log logrus.FieldLogger) func() {
	mgr, kernel, rc := v.mgr, v.kernel, v.bgp
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{}, 2)
	go func() {
		defer func() { done <- struct{}{} }()
		if err := mgr.Run(ctx); err != nil {
			log.WithError(err).Error("VXLAN stopped")
		}
	}()
	waits := 1
	if !rc.Enabled {
		waits++
		path := rc.StatusSocket
		if path == "" {
			path = filepath.Join(cfg.StateDir, routing.StatusSocketName)
		}
		go func() {
			defer func() { done <- struct{}{} }()
			if err := routing.ServeVXLANStatus(ctx, path, cfg.NodeName, mgr, log); err != nil {
				log.WithError(err).Warn("status socket failed; `node status` will not work")
			}
		}()
	}
	return func() {
		cancel()
		for range waits {
			<-done
		}
		// The device and routes stay: containers keep talking while the
		// daemon restarts, and the next start diffs against them.
		kernel.Close()
	}
}
