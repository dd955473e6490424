package etcdtest

import (
	"context"
	"testing"
	"time"

	"github.com/calico-cnm/calico-cnm/datastore"
)

// Records runs the daemon's syncer over store, following kinds (default:
// the datastore package's own), until the test ends. Its List and Get
// first wait until the syncer has seen everything the store holds at the
// call, so a test reads what it just wrote, as it did reading the store.
func Records(t testing.TB, store *datastore.Store, kinds ...datastore.Kind) datastore.Records {
	t.Helper()
	if len(kinds) == 0 {
		kinds = datastore.Kinds()
	}
	s, err := datastore.NewSyncer(store, datastore.SyncerConfig{Kinds: kinds, ResyncInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = s.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return &currentRecords{Syncer: s, store: store, t: t}
}

type currentRecords struct {
	*datastore.Syncer
	store *datastore.Store
	t     testing.TB
}

func (r *currentRecords) catchUp() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, rev, err := r.store.ListWithRevision(ctx, "no-such-prefix/")
	if err == nil {
		err = r.Syncer.WaitRevision(ctx, rev)
	}
	if err != nil {
		r.t.Errorf("the syncer did not catch up with the store: %v", err)
	}
}

func (r *currentRecords) List(prefix string) ([]*datastore.Synced, int64) {
	r.catchUp()
	return r.Syncer.List(prefix)
}

func (r *currentRecords) Get(key string) (*datastore.Synced, bool) {
	r.catchUp()
	return r.Syncer.Get(key)
}
