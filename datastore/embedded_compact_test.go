package datastore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestEmbeddedMemberCompactsHistory: the embedded member keeps only its
// last embeddedHistory revisions. The syncer following it meanwhile keeps
// its watch (it never lists again) and ends with the last value, and
// nothing is logged at warning or above, compacting or stopping.
func TestEmbeddedMemberCompactsHistory(t *testing.T) {
	cfg, _ := embeddedOnSockets(t, "cnm-compact")
	cfg.embeddedCompactEvery = 20 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rec := &warnRecorder{}
	log := logrus.New()
	log.SetOutput(io.Discard)
	log.SetLevel(logrus.InfoLevel)
	log.AddHook(rec)
	store, err := Open(ctx, cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	t.Cleanup(func() {
		if !closed {
			store.Close()
		}
	})
	syncer, err := NewSyncer(store, SyncerConfig{
		Kinds: []Kind{{Prefix: "probe/", Decode: func(_ string, v []byte) (any, error) { return string(v), nil }}},
		Log:   log,
	})
	if err != nil {
		t.Fatal(err)
	}
	sctx, stopSyncer := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- syncer.Run(sctx) }()

	revOf := func() int64 {
		t.Helper()
		kv, err := store.Get(ctx, "probe/k")
		if err != nil {
			t.Fatal(err)
		}
		return kv.ModRevision
	}
	const writes = 3 * embeddedHistory
	var first, last int64
	for i := range writes {
		if err := store.Txn(ctx, Put("probe/k", []byte(fmt.Sprint(i)))); err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			first = revOf()
		}
	}
	last = revOf()

	readAt := func(rev int64) error {
		_, err := store.Client().Get(ctx, store.abs("probe/k"), clientv3.WithRev(rev))
		return err
	}
	for deadline := time.Now().Add(30 * time.Second); !errors.Is(readAt(first), rpctypes.ErrCompacted); {
		if time.Now().After(deadline) {
			t.Fatalf("revision %d (of %d) is still readable: the history was not compacted", first, last)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := readAt(last - embeddedHistory + 1); err != nil {
		t.Errorf("reading revision %d, within the last %d of %d: %v", last-embeddedHistory+1, embeddedHistory, last, err)
	}

	if err := syncer.WaitRevision(ctx, last); err != nil {
		t.Fatal(err)
	}
	if r, ok := syncer.Get("probe/k"); !ok || r.Value != fmt.Sprint(writes-1) {
		t.Errorf("the syncer holds %+v, want the last value %d", r, writes-1)
	}
	if n := syncer.Lists(); n != 1 {
		t.Errorf("the syncer listed the store %d times, want 1 (its watch outlives the compactions)", n)
	}
	stopSyncer()
	if err := <-ran; !errors.Is(err, context.Canceled) {
		t.Errorf("syncer Run returned %v, want context.Canceled", err)
	}
	store.Close()
	closed = true
	for _, l := range rec.take() {
		t.Errorf("logged %s", l)
	}
}
