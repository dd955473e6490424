package plugin

import (
	"context"
	"net"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/ipam"
	"github.com/calico-cnm/calico-cnm/reconcile"
)

// newReconciler wires the daemon's reconciler.
func newReconciler(cfg Config, store *datastore.Store, engine *ipam.Engine, dp reconcile.Dataplane, m *Metrics, log logrus.FieldLogger) (*reconcile.Reconciler, error) {
	docker, err := reconcile.NewDockerSource(cfg.DockerHost, log.WithField("component", "docker"))
	if err != nil {
		return nil, err
	}
	return &reconcile.Reconciler{
		Node:      cfg.NodeName,
		Store:     store,
		IPAM:      engine,
		Dataplane: dp,
		Docker:    docker,
		Grace:     cfg.ReconcileGrace,
		Interval:  cfg.ResyncInterval,
		// Every scope: reconcile.MakePlan never counts the swarm manager's
		// assignments (for other nodes' tasks) as orphans.
		ReleaseOrphans: true,
		Metrics:        m,
		Log:            log.WithField("component", "reconcile"),
	}, nil
}

// waitServed waits until every socket in paths accepts connections.
func waitServed(ctx context.Context, paths []string) error {
	for _, p := range paths {
		for {
			var d net.Dialer
			dctx, cancel := context.WithTimeout(ctx, time.Second)
			c, err := d.DialContext(dctx, "unix", p)
			cancel()
			if err == nil {
				c.Close()
				break
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	return nil
}
