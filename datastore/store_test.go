package datastore_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/datastore/etcdtest"
)

func TestGuardedTransactions(t *testing.T) {
	m := etcdtest.Start(t)
	s := m.Store
	ctx := context.Background()

	if _, err := s.Get(ctx, "a"); !errors.Is(err, datastore.ErrNotFound) {
		t.Fatalf("Get of missing key: want ErrNotFound, got %v", err)
	}
	if err := s.Txn(ctx, datastore.Create("a", []byte("1"))); err != nil {
		t.Fatalf("create: %v", err)
	}
	if err := s.Txn(ctx, datastore.Create("a", []byte("2"))); !errors.Is(err, datastore.ErrConflict) {
		t.Fatalf("second create: want ErrConflict, got %v", err)
	}
	kv, err := s.Get(ctx, "a")
	if err != nil || string(kv.Value) != "1" {
		t.Fatalf("Get a = %q, %v", kv.Value, err)
	}
	stale := kv.ModRevision
	if err := s.Txn(ctx, datastore.Update("a", []byte("2"), stale)); err != nil {
		t.Fatalf("update at current revision: %v", err)
	}
	// A writer that read before the update must lose, and nothing of its
	// transaction may be applied.
	err = s.Txn(ctx, datastore.Create("b", []byte("x")), datastore.Update("a", []byte("3"), stale))
	if !errors.Is(err, datastore.ErrConflict) {
		t.Fatalf("stale update: want ErrConflict, got %v", err)
	}
	if _, err := s.Get(ctx, "b"); !errors.Is(err, datastore.ErrNotFound) {
		t.Fatalf("failed txn applied part of itself: b exists (%v)", err)
	}
	kv, _ = s.Get(ctx, "a")
	if err := s.Txn(ctx, datastore.Delete("a", stale)); !errors.Is(err, datastore.ErrConflict) {
		t.Fatalf("stale delete: want ErrConflict, got %v", err)
	}
	if err := s.Txn(ctx, datastore.Delete("a", kv.ModRevision)); err != nil {
		t.Fatalf("delete: %v", err)
	}
	if err := s.Txn(ctx, datastore.Check("a", 0), datastore.Put("c", []byte("z"))); err != nil {
		t.Fatalf("check-absent then put: %v", err)
	}
	kvs, err := s.List(ctx, "")
	if err != nil || len(kvs) != 1 || kvs[0].Key != "c" {
		t.Fatalf("List = %+v, %v; want only c", kvs, err)
	}
}

// TestRevisionResets: a client that sees the datastore's revision go
// back (etcd wiped and restored) counts it, once.
func TestRevisionResets(t *testing.T) {
	m := etcdtest.Start(t)
	ctx := context.Background()
	c := m.Client(t)
	for i := range 20 {
		if err := c.Txn(ctx, datastore.Put("k"+strconv.Itoa(i), []byte("v"))); err != nil {
			t.Fatal(err)
		}
	}
	if n := c.RevisionResets(); n != 0 {
		t.Fatalf("RevisionResets = %d before any reset", n)
	}
	m.Wipe(t)
	etcdtest.Reach(t, c)
	if _, err := c.List(ctx, ""); err != nil {
		t.Fatal(err)
	}
	if n := c.RevisionResets(); n != 1 {
		t.Errorf("RevisionResets = %d after the store was wiped, want 1", n)
	}
}

func TestRetryResolvesRacingIncrements(t *testing.T) {
	m := etcdtest.Start(t)
	ctx := context.Background()
	const writers, each = 4, 25
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := 0; w < writers; w++ {
		s := m.Client(t)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				err := s.Retry(ctx, func(ctx context.Context) error {
					var n int
					rev, err := s.GetJSON(ctx, "counter", &n)
					if err != nil && !errors.Is(err, datastore.ErrNotFound) {
						return err
					}
					return s.Txn(ctx, datastore.Write("counter", datastore.MustJSON(n+1), rev))
				})
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	var n int
	if _, err := m.Store.GetJSON(ctx, "counter", &n); err != nil || n != writers*each {
		t.Fatalf("counter = %d (%v), want %d: a lost update slipped through", n, err, writers*each)
	}
}

func TestWatchSeesChanges(t *testing.T) {
	m := etcdtest.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	_, rev, err := m.Store.ListWithRevision(ctx, "w/")
	if err != nil {
		t.Fatal(err)
	}
	ch := m.Store.Watch(ctx, "w/", rev)
	if err := m.Store.Txn(ctx, datastore.Create("w/x", []byte("1"))); err != nil {
		t.Fatal(err)
	}
	if err := m.Store.Txn(ctx, datastore.Delete("w/x", 0)); err != nil {
		t.Fatal(err)
	}
	want := []datastore.EventType{datastore.EventPut, datastore.EventDelete}
	for i, w := range want {
		select {
		case ev := <-ch:
			if ev.Err != nil || ev.Type != w || ev.Key != "w/x" {
				t.Fatalf("event %d = %+v, want type %v on w/x", i, ev, w)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("no event %d within 5s", i)
		}
	}
}

func TestUnreachableDatastoreFailsFastWithTypedError(t *testing.T) {
	cfg := datastore.Config{
		Endpoints:      []string{"http://127.0.0.1:" + strconv.Itoa(etcdtest.DeadPort(t))},
		RequestTimeout: 500 * time.Millisecond,
		DialTimeout:    200 * time.Millisecond,
	}
	s, err := datastore.Open(context.Background(), cfg, nil)
	if err != nil {
		t.Fatalf("Open must not block on an unreachable endpoint: %v", err)
	}
	defer s.Close()
	start := time.Now()
	_, err = s.Get(context.Background(), "x")
	if !errors.Is(err, datastore.ErrUnavailable) {
		t.Fatalf("want ErrUnavailable, got %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("Get took %s with a 500ms request timeout", d)
	}
}

func TestTLSFilesWithPlainEndpointRejected(t *testing.T) {
	_, err := datastore.Open(context.Background(), datastore.Config{
		Endpoints: []string{"http://127.0.0.1:2379"}, CACertFile: "/nonexistent/ca.pem",
	}, nil)
	if err == nil {
		t.Fatal("want an error for TLS files with missing CA")
	}
}
