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

	_ = m.Store.Close()
	cfg := m.Config
	cfg.DataDir = t.TempDir()
	fresh, err := datastore.Open(ctx, cfg, nil)
	if err != nil {
		t.Fatalf("replacement member: %v", err)
	}
	t.Cleanup(func() { _ = fresh.Close() })
	if err := fresh.Txn(ctx, datastore.Put("x/new", []byte("1"))); err != nil {
		t.Fatal(err)
	}
	// The client's next read meets the lower revision (retried while its
	// connection moves to the new member).
	for {
		if _, err := c.Get(ctx, "x/new"); err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("the client never reached the new member")
		}
		time.Sleep(100 * time.Millisecond)
	}
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
