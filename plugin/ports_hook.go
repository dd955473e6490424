package plugin

import (
	"context"

	"github.com/sirupsen/logrus"

	"github.com/calico-cnm/calico-cnm/dataplane"
	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/nft"
	"github.com/calico-cnm/calico-cnm/ports"
)

// newPorts makes the publisher of container ports (package ports) for the
// host namespace, programming its tables through conn. Its tables are
// rebuilt from the datastore by startPorts.
func newPorts(cfg Config, store *datastore.Store, records datastore.Records, dp *dataplane.Linux, conn *nft.Conn, engineID func() string, log logrus.FieldLogger) *ports.Manager {
	return ports.NewManager(store, records, cfg.NodeName, ports.NewTables(conn), dp, ipv6Available(cfg.ProcSys), engineID, log)
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
