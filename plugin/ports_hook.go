package plugin

import (
	"context"
	"fmt"

	"github.com/sirupsen/logrus"

	"github.com/calico-cnm/calico-cnm/dataplane"
	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/ports"
)

// newPorts makes the publisher of container ports (package ports) for the
// host namespace. Its tables are rebuilt from the datastore by startPorts.
func newPorts(cfg Config, store *datastore.Store, dp *dataplane.Linux, engineID func() string, log logrus.FieldLogger) (*ports.Manager, *ports.NFT, error) {
	nft, err := ports.NewNFT("")
	if err != nil {
		return nil, nil, fmt.Errorf("published ports: %w", err)
	}
	return ports.NewManager(store, cfg.NodeName, nft, dp, ipv6Available(cfg.ProcSys), engineID, log), nft, nil
}

// startPorts rebuilds the published ports' rules now and on every resync
// under sup. The rules stay when the daemon stops: the containers' ports
// keep working.
func startPorts(sup *supervisor, cfg Config, m *ports.Manager) {
	sup.Service("published ports", func(ctx context.Context) error {
		m.Run(ctx, cfg.ResyncInterval)
		return ctx.Err()
	})
}
