// Package followtest has what tests of the managers that follow the
// datastore (package follow) share: a datastore with IPAM, a syncer the
// test stops (after which no change reaches them), and the check that
// their Run gives up then.
package followtest

import (
	"context"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/datastore/etcdtest"
	"github.com/calico-cnm/calico-cnm/ipam"
)

// Stoppable runs the daemon's syncer over store (every kind the daemon
// follows) until stop is called or the test ends; stop waits until its
// Run has returned.
func Stoppable(t testing.TB, store *datastore.Store) (records *datastore.Syncer, stop func()) {
	t.Helper()
	s, err := datastore.NewSyncer(store, datastore.SyncerConfig{Kinds: append(datastore.Kinds(), ipam.Kinds()...), ResyncInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = s.Run(ctx) }()
	stop = func() { cancel(); <-done }
	t.Cleanup(stop)
	return s, stop
}

// Fixture is a real (embedded) datastore and IPAM for a manager under
// test, a quiet logger and a context the test cancels.
func Fixture(t *testing.T) (*datastore.Store, *ipam.Engine, context.Context, context.CancelFunc, *logrus.Logger) {
	t.Helper()
	store := etcdtest.Start(t).Client(t)
	ctx, cancel := context.WithCancel(context.Background())
	log := logrus.New()
	log.SetLevel(logrus.WarnLevel)
	return store, ipam.New(store, ipam.Options{Log: log}), ctx, cancel, log
}
