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
)

// vxlanRunner is the VXLAN manager with its netlink handle, made early (the
// network driver asks it for MTUs) and started with startVXLAN.
type vxlanRunner struct {
	mgr    *vxlan.Manager
	kernel *vxlan.Netlink
	bgp    routing.Config
}

// newVXLAN makes the VXLAN manager: it follows the pools, and while one of
// them uses VXLAN it keeps vxlan.calico and the routes to the other hosts'
// blocks, with or without BGP.
func newVXLAN(cfg Config, store *datastore.Store, records datastore.Records, engine *ipam.Engine, log logrus.FieldLogger) (*vxlanRunner, error) {
	rc := cfg.BGP
	if err := rc.Finish(); err != nil {
		return nil, err
	}
	kernel, err := vxlan.NewNetlink()
	if err != nil {
		return nil, fmt.Errorf("opening netlink for VXLAN: %w", err)
	}
	mgr, err := vxlan.NewManager(vxlan.Deps{
		Store: store, Records: records, Blocks: engine, Kernel: kernel, NodeName: cfg.NodeName,
		Config: vxlan.Config{NodeIP: rc.NodeIP, AutodetectMethod: rc.AutodetectMethod, BGP: rc.Enabled},
		Log:    log, ResyncInterval: cfg.ResyncInterval,
	})
	if err != nil {
		kernel.Close()
		return nil, err
	}
	return &vxlanRunner{mgr: mgr, kernel: kernel, bgp: rc}, nil
}

// startVXLAN runs the manager under sup; the returned function releases
// its netlink handle once sup has stopped. Like startRouting it only
// spawns. Without BGP it also serves `node status` (the BGP agent does
// otherwise, VXLAN included), an optional service: `node status` not
// answering does not stop the daemon.
func startVXLAN(sup *supervisor, cfg Config, v *vxlanRunner, log logrus.FieldLogger) (release func()) {
	mgr, kernel, rc := v.mgr, v.kernel, v.bgp
	sup.Service("VXLAN", mgr.Run)
	if !rc.Enabled {
		path := rc.StatusSocket
		if path == "" {
			path = filepath.Join(cfg.StateDir, routing.StatusSocketName)
		}
		sup.Optional("VXLAN status socket", func(ctx context.Context) error {
			return routing.ServeVXLANStatus(ctx, path, cfg.NodeName, mgr, log)
		})
	}
	return func() { kernel.Close() }
}
