package datastore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/datastore/etcdtest"
)

// TestWatchesRestartWhenTheRevisionGoesBack: the etcd behind a client is
// replaced by an empty member (wiped, same URL). The client's watches
// would wait for revisions the new member has not reached; the first
// response with a lower revision ends them with an error, so the watchers
// re-list.
func TestWatchesRestartWhenTheRevisionGoesBack(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	m := etcdtest.Start(t)
	c := m.Client(t)
	for i := range 30 {
		if err := c.Txn(ctx, datastore.Put(fmt.Sprintf("x/%d", i), []byte("1"))); err != nil {
			t.Fatal(err)
		}
	}
	_, rev, err := c.ListWithRevision(ctx, "x/")
	if err != nil {
		t.Fatal(err)
	}
	events := c.Watch(ctx, "x/", rev)

	m.Wipe(t)
	// The client's next read meets the lower revision.
	etcdtest.Reach(t, c)
	for {
		select {
		case ev, ok := <-events:
			if !ok {
				t.Fatal("watch closed without an error event")
			}
			if ev.Err != nil {
				return
			}
		case <-ctx.Done():
			t.Fatal("the watch did not end after the revision went back")
		}
	}
}
