package plugin

import (
	"context"

	"github.com/sirupsen/logrus"

	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/ipam"
)

// startRouting starts the BGP speaker and kernel route programming when
// configured; the returned stop function waits for it to finish.
func startRouting(ctx context.Context, cfg Config, store *datastore.Store, engine *ipam.Engine, log logrus.FieldLogger) (stop func(), err error) {
	if !cfg.BGP.Enabled {
		return func() {}, nil
	}
	log.Warn("BGP is not implemented yet")
	return func() {}, nil
}
