// Package followtest has a datastore syncer for tests of the managers
// that follow the datastore through it (package follow): one the test
// stops, after which no change reaches them.
package followtest

import (
	"context"
	"testing"
	"time"

	"github.com/calico-cnm/calico-cnm/datastore"
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
