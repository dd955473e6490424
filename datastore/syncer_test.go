package datastore_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/calico-cnm/calico-cnm/datastore"
	"github.com/calico-cnm/calico-cnm/datastore/etcdtest"
)

// testKinds: "num/" records decode as ints (a non-number is undecodable),
// "txt/" as strings; "other/" is followed by nobody.
func testKinds() []datastore.Kind {
	return []datastore.Kind{
		{Prefix: "num/", Decode: func(_ string, v []byte) (any, error) { return strconv.Atoi(string(v)) }},
		{Prefix: "txt/", Decode: func(_ string, v []byte) (any, error) { return string(v), nil }},
	}
}

func startSyncer(t *testing.T, ctx context.Context, store *datastore.Store) *datastore.Syncer {
	t.Helper()
	s, err := datastore.NewSyncer(store, datastore.SyncerConfig{Kinds: testKinds(), ResyncInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("Run returned %v, want context.Canceled", err)
		}
	})
	return s
}

// values turns a batch into key -> decoded value ("deleted" for removals,
// "bad" for undecodable records).
func values(b datastore.Batch) map[string]any {
	out := map[string]any{}
	for _, c := range b.Changes {
		switch {
		case c.Deleted():
			out[c.Key] = "deleted"
		case c.New.Err != nil:
			out[c.Key] = "bad"
		default:
			out[c.Key] = c.New.Value
		}
	}
	return out
}

func put(t *testing.T, ctx context.Context, s *datastore.Store, kv ...string) int64 {
	t.Helper()
	var ops []datastore.Op
	for i := 0; i < len(kv); i += 2 {
		ops = append(ops, datastore.Put(kv[i], []byte(kv[i+1])))
	}
	rev, err := s.TxnRev(ctx, ops...)
	if err != nil {
		t.Fatal(err)
	}
	return rev
}

// nextUntil takes batches until one reaches rev, merging their changes.
func nextUntil(t *testing.T, ctx context.Context, sub *datastore.Subscription, rev int64) datastore.Batch {
	t.Helper()
	var all datastore.Batch
	for all.Revision < rev {
		b, err := sub.Next(ctx)
		if err != nil {
			t.Fatalf("waiting for revision %d: %v", rev, err)
		}
		all.Changes = append(all.Changes, b.Changes...)
		all.Revision, all.InSync = b.Revision, b.InSync
	}
	return all
}

func TestSyncerListsThenFollowsWithOneListAndTypedValues(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	m := etcdtest.Start(t)
	rev := put(t, ctx, m.Store, "num/a", "1", "num/bad", "x", "txt/a", "hello", "other/a", "1")

	sctx, stop := context.WithCancel(ctx)
	defer stop()
	s := startSyncer(t, sctx, m.Store)
	nums := s.Subscribe(sctx, "nums", "num/")
	first := nextUntil(t, ctx, nums, rev)
	if !first.InSync {
		t.Error("the first batch after the list is not InSync")
	}
	want := map[string]any{"num/a": 1, "num/bad": "bad"}
	if got := values(first); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("first batch %v, want %v", got, want)
	}

	// Changes arrive typed, with what the subscriber knew before; a key
	// outside the subscription or any kind never shows.
	rev = put(t, ctx, m.Store, "num/a", "2", "num/b", "3", "txt/a", "bye", "other/a", "2")
	if _, err := m.Store.DeleteExisting(ctx, "num/bad"); err != nil {
		t.Fatal(err)
	}
	rev++
	b := nextUntil(t, ctx, nums, rev)
	want = map[string]any{"num/a": 2, "num/b": 3, "num/bad": "deleted"}
	if got := values(b); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("changes %v, want %v", got, want)
	}
	for _, c := range b.Changes {
		if c.Key == "num/a" && (c.Old == nil || c.Old.Value != 1) {
			t.Errorf("num/a's Old is %+v, want the record holding 1", c.Old)
		}
	}

	// A late subscriber starts from memory with the current records.
	txt := s.Subscribe(sctx, "txt", "txt/")
	if got := values(nextUntil(t, ctx, txt, rev)); fmt.Sprint(got) != fmt.Sprint(map[string]any{"txt/a": "bye"}) {
		t.Errorf("late subscriber got %v", got)
	}
	if recs, _ := s.List("num/"); len(recs) != 2 {
		t.Errorf("List(num/) holds %d records, want 2", len(recs))
	}
	if n := s.Lists(); n != 1 {
		t.Errorf("the syncer listed the datastore %d times while following changes, want 1", n)
	}
	if err := s.WaitRevision(ctx, rev); err != nil {
		t.Fatal(err)
	}
}

// TestSyncerCoalescesForASlowSubscriber: changes to one key while the
// subscriber is busy reach it as one change from what it knew to the
// latest; a record created and deleted meanwhile never shows.
func TestSyncerCoalescesForASlowSubscriber(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	m := etcdtest.Start(t)
	put(t, ctx, m.Store, "num/a", "1")
	sctx, stop := context.WithCancel(ctx)
	defer stop()
	s := startSyncer(t, sctx, m.Store)
	sub := s.Subscribe(sctx, "slow", "num/")
	nextUntil(t, ctx, sub, 1)

	for i := 2; i <= 20; i++ {
		put(t, ctx, m.Store, "num/a", strconv.Itoa(i), "num/tmp", "0")
	}
	if _, err := m.Store.DeleteExisting(ctx, "num/tmp"); err != nil {
		t.Fatal(err)
	}
	last := put(t, ctx, m.Store, "txt/x", "y")
	if err := s.WaitRevision(ctx, last); err != nil {
		t.Fatal(err)
	}
	b := sub.Take()
	if len(b.Changes) != 1 || b.Changes[0].Key != "num/a" || b.Changes[0].New.Value != 20 || b.Changes[0].Old.Value != 1 {
		t.Fatalf("coalesced batch %+v, want one change of num/a from 1 to 20", values(b))
	}
	if b.Revision != last {
		t.Errorf("batch revision %d, want %d", b.Revision, last)
	}
}

// TestSyncerRelistsAfterTheStoreWentBack: the etcd behind the syncer is
// wiped and refilled (a restore). The watch ends, the syncer lists again
// and tells the subscriber only the difference.
func TestSyncerRelistsAfterTheStoreWentBack(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	m := etcdtest.Start(t)
	c := m.Client(t)
	for i := range 20 {
		put(t, ctx, c, "txt/pad", strconv.Itoa(i))
	}
	rev := put(t, ctx, c, "num/keep", "1", "num/gone", "2", "num/changed", "3")
	sctx, stop := context.WithCancel(ctx)
	defer stop()
	s := startSyncer(t, sctx, c)
	sub := s.Subscribe(sctx, "nums", "num/")
	nextUntil(t, ctx, sub, rev)

	m.Wipe(t)
	put(t, ctx, m.Store, "num/keep", "1", "num/changed", "4", "num/new", "5")
	etcdtest.Reach(t, c)

	var got map[string]any
	want := map[string]any{"num/changed": 4, "num/gone": "deleted", "num/new": 5}
	for fmt.Sprint(got) != fmt.Sprint(want) {
		b, err := sub.Next(ctx)
		if err != nil {
			t.Fatalf("after the restore the subscriber got %v, want %v", got, want)
		}
		if got == nil {
			got = map[string]any{}
		}
		for k, v := range values(b) {
			got[k] = v
		}
	}
	if s.Lists() < 2 {
		t.Errorf("the syncer listed %d times, want a second list after the restore", s.Lists())
	}
}

func TestNewSyncerRejectsOverlappingKinds(t *testing.T) {
	dec := func(string, []byte) (any, error) { return nil, nil }
	_, err := datastore.NewSyncer(&datastore.Store{}, datastore.SyncerConfig{Kinds: []datastore.Kind{
		{Prefix: "a/", Decode: dec}, {Prefix: "a/b/", Decode: dec},
	}})
	if err == nil {
		t.Fatal("overlapping kinds accepted")
	}
}

// TestSyncerRelistsAfterCompaction: the syncer's watch starts from a
// revision etcd has compacted away. The watch fails, and the next list
// hands the subscriber exactly what changed meanwhile.
func TestSyncerRelistsAfterCompaction(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	m := etcdtest.Start(t)
	put(t, ctx, m.Store, "num/keep", "1", "num/gone", "2", "num/changed", "3")
	s, err := datastore.NewSyncer(m.Store, datastore.SyncerConfig{Kinds: testKinds()})
	if err != nil {
		t.Fatal(err)
	}
	sub := s.Subscribe(ctx, "nums", "num/")
	rev, err := s.ListForTest(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sub.Take()

	put(t, ctx, m.Store, "num/changed", "4", "num/new", "5")
	if _, err := m.Store.DeleteExisting(ctx, "num/gone"); err != nil {
		t.Fatal(err)
	}
	now := put(t, ctx, m.Store, "txt/x", "y")
	if _, err := m.Store.Client().Compact(ctx, now); err != nil {
		t.Fatal(err)
	}
	if err := s.WatchForTest(ctx, rev); err == nil || !strings.Contains(err.Error(), "compacted") {
		t.Fatalf("watch from a compacted revision returned %v, want a compaction error", err)
	}
	if _, err := s.ListForTest(ctx); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"num/changed": 4, "num/gone": "deleted", "num/new": 5}
	if got := values(sub.Take()); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("after the compaction the subscriber got %v, want %v", got, want)
	}
}

// TestSyncerDecodesOncePerRevision: a record is decoded once per revision
// however many subscribers take it, and a re-list that finds it unchanged
// does not decode it again.
func TestSyncerDecodesOncePerRevision(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	m := etcdtest.Start(t)
	var decodes atomic.Int64
	kinds := []datastore.Kind{{Prefix: "num/", Decode: func(_ string, v []byte) (any, error) {
		decodes.Add(1)
		return strconv.Atoi(string(v))
	}}}
	put(t, ctx, m.Store, "num/a", "1", "num/b", "2")
	s, err := datastore.NewSyncer(m.Store, datastore.SyncerConfig{Kinds: kinds})
	if err != nil {
		t.Fatal(err)
	}
	subs := []*datastore.Subscription{s.Subscribe(ctx, "one", "num/"), s.Subscribe(ctx, "two", "num/"), s.Subscribe(ctx, "three", "num/a")}
	if _, err := s.ListForTest(ctx); err != nil {
		t.Fatal(err)
	}
	if n := decodes.Load(); n != 2 {
		t.Fatalf("the first list decoded %d times, want 2", n)
	}
	if _, err := s.ListForTest(ctx); err != nil {
		t.Fatal(err)
	}
	if n := decodes.Load(); n != 2 {
		t.Errorf("a re-list of unchanged records decoded %d more times, want none", n-2)
	}
	var first *datastore.Synced
	for _, sub := range subs {
		for _, c := range sub.Take().Changes {
			if c.Key != "num/a" {
				continue
			}
			if first == nil {
				first = c.New
			} else if c.New != first {
				t.Error("subscribers got different copies of one record")
			}
		}
	}
}
